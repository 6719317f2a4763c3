"""Who sent a request, judged from its route: the orders only rank 0, or a rank's parent, may give.

Every broker that receives a request pushes on its route the hop it came from (docs/protocol.md
§3.2): "p" from its parent, "c<rank>" from a child, "l<id>" from a local client, and "s" for a
request of its own. A broker trusts only the hops pushed by itself and by its ancestors, so the
tail of the route that they pushed tells who started the request.
"""

from __future__ import annotations

from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message


def from_rank0(request: Message, topology: Topology, rank: int) -> bool:
    """Whether rank 0 itself sent `request` to `rank`: rank 0's own "s", then one "p" pushed by
    each broker on the way down. Only the last level+1 hops were pushed by brokers we trust."""
    level = topology.level(rank)
    return request.route[-(level + 1) :] == ["s"] + ["p"] * level


def from_parent_of(request: Message, topology: Topology, rank: int) -> bool:
    """Whether the parent broker of `rank` itself sent `request` to rank 0: its own "s", then one
    "c<child>" pushed by each broker on the way up."""
    hops, current = [], topology.parent(rank)
    while current:
        hops.append(f"c{current}")
        current = topology.parent(current)
    return request.route == ["s", *hops]
