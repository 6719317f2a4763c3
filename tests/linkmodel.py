"""A pure simulation of an instance's links, for tests/test_link_model.py: no sockets, no processes,
a clock the test moves.

Each broker is a `Node` built from the real pieces a broker is built from: its `Uplink` (around
the `Upward` machine) over `ParentLink`s, its `Children` (around `Downward`, with the real hello
judge and KeyRing), its `Router`, `Performer`, heal and FLUB services, and at rank 0 the real
`RankTable` behind `RankPath`. Only the sockets are replaced: a `Wire` stands for one connection
from a child's DEALER to a parent's ROUTER, with an in-order queue each way. The frames on it are
the real encoded messages; what a socket monitor would report (an accept, a close, a key refused
at the CURVE handshake) travels in the same queues, in order. The glue that the real broker has
around these pieces (broker/broker.py: `_read_children`, `_read_parent`, `_uplink_news`,
`_timers`, `report`, `_send_reports`) is mirrored in `Node`, line for line where it matters.

What is abstracted away, plainly:
- The CURVE handshake is one step: the parent's KeyRing admits the child's key (the connection is
  accepted) or not (the child's monitor says so). ZAP runs in the parent's loop, so a stopped
  parent answers no handshake.
- A parent reads its children's messages only once it admits children (first welcomed), as
  broker.py means to; see the report about its monitor handler.
- Link buffers are unbounded: no link fills up (no `full` losses, no HWM drops).
- Closing with linger 0 drops everything the closing side had not yet delivered; a killed process
  loses nothing it had sent. A connection's close reaches the peer after what was sent before it.
- Time moves only when the test says: deliveries take no time, and before each step of the clock
  every deliverable message is delivered (a broker reads its queue before judging silence).
  So reports are batched per turn (what one read brought goes up as one report, rank 0 applies
  it in one pass), without broker.py's interval between two reports, which is time.
- No jobs, no local clients but the FLUB joiners' answers, no shutdown, no retire, no config
  bootstrap (shared keys, rejoins).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import zmq
from zmq.utils import z85

from tbon.overlay.broker import perform as perform_module
from tbon.overlay.broker import router as router_module
from tbon.overlay.broker.perform import Performer
from tbon.overlay.broker.router import Router
from tbon.overlay.links import children as children_module
from tbon.overlay.links import parent as parent_module
from tbon.overlay.links import zmqio
from tbon.overlay.links.children import Children
from tbon.overlay.links.keyring import Identity, KeyRing
from tbon.overlay.links.liveness import Liveness
from tbon.overlay.links.parent import ParentLink
from tbon.overlay.links.uplink import Uplink, UplinkNews, seeking_seconds
from tbon.overlay.links.upward import Card
from tbon.overlay.services.actions import Action, Apply, ApplyAll, Send
from tbon.overlay.services.flub import FlubService
from tbon.overlay.services.heal import HealService
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.rankpath import Applied, RankPath
from tbon.overlay.state.ranktable import Event, Online, RankTable, Reserve
from tbon.overlay.state.reports import Batcher, encode_events
from tbon.overlay.state.terms import Terms
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message, decode

HEARTBEAT = 1.0
TIMEOUT = 5.0
REATTACH = 5.0
JOIN_TIMEOUT = 30.0
STEP = 0.25
"""The clock moves by at most this much between two rounds of timers."""

MONITOR = struct.Struct("=HI")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@contextmanager
def model_time(clock: Clock) -> Iterator[None]:
    """The modules that read the time themselves read the model's clock meanwhile, and the one
    call into libzmq that takes no fake socket (zmqio's zmq_poll, in readable()) asks the fakes'
    queues."""
    fake = SimpleNamespace(monotonic=clock.monotonic)
    modules = (router_module, perform_module, children_module, parent_module)
    saved = [module.time for module in modules]
    for module in modules:
        module.time = fake  # type: ignore[attr-defined]
    real_poll = zmqio.zmq_poll
    zmqio.zmq_poll = _poll_fakes  # type: ignore[assignment]
    try:
        yield
    finally:
        zmqio.zmq_poll = real_poll  # type: ignore[assignment]
        for module, was in zip(modules, saved, strict=True):
            module.time = was  # type: ignore[attr-defined]


def _poll_fakes(items: Sequence[tuple[Any, int]], timeout: int = -1) -> list[tuple[Any, int]]:
    """zmq_poll(items, 0) for the model's sockets: those with a message waiting."""
    return [(sock, zmq.POLLIN) for sock, _ in items if sock.inbox or sock._reading]


def key_of(bid: int) -> str:
    return z85.encode(bid.to_bytes(32, "big")).decode()


class Frame:
    """What recv_multipart(copy=False) gives: bytes, a buffer, and properties."""

    def __init__(self, data: bytes, props: dict[Any, Any] | None = None) -> None:
        self.bytes = data
        self.buffer = memoryview(data)
        self._props = props or {}
        self.more = False  # whether another frame of its message follows (FakeRouter.recv)

    def get(self, name: Any) -> Any:
        return self._props[name]

    def __len__(self) -> int:
        return len(self.bytes)


class FrameByFrame:
    """recv and send one frame a call, as links/zmqio.py calls them: a message is taken from
    `inbox` whole (each frame saying whether more follow), and given to send_multipart whole."""

    inbox: deque[list[Any]]

    def __init__(self) -> None:
        self._reading: deque[Frame] = deque()  # the rest of a message recv is reading
        self._sending: list[Any] = []  # the frames of a message send is writing

    def recv(self, flags: int = 0, copy: bool = True) -> Frame:
        if not self._reading:
            if not self.inbox and flags & zmq.NOBLOCK:
                raise zmq.Again()
            frames = [f if isinstance(f, Frame) else Frame(f) for f in self.inbox.popleft()]
            for i, frame in enumerate(frames):
                frame.more = i < len(frames) - 1
            self._reading.extend(frames)
        return self._reading.popleft()

    def send(self, data: Any, flags: int = 0, copy: bool = True) -> None:
        self._sending.append(data)
        if not flags & zmq.SNDMORE:
            frames, self._sending = self._sending, []
            self.send_multipart(frames, flags)

    def send_multipart(self, frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
        raise NotImplementedError


class FakeMonitor(FrameByFrame):
    def __init__(self) -> None:
        super().__init__()
        self.inbox: deque[list[bytes]] = deque()

    def push(self, event: int, fd: int) -> None:
        self.inbox.append([MONITOR.pack(event, fd), b"tcp://model"])

    def poll(self, timeout: int = 0) -> bool:
        return bool(self.inbox)

    def get(self, option: int) -> int:
        assert option == zmq.EVENTS
        return zmq.POLLIN if self.inbox else 0

    def recv_multipart(self) -> list[bytes]:
        return self.inbox.popleft()

    def close(self, linger: int = 0) -> None:
        self.inbox.clear()


Item = tuple[str, Any]
"""On a wire: ("knock", None) the handshake, ("msg", frames), ("closed", None) the connection's
close as the parent's monitor sees it; to the child: ("msg", frames), ("refused", None) its key
refused at the handshake, ("dropped", None) the parent's end went."""


@dataclass(eq=False)
class Wire:
    """One connection from a child's DEALER to a parent's ROUTER."""

    fd: int
    child: Node
    parent: Node
    to_parent: deque[Item] = field(default_factory=deque)
    to_child: deque[Item] = field(default_factory=deque)
    accepted: bool = False
    user_id: str = ""
    child_closed: bool = False
    parent_closed: bool = False
    partitioned: bool = False  # nothing gets through, either way, until healed
    broken: bool = False  # the connection dropped under both ends (a reset)
    link: SimParentLink | None = None

    @property
    def open(self) -> bool:
        return self.accepted and not (self.child_closed or self.parent_closed or self.broken)

    @property
    def routing_id(self) -> bytes:
        return f"w{self.fd}".encode()

    def closed_by_child(self, keep: bool) -> None:
        """The child closed its end (`keep`: what it sent still leaves) or died."""
        if self.child_closed:
            return
        self.child_closed = True
        self.to_child.clear()
        if self.broken:
            return
        if not self.accepted or not keep:
            self.to_parent.clear()
        if self.accepted and not self.parent_closed:
            self.to_parent.append(("closed", None))

    def closed_by_parent(self) -> None:
        if self.parent_closed:
            return
        self.parent_closed = True
        self.to_parent.clear()
        if self.accepted and not self.broken and not self.child_closed:
            self.to_child.append(("dropped", None))

    def reset(self) -> None:
        """The connection drops under both ends (a reset): what was in flight is lost, and each
        end's monitor says so. The child's DEALER would connect again, but says no second hello
        on it: its end of the link is over."""
        if not self.open:
            return
        self.broken = True
        self.to_parent.clear()
        self.to_child.clear()
        self.to_parent.append(("closed", None))
        self.to_child.append(("dropped", None))


class FakeDealer(FrameByFrame):
    def __init__(self, wire: Wire) -> None:
        super().__init__()
        self.wire = wire
        self.inbox: deque[list[Frame]] = deque()
        self.linger = 1000  # ParentLink's: the shutdown timeout

    def send_multipart(self, frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
        wire = self.wire
        if not (wire.child_closed or wire.parent_closed or wire.broken):
            wire.to_parent.append(("msg", [bytes(f) for f in frames]))

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[Frame]:
        if not self.inbox and flags & zmq.NOBLOCK:
            raise zmq.Again()
        return self.inbox.popleft()

    def poll(self, timeout: int = 0) -> bool:
        return bool(self.inbox)

    def get(self, option: int) -> int:
        assert option == zmq.EVENTS
        return zmq.POLLIN if self.inbox else 0

    def disable_monitor(self) -> None:
        pass

    def close(self, linger: int | None = None) -> None:
        self.wire.closed_by_child(keep=linger != 0 and self.linger != 0)


class SimParentLink(ParentLink):
    """A ParentLink whose DEALER is a Wire: its reads, heartbeats and silences are the real ones."""

    def __init__(self, node: Node, wire: Wire, peer: int, incarnation: int, now: float) -> None:
        self.rank = node.rank
        self.peer = peer
        self.shared_key = False
        self.quiet = False
        self.incarnation = incarnation
        self.config = node.config
        self.overflow = None
        self.socket = FakeDealer(wire)  # type: ignore[assignment]
        self.monitor = FakeMonitor()  # type: ignore[assignment]
        self.welcomed = False
        self.handshaken = True  # the model's handshake is one step, done as the wire opens
        self._last_sent = now
        self.answered = False
        self.endpoint = wire.parent.endpoint
        self._liveness = Liveness(0, node.config.timeout, now)
        hello = {
            "rank": node.rank,
            "incarnation": incarnation,
            "version": PROTOCOL_VERSION,
            "hostname": node.host,
            "pid": node.bid,
        }
        self.send(Message(Kind.CONTROL, "hello", hello))


class FakeRouter(FrameByFrame):
    """A parent's ROUTER: sends go down the wire its routing id names."""

    def __init__(self, node: Node) -> None:
        super().__init__()
        self.node = node
        self.inbox: deque[list[Frame]] = deque()

    def send_multipart(self, frames: Sequence[Any], flags: int = 0, copy: bool = True) -> None:
        routing_id, *rest = (bytes(f) for f in frames)
        wire = self.node.net.by_routing.get(routing_id)
        if wire is None or wire.parent is not self.node or not wire.open:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        message = decode(rest)
        if message.topic == "welcome":
            self.node.net.welcomed(self.node, message.payload)
        wire.to_child.append(("msg", rest))

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[Frame]:
        if not self.inbox and flags & zmq.NOBLOCK:
            raise zmq.Again()
        return self.inbox.popleft()

    def poll(self, timeout: int = 0) -> bool:
        return bool(self.inbox)

    def get(self, option: int) -> int:
        assert option == zmq.EVENTS
        return zmq.POLLIN if self.inbox else 0


class SimChildren(Children):
    """Children whose ROUTER and monitor are the model's; everything else is the real adapter."""

    @staticmethod
    def build(node: Node) -> SimChildren:
        children = SimChildren.__new__(SimChildren)
        children._start(node.rank, node.net.topology, node.config)  # type: ignore[arg-type]
        children.keyring = KeyRing()
        children.zap = SimpleNamespace(refusals=[])  # type: ignore[assignment]
        children._full = set()
        children.socket = FakeRouter(node)  # type: ignore[assignment]
        children.monitor = FakeMonitor()  # type: ignore[assignment]
        return children


class FakeLocal:
    """Rank 0's local clients: only FLUB joiners, whose answers start their brokers."""

    def __init__(self, net: Net) -> None:
        self.net = net

    def send(self, hop: str, message: Message) -> bool:
        self.net.joiner_answered(hop, message)
        return True


class WatchedPath(RankPath):
    """Rank 0's one path, with the revocations it orders noted for the oracle."""

    def __init__(self, table: RankTable, net: Net) -> None:
        super().__init__(table)
        self.net = net

    def handle(self, event: Event | Reserve, now: float) -> Applied:
        applied = super().handle(event, now)
        self.net.log.append(f"{now:.2f} rank0 {event!r} -> {applied.outcome.reason or 'ok'}")
        for action in applied.actions:
            if isinstance(action, Send) and action.message.topic == "flub.revoke":
                payload = action.message.payload
                self.net.revoked.add((payload["rank"], payload["incarnation"]))
        return applied


class Node:
    """One broker: the real pieces, and broker.py's glue between them."""

    def __init__(self, net: Net, bid: int, rank: int, incarnation: int) -> None:
        self.net = net
        self.bid = bid
        self.rank = rank
        self.incarnation = incarnation
        self.key = key_of(bid)
        self.host = f"host{bid}"
        self.endpoint = f"tcp://node{bid}:7000"
        self.alive = True
        self.running = True
        self.ended: tuple[int, str] | None = None
        self.admitting = rank == 0
        self.config = SimpleNamespace(
            heartbeat=HEARTBEAT,
            torpid=0.0,
            timeout=TIMEOUT,
            hostname=self.host,
            shutdown_timeout=1.0,
            handshake_timeout=5.0,
        )
        topology = net.topology
        self.children = SimChildren.build(self) if topology.children(rank) else None
        self.uplink: Uplink | None = None
        self.table: RankTable | None = None
        self.path: RankPath | None = None
        card = {"endpoint": self.endpoint, "public_key": self.key, "hostname": self.host}
        self.lifecycle = Lifecycle()
        self.heal = HealService(rank, topology, card)
        self.flub: FlubService | None = None
        self.served: list[tuple[str, dict[str, Any]]] = []  # rank 0's orders, as served here

    def start(self, parent_card: Card | None, table: RankTable | None = None) -> None:
        """Open the first link (bootstrap's, or a joiner's) and build the router and performer."""
        net = self.net
        self.terms = Terms(self.rank, leading=self.rank == 0)  # one per broker, as broker.py
        if parent_card is not None:
            first = net.open_link(self, parent_card, self.incarnation)
            self.uplink = Uplink(
                first, net.open_link_for(self), REATTACH, _ignore, _ignore, self.terms
            )
        if table is not None:
            self.table = table
            self.path = WatchedPath(table, net)
        card = {"endpoint": self.endpoint, "public_key": self.key, "hostname": self.host}
        attributes = {"broker.join-timeout": JOIN_TIMEOUT}
        topology = net.topology
        self.flub = FlubService(self.rank, topology, self.table, self.lifecycle, card, attributes)
        handlers = {
            "flub.authorize": self._served(self.flub.authorize),
            "flub.revoke": self._served(self.flub.revoke),
            "heal.foster": self._served(self.heal.foster),
            "heal.adopt": self._served(self.heal.adopt),
            "heal.withdraw": self._served(self.heal.withdraw),
            "heal.home": self._served(self.heal.home),
        }
        if self.table is not None:
            handlers["flub.allocate"] = self.flub.allocate
        links = (self.uplink, self.children, FakeLocal(net))
        self.router = Router(
            self.rank,
            topology,
            self.table,
            links,  # type: ignore[arg-type]
            handlers,
            frozenset({"flub.allocate"}),
            self.perform,
            lambda hop, message: None,
            call_timeout=JOIN_TIMEOUT,
            terms=self.terms,
        )
        self.performer = Performer(
            self.rank,
            self,
            self.router,
            self.children,
            SimpleNamespace(),  # type: ignore[arg-type]
            None,
            self.path,
        )
        if self.children is not None:
            self.children.terms = self.terms
            self.children.lineage = [self.card()] if self.rank == 0 else []
            if self.uplink is not None:
                self.children.seeking_for = self.uplink.seeking_for
        self.reports = Batcher(interval=0.0)  # a report per turn: see the module's docstring
        if self.rank == 0:
            self.perform([Apply(Online(0, 1, self.host, self.bid))])

    def _served(self, handler: Any) -> Any:
        def served(request: Message, now: float) -> list[Action]:
            self.served.append((request.topic, dict(request.payload)))
            assert request.term == 1, f"{request.topic} without the root's term"  # §13.3
            return handler(request, now)

        return served

    def card(self) -> list[Any]:
        return [self.rank, self.endpoint, self.key]

    def __repr__(self) -> str:
        state = "dead" if not self.alive else ("up" if self.running else "stopped")
        machine = type(self.uplink.machine.state).__name__ if self.uplink else "root"
        return f"<broker {self.bid} rank {self.rank}.{self.incarnation} {state} {machine}>"

    # --- what the performer asks of the loop (broker.py) --------------------------------------

    def perform(self, actions: list[Action]) -> None:
        self.performer.perform(actions)

    def report(self, events: Sequence[Event], now: float) -> None:
        """As broker.py: rank 0 applies a report in one pass; the others hold it (Batcher) for
        the end of this turn."""
        if not self.alive or not events:
            return
        if self.path is not None:
            self.perform([ApplyAll(events)])
            return
        self.reports.add(events, now)

    def send_reports(self, now: float) -> None:
        """broker.py's _send_reports, after each turn: what is due goes up."""
        if not self.alive or self.uplink is None:
            return
        for batch in self.reports.take(now):
            self.uplink.send(Message(Kind.CONTROL, "report", encode_events(batch)))

    def wake(self) -> None:
        pass

    def go_home(self, card: tuple[int, str, str]) -> str:
        if self.uplink is None:
            return "rank 0 has no parent"
        now = self.net.clock.now
        news = self.uplink.move_home(card, now)
        self.uplink_news(news, now)
        return news.declined

    def shut_down(self, end_program: bool, now: float) -> None:
        raise AssertionError("the model has no shutdown")

    def leave(self, exit_code: int) -> None:
        raise AssertionError("the model has no retire")

    # --- input, as broker.py reads it ------------------------------------------------------

    def uplink_news(self, news: UplinkNews, now: float) -> None:
        uplink = self.uplink
        assert uplink is not None
        if news.attached:
            self.incarnation = uplink.incarnation
            if news.first:
                self.admitting = True
            elif self.children is not None:
                self.report(self.children.census(), now)  # as broker.py: up a new link
        if news.lineage and self.children is not None:
            self.children.lineage = [*map(list, uplink.lineage), self.card()]
            self.children.send_lineage()
        if news.seeking_until is not None and self.children is not None:
            seeking = Message(
                Kind.CONTROL, "seeking", {"for": seeking_seconds(news.seeking_until, now)}
            )
            for rank in self.children.connected():
                self.children.send(rank, seeking)
        if news.ended is not None:
            self.net.end(self, news.ended.exit_code, news.ended.reason)
            return
        assert not news.shutdown and news.retire is None
        for message in news.messages:
            self.router.route(message, f"p{news.peer}", now)

    def read_parent(self, link: SimParentLink, now: float) -> None:
        uplink = self.uplink
        assert uplink is not None
        while self.alive and uplink.holds(link) and link.socket.poll(0):
            news = uplink.read(link, now)
            if news is not None:
                self.uplink_news(news, now)
        self.send_reports(now)

    def read_parent_monitor(self, link: SimParentLink, now: float) -> None:
        assert self.uplink is not None
        self.uplink_news(self.uplink.monitor(link, now), now)
        self.send_reports(now)

    def read_children(self, now: float) -> None:
        children = self.children
        assert children is not None
        children.drain_monitor()
        while self.alive and children.socket.poll(0):
            inbound = children.read(now)
            self.report(inbound.reports, now)
            assert not inbound.rejoins
            for child, message in inbound.messages:
                if self.alive:
                    self.router.route(message, f"c{child}", now)
        if self.alive:
            self.report(children.settle(), now)
        self.send_reports(now)

    def timers(self, now: float) -> None:
        """broker.py's _timers: the children's clock, the links up, calls, leases, adrift."""
        if self.children is not None:
            self.report(self.children.tick(now), now)
        if self.uplink is not None and self.alive:
            self.uplink_news(self.uplink.tick(now), now)
        if not self.alive:
            return
        self.router.expire(now)
        if self.table is not None and self.flub is not None:
            self.perform(self.flub.expire(now))
            self.report(self.table.adrift(now), now)
        self.send_reports(now)


def _ignore(link: ParentLink) -> None:
    pass


class Net:
    """The instance: its brokers, the wires between them, and the clock."""

    def __init__(self, size: int, clock: Clock) -> None:
        self.clock = clock
        self.topology = Topology("kary:2", size)
        self.nodes: list[Node] = []
        self.wires: list[Wire] = []
        self.by_endpoint: dict[str, Node] = {}
        self.by_routing: dict[bytes, Wire] = {}
        self.joiners: dict[str, tuple[int, str]] = {}  # FLUB: client hop -> (bid, key)
        self.revoked: set[tuple[int, int]] = set()  # (rank, incarnation) rank 0 revoked
        self.welcomes: list[tuple[float, int, int, int]] = []  # (time, parent bid, rank, inc)
        self.bad_welcomes: list[str] = []
        self.log: list[str] = []
        self._next_bid = 100  # a broker's id, its pid and the root of its key
        self._next_fd = 3
        launched = [self._node(rank, 1) for rank in range(size)]
        hosts = [node.host for node in launched]
        for node in launched:  # bootstrap authorizes every child's key before any hello
            if node.children is not None:
                for child in self.topology.children(node.rank):
                    node.children.authorize(child, 1, launched[child].key)
        table = RankTable(self.topology, hosts, self.clock.now, reattach_grace=TIMEOUT + REATTACH)
        launched[0].start(None, table)
        for node in launched[1:]:
            parent = launched[self.topology.parent(node.rank) or 0]
            node.start(tuple(parent.card()))  # type: ignore[arg-type]

    def _node(self, rank: int, incarnation: int) -> Node:
        node = Node(self, self._next_bid, rank, incarnation)
        self._next_bid += 1
        self.nodes.append(node)
        self.by_endpoint[node.endpoint] = node
        return node

    @property
    def root(self) -> Node:
        return self.nodes[0]

    @property
    def table(self) -> RankTable:
        table = self.root.table
        assert table is not None
        return table

    # --- links --------------------------------------------------------------------------------

    def open_link(self, node: Node, card: Card, incarnation: int) -> SimParentLink:
        parent = self.by_endpoint[card[1]]
        wire = Wire(self._next_fd, node, parent)
        self._next_fd += 1
        self.wires.append(wire)
        self.by_routing[wire.routing_id] = wire
        if parent.alive:
            wire.to_parent.append(("knock", None))
        else:
            wire.parent_closed = True  # nobody listens there: the hello goes unanswered
        wire.link = SimParentLink(node, wire, card[0], incarnation, self.clock.now)
        return wire.link

    def open_link_for(self, node: Node) -> Any:
        return lambda card, incarnation: self.open_link(node, card, incarnation)

    def welcomed(self, parent: Node, payload: dict[str, Any]) -> None:
        """A parent sent a welcome: noted, and held against the revocations it was sent."""
        rank, incarnation = payload["rank"], payload["incarnation"]
        self.welcomes.append((self.clock.now, parent.bid, rank, incarnation))
        for topic, order in parent.served:
            if topic == "flub.revoke" and (order["rank"], order["incarnation"]) == (
                rank,
                incarnation,
            ):
                self.bad_welcomes.append(
                    f"{self.clock.now:.2f}: broker {parent.bid} (rank {parent.rank}) welcomed "
                    f"rank {rank} incarnation {incarnation}, which rank 0 had revoked there"
                )

    # --- delivery -----------------------------------------------------------------------------

    def deliverable(self) -> list[tuple[Wire, bool]]:
        """(wire, upward) for each queue whose next item can be delivered now."""
        self._prune()
        return [
            (wire, upward)
            for wire in self.wires
            for upward in (True, False)
            if self.ready(wire, upward)
        ]

    def ready(self, wire: Wire, upward: bool) -> bool:
        """Whether the next item on `wire` (toward the parent if `upward`) can be delivered."""
        if wire.partitioned:
            return False
        if upward:
            parent = wire.parent
            if not (wire.to_parent and parent.alive and parent.running) or wire.parent_closed:
                return False
            return wire.to_parent[0][0] != "msg" or parent.admitting
        child = wire.child
        return bool(wire.to_child) and child.alive and child.running and not wire.child_closed

    def _prune(self) -> None:
        """Forget the wires that are over at both ends, with nothing left on them."""
        if len(self.wires) < 2 * len(self.nodes) + 64:
            return
        done = [
            wire
            for wire in self.wires
            if (wire.child_closed or wire.parent_closed or wire.broken)
            and not wire.to_parent
            and not wire.to_child
        ]
        for wire in done:
            self.wires.remove(wire)
            del self.by_routing[wire.routing_id]

    def deliver(self, wire: Wire, upward: bool) -> None:
        now = self.clock.now
        if upward:
            kind, frames = wire.to_parent.popleft()
            parent = wire.parent
            children = parent.children
            assert children is not None
            if kind == "knock":
                identity = children.keyring.lookup(z85.decode(wire.child.key))
                if identity is None:
                    wire.to_parent.clear()
                    wire.to_child.append(("refused", None))
                    return
                wire.accepted, wire.user_id = True, identity.user_id
                children.monitor.push(zmq.EVENT_ACCEPTED, wire.fd)  # type: ignore[attr-defined]
            elif kind == "closed":
                children.monitor.push(zmq.EVENT_DISCONNECTED, wire.fd)  # type: ignore[attr-defined]
            else:
                props = {"User-Id": wire.user_id, zmq.SRCFD: wire.fd}
                head, *rest = frames
                received = [Frame(wire.routing_id), Frame(head, props), *map(Frame, rest)]
                children.socket.inbox.append(received)  # type: ignore[attr-defined]
            parent.read_children(now)
            return
        kind, frames = wire.to_child.popleft()
        link = wire.link
        assert link is not None
        child = wire.child
        if kind == "msg":
            link.socket.inbox.append([Frame(f) for f in frames])  # type: ignore[attr-defined]
            child.read_parent(link, now)
        else:
            event = zmq.EVENT_HANDSHAKE_FAILED_AUTH if kind == "refused" else zmq.EVENT_DISCONNECTED
            link.monitor.push(event, wire.fd)  # type: ignore[attr-defined]
            child.read_parent_monitor(link, now)

    def settle(self, limit: int = 20000) -> int:
        """Deliver until nothing can be; returns how many were delivered."""
        count = 0
        while True:
            ready = self.deliverable()
            if not ready:
                return count
            for wire, upward in ready:
                if self.ready(wire, upward):
                    self.deliver(wire, upward)
                    count += 1
            if count > limit:
                raise AssertionError(f"no quiet after {limit} deliveries: a message storm")

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: every broker that runs keeps its timers, and reads what comes."""
        self.settle()
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + STEP)
            for node in list(self.nodes):
                if node.alive and node.running:
                    node.timers(self.clock.now)
            self.settle()

    # --- what happens to brokers ---------------------------------------------------------------

    def end(self, node: Node, code: int, reason: str) -> None:
        """The broker exits (its process is gone): every connection it held closes."""
        if not node.alive:
            return
        node.alive = False
        node.ended = (code, reason)
        self.log.append(f"{self.clock.now:.2f} {node!r} ended {code}: {reason}")
        for wire in self.wires:
            if wire.child is node:
                wire.closed_by_child(keep=True)
            if wire.parent is node:
                wire.closed_by_parent()

    def kill(self, node: Node) -> None:
        self.end(node, -9, "killed")

    def refill(self, rank: int) -> None:
        """A joiner asks rank 0 for `rank` (flub.allocate from a local client): its broker starts
        with the answer, if that names its parent's card."""
        bid = self._next_bid
        self._next_bid += 1
        hop = f"l{bid:x}"
        key = key_of(bid)
        self.joiners[hop] = (bid, key)
        ask = {"public_key": key, "hostname": f"host{bid}", "rank": rank}
        request = Message(Kind.REQUEST, "flub.allocate", ask, nodeid=0)
        self.root.router.route(request, hop, self.clock.now)

    def joiner_answered(self, hop: str, reply: Message) -> None:
        bid, _key = self.joiners.pop(hop)
        card = reply.payload.get("parent_card")
        self.log.append(f"{self.clock.now:.2f} joiner {bid}: {reply.errstr or reply.payload}")
        if reply.errnum or not card:
            return  # gave up (a real joiner would ask flub.kex; its lease then runs out)
        rank, incarnation, parent = (reply.payload[k] for k in ("rank", "incarnation", "parent"))
        node = Node(self, bid, rank, incarnation)
        self.nodes.append(node)
        self.by_endpoint[node.endpoint] = node
        node.start((parent, card["endpoint"], card["public_key"]))

    # --- what the oracle asks -------------------------------------------------------------------

    def quiet(self) -> bool:
        """Nothing can be delivered, nobody is stopped, no link is cut."""
        return (
            not self.deliverable()
            and all(node.running for node in self.nodes if node.alive)
            and not any(wire.partitioned and wire.open for wire in self.wires)
        )

    def holders(self, rank: int) -> list[Node]:
        """The live brokers attached as `rank` by a link whose parent holds them connected on it."""
        found = []
        for node in self.nodes:
            if not node.alive or node.rank != rank or node.uplink is None:
                continue
            link = node.uplink.link if node.uplink.welcomed else None
            if link is None:
                continue
            wire = link.socket.wire  # type: ignore[attr-defined]
            parent = wire.parent
            if not parent.alive or parent.children is None or not wire.open:
                continue
            session = parent.children.sessions.get(rank)
            if session is not None and session.connected and session.routing_id == wire.routing_id:
                found.append(node)
        return found

    def identity(self, node: Node) -> Identity:
        return Identity(node.rank, node.incarnation)
