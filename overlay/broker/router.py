"""The router: moves messages between a broker's links and its services.

A request names its destination rank (`nodeid`). One addressed to this broker is handed to the
service its topic maps to in one table; an unknown topic is answered ENOSYS. Any other request
goes one hop on: to the parent, or to the child whose subtree holds the target. On the way, each
broker pushes onto the request's route the hop it came from ("p" the parent, "c<rank>" a child,
"l<id>" a local client, "s" this broker itself), and a response retraces the route, popping one
hop per broker. A request this broker makes itself with a continuation (a Call) gets a tag, and
its response is handed to that continuation instead of being sent anywhere.
"""

from __future__ import annotations

import errno
import itertools
import logging
import time
from collections.abc import Callable

from tbon.overlay.links.children import Children
from tbon.overlay.links.local import LocalServer
from tbon.overlay.links.parent import ParentLink
from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.exec import unreachable
from tbon.overlay.state.ranktable import CONNECTED, RankTable
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import ANY_RANK, Kind, Message

log = logging.getLogger("tbon.broker")

Handler = Callable[[Message, float], list[Action]]
Continuation = Callable[[Message, float], list[Action]]


class Router:
    def __init__(
        self,
        rank: int,
        topology: Topology,
        table: RankTable | None,
        links: tuple[ParentLink | None, Children | None, LocalServer],
        handlers: dict[str, Handler],
        root_topics: frozenset[str],
        perform: Callable[[list[Action]], None],
        on_local_request: Callable[[str, Message], None],
    ) -> None:
        """`handlers` maps each topic this broker serves to its service; `root_topics` are the
        topics a request without a rank (ANY_RANK) sends to rank 0; `perform` carries out what a
        handler or a continuation returns; `on_local_request` sees each request of a local
        client first, with the client's hop."""
        self.rank = rank
        self.topology = topology
        self.table = table
        self.parent, self.children, self.local = links
        self.handlers = handlers
        self.root_topics = root_topics
        self.perform = perform
        self.on_local_request = on_local_request
        self._pending: dict[int, Continuation] = {}
        self._tags = itertools.count(1)
        self._gone: set[tuple[str, int]] = set()  # (client hop, rank) told the client left

    def route(self, message: Message, came_from: str, now: float) -> None:
        if message.kind is Kind.REQUEST:
            if came_from.startswith("l"):
                self.on_local_request(came_from, message)
            message.route.append(came_from)
            self.request(message, now)
        elif message.kind is Kind.RESPONSE:
            self.respond(message)
        else:
            log.warning("dropped a %s message %r from %s", message.kind, message.topic, came_from)

    def request(self, message: Message, now: float) -> None:
        if message.topic in self.root_topics and message.nodeid == ANY_RANK:
            message.nodeid = 0
        target = message.nodeid
        if target in (ANY_RANK, self.rank):
            self.perform(self._serve(message, now))
            return
        size = self.topology.size
        if not 0 <= target < size:
            why = f"no rank {target} in this instance of size {size}"
            self.respond(message.fail(errno.ENOENT, why))
            return
        if self.table is not None:
            state = self.table.entry(target).state
            if state not in CONNECTED:
                self.respond(message.fail(errno.EHOSTUNREACH, f"rank {target} is {state}"))
                return
        hop = self.topology.next_hop(self.rank, target)
        if hop == self.topology.parent(self.rank):
            assert self.parent is not None
            self.parent.send(message)
        elif not self.send_down(hop, message):
            self.respond(message.fail(errno.EHOSTUNREACH, unreachable(target, hop)))

    def _serve(self, request: Message, now: float) -> list[Action]:
        handler = self.handlers.get(request.topic)
        if handler is None:
            return _answer(request.fail(errno.ENOSYS, f"unknown request {request.topic!r}"))
        try:
            return handler(request, now)
        except Exception as error:  # a request we could not serve never stops a broker
            log.error("request %r failed: %r", request.topic, error)
            return _answer(request.fail(errno.EPROTO, f"{request.topic}: internal error"))

    def send_down(self, child: int, message: Message) -> bool:
        return self.children is not None and self.children.send(child, message)

    def call(self, request: Message, then: Continuation) -> None:
        """Send a request of this broker's own; `then` gets the response."""
        request.tag = next(self._tags)
        self._pending[request.tag] = then
        self.route(request, "s", time.monotonic())

    def send(self, request: Message) -> None:
        """Send a one-way request of this broker's own: no tag, no answer awaited."""
        self.route(request, "s", time.monotonic())

    def respond(self, reply: Message) -> bool:
        """Send `reply` one hop back along its route; False if that hop is gone."""
        if not reply.route:
            return False
        hop = reply.route.pop()
        if hop == "s":
            then = self._pending.pop(reply.tag, None)
            if then is None:
                return False
            self.perform(then(reply, time.monotonic()))
            return True
        if hop == "p" and self.parent is not None:
            self.parent.send(reply)
            return True
        if hop.startswith("c") and is_decimal(hop[1:]):
            return self.send_down(int(hop[1:]), reply)
        if hop.startswith("l"):
            if self.local.send(hop, reply):
                return True
            if reply.streaming:
                self.client_gone(hop, reply.nodeid)
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
