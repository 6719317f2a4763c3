"""The router: moves messages between a broker's links and its services.

A request names its destination rank (`nodeid`). One addressed to this broker is handed to the
service its topic maps to in one table; an unknown topic is answered ENOSYS. Any other request
goes one hop on: to the parent, or down to the deepest broker on the way to the target that is
attached here (its child, or a foster child: docs/protocol.md §12). On the way, each broker
pushes onto the request's route the hop it came from ("p<rank>" the parent, "c<rank>" a child,
"l<id>" a local client, "s" this broker itself), and a response retraces the route, popping one
hop per broker. A response whose way back runs through a broker that has gone since skips it:
the hops that broker pushed are taken off, up (uplink.py) or down (`_down_past`). A request this
broker makes itself with a continuation (a Call) gets a tag, and its response is handed to that
continuation instead of being sent anywhere.

Such a response is believed only if it comes back by the link its request went out on, and only
for a tag nobody else could guess (48 random bits): a client or a broker elsewhere in the tree
cannot answer rank 0's order to a parent in the parent's place. A call unanswered within
`call_timeout` gets ETIMEDOUT, so nothing waits for a broker that died holding a request.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.exec import EXEC_TOPICS, last_word, unreachable
from tbon.overlay.services.trust import ORDERS, learned_from, unless_current
from tbon.overlay.state.healing import is_below
from tbon.overlay.state.rankstates import CONNECTED
from tbon.overlay.state.terms import News, Terms
from tbon.overlay.state.topology import Topology, grouped
from tbon.overlay.wire.message import ANY_RANK, Kind, Message
from tbon.overlay.wire.route import child_hop, parent_hop
from tbon.record import Record

if TYPE_CHECKING:  # each link's module is loaded by a broker that has such a link only
    from tbon.overlay.links.children import Children
    from tbon.overlay.links.local import LocalServer
    from tbon.overlay.links.uplink import Uplink
    from tbon.overlay.state.ranktable import RankTable  # rank 0's, and a member's

log = logging.getLogger("tbon.broker")

Handler = Callable[[Message, float], list[Action]]
Continuation = Callable[[Message, float], list[Action]]
HERE = "here"  # the link of a request this broker serves itself, or answers without sending


TABLE_REQUESTS = frozenset(
    {
        "flub.allocate",
        "flub.challenge",
        "flub.release",
        "config.rejoin",
        "retire.rank",
        "retire.progress",
    }
)
"""Requests for the rank table a client addresses to rank 0 by number. With the root topics (a
request without a rank goes to the root) and exec's fan-out from the top, they are what a
client sends to rank 0 as the root: after a takeover (docs/protocol.md §13.4) a broker sends
them to the root of the latest term (`Router.to_the_root`)."""


class Pending(Record):
    """A call awaiting its response: what to do with it, the link it must come back by, and
    when to stop waiting."""

    __slots__ = __match_args__ = ("then", "link", "deadline", "topic")

    def __init__(self, then: Continuation, link: str, deadline: float, topic: str) -> None:
        self.then, self.link, self.deadline, self.topic = then, link, deadline, topic


class Router:
    def __init__(
        self,
        rank: int,
        topology: Topology,
        table: RankTable | None,
        links: tuple[Uplink | None, Children | None, LocalServer],
        handlers: dict[str, Handler],
        root_topics: frozenset[str],
        perform: Callable[[list[Action]], None],
        on_local_request: Callable[[str, Message], list[Action] | None],
        call_timeout: float,
        terms: Terms | None = None,
    ) -> None:
        """`handlers` maps each topic this broker serves to its service; `root_topics` are the
        topics a request without a rank (ANY_RANK) sends to rank 0; `perform` carries out what a
        handler or a continuation returns; `on_local_request` sees each request of a local
        client first, with the client's hop, and may keep it from going on (what to do instead:
        a stranger's exec.signal, services/exec.py `unless_own_job`); a call unanswered for
        `call_timeout` fails.
        `terms`: the broker's term fence (docs/protocol.md §13.3), which stamps the root's orders
        as they leave and judges those served here."""
        self.rank = rank
        self.topology = topology
        self.table = table
        self.parent, self.children, self.local = links
        self.handlers = handlers
        self.root_topics = root_topics
        self.to_the_root = root_topics | TABLE_REQUESTS | frozenset(EXEC_TOPICS)
        self.perform = perform
        self.on_local_request = on_local_request
        # takes an answer to exec.start on its way up from here to hold it, and says what to
        # do instead of sending it on (services/exec.py's gather: exits merged up the tree)
        self.gather: Callable[[Message, float], list[Action] | None] = lambda reply, now: None
        # sees each response delivered to a local client, with the client's hop
        self.on_local_response: Callable[[str, Message], None] = lambda hop, reply: None
        self.call_timeout = call_timeout
        self.terms = terms if terms is not None else Terms(rank, leading=rank == 0)
        # sees what the fence learned: a later term, a term that is not one (broker.py)
        self.on_terms: Callable[[list[News]], None] = lambda news: None
        self._pending: dict[int, Pending] = {}
        self._gone: set[tuple[str, int]] = set()  # (client hop, rank) told the client left
        # broker -> the foster child across the dead root its requests came up by (§13.4)
        self._across: dict[int, int] = {}

    def route(self, message: Message, came_from: str, now: float) -> None:
        if message.kind is Kind.REQUEST:
            if came_from == "s" and message.topic in ORDERS:
                message.term = self.terms.term  # the one place an order gets its term
            if came_from.startswith("l"):
                instead = self.on_local_request(came_from, message)
                if instead is not None:
                    self.perform(instead)
                    return
            message.route.append(came_from)
            if came_from.startswith("c"):
                self._learn_across(message.route)
            self.request(message, now)
        elif message.kind is Kind.RESPONSE:
            self.respond(message, came_from)
        else:
            log.warning("dropped a %s message %r from %s", message.kind, message.topic, came_from)

    def request(self, message: Message, now: float) -> None:
        if message.topic in self.root_topics and message.nodeid == ANY_RANK:
            message.nodeid = self.root
        elif message.nodeid == 0 and message.topic in self.to_the_root and self.root != 0:
            message.nodeid = self.root  # for rank 0 as the root: the root that took over
        target = message.nodeid
        if target in (ANY_RANK, self.rank):
            self.perform(self._serve(message, now))
            return
        size = self.topology.size
        if not 0 <= target < size:
            why = f"no rank {target} in this instance of size {size}"
            self.respond(message.fail(errno.ENOENT, why))
            return
        if self.table is not None and not message.topic.startswith("group."):
            # the root group's own messages go by the links alone: a standby's hello is not in
            # the table until the group commits it, which needs that standby's answer
            state = self.table.entry(target).state
            if state not in CONNECTED:
                self.respond(message.fail(errno.EHOSTUNREACH, f"rank {target} is {state}"))
                return
            if not self.table.reachable(target):
                why = f"rank {target} is reattaching to the tree"
                self.respond(message.fail(errno.EHOSTUNREACH, why))
                return
        hop = self.topology.next_hop(self.rank, target)
        if hop == self.topology.parent(self.rank):
            across = self._attached_across(target)
            if across is None or not self.send_down(across, message):
                self._send_up(message)
            return
        below = self._attached_toward(target, hop)
        if self.send_down(below, message):
            return
        if self.parent is not None and parent_hop(message.route[-1]) is None:
            self._send_up(message)  # attached above us (fostered past a broker that went)
            return
        self.respond(message.fail(errno.EHOSTUNREACH, unreachable(target, hop)))

    @property
    def root(self) -> int:
        """Where a request for the table goes: rank 0, or the root of a later term this broker
        knows of (after a takeover, docs/protocol.md §13.4)."""
        root = self.terms.root
        return root if root is not None and self.terms.term > 1 else 0

    def _send_up(self, message: Message) -> None:
        parent = self.parent
        if parent is None:  # the root that took over: its parent was the dead root
            why = f"rank {self.rank} is the root: no rank {message.nodeid} above it"
            self.respond(message.fail(errno.EHOSTUNREACH, why))
            return
        if not parent.welcomed:
            why = f"rank {self.rank} is reattaching to the tree: its parent was lost"
            self.respond(message.fail(errno.EHOSTUNREACH, why))
            return
        parent.send(message)

    def hop_down(self, target: int) -> int:
        """The broker attached here that a message for `target` goes to: the deepest on the
        way that is attached here, else the child the topology names. For a rank not below
        this broker (a root that took over, exec's fan-out), as `route` finds it: a foster
        child across the dead root, or the way its requests came up (§13.4). Asked once per
        target of an exec: with no foster child here (`fosters` is kept, not found), the
        topology's hop at once."""
        children = self.children
        if children is None or not children.fosters:
            return self.topology.next_hop(self.rank, target)  # only the topology's children
        hop = self.topology.next_hop(self.rank, target)
        if hop == self.topology.parent(self.rank):
            across = self._attached_across(target)
            return hop if across is None else across
        return self._attached_toward(target, hop)

    def hops_down(self, targets: list[int]) -> dict[int, list[int]]:
        """`targets` (none of them this broker) grouped by `hop_down`: rank 0 splits each exec
        request's thousand targets so, in one loop of the topology's when no foster child is
        attached here (where hop_down is the topology's hop), else one hop_down per target."""
        children = self.children
        if children is None or not children.fosters:
            return self.topology.split_below(self.rank, targets)
        return grouped(targets, self.hop_down)

    def _learn_across(self, route: list[str]) -> None:
        """A broker's own request that came up by a child not below this broker (a member
        fostered across the dead root, §13.4): that child is the way back down to its sender,
        however deep below it (a member fostered by another member)."""
        via = child_hop(route[-1])
        if via is None or is_below(self.topology, via, self.rank) or route[0] != "s":
            return
        sender = child_hop(route[1]) if len(route) > 2 else via
        if sender is not None:
            self._across[sender] = via

    def _attached_across(self, target: int) -> int | None:
        """The foster child attached here on `target`'s way up though not below this broker: the
        rank itself or an ancestor of it, attached here; else the one `target`'s own requests
        came up by (a root group member fostered by another across the dead root,
        docs/protocol.md §13.4), which is older news: the member may have moved here since.
        None if there is none (then the parent is the way)."""
        children = self.children
        if children is None or not children.fosters:
            return None
        current: int | None = target
        while current is not None:  # attached here itself, or by an ancestor: that link first
            if children.attached(current) and not is_below(self.topology, current, self.rank):
                return current
            current = self.topology.parent(current)
        via = self._across.get(target)  # learned while it hung under another member: may be old
        if via is not None and children.attached(via):
            return via
        return None

    def _attached_toward(self, target: int, hop: int) -> int:
        """`hop_down`, given the child `hop` the topology names."""
        children = self.children
        if children is None or not children.fosters:
            return hop  # only children in the topology are attached here
        current: int | None = target
        while current is not None and current != self.rank:
            if children.attached(current):
                return current
            current = self.topology.parent(current)
        return hop

    def _serve(self, request: Message, now: float) -> list[Action]:
        refused, news = unless_current(self.terms, request, self.rank)
        if news:
            self.on_terms(news)
        if refused is not None:
            return refused
        handler = self.handlers.get(request.topic)
        if handler is None:
            return _answer(request.fail(errno.ENOSYS, f"unknown request {request.topic!r}"))
        try:
            return handler(request, now)
        except Exception as error:  # a request we could not serve never stops a broker
            log.error("request %r failed: %s: %s", request.topic, type(error).__name__, error)
            return _answer(request.fail(errno.EPROTO, f"{request.topic}: internal error"))

    def send_down(self, child: int, message: Message) -> bool:
        return self.children is not None and self.children.send(child, message)

    def call(self, request: Message, then: Continuation, now: float) -> None:
        """Send a request of this broker's own; `then` gets the response, or ETIMEDOUT."""
        tag = int.from_bytes(os.urandom(6), "big") or 1
        request.tag = tag
        if request.topic in self.root_topics and request.nodeid == ANY_RANK:
            request.nodeid = self.root
        link = self._link_toward(request.nodeid)
        self._pending[tag] = Pending(then, link, now + self.call_timeout, request.topic)
        self.route(request, "s", now)

    def _link_toward(self, target: int) -> str:
        """The link a request for `target` leaves by: "p", "c<rank>", or HERE."""
        if target == self.rank or not 0 <= target < self.topology.size:
            return HERE
        hop = self.topology.next_hop(self.rank, target)
        if hop == self.topology.parent(self.rank):
            across = self._attached_across(target)
            return "p" if across is None else f"c{across}"
        return f"c{self._attached_toward(target, hop)}"

    def _came_back_by(self, link: str, came_from: str) -> bool:
        """Whether a response that came by `came_from` came back by the link its request left
        by: the parent link (whichever parent it is attached to now), or that child's subtree
        (a foster child, attached here after the child that went)."""
        if came_from in (link, HERE) or (link == "p" and parent_hop(came_from) is not None):
            return True
        sent_to, child = child_hop(link), child_hop(came_from)
        return sent_to is not None and child is not None and is_below(self.topology, child, sent_to)

    def next_deadline(self) -> float | None:
        if not self._pending:  # asked every busy turn: most have no call of their own out
            return None
        return min((p.deadline for p in self._pending.values()), default=None)

    def expire(self, now: float) -> None:
        """Fail every call whose answer is overdue."""
        for tag, pending in list(self._pending.items()):
            if now >= pending.deadline and self._pending.pop(tag, None) is not None:
                late = Message(Kind.RESPONSE, pending.topic, tag=tag)
                late.errnum, late.errstr = errno.ETIMEDOUT, f"{pending.topic}: no answer in time"
                self.perform(pending.then(late, now))

    def send(self, request: Message) -> None:
        """Send a one-way request of this broker's own: no tag, no answer awaited."""
        self.route(request, "s", time.monotonic())

    def respond(self, reply: Message, came_from: str = HERE, gather: bool = True) -> bool:
        """Send `reply` one hop back along its route; False if that hop is gone. `came_from`
        is the link a response arrived by (HERE: made by this broker). An answer to exec.start
        on its way up (made here, or from a child) may be held instead, to go on merged with
        others (`gather`; False for what was merged here)."""
        if not reply.route:
            return False
        if (
            gather
            and reply.streaming
            and reply.topic == "exec.start"
            and (came_from == HERE or came_from.startswith("c"))
        ):
            instead = self.gather(reply, time.monotonic())
            if instead is not None:
                self.perform(instead)
                return True
        hop = reply.route.pop()
        if hop == "s":
            pending = self._pending.get(reply.tag)
            if pending is None:
                return False
            if not self._came_back_by(pending.link, came_from):
                log.warning(
                    "dropped an answer to %s from %s: it went out to %s",
                    pending.topic,
                    came_from,
                    pending.link,
                )
                return False
            del self._pending[reply.tag]
            if news := learned_from(self.terms, reply):
                self.on_terms(news)
            self.perform(pending.then(reply, time.monotonic()))
            return True
        if (parent := parent_hop(hop)) is not None:
            if self.parent is None:  # the root now, that had a parent: a takeover
                return self._up_past(reply, came_from)
            return self.parent.send_response(reply, parent)
        if (child := child_hop(hop)) is not None:
            return self.send_down(child, reply) or self._down_past(child, reply)
        if hop.startswith("l"):
            if self.local.send(hop, reply):
                self.on_local_response(hop, reply)
                return True
            if reply.streaming and not last_word(reply):
                self.client_gone(hop, reply.nodeid)
        return False

    def _up_past(self, reply: Message, came_from: str) -> bool:
        """A response whose way back runs up through the root this broker took over from
        (docs/protocol.md §13.4): a request that went up to it and came down again (exec's
        fan-out from the top). The hop that root pushed names the child it came from: this
        broker (the response is back where its way turned down), or another child, sent down
        to if it is attached here now. Anything else (a client of the dead root, its own
        request) went with it."""
        below = child_hop(reply.route[-1]) if reply.route else None
        if below is None:
            return False
        if below == self.rank:
            reply.route.pop()
        return self.respond(reply, came_from)

    def _down_past(self, gone: int, reply: Message) -> bool:
        """A response for child `gone`, which is not attached here: if the child its broker got
        the request from is (a foster child now), take off the hop `gone` pushed and send it
        there. Each "c<rank>" under the top names the child before it."""
        children = self.children
        for _ in range(len(reply.route)):
            if children is None or not reply.route:
                return False
            below = child_hop(reply.route[-1])
            if below is None or not is_below(self.topology, below, gone):
                return False
            reply.route.pop()
            if children.attached(below):
                return self.send_down(below, reply)
            gone = below
        return False

    def client_gone(self, hop: str, origin: int) -> None:
        """Tell the rank serving a stream that its client went away, along the stream's route."""
        if (hop, origin) in self._gone:
            return
        self._gone.add((hop, origin))
        notice = Message(Kind.REQUEST, "client.disconnect", nodeid=origin, route=[hop])
        self.request(notice, time.monotonic())

    def forget_client(self, hop: str) -> None:
        """A local client's connection closed: tell rank 0, and forget it (ids are not soon
        reused)."""
        self.client_gone(hop, 0)
        self._gone = {(h, r) for h, r in self._gone if h != hop}


def _answer(reply: Message) -> list[Action]:
    return [Respond(reply)]
