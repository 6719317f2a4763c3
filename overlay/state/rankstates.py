"""The state of a rank: the six that `tbon status` shows, the finer ones rank 0 keeps, the entry
that holds one rank's state, and the subtree roll-up (from scratch, and kept live by `Rollup`).

The public states and subtree statuses are a contract (docs/design.md): scripts read them. The
rank table needs finer distinctions than those six, for instance whether an offline rank belongs
to its host in a config file or was launched by PMI, or whether a vacant rank was retired. Each of
those is a `Phase` of its own, and `PUBLIC` is the one mapping from a phase to what status shows.
ranktable.py says how a rank moves between phases.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum, StrEnum

from tbon.overlay.state.topology import Topology
from tbon.record import Record


class RankState(StrEnum):
    """What `tbon status` shows for a rank (docs/design.md): never rename or add one lightly."""

    ONLINE = "online"
    OFFLINE = "offline"
    RESERVED = "reserved"
    RETIRING = "retiring"
    LOST = "lost"
    VACANT = "vacant"


class SubtreeStatus(StrEnum):
    """A rank's subtree rolled up as Flux does: lost below beats short below."""

    FULL = "full"
    PARTIAL = "partial"
    DEGRADED = "degraded"
    LOST = "lost"
    OFFLINE = "offline"


CONNECTED = frozenset({RankState.ONLINE, RankState.RETIRING})
"""States whose broker holds a live connection to its parent."""

ALLOCATABLE = (RankState.VACANT, RankState.LOST)
"""States FLUB may hand to a joining broker (docs/design.md); the table's Reserve rows agree."""


class Phase(Enum):
    """The state rank 0 keeps for a rank: a public state, refined by who holds the rank.

    An *open* rank is filled by whichever broker bootstrap (PMI) or FLUB gives it to; a
    *config* rank belongs to its host in the config file, which alone may run its broker. The
    values are for logs and tests only; status shows `PUBLIC[phase]`.
    """

    LAUNCHED = "launched"  # open, offline: started by bootstrap, its hello is awaited
    RESERVED = "reserved"  # open: FLUB gave it to a joiner's key, until hello or lease end
    ONLINE = "online"  # open: its broker is connected
    RETIRING = "retiring"  # open: its broker is being drained by `tbon retire`
    LOST = "lost"  # open: its broker failed; FLUB may give the rank to another
    VACANT = "vacant"  # open: a spare, a clean goodbye, or a lapsed reservation
    RETIRED = "retired"  # vacant for good for its broker: the key that held it is barred
    CONFIG_BOOTING = "config-booting"  # config, offline: this incarnation not yet online
    CONFIG_DOWN = "config-down"  # config, offline: this incarnation was online, its broker went
    CONFIG_ONLINE = "config-online"  # config: its host's broker is connected
    CONFIG_RETIRING = "config-retiring"  # config: its host's broker is being drained
    CONFIG_LOST = "config-lost"  # config: its broker died while retiring; FLUB may refill it

    # Each member is the one object of its phase: hashed by identity (in C), not by its name
    # (Enum's __hash__, in Python), since the table looks a phase up at every event it decides.
    __hash__ = object.__hash__


PUBLIC: dict[Phase, RankState] = {
    Phase.LAUNCHED: RankState.OFFLINE,
    Phase.RESERVED: RankState.RESERVED,
    Phase.ONLINE: RankState.ONLINE,
    Phase.RETIRING: RankState.RETIRING,
    Phase.LOST: RankState.LOST,
    Phase.VACANT: RankState.VACANT,
    Phase.RETIRED: RankState.VACANT,
    Phase.CONFIG_BOOTING: RankState.OFFLINE,
    Phase.CONFIG_DOWN: RankState.OFFLINE,
    Phase.CONFIG_ONLINE: RankState.ONLINE,
    Phase.CONFIG_RETIRING: RankState.RETIRING,
    Phase.CONFIG_LOST: RankState.LOST,
}
"""The one mapping from what the table keeps to what status shows."""

CONFIG_PHASES = frozenset(
    {
        Phase.CONFIG_BOOTING,
        Phase.CONFIG_DOWN,
        Phase.CONFIG_ONLINE,
        Phase.CONFIG_RETIRING,
        Phase.CONFIG_LOST,
    }
)
"""The phases of a rank that belongs to its host in the config file."""


class Lease(Record):
    """A reservation's terms: when it lapses, and the host to show again if it does."""

    __slots__ = __match_args__ = ("until", "host_before")

    def __init__(self, until: float, host_before: str) -> None:
        self.until, self.host_before = until, host_before


class RankEntry:
    """One rank as rank 0 knows it. Its state is the phase; the fields are that phase's data,
    and the properties give callers the public view without exposing the phase.

    Not a dataclass, for start-up time (tbon/record.py), but equal and shown as the dataclass
    was, field by field (group.py's digest hashes the repr); mutable, so not hashable."""

    __slots__ = __match_args__ = (
        "rank",
        "phase",
        "incarnation",
        "host",
        "pid",
        "since",
        "torpid",
        "key",
        "lease",
        "reason",
        "last_pid",
        "attached_to",
        "adrift_until",
        "other_links",
        "past_links",
    )
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        rank: int,
        phase: Phase,
        incarnation: int,
        host: str,
        pid: int | None,
        since: float,
        torpid: bool = False,
        key: str | None = None,
        lease: Lease | None = None,
        reason: str = "",
        last_pid: int | None = None,
        attached_to: int | None = None,
        adrift_until: float | None = None,
        other_links: tuple[int, ...] = (),
        past_links: tuple[int, ...] = (),
    ) -> None:
        self.rank, self.phase, self.incarnation, self.host = rank, phase, incarnation, host
        self.pid = pid
        self.since = since  # when the rank entered its phase
        self.torpid = torpid
        self.key = key  # the key FLUB last reserved the rank for: kept, to know who holds it
        self.lease = lease  # while reserved, and only then
        self.reason = reason  # why it entered its phase, worded by the table's row ("": nothing)
        self.last_pid = last_pid  # the last broker welcomed as this rank: kept once it has gone
        # while connected: the broker its link goes to (None: adrift)
        self.attached_to = attached_to
        self.adrift_until = adrift_until  # lost its link: when rank 0 gives up on its reattaching
        # while connected: other brokers that welcomed this broker too, whose end of that link
        # has not been reported yet (a second welcome while it sought a parent, or the way home)
        self.other_links = other_links
        # while connected: parents whose link to this broker ended (moved or dropped) while it
        # held another; the lineage its subtree holds may still be theirs (the broker died before
        # its children read the other link's), so a foster parent is chosen on their chain too
        # (state/healing.py, rule 3). Ancestors only, each once: no longer than the tree is deep
        self.past_links = past_links

    def fields(self) -> tuple[object, ...]:
        """Every field's value, in order (what dataclasses.astuple gave)."""
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.fields() == other.fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"RankEntry({shown})"

    @property
    def state(self) -> RankState:
        """The public state: what status shows and callers compare."""
        return PUBLIC[self.phase]

    @property
    def lease_until(self) -> float | None:
        return self.lease.until if self.lease is not None else None

    @property
    def joiner(self) -> str | None:
        """The key a reservation awaits, while the rank is reserved."""
        return self.key if self.phase is Phase.RESERVED else None

    @property
    def retired(self) -> bool:
        return self.phase is Phase.RETIRED


def subtree_status(state: RankState, lost_below: bool, short_below: bool) -> SubtreeStatus:
    """One rank's subtree status from its own state and what is below it (docs/design.md §4):
    the rules in order, the first that matches wins, so lost beats partial."""
    if state is RankState.LOST:
        return SubtreeStatus.LOST
    if state not in CONNECTED:
        return SubtreeStatus.OFFLINE
    if lost_below:
        return SubtreeStatus.DEGRADED
    if short_below or state is RankState.RETIRING:
        return SubtreeStatus.PARTIAL
    return SubtreeStatus.FULL


SUBTREE_STATUS: dict[tuple[RankState, bool, bool], SubtreeStatus] = {
    (state, lost, short): subtree_status(state, lost, short)
    for state in RankState
    for lost in (False, True)
    for short in (False, True)
}
"""`subtree_status` of every case, for `Rollup` to look up at each move rather than call."""

# The members the roll-up compares at each move, bound once: CPython 3.11 reads an enum member
# through its class (`RankState.LOST`) ten times slower than a module global.
_LOST, _ONLINE, _OFFLINE = RankState.LOST, RankState.ONLINE, RankState.OFFLINE


def roll_up(topology: Topology, states: list[RankState]) -> list[SubtreeStatus]:
    """Each rank's subtree status, rolled up from the leaves as Flux does: in the tree's
    post-order, since a config file's tree may number a parent after its child."""
    statuses: list[SubtreeStatus] = [SubtreeStatus.FULL] * topology.size
    below_lost = [False] * topology.size
    below_short = [False] * topology.size
    parents = topology.parents()
    for rank in topology.bottom_up():
        state = states[rank]
        statuses[rank] = subtree_status(state, below_lost[rank], below_short[rank])
        parent = parents[rank]
        if parent is not None:
            below_lost[parent] |= state is RankState.LOST or below_lost[rank]
            below_short[parent] |= state is not RankState.ONLINE or below_short[rank]
    return statuses


class Rollup:
    """Every rank's subtree status kept current as states change, and when each last changed.

    `tbon status -v` shows how long a rank has been as it is shown, and an online rank is shown
    by its subtree status, so the table must know when that changed. Rolling the whole tree up
    after every event would cost O(size) an event (8192 ranks wiring up: 67 million steps).
    Instead each rank counts its children whose subtree holds a lost rank, and those whose
    subtree holds a rank not online; a change walks up only as far as it changes what a subtree
    holds, which a tree wiring up seldom does beyond the parent. `roll_up` is the oracle the
    tests hold it to.
    """

    def __init__(self, topology: Topology, states: list[RankState], now: float) -> None:
        size = topology.size
        self.parents = topology.parents()
        self.states = list(states)
        self.offline = states.count(RankState.OFFLINE)  # ranks not up yet: RankTable.up()
        self.counts = Counter(states)  # ranks in each state: `tbon status --summary` of rank 0
        self.lost_kids = [0] * size  # children whose subtree holds a lost rank
        self.short_kids = [0] * size  # children whose subtree holds a rank not online
        self.statuses = [SubtreeStatus.FULL] * size
        lost_kids, short_kids, parents = self.lost_kids, self.short_kids, self.parents
        for rank in topology.bottom_up():  # its children counted before it: roll_up in one walk
            state = states[rank]
            lost, short = lost_kids[rank] > 0, short_kids[rank] > 0
            self.statuses[rank] = SUBTREE_STATUS[state, lost, short]
            parent = parents[rank]
            if parent is not None:
                lost_kids[parent] += state is _LOST or lost
                short_kids[parent] += state is not _ONLINE or short
        self.since = [now] * size  # when each rank's subtree status last changed

    def _holds(self, rank: int) -> tuple[bool, bool]:
        """Whether the subtree of `rank`, itself included, holds a lost rank, a rank not online."""
        state = self.states[rank]
        return (
            state is _LOST or self.lost_kids[rank] > 0,
            state is not _ONLINE or self.short_kids[rank] > 0,
        )

    def _restate(self, rank: int, now: float) -> tuple[bool, bool]:
        """The status of `rank`'s subtree from what it and its children hold now, stamped with
        `now` if it changed; and what the subtree holds (`_holds`), for its parent's counts."""
        held = self.states[rank]
        lost, short = self.lost_kids[rank] > 0, self.short_kids[rank] > 0
        status = SUBTREE_STATUS[held, lost, short]
        if status is not self.statuses[rank]:
            self.statuses[rank], self.since[rank] = status, now
        return (held is _LOST or lost, held is not _ONLINE or short)

    def set(self, rank: int, state: RankState, now: float) -> None:
        """`rank` is now in `state`: restate it, and its ancestors while what they hold moves.
        Called at every move of every rank, so `_holds` and the restating are written out."""
        states, was = self.states, self.states[rank]
        if was is state:
            return
        lost_kids, short_kids, parents = self.lost_kids, self.short_kids, self.parents
        before = (was is _LOST or lost_kids[rank] > 0, was is not _ONLINE or short_kids[rank] > 0)
        self.offline += (state is _OFFLINE) - (was is _OFFLINE)
        self.counts[was] -= 1
        self.counts[state] += 1
        states[rank] = state
        current = rank
        while True:
            after = self._restate(current, now)
            parent = parents[current]
            if after == before or parent is None:
                return
            parent_before = self._holds(parent)
            lost_kids[parent] += after[0] - before[0]
            short_kids[parent] += after[1] - before[1]
            current, before = parent, parent_before

    def set_online(self, ranks: list[int], now: float) -> None:
        """Each of `ranks` is now online, restated in one pass rather than one walk up each.

        Their ancestors are restated from the deepest level up, each once however many of its
        children moved, and only while what a subtree holds changes, as `set` does. The same
        as `set` one by one, `since` included, because every move is toward online: what a
        subtree holds (a lost rank, a rank not online) only clears, so no status can change
        and change back within the batch, which `set` would have stamped and this would not.
        """
        states, lost_kids, short_kids = self.states, self.lost_kids, self.short_kids
        parents = self.parents
        before: dict[int, tuple[bool, bool]] = {}  # what each subtree held before the batch
        levels: dict[int, set[int]] = {}  # the ranks to restate, by depth
        left: dict[RankState, int] = {}  # how many left each state: counted once, below
        depths: dict[int | None, int] = {}  # of the parents met (a report's ranks share some)
        for rank in ranks:
            was = states[rank]
            if was is _ONLINE:
                continue
            if rank not in before:  # what _holds says, `was` not online
                before[rank] = (was is _LOST or lost_kids[rank] > 0, True)
            left[was] = left.get(was, 0) + 1
            states[rank] = _ONLINE
            parent = parents[rank]
            depth = depths.get(parent)
            if depth is None:
                depth, up = 0, parent
                while up is not None:
                    depth, up = depth + 1, parents[up]
                depths[parent] = depth
            levels.setdefault(depth, set()).add(rank)
        if left:  # a Counter's items cost more than a dict's: one update per state moved
            counts = self.counts
            for was, count in left.items():
                counts[was] -= count
            counts[_ONLINE] += sum(left.values())
            self.offline -= left.get(_OFFLINE, 0)
        depth = max(levels, default=-1)
        while depth >= 0:
            for rank in levels.get(depth, ()):
                after = self._restate(rank, now)
                parent, was_held = parents[rank], before[rank]
                if parent is None or after == was_held:
                    continue
                if parent not in before:
                    before[parent] = self._holds(parent)
                lost_kids[parent] += after[0] - was_held[0]
                short_kids[parent] += after[1] - was_held[1]
                levels.setdefault(depth - 1, set()).add(parent)
            depth -= 1
