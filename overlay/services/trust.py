"""The orders only the root, or a rank's parent, may give: the checks and the refusal that the
router and the services obeying such orders (heal, FLUB, retire) share.

Who sent a request is read from its route (wire/route.py); what is refused, and how, is said here.
"""

from __future__ import annotations

import errno

from tbon.overlay.parse.numbers import is_decimal, is_int
from tbon.overlay.services.actions import Action, Respond, fail, warning
from tbon.overlay.state.terms import News, Refuse, Terms
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message
from tbon.overlay.wire.route import (
    broker_own,
    connection_of,
    order_sender,
    same_client,
    sent_down,
)

ORDERS = frozenset(
    {
        "flub.authorize",
        "flub.revoke",
        "heal.foster",
        "heal.adopt",
        "heal.home",
        "heal.withdraw",
        "retire.order",
    }
)
"""The requests only the root sends into the tree: each carries its term, and is fenced
(docs/protocol.md §13.3). The other orders are controls on a link (state/terms.py)."""


def unless_from_root(request: Message) -> list[Action] | None:
    """None if `request` (an order) is a broker's own sent down to this one, or this broker's own
    (only the root sends orders, and which broker is the root of the order's term the router's
    term fence judged before this service: `unless_current`); else the refusal, said in the log."""
    if sent_down(request):
        return None
    rank = request.payload.get("rank")
    return [
        warning(f"refused {request.topic} for rank {rank}: not from the root"),
        *fail(request, errno.EPERM, f"{request.topic} comes from the root only"),
    ]


def unless_current(
    terms: Terms, request: Message, rank: int
) -> tuple[list[Action] | None, list[News]]:
    """The term fence on a request served here: None if it is obeyed (not an order, or an order
    of the current term or a later one from that term's root, which raises the fence), else its
    refusal: ESTALE for a former root's, EPERM for another broker's (state/terms.py). An order
    not sent down by a broker (a client's) is left to its service, which refuses it (EPERM): its
    term never moves the fence. Also what the fence learned, for the broker (state/terms.py)."""
    if request.topic not in ORDERS:  # every request served: its route is read for orders only
        return None, []
    sender = order_sender(request, rank)
    if sender is None:
        return None, []
    verdict, news = terms.order(request.term, sender)
    if not isinstance(verdict, Refuse):
        return None, news
    reply = request.fail(verdict.errnum, verdict.errstr)
    if verdict.term is not None:  # ESTALE: what its sender is to learn
        reply.term, reply.payload = verdict.term, {"root": verdict.root}
    rank_named = request.payload.get("rank")
    said = warning(f"refused {request.topic} for rank {rank_named}: {reply.errstr}")
    return [said, Respond(reply)], news


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


def learned_from(terms: Terms, reply: Message) -> list[News]:
    """An answer to one of this broker's own orders (matched to its call): an ESTALE one names a
    later term, and its root, which this broker is to learn (§13.3)."""
    if reply.errnum != errno.ESTALE or reply.term is None or reply.topic not in ORDERS:
        return []
    root = reply.payload.get("root")
    return terms.heard(reply.term, root if is_int(root) and root >= 0 else None)


def unless_broker_own(request: Message) -> list[Action] | None:
    """None if `request` (a one-way notice only brokers send, such as exec.taken) was started by
    a broker itself; else it is ignored, said in the log (it has no answer to refuse it with). A
    client that wrote one could otherwise speak for another client's job."""
    if broker_own(request):
        return None
    sender = "/".join(connection_of(request))
    return [warning(f"ignored {request.topic} written by a client ({sender}): brokers send it")]


def unless_job_client(request: Message, rank: int, start: Message | None) -> list[Action] | None:
    """None if `request` (exec.stdin, exec.signal, exec.credit, exec.resend, exec.taken; an
    exec.start reusing a finished job's id) may act on the job it names at `rank`: `start`, the
    job's exec.start as it reached this rank, came from the same client (wire/route.py
    `same_client`: its broker and its connection there, which no heal changes), or no such job
    is here (nothing to act on). Else it is ignored, said in the log: all but exec.start are
    one-way, with no answer to refuse them by. A job id is the client's to choose and shows in
    the brokers' logs, so knowing it proves nothing (docs/protocol.md §7)."""
    if start is None or same_client(request, start, rank):
        return None
    return [not_its_client(request, "/".join(connection_of(request)) or "?")]


def not_its_client(request: Message, sender: str) -> Action:
    """The warning that `request`, naming a job that `sender` (a connection, as its hops read)
    did not start, is ignored: said by the job's rank, or sooner by the sender's own broker."""
    job = str(request.payload.get("id"))[:40]
    return warning(f"ignored {request.topic} for job {job} from {sender}: not its client")
