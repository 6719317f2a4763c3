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

    Built for every status.get and every table a watcher is sent (at 2048 ranks, 2048 entries):
    each entry's state, and the tree's shape, are looked up once."""
    statuses = table.subtree_statuses()
    topology = table.topology
    ranks = []
    for entry, status in zip(table.entries, statuses, strict=True):
        rank, state = entry.rank, entry.state
        shown: dict[str, Any] = {
            "rank": rank,
            "state": state.value,
            "host": entry.host,
            "pid": entry.pid,
            "incarnation": entry.incarnation,
            "parent": topology.parent(rank),
            "children": list(topology.children(rank)),
            "subtree": status.value,
            "torpid": entry.torpid,
            "since": round(max(0.0, now - entry.since), 3),
        }
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
        ranks.append(shown)
    return {"size": table.size, "topo": topology.spec, "ranks": ranks}
