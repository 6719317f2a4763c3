"""A child's side of one link: the DEALER that connects to a parent's ROUTER.

The link is CURVE-encrypted with the parent's public key as the server key. After the handshake the
child says hello and waits to be welcomed or refused; from then on it answers the parent's
heartbeats (and beats unasked if they stop, docs/protocol.md §5.2), and a dropped connection
or a silent parent ends the link (`LinkEnded`). What the broker does then (seek a live
ancestor, or exit) is decided in upward.py; uplink.py holds several of these at once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import zmq

from tbon import exitcodes
from tbon.overlay.config.attributes import BrokerConfig
from tbon.overlay.links.cards import BadCards, Card, card_ok, decode_group
from tbon.overlay.links.handshakes import Handshakes
from tbon.overlay.links.liveness import Liveness, Verdict
from tbon.overlay.links.monitor import read_event
from tbon.overlay.links.zmqio import DONTWAIT, readable, receive, receive_bytes, send_frames
from tbon.overlay.wire.flow import LINK_HWM
from tbon.overlay.wire.message import (
    HEARTBEAT_FRAMES,
    PROTOCOL_VERSION,
    Buffer,
    Kind,
    Message,
    MessageError,
    decode_frames,
    encode,
    is_heartbeat,
)
from tbon.record import Record

log = logging.getLogger("tbon.parent")

OWN_BEAT = 1.5
"""Heartbeats after which a child that sent nothing up beats unasked: its parent's beats, which it
answers, come every one; the half more keeps the two clocks from racing each other."""

"""As plain ints: ZeroMQ's own are enums, whose operators cost a Python call each."""

MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class LinkEnded(Record):
    """The link is over and the broker must exit with `exit_code`."""

    __slots__ = __match_args__ = ("exit_code", "reason")

    def __init__(self, exit_code: int, reason: str) -> None:
        self.exit_code = exit_code
        self.reason = reason


class ParentInbound(Record):
    __slots__ = __match_args__ = (
        "welcomed",
        "lineage",
        "group",
        "shutdown",
        "retire",
        "seeking",
        "ended",
        "messages",
        "term",
        "root",
    )
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        welcomed: bool = False,
        lineage: list[Any] | None = None,
        group: tuple[Card, ...] | None = None,
        shutdown: bool = False,
        retire: dict[str, Any] | None = None,
        seeking: float | None = None,
        ended: LinkEnded | None = None,
        messages: list[Message] | None = None,
        term: object = None,
        root: object = None,
    ) -> None:
        self.welcomed = welcomed
        self.lineage = lineage  # the ancestors' cards, from a welcome or a `lineage`
        self.group = group  # the root group's cards with it (None: malformed)
        self.shutdown = shutdown
        self.retire = retire  # the parent's order to retire: force, timeout
        self.seeking = seeking  # the parent seeks a parent of its own for so many seconds
        self.ended = ended
        self.messages: list[Message] = [] if messages is None else messages
        self.term = term  # the header term of the control message read (state/terms.py)
        self.root = root  # a `refuse`'s root of that term, where its sender named it


class ParentLink:
    def __init__(
        self,
        context: zmq.Context,
        rank: int,
        incarnation: int,
        config: BrokerConfig,
        keypair: tuple[str, str],
        parent: tuple[str, str],
        now: float,
        peer: int | None = None,
        shared_key: bool = False,
    ) -> None:
        """Connect to the parent at `parent` (endpoint, public key), rank `peer`, and say hello;
        the hello is queued until the CURVE handshake completes."""
        self.rank = rank
        self.peer = peer
        self.shared_key = shared_key  # config bootstrap: the instance's key, not this broker's
        self.quiet = False  # an ancestor asked while seeking: its refusals are expected
        self.incarnation = incarnation
        self.config = config
        self.overflow: LinkEnded | None = None  # set by send() on a full link
        public, secret = keypair
        self.socket = context.socket(zmq.DEALER)
        # setsockopt, not the attributes: each attribute is looked up through pyzmq's enums,
        # a third of a millisecond of every forked broker's start (pages copied, mostly)
        option = self.socket.setsockopt
        option(zmq.LINGER, int(config.shutdown_timeout * 1000))
        option(zmq.SNDHWM, LINK_HWM)
        option(zmq.RCVHWM, LINK_HWM)
        option(zmq.MAXMSGSIZE, 8 * 1024 * 1024)
        option(zmq.CURVE_PUBLICKEY, public.encode())
        option(zmq.CURVE_SECRETKEY, secret.encode())
        self.monitor = self.socket.get_monitor_socket(MONITORED)
        self.welcomed = False
        # a broker has answered at the other end (its handshake done, or a message read): until
        # then nobody there can have welcomed this one
        self.handshaken = False
        self._last_sent = now  # the hello, below
        self.answered = False  # a heartbeat was answered: the broker's next deadline moved
        self.endpoint, parent_public_z85 = parent
        self.handshakes = Handshakes(self.endpoint)  # what its failures and retries are told
        option(zmq.CURVE_SERVERKEY, parent_public_z85.encode())
        self.socket.connect(self.endpoint)
        hello_timeout = self.config.timeout or 60.0
        self._liveness = Liveness(0, hello_timeout, now)  # until welcomed: the wait for it
        self.send(
            _control(
                "hello",
                rank=self.rank,
                incarnation=self.incarnation,
                version=PROTOCOL_VERSION,
                hostname=self.config.hostname,
                pid=os.getpid(),
            )
        )

    def send(self, message: Message) -> None:
        """Queue `message` for the parent, never blocking: a full link means a parent that has
        stopped reading, and ends the link (`overflow`), as silence would, only sooner."""
        self._send_frames(encode(message), time.monotonic())

    def _send_frames(self, frames: Sequence[Buffer], now: float) -> None:
        if self.overflow is not None:
            return
        try:
            send_frames(self.socket, frames, DONTWAIT)
            self._last_sent = now
        except zmq.Again:
            self.overflow = LinkEnded(
                exitcodes.LOST,
                f"the link to the parent is full ({LINK_HWM} messages unsent): it stopped reading",
            )

    def drain_monitor(self) -> LinkEnded | None:
        while readable(self.monitor):
            event, value = read_event(receive_bytes(self.monitor))
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshaken = True
                if (line := self.handshakes.success()) is not None:
                    log.log(*line)
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                return LinkEnded(
                    exitcodes.REFUSED, f"parent at {self.endpoint} refused this broker's key"
                )
            if event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                # ZeroMQ tries again by itself: a retry that succeeds is no fault (handshakes.py)
                protocol = event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                log.log(*self.handshakes.failure(_why(event, value), protocol, self.quiet))
            elif event == zmq.EVENT_DISCONNECTED and self.welcomed:
                return LinkEnded(exitcodes.LOST, "lost the connection to the parent")
        return None

    def readable(self) -> bool:
        """Whether a message waits to be read (asked of ZeroMQ without a poll)."""
        return readable(self.socket)

    def read(self, now: float) -> ParentInbound | None:
        """The next message from the parent; None if there was none, or if it was only a
        heartbeat (answered here: nothing in it for the broker)."""
        try:
            frames = receive(self.socket, DONTWAIT)
        except zmq.Again:
            return None
        self.handshaken = True
        if self.welcomed and is_heartbeat(frames):
            self._liveness.heard(now)
            self._answer(now)
            return None
        inbound = ParentInbound()
        try:
            message = decode_frames(frames)
        except MessageError as error:
            log.warning("dropped a malformed message from the parent: %s", error)
            return inbound
        if self.welcomed:
            self._liveness.heard(now)
        if message.kind is not Kind.CONTROL:
            inbound.messages.append(message)
            return inbound
        inbound.term = message.term
        if message.topic == "welcome":
            if self.welcomed:
                return inbound  # a repeat changes nothing
            self.welcomed = inbound.welcomed = True
            incarnation = message.payload.get("incarnation")
            if isinstance(incarnation, int) and incarnation > 0:
                self.incarnation = incarnation  # config bootstrap: the parent knows it
            inbound.lineage = _lineage(message.payload.get("lineage"))
            inbound.group = _group(message.payload.get("group"))
            self._liveness = Liveness(0, self.config.timeout, now, 3 * self.config.heartbeat)
        elif message.topic == "lineage":
            inbound.lineage = _lineage(message.payload.get("lineage"))
            inbound.group = _group(message.payload.get("group"))
        elif message.topic == "refuse":
            code = message.payload.get("exit_code", exitcodes.REFUSED)
            code = code if code in (exitcodes.SHUTDOWN, exitcodes.LOST) else exitcodes.REFUSED
            reason = str(message.payload.get("reason", "refused"))
            inbound.ended = LinkEnded(code, f"refused by the parent: {reason}")
            inbound.root = message.payload.get("root")
        elif message.topic == "shutdown":
            inbound.shutdown = True
        elif message.topic == "retire":
            inbound.retire = dict(message.payload)
        elif message.topic == "seeking":
            inbound.seeking = _seconds(message.payload.get("for"))
        elif message.topic == "heartbeat":
            if self.welcomed:
                self._answer(now)
        else:
            log.warning("unknown control message %r from the parent", message.topic)
        return inbound

    def tick(self, now: float) -> LinkEnded | None:
        if self.overflow is not None:
            return self.overflow
        if self.welcomed and now >= self._own_beat():
            self._send_frames(HEARTBEAT_FRAMES, now)
        if self._liveness.check(now) is Verdict.LOST:
            if self.welcomed:
                return LinkEnded(
                    exitcodes.LOST,
                    f"the parent has been silent for {now - self._liveness.last_heard:.1f}s",
                )
            return LinkEnded(
                exitcodes.LOST, f"no answer to hello from the parent at {self.endpoint}"
            )
        return None

    def _answer(self, now: float) -> None:
        """A heartbeat from the parent, answered at once, so that parent and child wake once a
        beat, not each on its own clock; unless the parent heard from this broker within the
        last half beat. The answer is the frames made once (message.HEARTBEAT_FRAMES)."""
        if now - self._last_sent >= self.config.heartbeat / 2:
            self._send_frames(HEARTBEAT_FRAMES, now)
            self.answered = True

    def verdict_due(self, now: float) -> bool:
        """Whether the parent's silence is about to be judged at `now`."""
        deadline = self._liveness.deadline()
        return deadline is not None and deadline <= now

    def next_deadline(self) -> float | None:
        deadlines = [self._own_beat()] if self.welcomed else []
        if (deadline := self._liveness.deadline()) is not None:
            deadlines.append(deadline)
        return min(deadlines) if deadlines else None

    def _own_beat(self) -> float:
        """When this broker beats unasked: the parent's beats, answered, keep it later; only
        when they stop (or the parent skipped them, having sent something) does it come due."""
        return self._last_sent + OWN_BEAT * self.config.heartbeat

    def goodbye(self) -> None:
        """Tell the parent this incarnation ends cleanly (sent before the socket lingers closed)."""
        if self.welcomed:
            self.send(_control("goodbye"))

    def close(self, linger: bool) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=None if linger else 0)


def _control(topic: str, **payload: Any) -> Message:
    return Message(Kind.CONTROL, topic, payload)


def _seconds(value: Any) -> float | None:
    """A `seeking` message's seconds left, or None if they are not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < float("inf") else None


MAX_LINEAGE = 64
"""Cards kept from a parent: a tree deeper than this is not one tbon builds (kary:2 at 2^64)."""


def _lineage(value: Any) -> list[Any] | None:
    """The ancestors' cards a parent sent, each [rank, endpoint, public key], or None if they
    are not shaped so (a malformed lineage is ignored, never half-used)."""
    if not isinstance(value, list) or len(value) > MAX_LINEAGE:
        return None
    return value if all(card_ok(card) for card in value) else None


def _group(value: Any) -> tuple[Card, ...] | None:
    """The root group's cards a parent sent with its lineage (docs/protocol.md §13.4), or None
    if they are malformed: ignored with a warning, the cards known before kept."""
    try:
        return decode_group(value)
    except BadCards as error:
        log.warning("ignored the root group's cards from the parent: %s", error)
        return None


def _why(event: int, value: int) -> str:
    """What a failed handshake's monitor value says: libzmq's protocol error, or the errno of a
    connection that ended during it (ECONNRESET, EPIPE: the parent closed it, which it does to a
    handshake not done within its broker.handshake-timeout)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return f"protocol error {value:#x}"
    return os.strerror(value) if value else "no detail"
