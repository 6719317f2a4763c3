"""Who fosters whom, and who goes home: pure functions of rank 0's table (docs/protocol.md §12).

When a rank's broker ends, every connected broker below it whose chain of links ran through it
is cut off from rank 0, though only those attached to it directly know so yet. All of them are
given to one foster parent: the nearest ancestor of the rank that ended whose own chain still
reaches rank 0. Each is named with the incarnation and key rank 0 holds as current, and only
those: a foster parent admits exactly them. Those deeper down that did not lose their own
parent never use the admission, and it lapses.

When a rank is online again (replaced, or its own broker back), its children that live under a
foster parent, or are still seeking one, go home to it.
"""

from __future__ import annotations

from tbon.overlay.state.rankstates import CONFIG_PHASES, CONNECTED
from tbon.overlay.state.ranktable import RankTable

Admission = tuple[int, int, str]
"""(rank, incarnation, key): a broker a parent is told to admit; key "" is the instance's shared
key (config bootstrap), with which the broker must claim exactly that incarnation."""


def foster_parent(table: RankTable, rank: int) -> int:
    """The nearest ancestor of `rank` whose broker is connected and reaches rank 0 now."""
    for ancestor in table.topology.ancestors(rank):
        if table.reachable(ancestor):
            return ancestor
    return 0


def cut_off_below(table: RankTable, rank: int) -> list[Admission]:
    """The connected brokers below `rank` that no longer reach rank 0, as admissions. A broker
    whose key rank 0 does not know (one that came online before keys were reported) is left to
    its reattach timeout."""
    found: list[Admission] = []
    for below in table.topology.descendants(rank):
        entry = table.entries[below]
        if entry.state not in CONNECTED or table.reachable(below):
            continue
        if entry.key:
            found.append((below, entry.incarnation, entry.key))
        elif entry.phase in CONFIG_PHASES:
            found.append((below, entry.incarnation, ""))
    return found


def away_from_home(table: RankTable, rank: int) -> list[Admission]:
    """The children of `rank` (online again) that are connected but not attached to it."""
    found: list[Admission] = []
    for child in table.topology.children(rank):
        entry = table.entries[child]
        if entry.state not in CONNECTED or entry.attached_to == rank:
            continue
        key = entry.key or ""
        if key or entry.phase in CONFIG_PHASES:
            found.append((child, entry.incarnation, key))
    return found
