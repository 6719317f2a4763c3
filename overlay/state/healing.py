"""Healing the tree (docs/protocol.md §12): every rule of who may hold, foster, admit or report
on whom, in one room. Pure functions of the topology or of rank 0's table; the brokers ask them.

The rules:

1. **Above.** A broker's parent, foster or not, is always one of its rank's ancestors: a parent
   admits, fosters, reports on and routes to its own subtree only (`is_below`, `may_admit`).
   The hello judge, the revocations, the admissions record, the router and exec ask it. One
   exception: a root group member that took over from a dead rank 0 (docs/protocol.md §13.4)
   fosters whatever that death cut off, its topology subtree or not (the table's `holds`).
2. **Reports.** A child reports on its own subtree only, and only events seen by itself or by a
   broker below it (`may_report`): a broker cannot end a rank elsewhere in the tree. Its own
   word on its own link (`dropped`: the parent it lost) is the one report about itself.
3. **Foster choice.** When a rank's broker ends, every connected broker below it whose chain of
   links ran through it is cut off from rank 0 (`cut_off_below`), though only those attached
   to it directly know so yet. All of them are given to its foster parent: the nearest rank
   on the ended rank's chain of links that still reaches rank 0 (`foster_parents`). That
   chain, not the topology, is what their lineage names: a rank fostered by rank 0 gave its
   children the lineage [0, itself], so should it die before it goes home to its parent's new
   broker, they can find rank 0 but not that new broker, whose card they never had. A rank
   that had several links in its incarnation (welcomed home, its foster link over or not) may
   have left either lineage below it (its children may not have read the new one before it
   ended), so the nearest live rank on each chain fosters: the
   brokers seek every ancestor they know at once, keep the first that welcomes them and
   dismiss the others (protocol §12.1, step 4), and the unused admission is withdrawn (5). A
   rank that was adrift has no chain: the nearest ancestor whose own chain reaches rank 0.
   Each is named with the incarnation and key rank 0 holds as current, and only those: a
   foster parent admits exactly them. A broker whose key rank 0 does not know is left to its
   reattach timeout.
4. **Going home.** When a rank is online again, its children that live under a foster parent,
   or still seek one, go home to it (`away_from_home`); a rank that came online under a foster
   parent while its own parent is there goes home itself (`goes_home`). One exception: a rank 0
   refilled after a takeover (docs/protocol.md §13.6) is a foster child of the root, which is
   its own topology child; nothing goes home to it (the root would hang below it).
5. **Admissions and their withdrawal.** A foster admission is used once its rank is attached,
   as that incarnation, to the parent told; it is moot once that incarnation is no longer
   connected, or its rank is attached to another broker that reaches rank 0; else it stays open
   (`admission_fate`). Rank 0 withdraws moot ones (services/rankpath.py): left open, one would
   let a later seek be welcomed by two parents, and its parent wait for it at a shutdown.
6. **Whole.** The tree is whole when no connected rank is adrift (`adrift`): what heal.wait
   waits for at rank 0.

Rank 0 decides from these after each event it applies (services/rankpath.py) and records whom
it told (admissions.py); the orders travel as requests down the tree (services/heal.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

from tbon.overlay.state.rankstates import CONFIG_PHASES, CONNECTED
from tbon.overlay.state.topology import Topology

if TYPE_CHECKING:  # the table imports nothing from here; only its type is named
    from tbon.overlay.state.ranktable import RankTable

Admission = tuple[int, int, str]
"""(rank, incarnation, key): a broker a parent is told to admit; key "" is the instance's shared
key (config bootstrap), with which the broker must claim exactly that incarnation."""


# --- 1 and 2: above, and reports -----------------------------------------------------------------


def is_below(topology: Topology, rank: int, upper: int) -> bool:
    """Whether `rank` is in `upper`'s subtree, strictly below it (both ranks of the instance)."""
    size = topology.size
    return 0 <= rank < size and 0 <= upper < size and topology.is_ancestor(upper, rank)


def may_admit(topology: Topology, parent: int, rank: int) -> bool:
    """Whether `parent` may ever hold `rank`'s broker as a child: one of its ancestors."""
    return is_below(topology, rank, parent)


def may_report(
    topology: Topology, sender: int, rank: int, seen_by: int | None, own: bool = False
) -> bool:
    """Whether the child `sender` may report an event on `rank` seen by `seen_by`: a rank of
    its subtree, seen by itself or by a broker below it; or, `own`, its word on itself."""
    about = (own and rank == sender) or is_below(topology, rank, sender)
    if not about or seen_by is None:
        return False
    return seen_by == sender or is_below(topology, seen_by, sender)


# --- 3: foster choice ----------------------------------------------------------------------------


def foster_parents(
    table: RankTable, rank: int, lineages: Sequence[Sequence[int]] = ()
) -> list[int]:
    """Who fosters what `rank` held, nearest first: on each chain of links it had before it
    ended (`lineages`, from `RankTable.links_above`), the nearest rank that still reaches rank
    0; for a chain with none, or a rank that was adrift (no chain), the nearest ancestor whose
    own chain does."""
    root = table.root  # rank 0, or the member that took over from it (§13.4)
    nearest = next((a for a in table.topology.ancestors(rank) if table.reachable(a)), root)
    found = [next((a for a in chain if table.reachable(a)), nearest) for chain in lineages]
    chosen = set(found or [nearest])
    ordered = [a for a in table.topology.ancestors(rank) if a in chosen]
    return [*ordered, root] if root in chosen and root not in ordered else ordered or [root]


def cut_off_below(table: RankTable, rank: int) -> list[Admission]:
    """The connected brokers below `rank` that no longer reach rank 0, as admissions. A broker
    whose key rank 0 does not know (one that came online before keys were reported) is left to
    its reattach timeout."""
    found: list[Admission] = []
    # a root that died held ranks anywhere in the tree (§13.4): every one is looked at
    whole = rank in table.former_roots and rank != 0
    for below in range(table.size) if whole else table.topology.descendants(rank):
        if below == rank:
            continue
        entry = table.entries.peek(below)
        if entry.state not in CONNECTED or table.reachable(below):
            continue
        if entry.key:
            found.append((below, entry.incarnation, entry.key))
        elif entry.phase in CONFIG_PHASES:
            found.append((below, entry.incarnation, ""))
    return found


# --- 4: going home -------------------------------------------------------------------------------


def away_from_home(table: RankTable, rank: int) -> list[Admission]:
    """The children of `rank` (online again) that are connected but not attached to it; none
    for a rank 0 that is not the root (refilled after a takeover: rule 4)."""
    found: list[Admission] = []
    if rank == 0 and table.root != 0:
        return found
    for child in table.topology.children(rank):
        entry = table.entries.peek(child)
        if entry.state not in CONNECTED or entry.attached_to == rank:
            continue
        key = entry.key or ""
        if key or entry.phase in CONFIG_PHASES:
            found.append((child, entry.incarnation, key))
    return found


def goes_home(table: RankTable, rank: int, parent: int | None) -> int | None:
    """The rank's own parent, if `rank` came online under another broker (`parent`, a foster
    parent) while its own parent reaches rank 0, and rank 0 can name it (a key, or config
    bootstrap's shared one); else None."""
    if parent is None:
        return None
    home = table.topology.parent(rank)
    if home is None or parent == home or not table.reachable(home):
        return None
    entry = table.entries.peek(rank)
    return home if entry.key or entry.phase in CONFIG_PHASES else None


# --- 5: admissions and their withdrawal ----------------------------------------------------------


class Fate(Enum):
    """What becomes of an open foster admission now."""

    OPEN = "open"  # it may still be used
    USED = "used"  # its broker came: closed without a word
    MOOT = "moot"  # withdrawn at its parent


def admission_fate(table: RankTable, rank: int, incarnation: int, parent: int) -> Fate:
    """The fate of `parent`'s open admission of (rank, incarnation)."""
    entry = table.entries.peek(rank)
    current = entry.incarnation == incarnation and entry.state in CONNECTED
    if current and entry.attached_to == parent:
        return Fate.USED
    if not current or (entry.attached_to is not None and table.reachable(rank)):
        return Fate.MOOT
    return Fate.OPEN


# --- 6: whole ------------------------------------------------------------------------------------


def adrift(table: RankTable) -> bool:
    """Whether some connected rank is seeking a parent now."""
    return any(entry.adrift_until is not None for entry in table.deadlined())
