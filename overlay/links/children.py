"""A parent's side of its links, on real sockets: the adapter around the machine of downward.py.

The ROUTER is a CURVE server whose ZAP handler accepts exactly the keys in the KeyRing, each bound
to one (rank, incarnation) and stamped on the child's messages as the ZeroMQ User-Id. A child is
believed about nothing but itself and its own subtree. The machine decides (whom to welcome, when
a session ends, whom a shutdown waits for); this module reads the ROUTER and its socket monitor,
turns what they bring into stimuli, and carries out the instructions: it encodes and sends the
welcomes, refusals and orders, keeps the KeyRing, and hands the broker an `Inbound` of reports,
messages and rejoins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import zmq

from tbon.overlay.config.attributes import BrokerConfig
from tbon.overlay.links import downward
from tbon.overlay.links.blocklist import Blocklist, attach
from tbon.overlay.links.descriptors import descriptor_limit, reserve_size
from tbon.overlay.links.downward import Downward, Rejoin, Timing
from tbon.overlay.links.keyring import SHARED_USER_ID, Identity, KeyRing, ZapHandler
from tbon.overlay.links.monitor import read_event
from tbon.overlay.links.refusals import Refusals, refusal_grace
from tbon.overlay.links.sessions import ChildSession
from tbon.overlay.links.strangers import FloodLog, Strangers, caps_for
from tbon.overlay.links.zmqio import DONTWAIT, readable, receive, receive_bytes, send_frames
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.healing import may_report
from tbon.overlay.state.rankevents import Dropped, Event
from tbon.overlay.state.reports import decode_events
from tbon.overlay.state.terms import TERMED_CONTROLS, Terms
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.flow import LINK_HWM
from tbon.overlay.wire.message import (
    HEARTBEAT_FRAMES,
    REPORT_HEAD,
    Buffer,
    Kind,
    Message,
    MessageError,
    decode_frames,
    decode_payload,
    encode,
    is_heartbeat,
)

SRCFD = int(zmq.SRCFD)
"""As plain ints: ZeroMQ's own are enums, whose operators cost a Python call each."""

log = logging.getLogger("tbon.children")

__all__ = ["Children", "Inbound", "Rejoin"]

MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
FLOOD_LOG_EVERY = 10.0  # seconds between lines about a connection flood


@dataclass(slots=True)
class Inbound:
    """What one read of the ROUTER produced for the broker to act on."""

    reports: list[Event] = field(default_factory=list)
    messages: list[tuple[int, Message]] = field(default_factory=list)
    rejoins: list[Rejoin] = field(default_factory=list)
    # a session's deadline may be sooner (Downward.hastens): the loop's timers, at once
    sooner: bool = False
    # it was only a heartbeat from a live session, heard: nothing for the broker to do
    beat: bool = False


def timing(config: BrokerConfig) -> Timing:
    return Timing(config.heartbeat, config.torpid, config.timeout)


class Children:
    def __init__(
        self,
        context: zmq.Context,
        rank: int,
        topology: Topology,
        config: BrokerConfig,
        secret_z85: str,
    ) -> None:
        self._start(rank, topology, config)
        self.keyring = KeyRing()
        self.zap = ZapHandler(context, self.keyring)
        self._full: set[bytes] = set()  # routing ids of children whose link is full
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.sndhwm = LINK_HWM  # per child; see _send_raw
        self.socket.rcvhwm = LINK_HWM
        self.socket.router_mandatory = 1
        self.socket.curve_server = True
        self.socket.curve_secretkey = secret_z85.encode()
        self.socket.zap_domain = b"tbon"
        self.socket.maxmsgsize = 8 * 1024 * 1024
        # a peer that has not completed the CURVE handshake by then is closed (libzmq: 30 s)
        self.socket.handshake_ivl = max(1, round(config.handshake_timeout * 1000))
        self.monitor = self.socket.get_monitor_socket(MONITORED)

    def _start(self, rank: int, topology: Topology, config: BrokerConfig) -> None:
        """The state with no sockets in it (tests build a Children from this alone)."""
        self.rank = rank
        self.topology = topology
        self._config = config
        # a phase drawn at random: parents started together do not beat together
        self.machine = Downward(rank, topology, timing(config), random.random())
        self.refusals = Refusals(refusal_grace(config.heartbeat))  # keys refused at handshake
        nofile = descriptor_limit()
        expected = len(topology.children(rank))
        self.strangers = Strangers(caps_for(nofile, reserve_size(nofile), expected))
        self.flood = FloodLog(FLOOD_LOG_EVERY)
        self.blocklist = Blocklist(max(1.0, config.handshake_timeout))  # blocklist.py
        self._port = 0  # the tree port: a stranger is closed only on a socket bound to it
        # its listening socket's descriptor (ZeroMQ's), looked for at the first block only: the
        # look walks every descriptor of the broker (its reserve too), and most never block
        self._listener: int | None = None
        self._looked = False
        # the cards (rank, endpoint, public key) of this broker's ancestors and its own, rank 0
        # first: what a child needs to seek a live ancestor should this broker go
        self.lineage: list[list[Any]] = []
        # the root group's cards (docs/protocol.md §13.4), sent with every lineage: whom a child
        # whose ancestors are all gone asks too. Empty with no standbys, and then not sent
        self.group: list[list[Any]] = []
        # the seconds left of this broker's search for a parent (or its parent's), said to a
        # child right after its welcome; None: nobody above seeks (the broker sets it: uplink.py)
        self.seeking_for: Callable[[float], float | None] = lambda now: None
        # the broker's term fence (state/terms.py): its term goes on each welcome, lineage,
        # retire and shutdown sent down (the broker shares its own)
        self.terms = Terms(rank, leading=rank == 0)

    @property
    def config(self) -> BrokerConfig:
        return self._config

    @config.setter
    def config(self, config: BrokerConfig) -> None:
        """FLUB bootstrap learns the instance's attributes after the ROUTER was bound."""
        self._config = config
        self.machine.timing = timing(config)
        self.refusals.grace = refusal_grace(config.heartbeat)

    def bind(self, endpoint: str) -> str:
        """Bind to `endpoint` (a port of `*` picks a free one); returns the address bound."""
        self.socket.bind(endpoint)
        bound = self.socket.last_endpoint.decode()
        self._port = int(bound.rsplit(":", 1)[1])
        self._listener, self._looked = None, False
        return bound

    # --- the sessions, as the broker and the router ask them -----------------------------------

    @property
    def sessions(self) -> dict[int, ChildSession]:
        return self.machine.sessions

    @property
    def fosters(self) -> AbstractSet[int]:
        return self.machine.fosters

    @property
    def shutting_down(self) -> bool:
        return self.machine.shutting_down

    def attached(self, rank: int) -> bool:
        """Whether `rank`'s broker is connected here (as a child or a foster child)."""
        return self.machine.attached(rank)

    def connected(self) -> list[int]:
        return self.machine.connected()

    def census(self) -> list[Event]:
        """Every child's state as this parent reported it (downward.py): said again up a new
        link."""
        return self.machine.census()

    def awaited(self, now: float | None = None) -> list[int]:
        """What a shutdown waits for (downward.py): the children connected, and the foster
        children still within their grace at `now` (None: whatever their grace)."""
        return self.machine.awaited(now)

    def verdict_due(self, now: float) -> bool:
        return self.machine.verdict_due(now)

    def next_deadline(self) -> float:
        deadlines = [self.flood.next_deadline(), self.blocklist.next_deadline()]
        return min([self.machine.next_deadline(), *(d for d in deadlines if d is not None)])

    # --- rank 0's word ------------------------------------------------------------------------

    def authorize(
        self,
        rank: int,
        incarnation: int,
        public_z85: str,
        foster_until: float | None = None,
    ) -> None:
        """Admit `public_z85` as (rank, incarnation) ("": a config-booted broker holding the
        instance's shared key, which must claim exactly that incarnation). With `foster_until`,
        a foster child's admission (docs/protocol.md §12): expected until then."""
        admit = downward.Admit(rank, incarnation, public_z85, foster_until)
        self._feed(admit, time.monotonic(), Inbound())

    def withdraw(self, rank: int, incarnation: int) -> None:
        """Rank 0 withdrew a foster admission it found moot."""
        self._feed(downward.Withdraw(rank, incarnation), time.monotonic(), Inbound())

    def revoke(self, rank: int, incarnation: int, reason: str) -> None:
        """Rank 0 ended this incarnation for good (replaced, voided). Nothing is reported:
        rank 0 knows."""
        self._feed(downward.Revoke(rank, incarnation, reason), time.monotonic(), Inbound())

    def retire(self, rank: int, incarnation: int, order: dict[str, Any]) -> str:
        """Rank 0 recorded (rank, incarnation) as retiring: record it here too, then tell its
        broker to drain and leave. Returns why that could not be done, or ""."""
        retire = downward.Retire(rank, incarnation, order)
        return self._feed(retire, time.monotonic(), Inbound())

    def rejoined(self, rejoin: Rejoin, incarnation: int | None, why: str, now: float) -> Inbound:
        """Rank 0's answer to a Rejoin: welcome the broker as `incarnation`, or refuse it."""
        inbound = Inbound()
        self._feed(downward.Rejoined(rejoin, incarnation, why), now, inbound)
        return inbound

    # --- input ------------------------------------------------------------------------------

    def drain_monitor(self) -> bool:
        """Take in pending connection events; whether there were any. A disconnect is only noted
        here: it is applied by `settle`, after the messages that the connection delivered before
        it closed (a goodbye)."""
        took = False
        while readable(self.monitor):
            took = True
            kind, fd = read_event(receive_bytes(self.monitor))
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                now = time.monotonic()
                for address, key in self.zap.refusals:  # an orphan's first knocks: debug only
                    level = self.refusals.level(key, now)
                    if level is not None:
                        log.log(
                            level,
                            "refused a child from %s: CURVE key %s is not authorized",
                            address,
                            key,
                        )
                self.zap.refusals.clear()
            else:
                self._connection_event(kind, fd)
        return took

    def _connection_event(self, kind: int, fd: int) -> None:
        if kind == zmq.EVENT_ACCEPTED:
            self._stranger(fd)
            self._feed(downward.Accepted(fd), 0.0, Inbound())
        elif kind == zmq.EVENT_DISCONNECTED:
            self.strangers.forget(fd)
            self._feed(downward.Closed(fd), 0.0, Inbound())

    def _stranger(self, fd: int) -> None:
        """A connection accepted on `fd`: a stranger until it authenticates (strangers.py);
        those past the caps are hung up, and the flood logged once per interval."""
        self.flood.accepted()
        source = "?"  # gone already: counted all the same, as from nowhere known
        with _borrowed(fd) as sock:
            if sock is not None:
                source = sock.getpeername()[0]
        over = self.strangers.accepted(fd, source)
        if not over:
            return
        for victim, _ in over:
            self._hang_up(victim)
        sources = [source for _, source in over]
        self.flood.closed(sources)
        now = time.monotonic()
        self._block(self.blocklist.over(sources, now))
        self._log_flood(now)

    def _block(self, blocked: frozenset[str] | None) -> None:
        """Have the tree port's listener drop new connections from `blocked` (None: as is)."""
        if blocked is None:
            return
        if not self._looked and self._port:
            self._listener, self._looked = _find_listener(self._port), True
        if self._listener is None:
            return
        try:
            attach(self._listener, blocked)
        except OSError as error:
            log.warning("could not filter the tree port (%s): strangers are only closed", error)
            self._listener = None

    def _hang_up(self, fd: int) -> None:
        """End a stranger's connection by shutting its socket down: ZeroMQ sees it end and
        closes the descriptor itself (closing it here would race ZeroMQ's own use of the
        number). Only a TCP socket on the tree port is touched: the number may be reused."""
        with _borrowed(fd) as sock:
            if sock is not None and sock.getsockname()[1] == self._port:
                sock.shutdown(socket.SHUT_RDWR)

    def _log_flood(self, now: float) -> None:
        line = self.flood.line(now, self.strangers.caps)
        if line is not None:
            log.warning("%s", line)

    def settle(self) -> list[Event]:
        """Declare lost every child whose connection closed without a goodbye."""
        inbound = Inbound()
        self._feed(downward.Settle(), time.monotonic(), inbound)
        return inbound.reports

    def read(self, now: float) -> Inbound:
        """Read one message from a child.

        The monitor is drained first so that a hello is tied to the connection (fd and
        generation) it came on, and a child that said hello and died at once is seen to be gone.
        What most of a parent's reading is, a heartbeat or a report from a live session, is
        known by its header's bytes and read without either (`_known`).
        """
        inbound = Inbound()
        frames = receive(self.socket)
        if len(frames) < 2:
            return inbound
        routing_id = frames[0].bytes
        if (sender := self._known(routing_id, frames, now, inbound)) is not None:
            if frames[1].bytes == REPORT_HEAD:
                self._known_report(sender, frames, inbound)
            else:  # a heartbeat: heard (a torpid flag cleared is a report), nothing more to do
                inbound.beat = not (inbound.reports or inbound.sooner)
            return inbound
        self.drain_monitor()
        try:
            user_id = frames[1].get("User-Id")
            fd = frames[1].get(SRCFD)
            self.strangers.forget(fd)  # only an authenticated peer's messages come through
            message = decode_frames(frames[1:])
        except (MessageError, zmq.ZMQError, UnicodeDecodeError) as error:
            log.warning("dropped a malformed message from a child: %s", error)
            return inbound
        sender = self._sender(user_id, routing_id, message)
        if sender is None:
            log.warning("dropped a message from an unauthenticated peer")
            return inbound
        if message.kind is Kind.CONTROL and message.topic == "hello":
            key = None if user_id == SHARED_USER_ID else sender
            self._hello(routing_id, fd, key, message, now, inbound)
            return inbound
        if not self.machine.live(routing_id, sender):
            self._refuse_stale(routing_id, sender, message)
            return inbound
        self._feed(downward.Heard(routing_id), now, inbound)
        if message.kind is not Kind.CONTROL:
            inbound.messages.append((sender.rank, message))
        elif message.topic == "goodbye":
            self._feed(downward.Goodbye(routing_id), now, inbound)
        elif message.topic == "moved":
            to = message.payload.get("to")
            if is_int(to):
                self._feed(downward.MovedAway(routing_id, int(to)), now, inbound)
        elif message.topic == "report":
            self._report(sender, message.payload, inbound)
        elif message.topic != "heartbeat":
            log.warning("rank %d sent an unknown control message %r", sender.rank, message.topic)
        return inbound

    def readable(self) -> bool:
        """Whether a message waits on the ROUTER (asked of ZeroMQ without a poll)."""
        return readable(self.socket)

    def _known(
        self, routing_id: bytes, frames: list[Any], now: float, inbound: Inbound
    ) -> Identity | None:
        """A heartbeat or a report (known by its header's bytes) from the live session on
        `routing_id`, sent with the key bound to it: heard, and its sender's identity returned
        (a report's events are then read by `_known_report`). Read() makes the same of
        them, less the monitor (no hello to tie to a connection), the strangers' count (the
        session's hello on this connection left it) and the header's parsing: most of what a
        parent reads, idle (beats) or at a wire-up (reports). None for any other message or
        sender: read as any message (a stale incarnation is refused there)."""
        first = frames[1]
        if len(frames) != 3 or (first.bytes != REPORT_HEAD and not is_heartbeat(frames[1:])):
            return None
        session = self.machine.session_on(routing_id)
        if session is None or not session.connected:
            return None
        user_id = first.get("User-Id")
        if user_id != SHARED_USER_ID and user_id != session.identity.user_id:
            return None
        self._feed(downward.Heard(routing_id), now, inbound)
        return session.identity

    def _known_report(self, sender: Identity, frames: list[Any], inbound: Inbound) -> None:
        """A report `_known` took: its payload decoded as read() decodes any message's."""
        try:
            payload = decode_payload(frames[1:], REPORT_HEAD)
        except MessageError as error:  # UnicodeDecodeError is one
            log.warning("dropped a malformed message from a child: %s", error)
            return
        assert payload is not None  # _known checked the header
        self._report(sender, payload, inbound)

    def _sender(self, user_id: str, routing_id: bytes, message: Message) -> Identity | None:
        """Who sent `message`: the identity its key is bound to, or, for the instance's shared
        key, the one it claimed in its hello on this connection."""
        if user_id != SHARED_USER_ID:
            return Identity.parse(user_id)
        if message.kind is Kind.CONTROL and message.topic == "hello":
            rank, incarnation = message.payload.get("rank"), message.payload.get("incarnation")
            if is_int(rank) and is_int(incarnation) and rank >= 0 and incarnation >= 0:
                return Identity(int(rank), int(incarnation))
            return None
        session = self.machine.session_on(routing_id)
        return session.identity if session is not None else None

    def _hello(
        self,
        routing_id: bytes,
        fd: int,
        key: Identity | None,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        """A hello from the holder of `key` (None: the shared key), to be judged."""
        self._feed(downward.Hello(routing_id, fd, key, hello), now, inbound)

    def _refuse_stale(self, routing_id: bytes, sender: Identity, message: Message) -> None:
        """Answer a broker whose incarnation has ended, so that it exits instead of lingering."""
        what = f"{message.kind} {message.topic!r}"
        self._feed(downward.Stale(routing_id, sender, what), time.monotonic(), Inbound())

    def _report(self, sender: Identity, payload: dict[str, Any], inbound: Inbound) -> None:
        """A child's report: each of its events about its own subtree, in its order."""
        try:
            events = decode_events(payload)
        except MessageError as error:
            log.warning("dropped a bad report from rank %d: %s", sender.rank, error)
            return
        for event in events:
            own = isinstance(event, Dropped)  # its word on its own link
            if may_report(self.topology, sender.rank, event.rank, event.parent, own):
                inbound.reports.append(event)
                continue
            log.warning(
                "rank %d reported on rank %d seen by rank %s, outside its subtree",
                sender.rank,
                event.rank,
                event.parent,
            )

    # --- the machine's instructions carried out --------------------------------------------------

    def _feed(self, stimulus: downward.Stimulus, now: float, inbound: Inbound) -> str:
        """Hand `stimulus` to the machine and carry out what it says; returns why an order
        could not be carried out, or ""."""
        try:
            instructions = self.machine.handle(stimulus, now)
        except downward.Unexpected as error:
            log.warning("ignored on the children's side: %s", error)
            return ""
        if self.machine.hastens(stimulus, instructions):
            inbound.sooner = True
        declined = ""
        for instruction in instructions:
            declined = self._carry_out(instruction, now, inbound) or declined
        return declined

    def _carry_out(self, instruction: downward.Instruction, now: float, inbound: Inbound) -> str:
        match instruction:
            case downward.SendWelcome(routing_id, identity):
                welcome = _control(
                    "welcome",
                    rank=identity.rank,
                    size=self.topology.size,
                    incarnation=identity.incarnation,
                    **self._lineage(),
                )
                self._send_raw(routing_id, welcome)
                if (left := self.seeking_for(now)) is not None:  # docs/protocol.md §5.6
                    self._send_raw(routing_id, _control("seeking", **{"for": left}))
            case downward.SendRefuse(routing_id, reason, exit_code):
                # with the root of this broker's term where known: a former root asking the
                # group learns its successor from it (docs/protocol.md §13.5)
                named = {} if self.terms.root is None else {"root": self.terms.root}
                refuse = _control("refuse", reason=reason, exit_code=exit_code, **named)
                self._send_raw(routing_id, refuse)
            case downward.SendControl(routing_id, topic, payload):
                message = HEARTBEAT_FRAMES if topic == "heartbeat" else _control(topic, **payload)
                if not self._send_raw(routing_id, message):
                    session = self.machine.session_on(routing_id)
                    rank = session.identity.rank if session is not None else "?"
                    return f"rank {rank} is not connected"
            case downward.Report(event):
                inbound.reports.append(event)
            case downward.AskRejoin(rejoin):
                inbound.rejoins.append(rejoin)
            case downward.AuthorizeKey(key, identity):
                self.keyring.authorize(key, identity)
            case downward.RevokeKey(identity):
                self.keyring.revoke(identity)
            case downward.RevokeRank(rank):
                self.keyring.revoke_rank(rank)
            case downward.Declined(reason):
                return reason
            case downward.Note(level, text):
                log.log(level, "%s", text)
            case _:
                raise AssertionError(f"an instruction the adapter does not know: {instruction}")
        return ""

    # --- output -----------------------------------------------------------------------------

    def send(self, rank: int, message: Message) -> bool:
        routing_id = self.machine.routing_id(rank)
        if routing_id is None:
            return False
        return self._send_raw(routing_id, message)

    def send_lineage(self) -> None:
        """This broker's ancestors changed (it was welcomed again, by a foster parent or a new
        one): tell every child, so that each can seek a live ancestor should this one go."""
        for rank in self.connected():
            self.send(rank, _control("lineage", **self._lineage()))

    def _lineage(self) -> dict[str, Any]:
        """What a welcome or `lineage` says of the way up: the ancestors, and the group."""
        if self.group:
            return {"lineage": self.lineage, "group": self.group}
        return {"lineage": self.lineage}

    def _send_raw(self, routing_id: bytes, message: Message | Sequence[Buffer]) -> bool:
        """Send `message` (or frames already encoded: a heartbeat's) to the child there."""
        if isinstance(message, Message):
            if message.kind is Kind.CONTROL and message.topic in TERMED_CONTROLS:
                message.term = self.terms.term  # the one place these get their term
            frames: Sequence[Buffer] = encode(message)
        else:
            frames = message
        try:
            send_frames(self.socket, [routing_id, *frames], DONTWAIT)
        except zmq.ZMQError as error:
            if error.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            if error.errno == zmq.EAGAIN and routing_id not in self._full:
                # A child that stopped reading: the message fails as if it were not connected,
                # and its silence ends it. Said once, not once per message.
                self._full.add(routing_id)
                log.warning("a child's link is full (%d messages unread): not sending", LINK_HWM)
            return False
        self._full.discard(routing_id)
        self.machine.sent(routing_id, time.monotonic())
        return True

    def shutdown(self) -> None:
        """Ask every connected child to shut its subtree down (leaves go first)."""
        self._feed(downward.ShutdownBegan(), time.monotonic(), Inbound())

    def tick(self, now: float) -> list[Event]:
        """Send heartbeats when due, and judge each child's silence."""
        inbound = Inbound()
        self._feed(downward.Tick(), now, inbound)
        self._block(self.blocklist.tick(now))
        self._log_flood(now)
        return inbound.reports

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        self.zap.close()


@contextlib.contextmanager
def _borrowed(fd: int) -> Iterator[socket.SocketType | None]:
    """The TCP socket of ZeroMQ's descriptor `fd`, to look at, never to close (None if it is
    not one now); socket errors inside are the connection gone, and ignored. The C socket
    (SocketType), not socket.socket: its family and type are plain ints, where socket.socket
    makes each an enum in Python (an accepted child asks both)."""
    try:
        sock = socket.SocketType(fileno=fd)
    except OSError:
        yield None
        return
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            yield None
        else:
            with contextlib.suppress(OSError):
                yield sock
    finally:
        sock.detach()


def _find_listener(port: int) -> int | None:
    """The descriptor of ZeroMQ's socket listening on the tree port (an IPv4 one), if any."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        with _borrowed(int(name)) as sock:
            if (
                sock is not None
                and sock.family == socket.AF_INET
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname()[1] == port
            ):
                return int(name)
    return None


def _control(topic: str, **payload: Any) -> Message:
    return Message(Kind.CONTROL, topic, payload)
