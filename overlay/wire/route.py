"""What a request's route says about who sent it: the hops brokers push, the client connection a
request came by, and whether rank 0 itself sent it.

Every broker that receives a request pushes on its route the hop it came from (docs/protocol.md
§3.2): "p<rank>" from the parent it is attached to (rank), "c<rank>" from a child, "l<id>" from
a local client, and "s" for a request of its own. Each link hop names the authenticated peer the
request came from, so a route says which brokers it passed even when one of them was a foster
parent (docs/protocol.md §12). A client may send a route of its own, but whatever it writes comes
before the hop of the broker it is a client of, and that broker's hop is never a link hop.

Pure readings of a route, shared by the links, the router and the services; the orders that
services refuse on these grounds are in services/trust.py.
"""

from __future__ import annotations

from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.wire.message import Message

Connection = tuple[str, ...]
"""A client connection (or a broker's own requests) as the brokers on the way wrote it."""


def from_rank0(request: Message) -> bool:
    """Whether rank 0 itself sent `request`: rank 0's own "s", then "p0" pushed by the broker
    attached to it, then only "p<rank>" hops pushed by each broker on the way down. A route that
    starts with "s" was started by a broker's own request; only rank 0's is followed by "p0"
    (a client's route always holds its broker's "l<id>"; another broker's request going up holds
    "c" hops). Counting hops would not do: a fostered broker is fewer hops from rank 0 than its
    level in the topology."""
    route = request.route
    if not route or route[0] != "s":
        return False
    if len(route) == 1:
        return True  # rank 0's request to itself
    return route[1] == "p0" and all(parent_hop(hop) is not None for hop in route[2:])


def order_sender(request: Message, rank: int) -> int | None:
    """The broker that sent `request` down the tree as its own, as served at `rank`: `rank`
    itself for its own request ("s" alone), X for X's own "s", then "p<X>" pushed by the broker
    attached to X, then only "p<rank>" hops on the way down; None for any other route (a
    client's, or a request going up). Only a broker above this one, or this broker itself, can
    have sent an order of the root's; which of them is the root is the term fence's to judge
    (services/trust.py)."""
    route = request.route
    if not route or route[0] != "s":
        return None
    if len(route) == 1:
        return rank
    if not all(parent_hop(hop) is not None for hop in route[2:]):
        return None
    return parent_hop(route[1])


def sent_down(request: Message) -> bool:
    """Whether `request` is a broker's own, sent down to the broker serving it (or that broker's
    own): the only shape an order of the root's can have (`order_sender`)."""
    return order_sender(request, 0) is not None


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


def broker_own(request: Message) -> bool:
    """Whether a broker started `request` itself (its own "s", then only the link hops of the
    brokers it passed), not a client: a client's route always holds its broker's "l<id>" after
    whatever the client wrote (connection_of), so no client can send one of this shape."""
    route = request.route
    return bool(route) and route[0] == "s" and connection_of(request) == tuple(route)


Origin = tuple[int, str]
"""Who started a request: the rank of the broker it entered the tree by, and the hop that broker
pushed for it ("l<id>": one of its local clients; "s": itself)."""


def origin(request: Message, here: int) -> Origin | None:
    """Who started `request`, read at rank `here`, however it travelled: its first broker's hop
    (connection_of), and that broker's rank, which the next broker's link hop names ("c<rank>"
    going up, "p<rank>" going down) or, with no link hop after it, `here`. The link hops between
    change when a heal fosters a broker on the way; these two do not, and no client can write
    them (connection_of). None for a route that no broker started."""
    connection = connection_of(request)
    if not connection or _link(connection[0]):
        return None
    if len(connection) == 1:
        return here, connection[0]
    first = parent_hop(connection[1])
    if first is None:
        first = child_hop(connection[1])
    return None if first is None else (first, connection[0])


def same_client(request: Message, start: Message, here: int) -> bool:
    """Whether `request` comes from the client that sent `start` (an exec.start, as both reached
    rank `here`), or from that client's broker itself, which speaks for its client (the
    acknowledgements it hands over, the kill when its client goes: docs/protocol.md §7.1). A
    broker's request that names the client it speaks for (`speaks_for`: the kill) must name
    this one: another of its clients may have reused the job's id and left at once, and a later
    broker of the same rank knows nothing of an earlier one's clients."""
    sender, owner = origin(request, here), origin(start, here)
    if sender is None or owner is None or sender[0] != owner[0]:
        return False
    if sender[1] == owner[1]:
        return True
    return sender[1] == "s" and speaks_for(request) in (None, owner[1])


def speaks_for(request: Message) -> str | None:
    """The client hop a broker wrote before its own "s" on a request it sends for that client
    (services/exec.py `client_gone`), or None. No client can write it: a client's route always
    holds its broker's "l<id>" after what it wrote, never "s" (connection_of)."""
    route, connection = request.route, connection_of(request)
    if not connection or connection[0] != "s" or len(route) == len(connection):
        return None
    return route[-len(connection) - 1]


def parent_hop(hop: str) -> int | None:
    """The parent's rank that a "p<rank>" hop names, or None for any other hop."""
    return int(hop[1:]) if hop.startswith("p") and is_decimal(hop[1:]) else None


def child_hop(hop: str) -> int | None:
    """The child's rank that a "c<rank>" hop names, or None for any other hop."""
    return int(hop[1:]) if hop.startswith("c") and is_decimal(hop[1:]) else None


def _link(hop: str) -> bool:
    """A hop that a broker pushed for a request from another broker: parent_hop or child_hop
    would read a rank in it (spelt out: read for every hop of a route, every exec notice)."""
    return hop.startswith(("p", "c")) and hop[1:].isascii() and hop[1:].isdigit()


def from_above(request: Message, sender: int) -> bool:
    """Whether the broker of rank `sender` itself sent `request` down to this one: its own "s",
    then "p<sender>" pushed by the broker attached to it, then only "p" hops (from_rank0, for a
    root group member that leads or campaigns: docs/protocol.md §13.4)."""
    route = request.route
    if len(route) < 2 or route[:2] != ["s", f"p{sender}"]:
        return False
    return all(parent_hop(hop) is not None for hop in route[2:])


def from_member(request: Message, sender: int) -> bool:
    """Whether the broker of rank `sender` itself sent `request` up to this one (the root): its
    own "s", then "c<sender>" pushed by the broker it is attached to, then only "c" hops on the
    way up (however many: it may be fostered). The hop a parent pushes names the child whose
    key it admitted, so a broker cannot speak for another member."""
    route = request.route
    if len(route) < 2 or route[:2] != ["s", f"c{sender}"]:
        return False
    return all(child_hop(hop) is not None for hop in route[2:])
