"""Who sent a request, judged from its route: the orders only rank 0, or a rank's parent, may give,
and the client connection a request came by.

Every broker that receives a request pushes on its route the hop it came from (docs/protocol.md
§3.2): "p" from its parent, "c<rank>" from a child, "l<id>" from a local client, and "s" for a
request of its own. A broker trusts only the hops pushed by itself and by its ancestors, so the
tail of the route that they pushed tells who started the request. A client may send a route of
its own, but whatever it writes comes before the hop of the broker it is a client of.
"""

from __future__ import annotations

from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message

Connection = tuple[str, ...]
"""A client connection (or a broker's own requests) as the brokers on the way wrote it."""


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


def connection_of(request: Message) -> Connection:
    """The connection that started `request`: the hop its first broker pushed ("l<id>" or "s"),
    then the link hops of the brokers after it. Hops before that were written by the sender, so
    two requests name the same connection however their senders padded their routes, and no
    sender can name another's."""
    route = request.route
    first = len(route) - 1
    while first > 0 and _link(route[first]):
        first -= 1
    return tuple(route[max(first, 0) :])


def client_notice(request: Message) -> bool:
    """Whether `request` (client.disconnect) is shaped as a broker makes one: the gone client's
    hop, then only the brokers' own. One with hops before it was written by a client, and could
    only ever be about that client itself."""
    route = request.route
    return bool(route) and route[0].startswith("l") and connection_of(request) == tuple(route)


def _link(hop: str) -> bool:
    """A hop that a broker pushed for a request from another broker."""
    return hop == "p" or (hop.startswith("c") and is_decimal(hop[1:]))
