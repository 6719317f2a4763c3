"""The orders only rank 0, or a rank's parent, may give: the checks and the refusal that the
services obeying such orders (heal, FLUB, retire) share.

Who sent a request is read from its route (wire/route.py); what is refused, and how, is said here.
"""

from __future__ import annotations

import errno

from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.services.actions import Action, fail, warning
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message
from tbon.overlay.wire.route import from_rank0


def unless_from_rank0(request: Message) -> list[Action] | None:
    """None if rank 0 itself sent `request` (an order); else the refusal, said in the log."""
    if from_rank0(request):
        return None
    rank = request.payload.get("rank")
    return [
        warning(f"refused {request.topic} for rank {rank}: not from rank 0"),
        *fail(request, errno.EPERM, f"{request.topic} comes from rank 0 only"),
    ]


def from_parent_of(request: Message, topology: Topology, rank: int) -> bool:
    """Whether the parent broker of `rank` itself sent `request` up to rank 0: its own "s", then
    "c<parent>" pushed by the broker it is attached to, then only "c" hops on the way up (however
    many: the parent may be fostered)."""
    parent = topology.parent(rank)
    route = request.route
    if parent == 0:
        return route == ["s"]  # rank 0's own request, to itself
    if parent is None or len(route) < 2 or route[:2] != ["s", f"c{parent}"]:
        return False
    return all(hop.startswith("c") and is_decimal(hop[1:]) for hop in route[2:])
