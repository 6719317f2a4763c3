"""The authoritative rank table kept at rank 0: every rule in one transition table.

States. Each rank is in one `Phase` (rankstates.py); `tbon status` shows `PUBLIC[phase]`, one of
the six states of docs/design.md. A phase says what the public state does not: who may hold the
rank.
An *open* rank goes to whichever broker bootstrap (PMI) or FLUB gives it; a *config* rank
(`CONFIG_*`) belongs to its host in the config file, which alone restarts its broker. At the
start, every launched rank is offline: LAUNCHED, or CONFIG_BOOTING when the instance was booted
from a config file (`fixed`). Spare ranks beyond them are VACANT, at incarnation 0.

Events. Every event names a rank and, except Reserve and Reboot, the incarnation it speaks
about; an event about any other incarnation than the rank's current one is refused. The rest is
decided by `TRANSITIONS`, keyed by (phase, event type). A pair the table does not list is
refused with a reason that says the rank's state. A row lists guards, named functions any of
which may refuse with a reason; then its effects, which write the event's data into the entry;
then the rank enters the row's target phase, which restarts its `since` and sets its `reason`,
as the row's `why` words it. A row without a target leaves the phase, `since` and `reason` as
they were: a repeat, or the torpid flag.

- Online (its parent welcomed the broker): an offline or reserved rank comes online once its
  parent is connected (rank 0 has no parent). A hello from the broker already online is a
  repeat; from any other broker it is refused. A parent welcomes no second broker as one
  incarnation (hello.py); should one be reported all the same, rank 0 voids it (Void).
- Lost (its broker failed) and Departed (a goodbye) end a connected or offline rank. An open
  rank becomes lost or vacant. A config rank goes offline (CONFIG_DOWN), since its host will
  run a broker again; one that was never online in this incarnation stays CONFIG_BOOTING. A
  retiring broker that says goodbye is RETIRED, which no host or key gets back; one that fails
  is lost (CONFIG_LOST for a config rank: no Reboot, but FLUB may refill it). Either way its
  key is barred for good. Rank 0 never ends.
- Special case: the ranks below one that ended. A connected broker whose link went to the rank
  that ended does not exit: it seeks a live ancestor (docs/protocol.md §12). It stays connected in
  the table, *adrift* (`attached_to` None), until an Online from a foster parent or its own
  parent attaches it again, or until the table's reattach grace runs out: then rank 0 itself
  declares it Lost ("did not reattach in time"), and its own attachees go adrift in turn, until
  the same deadline (their brokers search no longer than their parent did: `seeking`). A
  rank that never came online and whose parent is not connected either can never be welcomed
  now (its broker waits for a hello answer that will not come): it gets the internal event
  Orphaned, through the same table: an open rank becomes lost, a config rank stays offline.
- Link events name the broker that saw them (`parent`): a Lost, Departed or Torpid is believed
  only from the broker the rank is attached to now, so a late report from a link the rank left
  (its old parent, woken from a stop) changes nothing. An Online attaches the rank to the
  broker that welcomed it; the same broker saying hello to a foster parent or back home is a
  repeat that moves it. A lost rank whose same broker (same pid) says hello again, its
  incarnation never replaced, is online again: a healed partition (not one lost while
  retiring: its key is barred).
- Special case: one broker, several links. A broker seeking a parent may be welcomed by two
  ancestors before it keeps one, and one going home is welcomed at home before it leaves its
  foster parent: each welcoming parent reports an Online, and each reports the end of its link
  later (Moved, or Lost if the child's word did not reach it). The table keeps the parents other
  than `attached_to` whose link has not ended (`other_links`). A Lost or Moved from one of
  several links is the internal event LinkEnded: that link ends, and the rank stays connected,
  attached to another of its links if it was attached by that one. A rank is lost only when the
  last parent that holds its broker says so, so a stale `connection dropped` from a parent the
  broker left never hands its rank out while it runs on elsewhere (issue 20). A link that ended
  (a Moved or a drop) is kept in `past_links` while the rank is connected: its broker may have
  died before its children read its new link's lineage (the message dies with it, or waits
  unread behind the news that their connection dropped), and its foster parents are chosen on
  that chain too (`links_above`, healing.py rule 3). A rank that ends
  leaves every link below it that it held: those attached to it by their only link go adrift.
- Special case: a child's word on its parent (Dropped). A broker whose connection to its parent
  dropped and that was welcomed by another ancestor says so, once there: rank `rank`'s link to
  `gone` is over. Its new parent's Online went up the same path first and kept the old link in
  `other_links`; a Dropped about any link the table does not keep so is stale and refused. The
  link ends. And if `gone` is adrift, the child's word is believed about it: `gone` is Lost
  ("connection dropped, seen by rank R below it") at once, rather than at the end of its
  reattach grace (issue 20, item 4: a rank killed together with its parent showed online with a
  dead pid for minutes). Why that is safe. An adrift rank has no live link above it, so the
  ranks below it are the only brokers that can see it go, and nothing they say can contradict a
  live link. Only a dropped connection counts: it is made by the other end's close or death, not
  by the child's own stop or a partition (the child does not report a parent it found silent or
  that refused it: that parent may be alive and seeking, its own child's hello refused or
  stopped). Should a live `gone` be declared lost all the same, its own broker's next hello
  brings it back online (a lost rank's same broker returns, below), unless its rank was given
  to a new broker meanwhile, which is then the one holder. A `gone` attached to a live broker
  is left to that broker's word.
- Torpid sets or clears a flag on a connected rank: it is not a state, and `since` stays.
- Located: a launched rank starts with its host UNKNOWN_HOST (rank 0 learns a host from the
  rank's Online, not from PMI at the start); bootstrap's word on where the broker was started
  fills it in for a rank that never came online, launched or lost, while its host is unknown.
- Retire: an online rank other than rank 0, whose children are none of them online, reserved or
  retiring, starts retiring. Asking again, while it retires or once it has retired, is a repeat.
- Expire: a reserved rank whose lease has run out becomes vacant and shows its old host again.
- Release: its joiner failed before its hello and gives the reservation back, naming the key
  it was made for: the rank becomes vacant at once, as on Expire. The incarnation stays raised.
- Void: rank 0 refused an Online and so has the rank's parent cut that incarnation off, which
  the parent does not report. If the table still shows the incarnation connected (the Online was
  another broker's), Void ends it as Lost would: status never shows online a broker that its
  parent has cut off. Any other rank has nothing left to void (an expired or released
  reservation, an incarnation already ended), and Void is refused.
- Reboot: a config rank's broker was restarted and is at its parent's door. If the rank was
  online in this incarnation (CONFIG_DOWN), it takes a new one; if not, the current one serves.
- Reserve (a joiner asks FLUB). The key is checked first, across the table: a barred key never
  gets a rank; a key whose broker is connected holds its rank and asks for no other; a key
  that holds a reservation gets that one again (a repeat) if it asks for it or for any rank.
  Then the rank: the one asked for, or else the lowest whose row allows Reserve and whose guard
  passes. Lost, vacant and retired ranks may be reserved unless their parent is retiring; the
  rank takes a new incarnation and becomes open, whoever held it before. Rank 0, lost only by a
  takeover, is reserved like any lost rank: its parent is then the member that took over
  (`parent_of`), whose foster child the new broker is; the root's own rank is never reserved.
- Special case: the root after a takeover (docs/protocol.md §13.4, §13.6). `root` is the rank
  whose broker holds the table: rank 0, until a Lost of the root names another member of the
  root group as its `parent` (the one that took over; `taken_over`). Only the root cannot be
  lost but so (`root_stays`); a refilled rank 0 is a member like the others, attached to the
  root, lost by its parent's word as any rank is. When a root that took over dies in turn, the
  ranks attached to it sit anywhere in the tree, so the walk of `cut_below` covers the whole.

Reasons. `tbon status` tells why a rank is not online: each row that moves a rank words why
(its `why`). A Lost carries its parent's words ("connection dropped", "silent for 5.0s"); a Void
says "voided: " and rank 0's; an orphan names the rank above it that went; a goodbye is "said
goodbye (exit status 0)", since a broker says goodbye only as it exits 0 (at a shutdown, or
retired: then "retired"); a lapsed reservation "lease expired", a released one "released". A row
into a connected or reserved phase has nothing to explain, and clears the reason; a rank that
nothing has happened to yet has none. The last welcomed broker's pid stays as `last_pid` once it
has gone, and its host as `host`.

Subtree statuses are kept by a `Rollup` that each move updates, so that status can say how
long each rank's subtree has been as it is (`tbon status -v`).

Only Reserve and Reboot raise an incarnation. `apply` never performs I/O: the broker acts on the
Outcome, whose `changed` names every rank whose entry changed; `generation` counts the events
that changed something. Presentation (status, who holds a rank) lives in snapshot.py.

This module is longer than the house's ~400 lines on purpose: the rules above, the table, and
the guards and effects its rows name are meant to be read side by side. The events
(rankevents.py), the states (rankstates.py) and the presentation (snapshot.py) live apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tbon.overlay.state.rankentries import CompactEntries, Entries
from tbon.overlay.state.rankevents import (
    UNKNOWN_HOST,
    Departed,
    Dropped,
    Event,
    Expire,
    Located,
    Lost,
    Moved,
    Online,
    Outcome,
    Reboot,
    Release,
    Reservation,
    Reserve,
    Retire,
    Torpid,
    Void,
)
from tbon.overlay.state.rankstates import (
    ALLOCATABLE,
    CONFIG_PHASES,
    CONNECTED,
    PUBLIC,
    Lease,
    Phase,
    RankEntry,
    RankState,
    Rollup,
    SubtreeStatus,
)
from tbon.overlay.state.snapshot import describe
from tbon.overlay.state.topology import Topology
from tbon.record import Record

__all__ = [
    "ALLOCATABLE",
    "CONNECTED",
    "REFUSALS",
    "TRANSITIONS",
    "UNKNOWN_HOST",
    "Departed",
    "Dropped",
    "Event",
    "Expire",
    "Lease",
    "Located",
    "Lost",
    "Moved",
    "Online",
    "Outcome",
    "Phase",
    "RankEntry",
    "RankState",
    "RankTable",
    "Reboot",
    "Release",
    "Reservation",
    "Reserve",
    "Retire",
    "Rule",
    "SubtreeStatus",
    "Torpid",
    "Void",
]


class Orphaned(Record):
    """Internal: the broker above this rank ended, so this rank's broker exits too. `cause`
    names that rank and how it went, as the orphan's reason."""

    __slots__ = __match_args__ = ("rank", "incarnation", "cause")

    def __init__(self, rank: int, incarnation: int, cause: str) -> None:
        self.rank, self.incarnation, self.cause = rank, incarnation, cause


class LinkEnded(Record):
    """Internal: `parent`'s link to the rank's broker ended (its Lost or Moved), while the
    broker has another link: the rank stays connected."""

    __slots__ = __match_args__ = ("rank", "incarnation", "parent")

    def __init__(self, rank: int, incarnation: int, parent: int) -> None:
        self.rank, self.incarnation, self.parent = rank, incarnation, parent


def refused(reason: str) -> Outcome:
    return Outcome(False, (), reason)


def _no(reason: str, never: bool = False) -> Outcome:
    """A Reserve refused: nothing changes, and the joiner is told why (never: for good)."""
    return Outcome(False, (), reason, reservation=Reservation(False, reason=reason, never=never))


# --- guards: what must hold for a row to apply (None: it holds; else why not) -------------------

Stimulus = Event | Reserve | Orphaned | LinkEnded
Guard = Callable[["RankTable", RankEntry, Any, float], "str | None"]
Effect = Callable[["RankTable", RankEntry, Any, float], "tuple[int, ...]"]
Why = Callable[[Any], str]

REASON_LENGTH = 64
"""Reasons are cut to this many characters (the longest the table words today is under 60): a
whole table of them must fit in one status message (docs/design.md §14), and a Lost's reason
comes from a child broker."""


def parent_connected(table: RankTable, entry: RankEntry, event: Online, now: float) -> str | None:
    """A broker is welcomed by a parent that is there, one of its ancestors; rank 0 has none."""
    parent = reporter(table, entry, event)
    if parent is None:
        return None
    if not holds(table, parent, entry.rank):
        return f"rank {parent} is not an ancestor of rank {entry.rank}"
    if PUBLIC[table.entries.peek(parent).phase] in CONNECTED:
        return None
    return f"rank {entry.rank}'s parent is not online"


def holds(table: RankTable, parent: int, rank: int) -> bool:
    """Whether `parent` may hold `rank`'s broker: one of its ancestors, or the root that took
    over (docs/protocol.md §13.4), which holds whatever the dead root's death cut off."""
    return table.topology.is_ancestor(parent, rank) or (parent == table.root != 0)


def same_broker(table: RankTable, entry: RankEntry, event: Online, now: float) -> str | None:
    """A hello repeated by the broker already online is harmless; another broker's is not."""
    if event.pid == entry.pid and (not event.host or event.host == entry.host):
        return None
    return f"rank {entry.rank} is {entry.state}, it cannot come online"


def returning(table: RankTable, entry: RankEntry, event: Online, now: float) -> str | None:
    """A lost rank comes back only as the broker that was lost (a partition healed), unless it
    was lost while retiring: its key is barred for good (its parent does not let it back
    either: sessions.py)."""
    if entry.key is not None and entry.key in table.retired_keys:
        return f"rank {entry.rank} was lost while retiring: a retired broker does not come back"
    if event.pid == entry.last_pid and event.host == entry.host:
        return None
    return f"rank {entry.rank} is lost: only its last broker (pid {entry.last_pid}) may return"


def reporter(table: RankTable, entry: RankEntry, event: Any) -> int | None:
    """The broker an event about `entry` comes from: the one it names, else the topology parent."""
    parent = getattr(event, "parent", None)
    return table.topology.parent(entry.rank) if parent is None else parent


def on_its_link(table: RankTable, entry: RankEntry, event: Stimulus, now: float) -> str | None:
    """A link event is believed only from the broker the rank is attached to now; rank 0's own
    word (no `parent`) always is."""
    parent = getattr(event, "parent", None)
    if parent is None or parent == entry.attached_to or taken_over(table, entry, event):
        return None
    if entry.attached_to is None:
        return f"rank {entry.rank} is reattaching: rank {parent}'s word on it is stale"
    return f"rank {entry.rank} is attached to rank {entry.attached_to}, not to rank {parent}"


def root_stays(table: RankTable, entry: RankEntry, event: Stimulus, now: float) -> str | None:
    """The root keeps the table: it cannot be lost or leave it, but by a takeover."""
    if entry.rank != table.root or taken_over(table, entry, event):
        return None
    if entry.rank == 0:
        return "rank 0 cannot leave its own table"
    return f"rank {entry.rank} is the root: it cannot leave its own table"


def taken_over(table: RankTable, entry: RankEntry, event: Stimulus) -> bool:
    """The dead root's rank marked lost by the member that took over (docs/protocol.md §13.4):
    a Lost of the root's rank naming another member of the root group, connected, as its
    `parent`. With no root group (`members` empty, tbon.standbys=0) there is none, and rank 0
    stays as before."""
    successor = successor_named(table.root, table.members, event)
    return (
        entry.rank == table.root
        and successor is not None
        and table.entries.peek(successor).state in CONNECTED  # not a former root, dead
    )


def successor_named(root: int, members: tuple[int, ...], event: Stimulus) -> int | None:
    """The member a Lost of `root` names as its `parent`, the one taking over; None for any
    other event."""
    parent = getattr(event, "parent", None)
    if isinstance(event, Lost) and event.rank == root != parent and parent in members:
        return int(parent)
    return None


def root_once_applied(table: RankTable, pending: Iterable[Event | Reserve]) -> int:
    """The table's root once `pending` (events not yet applied, in order) are: each takeover
    among them (a Lost of the root naming another member, `taken_over`) names the next. A
    member elected root reckons the root it replaces by this, since the entries of an earlier
    term its log holds are committed and applied before anything it proposes (§13.4)."""
    root = table.root
    for event in pending:
        successor = successor_named(root, table.members, event)
        if successor is not None:
            root = successor
    return root


def root_not_retired(table: RankTable, entry: RankEntry, event: Retire, now: float) -> str | None:
    if entry.rank == 0:
        return "rank 0 cannot retire: shut the instance down instead"
    if entry.rank == table.root:
        return f"rank {entry.rank} is the root: it cannot retire (shut the instance down instead)"
    return None


def children_idle(table: RankTable, entry: RankEntry, event: Retire, now: float) -> str | None:
    """A rank is drained from the leaves up: no child may still be online, coming or going."""
    busy = [
        rank
        for rank in table.topology.children(entry.rank)
        if table.entries.peek(rank).state
        in (RankState.ONLINE, RankState.RESERVED, RankState.RETIRING)
    ]
    if not busy:
        return None
    return (
        f"rank {entry.rank} has children that are online, reserved or retiring "
        f"({', '.join(map(str, busy))}): retire them first"
    )


def lease_over(table: RankTable, entry: RankEntry, event: Expire, now: float) -> str | None:
    if entry.lease is None or now >= entry.lease.until:
        return None
    return f"rank {entry.rank}'s reservation has {entry.lease.until - now:.1f}s left"


def same_joiner(table: RankTable, entry: RankEntry, event: Release, now: float) -> str | None:
    """Only the key a reservation was made for may give it back."""
    if entry.joiner == event.public_key:
        return None
    return f"rank {entry.rank} is reserved for another key"


def parent_not_retiring(
    table: RankTable, entry: RankEntry, event: Reserve, now: float
) -> str | None:
    """A retiring broker takes no new children: the ranks below it are not handed out."""
    parent = table.topology.parent(entry.rank)
    if parent is not None and table.entries.peek(parent).state is RankState.RETIRING:
        return f"rank {entry.rank}'s parent is retiring"
    return None


def not_the_root(table: RankTable, entry: RankEntry, event: Reserve, now: float) -> str | None:
    """The root's rank is its own broker's. Rank 0 is reserved once it is lost, which only a
    takeover makes it (protocol §13.6): its joiner hangs under the root that took over."""
    if entry.rank != table.root:
        return None
    return f"rank {entry.rank} is the root"


RESERVABLE = (parent_not_retiring, not_the_root)
"""The guards of every Reserve: the rows differ only in the phase a rank is taken from."""


def never_located(table: RankTable, entry: RankEntry, event: Located, now: float) -> str | None:
    """Bootstrap's word on a host counts only while the rank has none: an Online, or a joiner's
    Reserve, brought the host of the broker that holds the rank now."""
    if entry.host == UNKNOWN_HOST:
        return None
    return f"rank {entry.rank}'s host is known: {entry.host}"


def held_that_link(table: RankTable, entry: RankEntry, event: Dropped, now: float) -> str | None:
    """A Dropped speaks of a link the table keeps beside the one the rank is attached by: its
    new parent's Online, sent up the same path before it, moved the old link there."""
    if event.gone in entry.other_links:
        return None
    return f"rank {entry.rank} holds no other link to rank {event.gone}: its word on it is stale"


# --- effects: what an event writes besides the phase (each returns the ranks it changed) --------


def seat(table: RankTable, entry: RankEntry, event: Online, now: float) -> tuple[int, ...]:
    """Record the welcomed broker, and the link it is attached by."""
    entry.host, entry.pid, entry.torpid = event.host, event.pid, False
    entry.last_pid = event.pid
    if event.key:
        entry.key = event.key
    attach(table, entry, event, now)
    return ()


def attach(table: RankTable, entry: RankEntry, event: Online, now: float) -> tuple[int, ...]:
    """The rank's link goes to the broker that welcomed it: home, or a foster parent."""
    parent = reporter(table, entry, event)
    if entry.attached_to == parent and entry.adrift_until is None:
        return ()
    others = [p for p in entry.other_links if p != parent]
    if entry.attached_to is not None and entry.attached_to != parent:
        others.append(entry.attached_to)  # its end of that link is still to be reported
    table.untime(entry)  # its reattach grace, if any, goes: it may have been the soonest kept
    entry.attached_to, entry.adrift_until, entry.other_links = parent, None, tuple(others)
    return (entry.rank,)


def end_link(table: RankTable, entry: RankEntry, event: LinkEnded, now: float) -> tuple[int, ...]:
    """One of the broker's links ended: it stays attached by another."""
    others = [p for p in entry.other_links if p != event.parent]
    if entry.attached_to == event.parent:
        entry.attached_to = others.pop() if others else None
    entry.other_links = tuple(others)
    if event.parent not in entry.past_links:
        entry.past_links += (event.parent,)
    return (entry.rank,)


def dropped(table: RankTable, entry: RankEntry, event: Dropped, now: float) -> tuple[int, ...]:
    """The rank's link to `gone` is over. If `gone` is adrift, no broker holds a link to it but
    the ones below it: this child saw its connection drop, so it is lost (Lost, as rank 0's own
    word: its attachees go adrift in turn)."""
    entry.other_links = tuple(p for p in entry.other_links if p != event.gone)
    changed = [entry.rank]
    gone = table.entries[event.gone]
    if gone.state in CONNECTED and gone.adrift_until is not None:
        why = f"{event.reason}, seen by rank {entry.rank} below it"
        lost = Lost(gone.rank, gone.incarnation, why)
        rule = table._rule(gone, lost, now)
        if isinstance(rule, Rule):
            changed += table._fire(gone, rule, lost, now)
    return tuple(changed)


def move(table: RankTable, entry: RankEntry, event: Moved, now: float) -> tuple[int, ...]:
    """The broker left the link to `parent` for one to `to`, an ancestor that is there."""
    to = event.to
    if not 0 <= to < table.size or not holds(table, to, entry.rank):
        return ()
    if table.entries.peek(to).state not in CONNECTED or entry.attached_to == to:
        return ()
    left = entry.attached_to
    table.untime(entry)
    entry.attached_to, entry.adrift_until = to, None
    entry.other_links = tuple(p for p in entry.other_links if p != to)
    if left is not None and left != to and left not in entry.past_links:
        entry.past_links += (left,)  # its children may not have read the new lineage yet
    return (entry.rank,)


def locate(table: RankTable, entry: RankEntry, event: Located, now: float) -> tuple[int, ...]:
    if entry.host == event.host:  # still unknown: a repeat
        return ()
    entry.host = event.host
    return (entry.rank,)


def flag(table: RankTable, entry: RankEntry, event: Torpid, now: float) -> tuple[int, ...]:
    if entry.torpid == event.torpid:
        return ()
    entry.torpid = event.torpid
    return (entry.rank,)


def lease(table: RankTable, entry: RankEntry, event: Reserve, now: float) -> tuple[int, ...]:
    """A new incarnation for the joiner's key, shown on its host until the lease lapses."""
    entry.incarnation += 1
    entry.lease = Lease(now + event.lease, entry.host)
    table.time(entry.rank)
    entry.host, entry.key = event.host, event.public_key
    return ()


def unlease(
    table: RankTable, entry: RankEntry, event: Expire | Release, now: float
) -> tuple[int, ...]:
    if entry.lease is not None:
        entry.host = entry.lease.host_before
    return ()


def renew(table: RankTable, entry: RankEntry, event: Reboot, now: float) -> tuple[int, ...]:
    """A restarted config broker is a new incarnation, so no report about the old one counts."""
    entry.incarnation += 1
    return ()


def bar_key(table: RankTable, entry: RankEntry, event: Stimulus, now: float) -> tuple[int, ...]:
    """A retired broker does not come back: its key may never be given a rank again."""
    if entry.key is not None:
        table.retired_keys[entry.key] = entry.rank
    return ()


def cut_below(table: RankTable, entry: RankEntry, event: Stimulus, now: float) -> tuple[int, ...]:
    """The ranks below one that ended: those attached to it go adrift, to seek a live ancestor;
    those that never came online under a parent that is gone get Orphaned (a rank the table has
    no row for stays as it is). Those attached to a rank that was itself adrift searched no
    longer than it did (`seeking`, docs/protocol.md section 5.6): they keep its deadline rather
    than start a new grace, so a dead subtree reads lost one grace after its root, not one grace
    per level."""
    grace_ends = now + table.reattach_grace
    top = entry.rank
    if taken_over(table, entry, event):
        assert isinstance(event, Lost) and event.parent is not None
        table.root = event.parent  # the member that took over
        if entry.rank not in table.former_roots:
            table.former_roots += (entry.rank,)
        top = 0  # what the dead root held may sit anywhere: its foster children too
    if entry.adrift_until is not None:
        grace_ends = min(grace_ends, entry.adrift_until)
    if isinstance(event, Lost):
        how = "was lost"
    elif isinstance(event, Void):
        how = "was voided"
    else:
        how = "retired" if entry.state is RankState.RETIRING else "left"
    cause = f"rank {entry.rank} above it {how}"
    changed: list[int] = []
    # (rank, whether its parent is connected): the walk covers the whole subtree, since a
    # foster child attached to the rank that ended may sit anywhere below it
    stack = [(child, False) for child in table.topology.children(top)]
    if top != entry.rank:
        stack.append((top, False))
    while stack:
        rank, parent_there = stack.pop()
        if rank == entry.rank:  # the dead root, met in the walk of the whole: its subtree
            stack.extend((child, False) for child in table.topology.children(rank))
            continue
        below = table.entries.peek(rank)  # a spare is neither connected nor orphaned
        connected = below.state in CONNECTED
        if connected and entry.rank in below.other_links:
            below.other_links = tuple(p for p in below.other_links if p != entry.rank)
        if connected and below.attached_to == entry.rank and below.other_links:
            below.attached_to, below.other_links = below.other_links[-1], below.other_links[:-1]
            changed.append(rank)
        elif connected and below.attached_to == entry.rank and rank == table.root:
            below.attached_to = None  # the root now: attached to nothing, seeking nothing
            changed.append(rank)
        elif connected and below.attached_to == entry.rank:
            below.attached_to, below.adrift_until = None, grace_ends
            table.time(rank)
            changed.append(rank)
        elif not connected and not parent_there:
            rule = TRANSITIONS.get((below.phase, Orphaned))
            if rule is not None:
                below = table.entries[rank]
                changed += table._fire(below, rule, Orphaned(rank, below.incarnation, cause), now)
        stack.extend((child, connected) for child in table.topology.children(rank))
    return tuple(changed)


def one_of_several(entry: RankEntry, event: Event) -> Event | LinkEnded:
    """A Lost or Moved from one of a connected broker's several links ends that link only
    (LinkEnded); a Moved from the link it is attached by moves it, as any Moved does."""
    if not entry.other_links:  # one link, as a rank that wires up has: asked first
        return event
    parent = getattr(event, "parent", None)
    if not isinstance(event, Lost | Moved) or parent is None:
        return event
    if parent in entry.other_links or (isinstance(event, Lost) and parent == entry.attached_to):
        return LinkEnded(entry.rank, entry.incarnation, parent)
    return event


# --- reasons: why a row's rank is in its new phase, as status shows it --------------------------


def told(event: Lost) -> str:
    """The parent's own words: "connection dropped", "silent for 5.0s"."""
    return event.reason


def voided(event: Void) -> str:
    return f"voided: {event.reason}"


def cut_off(event: Orphaned) -> str:
    return event.cause


GOODBYE = "said goodbye (exit status 0)"  # only a broker that exits 0 says goodbye
RETIRED = "retired"


# --- the table ----------------------------------------------------------------------------------


class Rule(Record):
    """One row: where the rank goes (None: it stays), what must hold, what else happens, and
    why the rank is there (a reason, or a function of the event that words it)."""

    __slots__ = __match_args__ = ("target", "guards", "effects", "note", "why")

    def __init__(
        self,
        target: Phase | None,
        guards: tuple[Guard, ...] = (),
        effects: tuple[Effect, ...] = (),
        note: str = "",  # said on an applied repeat; {rank} is filled in
        why: str | Why = "",
    ) -> None:
        self.target, self.guards, self.effects = target, guards, effects
        self.note, self.why = note, why


def _ends(target: Phase, why: str | Why, *, retired: bool = False) -> Rule:
    """Lost, Departed or Void: the rank goes to `target`, the ranks attached to it go adrift."""
    effects = (bar_key, cut_below) if retired else (cut_below,)
    return Rule(target, (root_stays, on_its_link), effects, why=why)


TRANSITIONS: dict[tuple[Phase, type[Stimulus]], Rule] = {
    # Online: a parent welcomed the broker
    (Phase.LAUNCHED, Online): Rule(Phase.ONLINE, (parent_connected,), (seat,)),
    (Phase.RESERVED, Online): Rule(Phase.ONLINE, (parent_connected,), (seat,)),
    (Phase.CONFIG_BOOTING, Online): Rule(Phase.CONFIG_ONLINE, (parent_connected,), (seat,)),
    (Phase.CONFIG_DOWN, Online): Rule(Phase.CONFIG_ONLINE, (parent_connected,), (seat,)),
    (Phase.ONLINE, Online): Rule(None, (same_broker, parent_connected), (attach,)),
    (Phase.RETIRING, Online): Rule(None, (same_broker, parent_connected), (attach,)),
    (Phase.CONFIG_ONLINE, Online): Rule(None, (same_broker, parent_connected), (attach,)),
    (Phase.CONFIG_RETIRING, Online): Rule(None, (same_broker, parent_connected), (attach,)),
    (Phase.LOST, Online): Rule(Phase.ONLINE, (returning, parent_connected), (seat,)),
    # Lost: the broker failed
    (Phase.LAUNCHED, Lost): _ends(Phase.LOST, told),
    (Phase.ONLINE, Lost): _ends(Phase.LOST, told),
    (Phase.RETIRING, Lost): _ends(Phase.LOST, told, retired=True),
    (Phase.CONFIG_BOOTING, Lost): _ends(Phase.CONFIG_BOOTING, told),
    (Phase.CONFIG_DOWN, Lost): _ends(Phase.CONFIG_DOWN, told),
    (Phase.CONFIG_ONLINE, Lost): _ends(Phase.CONFIG_DOWN, told),
    (Phase.CONFIG_RETIRING, Lost): _ends(Phase.CONFIG_LOST, told, retired=True),
    # Departed: the broker said goodbye
    (Phase.LAUNCHED, Departed): _ends(Phase.VACANT, GOODBYE),
    (Phase.ONLINE, Departed): _ends(Phase.VACANT, GOODBYE),
    (Phase.RETIRING, Departed): _ends(Phase.RETIRED, RETIRED, retired=True),
    (Phase.CONFIG_BOOTING, Departed): _ends(Phase.CONFIG_BOOTING, GOODBYE),
    (Phase.CONFIG_DOWN, Departed): _ends(Phase.CONFIG_DOWN, GOODBYE),
    (Phase.CONFIG_ONLINE, Departed): _ends(Phase.CONFIG_DOWN, GOODBYE),
    (Phase.CONFIG_RETIRING, Departed): _ends(Phase.RETIRED, RETIRED, retired=True),
    # Orphaned (internal): the broker above ended, so this one exits
    (Phase.LAUNCHED, Orphaned): Rule(Phase.LOST, why=cut_off),
    (Phase.CONFIG_BOOTING, Orphaned): Rule(Phase.CONFIG_BOOTING, why=cut_off),
    (Phase.CONFIG_DOWN, Orphaned): Rule(Phase.CONFIG_DOWN, why=cut_off),
    # LinkEnded (internal): one of the broker's several links ended; it keeps another
    (Phase.ONLINE, LinkEnded): Rule(None, (), (end_link,)),
    (Phase.RETIRING, LinkEnded): Rule(None, (), (end_link,)),
    (Phase.CONFIG_ONLINE, LinkEnded): Rule(None, (), (end_link,)),
    (Phase.CONFIG_RETIRING, LinkEnded): Rule(None, (), (end_link,)),
    # Torpid: a flag on a connected rank
    (Phase.ONLINE, Torpid): Rule(None, (on_its_link,), (flag,)),
    (Phase.RETIRING, Torpid): Rule(None, (on_its_link,), (flag,)),
    (Phase.CONFIG_ONLINE, Torpid): Rule(None, (on_its_link,), (flag,)),
    (Phase.CONFIG_RETIRING, Torpid): Rule(None, (on_its_link,), (flag,)),
    # Moved: the broker's link to this parent is over; it went to another
    (Phase.ONLINE, Moved): Rule(None, (on_its_link,), (move,)),
    (Phase.RETIRING, Moved): Rule(None, (on_its_link,), (move,)),
    (Phase.CONFIG_ONLINE, Moved): Rule(None, (on_its_link,), (move,)),
    (Phase.CONFIG_RETIRING, Moved): Rule(None, (on_its_link,), (move,)),
    # Dropped: the rank's broker saw its old parent's connection drop (the rank's own word)
    (Phase.ONLINE, Dropped): Rule(None, (held_that_link,), (dropped,)),
    (Phase.RETIRING, Dropped): Rule(None, (held_that_link,), (dropped,)),
    (Phase.CONFIG_ONLINE, Dropped): Rule(None, (held_that_link,), (dropped,)),
    (Phase.CONFIG_RETIRING, Dropped): Rule(None, (held_that_link,), (dropped,)),
    # Retire: `tbon retire`
    (Phase.ONLINE, Retire): Rule(Phase.RETIRING, (root_not_retired, children_idle)),
    (Phase.CONFIG_ONLINE, Retire): Rule(Phase.CONFIG_RETIRING, (root_not_retired, children_idle)),
    (Phase.RETIRING, Retire): Rule(None, note="rank {rank} is already retiring"),
    (Phase.CONFIG_RETIRING, Retire): Rule(None, note="rank {rank} is already retiring"),
    (Phase.RETIRED, Retire): Rule(None, note="rank {rank} is already retired"),
    # Expire: the lease ran out before the joiner's hello
    (Phase.RESERVED, Expire): Rule(
        Phase.VACANT, (lease_over,), (unlease,), why="lease expired before its joiner's hello"
    ),
    # Release: the joiner failed before its hello and gives the rank back
    (Phase.RESERVED, Release): Rule(
        Phase.VACANT, (same_joiner,), (unlease,), why="released: its joiner failed before hello"
    ),
    # Void: rank 0 had a connected incarnation cut off at its parent, which reports nothing
    (Phase.ONLINE, Void): _ends(Phase.LOST, voided),
    (Phase.RETIRING, Void): _ends(Phase.LOST, voided, retired=True),
    (Phase.CONFIG_ONLINE, Void): _ends(Phase.CONFIG_DOWN, voided),
    (Phase.CONFIG_RETIRING, Void): _ends(Phase.CONFIG_LOST, voided, retired=True),
    # Reboot: a config rank's broker was restarted on its host
    (Phase.CONFIG_BOOTING, Reboot): Rule(None),
    (Phase.CONFIG_DOWN, Reboot): Rule(
        Phase.CONFIG_BOOTING, effects=(renew,), why="its host restarted its broker"
    ),
    # Located: bootstrap says where a broker that never came online was started
    (Phase.LAUNCHED, Located): Rule(None, (never_located,), (locate,)),
    (Phase.LOST, Located): Rule(None, (never_located,), (locate,)),
    # Reserve: FLUB gives the rank to a joiner's key
    (Phase.VACANT, Reserve): Rule(Phase.RESERVED, RESERVABLE, (lease,)),
    (Phase.LOST, Reserve): Rule(Phase.RESERVED, RESERVABLE, (lease,)),
    (Phase.RETIRED, Reserve): Rule(Phase.RESERVED, RESERVABLE, (lease,)),
    (Phase.CONFIG_LOST, Reserve): Rule(Phase.RESERVED, RESERVABLE, (lease,)),
}
"""Every transition: (phase, event type) -> Rule. A pair not listed is refused (`REFUSALS`)."""


def _reboot_refusal(entry: RankEntry) -> str:
    if entry.phase is Phase.RETIRED:
        return f"rank {entry.rank} was retired: a retired broker does not come back"
    if entry.phase not in CONFIG_PHASES:
        return f"rank {entry.rank} is not held by config bootstrap"
    return f"rank {entry.rank} is {entry.state}"


RESERVABLE_PHASES = frozenset(phase for phase, kind in TRANSITIONS if kind is Reserve)
"""The phases a Reserve row takes a rank from (vacant, lost, retired, config lost)."""


def _by_rank(entry: RankEntry) -> int:
    return entry.rank


def _deadline(entry: RankEntry) -> float | None:
    """A rank's lease end or reattach grace end (it has one or the other, never both)."""
    return entry.lease.until if entry.lease is not None else entry.adrift_until


REFUSALS: dict[type[Event | Reserve], Callable[[RankEntry], str]] = {
    Online: lambda e: f"rank {e.rank} is {e.state}, it cannot come online",
    Lost: lambda e: f"rank {e.rank} is already {e.state}",
    Departed: lambda e: f"rank {e.rank} is already {e.state}",
    Torpid: lambda e: f"rank {e.rank} is {e.state}",
    Moved: lambda e: f"rank {e.rank} is {e.state}",
    Dropped: lambda e: f"rank {e.rank} is {e.state}",
    Retire: lambda e: (
        "rank 0 cannot retire: shut the instance down instead"
        if e.rank == 0
        else f"rank {e.rank} is {e.state}: nothing to retire"
    ),
    Expire: lambda e: f"rank {e.rank} is {e.state}, not reserved",
    Release: lambda e: f"rank {e.rank} is {e.state}, not reserved",
    Void: lambda e: f"rank {e.rank} is {e.state}: no broker of it is connected",
    Reboot: _reboot_refusal,
    Located: lambda e: f"rank {e.rank} is {e.state}: its host is its broker's",
    Reserve: lambda e: f"rank {e.rank} is taken: {describe(e)}",
}
"""Why the table refuses an event it has no row for, by event type."""


# --- the table of one instance ------------------------------------------------------------------


class RankTable:
    """The state of every rank of one instance."""

    def __init__(
        self,
        topology: Topology,
        hosts: list[str],
        now: float,
        fixed: bool = False,
        reattach_grace: float = 120.0,
        store: type[Entries] = CompactEntries,
    ) -> None:
        """Ranks below len(hosts) were launched by bootstrap (incarnation 1); the rest are spare.
        `fixed` (config bootstrap): those ranks belong to their hosts; when their broker goes
        they are offline, expected back, and never handed to FLUB. A rank adrift longer than
        `reattach_grace` (its broker's silence limit and reattach timeout) is lost. `store` keeps
        the entries (rankentries.py): spares nothing happened to cost nothing by default."""
        self.reattach_grace = reattach_grace
        if not 1 <= len(hosts) <= topology.size:
            raise ValueError("between 1 and size ranks are launched")
        self.topology = topology
        self.generation = 0
        self.members: tuple[int, ...] = ()  # the root group (rank 0 first), with standbys
        self.root = 0  # the rank whose broker holds the table: a member, after a takeover
        self.former_roots: tuple[int, ...] = ()  # the roots that died, each taken over
        self.retired_keys: dict[str, int] = {}  # a barred key -> the rank it retired from
        # the ranks given a lease or an adrift deadline since `deadlined` last looked (the rows
        # that set one add it): what the loop's timers walk, not the whole table, each turn
        self.timed: set[int] = set()
        # deadlines given so far (`time`): one more is a timer the loop must see at once
        # (rankpath.py's Wake); a deadline that goes or comes later needs no wake-up
        self.deadlines = 0
        # `next_expiry`'s answer, known since the last walk of `timed`: a deadline given since
        # is folded in (`time`); one gone since leaves it early, a wake-up whose timers walk again
        self._expiry: float | None = None
        self._expiry_known = False
        launched = Phase.CONFIG_BOOTING if fixed else Phase.LAUNCHED
        first = [RankEntry(rank, launched, 1, host, None, now) for rank, host in enumerate(hosts)]
        self.entries: Entries = store(first, topology.size, now)
        spares = topology.size - len(hosts)
        self._rollup = Rollup(
            topology, [first[0].state] * len(hosts) + [RankState.VACANT] * spares, now
        )
        # ranks moved online at `_onward_at` whose roll-up waits: a run of them is rolled up in
        # one pass (Rollup.set_online) when the roll-up is next read or moved otherwise
        self._onward: list[int] = []
        self._onward_at = now
        # every rank below it is in a phase no Reserve row takes from (`_reserve` moves it past
        # them, `_fire` back to any rank that enters such a phase): a join looks from there, not
        # across the whole table again
        self._free_from = 0

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def rollup(self) -> Rollup:
        """Every rank's subtree status, current: the ranks moved online since it was last read
        are rolled up first, in one pass (a report of many Onlines: one roll-up, not one each)."""
        if self._onward:
            self._rollup.set_online(self._onward, self._onward_at)
            self._onward = []
        return self._rollup

    def parent_of(self, rank: int) -> int | None:
        """The rank a broker of `rank` joins under: its topology parent; for rank 0, once
        another member took over, that root (protocol §13.6); None for the root itself."""
        if rank == self.root:
            return None
        return self.root if rank == 0 else self.topology.parent(rank)

    def entry(self, rank: int) -> RankEntry:
        """`rank`'s entry, to read: only the table's rules change entries."""
        return self.entries.peek(rank)

    def apply(self, event: Event | Reserve, now: float) -> Outcome:
        """Decide one event by the table, and count it in `generation` if it changed anything."""
        outcome = (
            self._reserve(event, now) if isinstance(event, Reserve) else self._event(event, now)
        )
        if outcome.changed:
            self.generation += 1
        return outcome

    def apply_all(self, events: Sequence[Event], now: float) -> list[Outcome]:
        """A report's events in one pass, in order, each decided by its row as `apply` decides
        it, until one is refused: its outcome ends the list, and the caller acts on it before
        the table moves on (rankpath.py voids a refused Online). The ranks moved online are
        rolled up once for the lot (`rollup`). The same table and outcomes as `apply` one by
        one (tests/test_rankpath_batch.py)."""
        outcomes: list[Outcome] = []
        entries, size = self.entries, self.size
        for event in events:
            if not 0 <= event.rank < size or isinstance(event, Reboot):
                outcome = self._event(event, now)
            else:  # what _event and _step do of one event, without their calls
                entry = entries.peek(event.rank)
                if event.incarnation != entry.incarnation:
                    outcome = self._event(event, now)  # refused: _event words it
                else:
                    stimulus = one_of_several(entry, event)
                    rule = self._rule(entry, stimulus, now)
                    if isinstance(rule, str):
                        outcome = refused(rule)
                    else:
                        entry = entries[entry.rank]
                        note = rule.note.format(rank=entry.rank) if rule.note else ""
                        outcome = Outcome(True, self._fire(entry, rule, stimulus, now), note)
            if outcome.changed:
                self.generation += 1
            outcomes.append(outcome)
            if not outcome.applied:
                break
        return outcomes

    def idle(self, event: Event | Reserve, now: float) -> bool:
        """Whether `event` would apply and change nothing: its row moves nowhere and has no
        effect (a config rank's first Reboot, whose incarnation 1 the launch gave). The table is
        not touched."""
        if isinstance(event, Reserve) or not 0 <= event.rank < self.size:
            return False
        entry = self.entries.peek(event.rank)
        if not isinstance(event, Reboot) and event.incarnation != entry.incarnation:
            return False
        rule = self._rule(entry, one_of_several(entry, event), now)
        return not isinstance(rule, str) and rule.target is None and not rule.effects

    def _event(self, event: Event, now: float) -> Outcome:
        if not 0 <= event.rank < self.size:
            return refused(f"rank {event.rank} is not in this instance of size {self.size}")
        entry = self.entries.peek(event.rank)  # kept once a row applies (_step)
        # Reboot names the incarnation that ended (or 0): it asks for the current one
        if not isinstance(event, Reboot) and event.incarnation != entry.incarnation:
            return refused(
                f"rank {event.rank} incarnation {event.incarnation} is not current "
                f"({entry.incarnation})"
            )
        return self._step(entry, one_of_several(entry, event), now)

    def _step(self, entry: RankEntry, event: Event | Reserve | LinkEnded, now: float) -> Outcome:
        rule = self._rule(entry, event, now)
        if isinstance(rule, str):
            return refused(rule)
        entry = self.entries[entry.rank]  # a spare is kept from its first applied event on
        note = rule.note.format(rank=entry.rank) if rule.note else ""
        return Outcome(True, self._fire(entry, rule, event, now), note)

    def _rule(self, entry: RankEntry, event: Event | Reserve | LinkEnded, now: float) -> Rule | str:
        """The row that applies to `event`, or why there is none (the table is not touched)."""
        rule = TRANSITIONS.get((entry.phase, type(event)))
        if rule is None:  # LinkEnded, internal, comes for a connected rank only
            return REFUSALS[type(event)](entry)  # type: ignore[index]
        for guard in rule.guards:
            if (why := guard(self, entry, event, now)) is not None:
                return why
        return rule

    def _fire(self, entry: RankEntry, rule: Rule, event: Stimulus, now: float) -> tuple[int, ...]:
        """Carry out a row whose guards passed: its effects, then the move to its target."""
        changed: list[int] = []
        for effect in rule.effects:  # they see the entry as the event found it
            changed += effect(self, entry, event, now)
        if rule.target is not None:
            entry.phase, entry.since = rule.target, now
            if entry.rank < self._free_from and rule.target in RESERVABLE_PHASES:
                self._free_from = entry.rank
            why = rule.why if isinstance(rule.why, str) else rule.why(event)
            entry.reason = why if len(why) <= REASON_LENGTH else why[: REASON_LENGTH - 3] + "..."
            state = PUBLIC[rule.target]
            if state is RankState.ONLINE:  # the roll-up waits for the run (`rollup`)
                if self._onward and now != self._onward_at:
                    self._rollup.set_online(self._onward, self._onward_at)
                    self._onward = []
                self._onward.append(entry.rank)
                self._onward_at = now
            else:
                self.rollup.set(entry.rank, state, now)
            if state not in CONNECTED or rule.target is not Phase.RESERVED:
                self.untime(entry)  # its lease or reattach grace may go below
            if state not in CONNECTED:
                entry.pid, entry.torpid = None, False
                entry.attached_to = entry.adrift_until = None
                entry.other_links = entry.past_links = ()
            if entry.lease is not None and rule.target is not Phase.RESERVED:
                entry.lease = None
            changed.insert(0, entry.rank)
        return tuple(dict.fromkeys(changed)) if len(changed) > 1 else tuple(changed)

    # --- FLUB ---------------------------------------------------------------------------------

    def _reserve(self, request: Reserve, now: float) -> Outcome:
        """Give a joiner a rank, atomically: it is reserved before anyone else can be told
        about it, and a repeated request from the same key gets the same rank."""
        if (answer := self._key_guard(request)) is not None:
            return answer
        if request.rank is None:
            # lowest first: interior ranks before the leaves below them; the first one found
            if (found := self._lowest_free(request, now)) is None:
                return _no("no available ranks")
            entry = self.entries[found]  # kept from now on
        elif not 0 <= request.rank < self.size:
            return _no(f"no rank {request.rank} in this instance of size {self.size}")
        else:
            entry = self.entries[request.rank]
        outcome = self._step(entry, request, now)
        if not outcome.applied:
            return _no(outcome.reason)
        grant = Reservation(True, entry.rank, entry.incarnation)
        return Outcome(outcome.applied, outcome.changed, outcome.reason, grant)

    def _lowest_free(self, request: Reserve, now: float) -> int | None:
        """The lowest rank a Reserve of any rank may take, or None. Only a rank in a phase
        with a Reserve row is judged by its guards (a refusal's words are not made for every
        rank taken); the prefix of ranks in no such phase is skipped from then on."""
        entries, size = self.entries, self.size
        start = self._free_from
        while start < size and entries.peek(start).phase not in RESERVABLE_PHASES:
            start += 1
        self._free_from = start
        for rank in range(start, size):
            entry = entries.peek(rank)
            if entry.phase in RESERVABLE_PHASES and isinstance(
                self._rule(entry, request, now), Rule
            ):
                return rank
        return None

    def _key_guard(self, request: Reserve) -> Outcome | None:
        """One broker, one rank: what the joiner's key already holds decides first."""
        key = request.public_key
        if (left := self.retired_keys.get(key)) is not None:
            return _no(
                f"this broker's key was retired from rank {left}: a retired broker does not "
                "come back (a new broker, with a new key, may join)",
                never=True,
            )
        keyed = self.keyed(key)  # a spare nothing happened to holds no key
        for entry in keyed:
            if entry.state in CONNECTED:
                return _no(f"this key already holds rank {entry.rank} ({entry.state})")
        for entry in keyed:
            if entry.joiner == key:
                if request.rank not in (None, entry.rank):
                    return _no(f"this key already holds a reservation of rank {entry.rank}")
                grant = Reservation(True, entry.rank, entry.incarnation, repeated=True)
                return Outcome(True, reservation=grant)
        return None

    def keyed(self, key: str) -> list[RankEntry]:
        """The entries whose broker or reservation has (or last had) `key`, in rank order: one
        pass over the kept entries, unsorted, comparing keys only (a join asks once or twice)."""
        found = [entry for entry in self.entries.kept() if entry.key == key]
        return sorted(found, key=_by_rank) if len(found) > 1 else found

    def verify(self, rank: int, incarnation: int, public_key: str) -> str | None:
        """Why `public_key` may not join as (rank, incarnation), or None if it was reserved so."""
        if not 0 <= rank < self.size:
            return f"no rank {rank} in this instance of size {self.size}"
        entry = self.entries.peek(rank)
        if entry.phase is not Phase.RESERVED or entry.incarnation != incarnation:
            return (
                f"rank {rank} incarnation {incarnation} is not reserved "
                f"(rank {rank} is {entry.state}, incarnation {entry.incarnation})"
            )
        if entry.joiner != public_key:
            return f"rank {rank} is reserved for another key"
        return None

    def time(self, rank: int) -> None:
        """`rank` was given a deadline (a lease, a reattach grace): the timers walk it, and the
        loop is woken for it."""
        self.timed.add(rank)
        self.deadlines += 1
        end = _deadline(self.entries.peek(rank)) if self._expiry_known else None
        if end is not None and (self._expiry is None or end < self._expiry):
            self._expiry = end

    def untime(self, entry: RankEntry) -> None:
        """`entry`'s deadline is about to go: if it was the soonest kept, the next asking
        walks again (any other going leaves the soonest as it is)."""
        if self._expiry_known and _deadline(entry) == self._expiry:
            self._expiry_known = False

    def deadlined(self) -> list[RankEntry]:
        """The entries with a lease or an adrift deadline, in rank order: `timed`, less the
        ranks whose deadline has gone since (it keeps those it returns)."""
        self._expiry_known = False  # the timers walk: the next asking walks too
        entries = [self.entries.peek(rank) for rank in sorted(self.timed)]
        held = [e for e in entries if e.lease is not None or e.adrift_until is not None]
        if len(held) < len(entries):
            self.timed = {entry.rank for entry in held}
        return held

    def expired(self, now: float) -> list[Expire]:
        """Reservations whose lease has run out."""
        return [
            Expire(e.rank, e.incarnation)
            for e in self.deadlined()
            if e.lease is not None and now >= e.lease.until
        ]

    def next_expiry(self) -> float | None:
        """The next lease or reattach grace to run out; never later than that, and kept between
        walks of the ranks with one (the loop asks after every busy turn, a join makes one
        more such rank, and the walk was one per turn across every join pending)."""
        if not self._expiry_known:
            soonest: float | None = None
            for entry in self.deadlined():  # a rank is reserved or adrift, never both
                end = _deadline(entry)
                if end is not None and (soonest is None or end < soonest):
                    soonest = end
            self._expiry, self._expiry_known = soonest, True
        return self._expiry

    def adrift(self, now: float) -> list[Lost]:
        """Ranks adrift past the reattach grace: rank 0 declares them lost itself."""
        return [
            Lost(e.rank, e.incarnation, "did not reattach in time")
            for e in self.deadlined()
            if e.adrift_until is not None and now >= e.adrift_until and e.state in CONNECTED
        ]

    def links_above(self, rank: int) -> list[list[int]]:
        """The chains of links from `rank` to rank 0 now, each nearest first: the one it is
        attached by, then one through each other parent that holds it (`other_links`) or held
        it until it moved on or the connection dropped (`past_links`). Its subtree's lineage
        (docs/protocol.md section 5.1) names the brokers of one of them, whichever its broker
        last passed down. A chain that breaks (a parent adrift) ends there; a rank not
        connected has none."""
        entry = self.entries[rank]
        if entry.state not in CONNECTED:
            return []
        links = (entry.attached_to, *entry.other_links, *entry.past_links)
        parents = [p for p in links if p is not None]
        return [[parent, *self._chain(parent)] for parent in dict.fromkeys(parents)]

    def _chain(self, rank: int) -> list[int]:
        """The ranks above `rank` by its attachments, up to the root or to where the chain
        breaks."""
        chain: list[int] = []
        while rank != self.root and len(chain) <= self.size:
            entry = self.entries[rank]
            if entry.state not in CONNECTED or entry.attached_to is None:
                break
            rank = entry.attached_to
            chain.append(rank)
        return chain

    def reachable(self, rank: int) -> bool:
        """Whether `rank`'s broker is connected and its chain of links reaches the root now."""
        seen = 0
        while rank != self.root:
            entry = self.entries.peek(rank)
            if entry.state not in CONNECTED or entry.attached_to is None or seen > self.size:
                return False
            rank, seen = entry.attached_to, seen + 1
        return True

    # --- views -----------------------------------------------------------------------------

    def up(self) -> bool:
        """Every launched rank is online: the instance is ready for its initial program. Asked
        after every batch of events until it holds, so it is a count, not a walk of the table."""
        return self.rollup.offline == 0

    def subtree_statuses(self) -> list[SubtreeStatus]:
        """Each rank's subtree status (rankstates.Rollup, held to rankstates.roll_up)."""
        return list(self.rollup.statuses)

    def subtree_since(self, rank: int) -> float:
        """When `rank`'s subtree status last changed."""
        return self.rollup.since[rank]
