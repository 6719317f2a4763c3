"""How the rank table is shown: the `tbon status --json` object, and who holds a rank.

Pure functions of the table, kept apart from its rules so that the state machine decides and
this module only words and shapes. Public keys are never shown: a reserved rank carries its
joiner's key fingerprint. Fields are only ever added (docs/design.md §12), and only where they
say something: `reason` and `last_pid` for a rank that is lost, offline or vacant, once known;
`subtree_since` for a connected rank, the one whose subtree status `tbon status` shows, and
`attached_to`, the broker its link goes to now (a foster parent if not `parent`; null while it
is `reattaching`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tbon.keys.cert import fingerprint
from tbon.overlay.state.rankstates import CONNECTED, RankState

if TYPE_CHECKING:
    from tbon.overlay.state.ranktable import RankEntry, RankTable


def describe(entry: RankEntry) -> str:
    """Who holds a rank, for a refusal that names them."""
    if entry.state in CONNECTED:
        return f"{entry.state} (host {entry.host}, pid {entry.pid})"
    if entry.joiner is not None:
        return f"reserved for a joiner on {entry.host} (key {fingerprint(entry.joiner)})"
    if entry.state is RankState.OFFLINE:
        return f"offline, expected from bootstrap on {entry.host}"
    return str(entry.state)


def snapshot(table: RankTable, now: float) -> dict[str, Any]:
    """The `tbon status --json` object (docs/design.md); field names are a public contract.

    Built whole only for a table of at most WHOLE_TABLE_MAX ranks (tbon/limits.py); a larger one
    is read in pages (statusviews.page)."""
    ranks = [shown(table, rank, now) for rank in range(table.size)]
    return {"size": table.size, "topo": table.topology.spec, "ranks": ranks}


def shown(table: RankTable, rank: int, now: float, children: bool = True) -> dict[str, Any]:
    """One rank's entry of the status object; without `children` for the views computed at
    rank 0, which draw the tree from `parent` and `attached_to` (a flat tree's root has 2^18)."""
    entry = table.entries.peek(rank)
    topology = table.topology
    state = entry.state
    shown: dict[str, Any] = {
        "rank": rank,
        "state": state.value,
        "host": entry.host,
        "pid": entry.pid,
        "incarnation": entry.incarnation,
        "parent": topology.parent(rank),
    }
    if children:
        shown["children"] = list(topology.children(rank))
    shown["subtree"] = table.rollup.statuses[rank].value
    shown["torpid"] = entry.torpid
    shown["since"] = round(max(0.0, now - entry.since), 3)
    if state in CONNECTED:
        shown["subtree_since"] = round(max(0.0, now - table.subtree_since(rank)), 3)
        shown["attached_to"] = entry.attached_to
        if entry.adrift_until is not None:
            shown["reattaching"] = True
    elif state is not RankState.RESERVED:  # gone, or never held: why, and who was it
        if entry.reason:
            shown["reason"] = entry.reason
        if entry.last_pid is not None:
            shown["last_pid"] = entry.last_pid
    if entry.retired:
        shown["retired"] = True
    if (joiner := entry.joiner) is not None:
        shown["joiner"] = fingerprint(joiner)
        shown["expires"] = round(max(0.0, (entry.lease_until or now) - now), 3)
    return shown
