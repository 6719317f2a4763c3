"""The authoritative rank table kept at rank 0: a plain state machine.

Every event names a rank and the incarnation it speaks about. An event whose incarnation is not the
rank's current one is refused and changes nothing: this is what keeps a late report about an old
broker from touching its successor. `apply` never performs I/O; the broker acts on its Outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tbon.keys.cert import fingerprint
from tbon.overlay.state.topology import Topology


class RankState(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    RESERVED = "reserved"
    RETIRING = "retiring"
    LOST = "lost"
    VACANT = "vacant"


class SubtreeStatus(StrEnum):
    FULL = "full"
    PARTIAL = "partial"
    DEGRADED = "degraded"
    LOST = "lost"
    OFFLINE = "offline"


CONNECTED = frozenset({RankState.ONLINE, RankState.RETIRING})
"""States whose broker holds a live connection to its parent."""

ALLOCATABLE = (RankState.VACANT, RankState.LOST)
"""States FLUB may hand to a joining broker (design.md)."""


@dataclass(slots=True)
class RankEntry:
    rank: int
    state: RankState
    incarnation: int
    host: str
    pid: int | None
    since: float
    torpid: bool = False
    joiner: str | None = None  # public key (Z85) a reservation was made for
    lease_until: float | None = None  # when that reservation expires
    host_before: str = ""  # the host shown before the reservation, restored if it expires
    retired: bool = False  # vacant because this incarnation was retired (not lost, not spare)
    key: str | None = None  # the public key this incarnation was reserved for (FLUB), kept
    fixed: bool = False  # held by a config-booted broker: offline while down, never for FLUB
    online_once: bool = False  # this incarnation has been online


@dataclass(frozen=True, slots=True)
class Online:
    """A parent welcomed this rank's broker (its hello was accepted)."""

    rank: int
    incarnation: int
    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class Lost:
    """A parent saw this rank's broker go: its connection dropped or it fell silent."""

    rank: int
    incarnation: int
    reason: str


@dataclass(frozen=True, slots=True)
class Departed:
    """This rank's broker said goodbye: a clean exit."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Torpid:
    """This rank's broker is connected but has been silent past tbon.torpid (or spoke again)."""

    rank: int
    incarnation: int
    torpid: bool


@dataclass(frozen=True, slots=True)
class Retire:
    """`tbon retire` begins for this incarnation: it is drained, then leaves (as Departed)."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Expire:
    """A reservation's lease (broker.join-timeout) ran out before its joiner said hello."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Reboot:
    """A config-booted rank's broker was restarted on its host: the rank takes a new
    incarnation (the ended one is `incarnation`) and stays offline until it is welcomed."""

    rank: int
    incarnation: int


Event = Online | Lost | Departed | Torpid | Expire | Retire | Reboot


@dataclass(frozen=True, slots=True)
class Reserve:
    """A joining broker asks for a rank (FLUB): a specific one, or None for any available."""

    public_key: str
    host: str
    rank: int | None
    lease: float


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to Reserve: a rank and its new incarnation, or why there is none."""

    granted: bool
    rank: int = -1
    incarnation: int = 0
    reason: str = ""
    repeated: bool = False  # the same key asked before and gets the same reservation
    never: bool = False  # this key may never have a rank: its broker was retired


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an event did: `changed` lists every rank whose entry changed (empty if refused)."""

    applied: bool
    changed: tuple[int, ...] = ()
    reason: str = ""


def refused(reason: str) -> Outcome:
    return Outcome(False, (), reason)


def describe(entry: RankEntry) -> str:
    """Who holds a rank, for a refusal that names them."""
    if entry.state in CONNECTED:
        return f"{entry.state} (host {entry.host}, pid {entry.pid})"
    if entry.state is RankState.RESERVED and entry.joiner is not None:
        return f"reserved for a joiner on {entry.host} (key {fingerprint(entry.joiner)})"
    if entry.state is RankState.OFFLINE:
        return f"offline, expected from bootstrap on {entry.host}"
    return str(entry.state)


class RankTable:
    """The state of every rank of one instance."""

    def __init__(
        self, topology: Topology, hosts: list[str], now: float, fixed: bool = False
    ) -> None:
        """Ranks below len(hosts) were launched by bootstrap (incarnation 1); the rest are spare.
        `fixed` (config bootstrap): those ranks belong to their hosts; when their broker goes
        they are offline, expected back, and never handed to FLUB."""
        if not 1 <= len(hosts) <= topology.size:
            raise ValueError("between 1 and size ranks are launched")
        self.topology = topology
        self.generation = 0
        self.retired_keys: dict[str, int] = {}  # key of a retired joiner -> the rank it left
        self.entries = [
            RankEntry(rank, RankState.OFFLINE, 1, host, None, now)
            for rank, host in enumerate(hosts)
        ]
        for entry in self.entries:
            entry.fixed = fixed
        spares = range(len(hosts), topology.size)
        self.entries += [
            RankEntry(rank, RankState.VACANT, 0, f"extra{rank - len(hosts)}", None, now)
            for rank in spares
        ]

    @property
    def size(self) -> int:
        return self.topology.size

    def entry(self, rank: int) -> RankEntry:
        return self.entries[rank]

    def apply(self, event: Event, now: float) -> Outcome:
        if not 0 <= event.rank < self.size:
            return refused(f"rank {event.rank} is not in this instance of size {self.size}")
        entry = self.entries[event.rank]
        if event.incarnation != entry.incarnation and not isinstance(event, Reboot):
            return refused(
                f"rank {event.rank} incarnation {event.incarnation} is not current "
                f"({entry.incarnation})"
            )
        match event:
            case Online():
                outcome = self._online(entry, event, now)
            case Lost():
                outcome = self._end(entry, RankState.LOST, now)
            case Departed():
                outcome = self._end(entry, RankState.VACANT, now)
            case Torpid():
                outcome = self._torpid(entry, event.torpid)
            case Expire():
                outcome = self._expire(entry, now)
            case Retire():
                outcome = self._retire(entry, now)
            case Reboot():
                outcome = self._reboot(entry, now)
        if outcome.changed:
            self.generation += 1
        return outcome

    def _online(self, entry: RankEntry, event: Online, now: float) -> Outcome:
        if entry.state is RankState.ONLINE and entry.pid == event.pid:
            return Outcome(True)
        if entry.state not in (RankState.OFFLINE, RankState.RESERVED):
            return refused(f"rank {entry.rank} is {entry.state}, it cannot come online")
        if entry.rank != 0 and not self._parent_connected(entry.rank):
            return refused(f"rank {entry.rank}'s parent is not online")
        self._set(entry, RankState.ONLINE, now)
        entry.host, entry.pid, entry.torpid = event.host, event.pid, False
        entry.online_once = True
        return Outcome(True, (entry.rank,))

    def _expire(self, entry: RankEntry, now: float) -> Outcome:
        if entry.state is not RankState.RESERVED:
            return refused(f"rank {entry.rank} is {entry.state}, not reserved")
        if entry.lease_until is not None and now < entry.lease_until:
            return refused(
                f"rank {entry.rank}'s reservation has {entry.lease_until - now:.1f}s left"
            )
        entry.host = entry.host_before
        self._set(entry, RankState.VACANT, now)
        return Outcome(True, (entry.rank,))

    # --- FLUB ---------------------------------------------------------------------------------

    def reserve(self, request: Reserve, now: float) -> Reservation:
        """Give a joiner a vacant or lost rank, atomically: it is reserved before anyone else
        can be told about it, and a repeated request from the same key gets the same rank."""
        if (left := self.retired_keys.get(request.public_key)) is not None:
            return Reservation(
                False,
                reason=f"this broker's key was retired from rank {left}: a retired broker does "
                "not come back (a new broker, with a new key, may join)",
                never=True,
            )
        for entry in self.entries:  # one broker, one rank: a key in the tree asks for no other
            if entry.key == request.public_key and entry.state in CONNECTED:
                return Reservation(
                    False, reason=f"this key already holds rank {entry.rank} ({entry.state})"
                )
        for entry in self.entries:
            if entry.state is RankState.RESERVED and entry.joiner == request.public_key:
                if request.rank not in (None, entry.rank):
                    return Reservation(
                        False, reason=f"this key already holds a reservation of rank {entry.rank}"
                    )
                return Reservation(True, entry.rank, entry.incarnation, repeated=True)
        if request.rank is not None:
            if not 0 <= request.rank < self.size:
                return Reservation(
                    False, reason=f"no rank {request.rank} in this instance of size {self.size}"
                )
            entry = self.entries[request.rank]
            if entry.state not in ALLOCATABLE:
                return Reservation(False, reason=f"rank {entry.rank} is taken: {describe(entry)}")
            if self._under_retiring(entry.rank):
                return Reservation(False, reason=f"rank {entry.rank}'s parent is retiring")
        else:
            free = [
                e
                for e in self.entries
                if e.state in ALLOCATABLE and not self._under_retiring(e.rank)
            ]
            if not free:
                return Reservation(False, reason="no available ranks")
            entry = free[0]  # lowest first: interior ranks before the leaves below them
        entry.incarnation += 1
        entry.retired = entry.fixed = False  # a FLUB broker holds it now
        entry.host_before, entry.host = entry.host, request.host
        self._set(entry, RankState.RESERVED, now)
        entry.joiner, entry.lease_until = request.public_key, now + request.lease
        entry.key = request.public_key
        self.generation += 1
        return Reservation(True, entry.rank, entry.incarnation)

    def _under_retiring(self, rank: int) -> bool:
        """A retiring broker takes no new children: the ranks below it are not handed out."""
        parent = self.topology.parent(rank)
        return parent is not None and self.entries[parent].state is RankState.RETIRING

    def verify(self, rank: int, incarnation: int, public_key: str) -> str | None:
        """Why `public_key` may not join as (rank, incarnation), or None if it was reserved so."""
        if not 0 <= rank < self.size:
            return f"no rank {rank} in this instance of size {self.size}"
        entry = self.entries[rank]
        if entry.state is not RankState.RESERVED or entry.incarnation != incarnation:
            return (
                f"rank {rank} incarnation {incarnation} is not reserved "
                f"(rank {rank} is {entry.state}, incarnation {entry.incarnation})"
            )
        if entry.joiner != public_key:
            return f"rank {rank} is reserved for another key"
        return None

    def expired(self, now: float) -> list[Expire]:
        """Reservations whose lease has run out."""
        return [
            Expire(e.rank, e.incarnation)
            for e in self.entries
            if e.state is RankState.RESERVED and e.lease_until is not None and now >= e.lease_until
        ]

    def next_expiry(self) -> float | None:
        leases = [
            e.lease_until
            for e in self.entries
            if e.state is RankState.RESERVED and e.lease_until is not None
        ]
        return min(leases) if leases else None

    def _end(self, entry: RankEntry, state: RankState, now: float) -> Outcome:
        """The broker of `entry` is gone, and so are those below it: they exit when they lose it."""
        if entry.state not in (*CONNECTED, RankState.OFFLINE):
            return refused(f"rank {entry.rank} is already {entry.state}")
        if entry.rank == 0:
            return refused("rank 0 cannot leave its own table")
        changed = [entry.rank]
        retiring = entry.state is RankState.RETIRING
        if entry.fixed and not retiring:
            state = RankState.OFFLINE
        self._set(entry, state, now)
        entry.retired = retiring and state is RankState.VACANT
        if retiring and entry.key is not None:
            self.retired_keys[entry.key] = entry.rank
        for rank in self.topology.descendants(entry.rank):
            below = self.entries[rank]
            if below.state in (*CONNECTED, RankState.OFFLINE):
                gone = RankState.OFFLINE if below.fixed else RankState.LOST
                self._set(below, gone, now)
                changed.append(rank)
        return Outcome(True, tuple(changed))

    def _retire(self, entry: RankEntry, now: float) -> Outcome:
        """online -> retiring, recorded before the broker is told anything. Retiring is not
        allocatable: until the broker has left (Departed) or is declared lost, FLUB cannot give
        the rank to anyone. Asking again is not an error."""
        if entry.state is RankState.RETIRING:
            return Outcome(True, reason=f"rank {entry.rank} is already retiring")
        if entry.state is RankState.VACANT and entry.retired:
            return Outcome(True, reason=f"rank {entry.rank} is already retired")
        if entry.rank == 0:
            return refused("rank 0 cannot retire: shut the instance down instead")
        if entry.state is not RankState.ONLINE:
            return refused(f"rank {entry.rank} is {entry.state}: nothing to retire")
        busy = [
            rank
            for rank in self.topology.children(entry.rank)
            if self.entries[rank].state
            in (RankState.ONLINE, RankState.RESERVED, RankState.RETIRING)
        ]
        if busy:
            return refused(
                f"rank {entry.rank} has children that are online, reserved or retiring "
                f"({', '.join(map(str, busy))}): retire them first"
            )
        self._set(entry, RankState.RETIRING, now)
        return Outcome(True, (entry.rank,))

    def _reboot(self, entry: RankEntry, now: float) -> Outcome:
        """A config-booted broker is at its parent's door: it may have its rank, with the current
        incarnation if that one has not been online yet (first boot), else with a new one."""
        if entry.state is RankState.VACANT and entry.retired:
            return refused(f"rank {entry.rank} was retired: a retired broker does not come back")
        if not entry.fixed:
            return refused(f"rank {entry.rank} is not held by config bootstrap")
        if entry.state is not RankState.OFFLINE:
            return refused(f"rank {entry.rank} is {entry.state}")
        if not entry.online_once:
            return Outcome(True)
        entry.incarnation += 1
        entry.online_once = False
        self._set(entry, RankState.OFFLINE, now)
        return Outcome(True, (entry.rank,))

    def _torpid(self, entry: RankEntry, torpid: bool) -> Outcome:
        if entry.state not in CONNECTED:
            return refused(f"rank {entry.rank} is {entry.state}")
        if entry.torpid == torpid:
            return Outcome(True)
        entry.torpid = torpid
        return Outcome(True, (entry.rank,))

    def _parent_connected(self, rank: int) -> bool:
        parent = self.topology.parent(rank)
        return parent is not None and self.entries[parent].state in CONNECTED

    @staticmethod
    def _set(entry: RankEntry, state: RankState, now: float) -> None:
        entry.state, entry.since = state, now
        if state not in CONNECTED:
            entry.pid, entry.torpid = None, False
        if state is not RankState.RESERVED:
            entry.joiner = entry.lease_until = None

    # --- views -----------------------------------------------------------------------------

    def up(self) -> bool:
        """Every launched rank is online: the instance is ready for its initial program."""
        return not any(entry.state is RankState.OFFLINE for entry in self.entries)

    def subtree_statuses(self) -> list[SubtreeStatus]:
        """Each rank's subtree status, rolled up from the leaves as Flux does.

        Lost beats partial."""
        statuses: list[SubtreeStatus] = [SubtreeStatus.FULL] * self.size
        below_lost = [False] * self.size
        below_short = [False] * self.size
        for rank in range(self.size - 1, -1, -1):
            entry = self.entries[rank]
            if entry.state is RankState.LOST:
                statuses[rank] = SubtreeStatus.LOST
            elif entry.state not in CONNECTED:
                statuses[rank] = SubtreeStatus.OFFLINE
            elif below_lost[rank]:
                statuses[rank] = SubtreeStatus.DEGRADED
            elif below_short[rank] or entry.state is RankState.RETIRING:
                statuses[rank] = SubtreeStatus.PARTIAL
            parent = self.topology.parent(rank)
            if parent is not None:
                lost_here = entry.state is RankState.LOST or below_lost[rank]
                short_here = entry.state is not RankState.ONLINE or below_short[rank]
                below_lost[parent] = below_lost[parent] or lost_here
                below_short[parent] = below_short[parent] or short_here
        return statuses

    def snapshot(self, now: float) -> dict[str, Any]:
        """The `tbon status --json` object (design.md); field names are a public contract."""
        statuses = self.subtree_statuses()
        ranks = []
        for entry, status in zip(self.entries, statuses, strict=True):
            ranks.append(
                {
                    "rank": entry.rank,
                    "state": entry.state.value,
                    "host": entry.host,
                    "pid": entry.pid,
                    "incarnation": entry.incarnation,
                    "parent": self.topology.parent(entry.rank),
                    "children": list(self.topology.children(entry.rank)),
                    "subtree": status.value,
                    "torpid": entry.torpid,
                    "since": round(max(0.0, now - entry.since), 3),
                }
            )
            if entry.retired:
                ranks[-1]["retired"] = True
            if entry.state is RankState.RESERVED and entry.joiner is not None:
                ranks[-1]["joiner"] = fingerprint(entry.joiner)
                ranks[-1]["expires"] = round(max(0.0, (entry.lease_until or now) - now), 3)
        return {"size": self.size, "topo": self.topology.spec, "ranks": ranks}
