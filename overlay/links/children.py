"""A parent's side of its links: the ROUTER its children connect to, and their sessions.

The ROUTER is a CURVE server whose ZAP handler accepts exactly the keys in the KeyRing, each bound
to one (rank, incarnation) and stamped on the child's messages as the ZeroMQ User-Id. A child is
believed about nothing but itself and its own subtree. Its death is seen the moment its connection
drops (the socket monitor), or when it falls silent past tbon.timeout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import zmq

from tbon import exitcodes
from tbon.overlay.broker.attributes import BrokerConfig
from tbon.overlay.links.keyring import SHARED_USER_ID, Identity, KeyRing, ZapHandler
from tbon.overlay.links.liveness import Liveness, Verdict
from tbon.overlay.links.monitor import read_event
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.ranktable import Departed, Event, Lost, Online, Torpid
from tbon.overlay.state.reports import decode_event
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message, MessageError, decode, encode

log = logging.getLogger("tbon.children")

MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str
    exit_code: int


def judge_hello(
    payload: dict[str, Any],
    sender: Identity,
    parent_rank: int,
    topology: Topology,
    current: dict[int, int],
    shutting_down: bool = False,
) -> Refusal | None:
    """Whether a hello from the holder of `sender`'s key may join as the child it claims to be.

    `current` maps each child rank to its current incarnation. Returns None to welcome it.
    """
    version = payload.get("version")
    if version != PROTOCOL_VERSION:
        return Refusal(
            f"incompatible protocol version {version!r} (rank {parent_rank} speaks "
            f"{PROTOCOL_VERSION})",
            exitcodes.REFUSED,
        )
    rank, incarnation = payload.get("rank"), payload.get("incarnation")
    if (rank, incarnation) != (sender.rank, sender.incarnation):
        return Refusal(
            f"key is authorized for rank {sender.rank} incarnation {sender.incarnation}, "
            f"not for rank {rank} incarnation {incarnation}",
            exitcodes.REFUSED,
        )
    if sender.rank >= topology.size or topology.parent(sender.rank) != parent_rank:
        return Refusal(
            f"rank {sender.rank} is not a child of rank {parent_rank}", exitcodes.REFUSED
        )
    now = current.get(sender.rank)
    if now is None:
        return Refusal(
            f"rank {sender.rank} has no incarnation expecting a broker", exitcodes.REFUSED
        )
    if now != sender.incarnation:
        return Refusal(
            f"superseded: rank {sender.rank} is now incarnation {now}", exitcodes.REFUSED
        )
    if shutting_down:
        return Refusal("the instance is shutting down", exitcodes.SHUTDOWN)
    return None


NOT_EXPECTED = Refusal("not expected", exitcodes.REFUSED)


@dataclass(slots=True)
class ChildSession:
    identity: Identity
    routing_id: bytes | None = None
    fd: int | None = None
    liveness: Liveness | None = None
    ended: str = ""  # why this incarnation ended; empty while it may still connect
    end_code: int = exitcodes.LOST  # the exit code its broker is told, should it speak again
    retiring: bool = False  # told to retire: however it ends, it is retired (exit 0)
    shared: bool = False  # a config-booted rank, whose broker holds the instance's shared key

    @property
    def connected(self) -> bool:
        return self.routing_id is not None and not self.ended


@dataclass(slots=True)
class Inbound:
    """What one read of the ROUTER produced for the broker to act on."""

    reports: list[Event] = field(default_factory=list)
    messages: list[tuple[int, Message]] = field(default_factory=list)
    rejoins: list[Rejoin] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Rejoin:
    """A config-booted rank's broker is back (restarted on its host): rank 0 must raise the
    rank's incarnation before it is welcomed. `incarnation` is the one that ended."""

    rank: int
    incarnation: int
    routing_id: bytes
    fd: int
    hello: Message


class Children:
    def __init__(
        self,
        context: zmq.Context,
        rank: int,
        topology: Topology,
        config: BrokerConfig,
        secret_z85: str,
    ) -> None:
        self.rank = rank
        self.topology = topology
        self.config = config
        self.keyring = KeyRing()
        self.zap = ZapHandler(context, self.keyring)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.sndhwm = 0
        self.socket.rcvhwm = 0
        self.socket.router_mandatory = 1
        self.socket.curve_server = True
        self.socket.curve_secretkey = secret_z85.encode()
        self.socket.zap_domain = b"tbon"
        self.socket.maxmsgsize = 8 * 1024 * 1024
        self.monitor = self.socket.get_monitor_socket(MONITORED)
        self.sessions: dict[int, ChildSession] = {}
        self._retired: set[Identity] = set()  # answered "retired" even once the rank is refilled
        self._by_routing: dict[bytes, ChildSession] = {}
        self._by_fd: dict[tuple[int, int], ChildSession] = {}  # (fd, generation) -> session
        self._fd_open: dict[int, bool] = {}
        self._fd_generation: dict[int, int] = {}
        self._closed: list[tuple[int, int]] = []
        self.shutting_down = False
        self._next_heartbeat = 0.0

    def bind(self, endpoint: str) -> str:
        """Bind to `endpoint` (a port of `*` picks a free one); returns the address bound."""
        self.socket.bind(endpoint)
        return self.socket.last_endpoint.decode()

    def authorize(self, rank: int, incarnation: int, public_z85: str) -> None:
        """Admit `public_z85` as (rank, incarnation). Asking again for the same incarnation
        changes nothing: a repeated key exchange must not orphan a broker already connected."""
        identity = Identity(rank, incarnation)
        old = self.sessions.get(rank)
        if old is not None and old.identity == identity and not old.ended:
            return
        self.keyring.authorize(public_z85, identity)
        if old is not None and old.routing_id is not None:
            self._by_routing.pop(old.routing_id, None)
        self.sessions[rank] = ChildSession(identity)

    def connected(self) -> list[int]:
        return [rank for rank, session in self.sessions.items() if session.connected]

    # --- input ------------------------------------------------------------------------------

    def drain_monitor(self) -> None:
        """Take in pending connection events. A disconnect is only noted here: it is applied by
        `settle`, after the messages that the connection delivered before it closed (a goodbye)."""
        while self.monitor.poll(0):
            kind, fd = read_event(self.monitor.recv_multipart())
            if kind == zmq.EVENT_ACCEPTED:
                self._fd_generation[fd] = self._fd_generation.get(fd, 0) + 1
                self._fd_open[fd] = True
            elif kind == zmq.EVENT_DISCONNECTED:
                self._fd_open[fd] = False
                self._closed.append((fd, self._fd_generation.get(fd, 0)))
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                for address, key in self.zap.refusals:
                    log.warning(
                        "refused a child from %s: CURVE key %s is not authorized", address, key
                    )
                self.zap.refusals.clear()

    def settle(self) -> list[Event]:
        """Declare lost every child whose connection closed without a goodbye."""
        reports: list[Event] = []
        closed, self._closed = self._closed, []
        for fd, generation in closed:
            session = self._by_fd.get((fd, generation))
            if session is not None:
                del self._by_fd[(fd, generation)]
                if session.connected:
                    reports.append(self._end(session, "lost", "connection lost"))
        return reports

    def read(self, now: float) -> Inbound:
        """Read one message from a child.

        The monitor is drained first so that a hello is tied to the connection (fd and
        generation) it came on, and a child that said hello and died at once is seen to be gone.
        """
        self.drain_monitor()
        inbound = Inbound()
        frames = self.socket.recv_multipart(copy=False)
        if len(frames) < 2:
            return inbound
        routing_id = frames[0].bytes
        try:
            user_id = frames[1].get("User-Id")
            fd = frames[1].get(zmq.SRCFD)
            message = decode([frame.bytes for frame in frames[1:]])
        except (MessageError, zmq.ZMQError, UnicodeDecodeError) as error:
            log.warning("dropped a malformed message from a child: %s", error)
            return inbound
        sender = self._sender(user_id, routing_id, message)
        if sender is None:
            log.warning("dropped a message from an unauthenticated peer")
            return inbound
        if message.kind is Kind.CONTROL and message.topic == "hello":
            if user_id == SHARED_USER_ID:
                self._shared_hello(routing_id, fd, sender, message, now, inbound)
            else:
                self._hello(routing_id, fd, sender, message, now, inbound)
            return inbound
        session = self._by_routing.get(routing_id)
        if session is None or session.identity != sender or not session.connected:
            self._refuse_stale(routing_id, sender, message)
            return inbound
        assert session.liveness is not None
        if session.liveness.heard(now) is Verdict.ALIVE:
            inbound.reports.append(Torpid(sender.rank, sender.incarnation, False))
        if message.kind is not Kind.CONTROL:
            inbound.messages.append((sender.rank, message))
        elif message.topic == "goodbye":
            inbound.reports.append(self._end(session, "departed", "said goodbye"))
        elif message.topic == "report":
            self._report(sender, message, inbound)
        elif message.topic != "heartbeat":
            log.warning("rank %d sent an unknown control message %r", sender.rank, message.topic)
        return inbound

    def _sender(self, user_id: str, routing_id: bytes, message: Message) -> Identity | None:
        """Who sent `message`: the identity its key is bound to, or, for the instance's shared
        key, the one it claimed in its hello on this connection."""
        if user_id != SHARED_USER_ID:
            return Identity.parse(user_id)
        if message.kind is Kind.CONTROL and message.topic == "hello":
            rank, incarnation = message.payload.get("rank"), message.payload.get("incarnation")
            if is_int(rank) and is_int(incarnation) and rank >= 0 and incarnation >= 0:
                return Identity(int(rank), int(incarnation))  # type: ignore[arg-type]
            return None
        session = self._by_routing.get(routing_id)
        return session.identity if session is not None else None

    def _hello(
        self,
        routing_id: bytes,
        fd: int,
        sender: Identity,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        session = self.sessions.get(sender.rank)
        refusal = self._ended(sender)
        if refusal is None:
            current = {r: s.identity.incarnation for r, s in self.sessions.items() if not s.ended}
            refusal = judge_hello(
                hello.payload, sender, self.rank, self.topology, current, self.shutting_down
            )
        if refusal is not None or session is None:
            self._refuse_hello(routing_id, hello, refusal or NOT_EXPECTED)
            return
        self._welcome(session, routing_id, fd, hello, now, inbound)

    def _ended(self, sender: Identity) -> Refusal | None:
        """Why an incarnation that has ended may not speak again, if it has: it was retired
        (exit 0), or it was lost, left or revoked. A lost one's exit code says "lost", not
        "refused": a new broker may take the rank by FLUB."""
        if sender in self._retired:
            return Refusal(_retired_reason(sender), exitcodes.SHUTDOWN)
        session = self.sessions.get(sender.rank)
        if session is not None and session.identity == sender and session.ended:
            reason = f"rank {sender.rank} incarnation {sender.incarnation} {session.ended}"
            return Refusal(reason, session.end_code)
        return None

    def _refuse_hello(self, routing_id: bytes, hello: Message, refusal: Refusal) -> None:
        log.warning("refused hello from rank %s: %s", hello.payload.get("rank"), refusal.reason)
        self._refuse(routing_id, refusal)

    def _refuse(self, routing_id: bytes, refusal: Refusal) -> None:
        self._send_raw(
            routing_id, _control("refuse", reason=refusal.reason, exit_code=refusal.exit_code)
        )

    def _shared_hello(
        self,
        routing_id: bytes,
        fd: int,
        sender: Identity | None,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        """A hello from a holder of the instance's key (config bootstrap), claiming a rank. Its
        broker cannot know its incarnation, so rank 0 says it (a Rejoin): the current one on
        first boot, a new one for a broker restarted on its host. Rank 0 also refuses a rank
        that was retired, or that a broker joined by FLUB holds now."""
        version = hello.payload.get("version")
        refusal = None
        if version != PROTOCOL_VERSION:
            refusal = Refusal(f"incompatible protocol version {version!r}", exitcodes.REFUSED)
        elif (
            sender is None
            or sender.rank >= self.topology.size
            or (self.topology.parent(sender.rank) != self.rank)
        ):
            rank = hello.payload.get("rank")
            refusal = Refusal(f"rank {rank} is not a child of rank {self.rank}", exitcodes.REFUSED)
        elif self.shutting_down:
            refusal = Refusal("the instance is shutting down", exitcodes.SHUTDOWN)
        session = self.sessions.get(sender.rank) if sender is not None else None
        if refusal is None and session is not None and session.connected and not session.shared:
            refusal = Refusal(
                f"rank {session.identity.rank} is held by a broker that joined by FLUB",
                exitcodes.REFUSED,
            )
        if refusal is not None or sender is None:
            self._refuse_hello(routing_id, hello, refusal or NOT_EXPECTED)
            return
        if session is not None and session.connected:  # its old broker: this one replaces it
            inbound.reports.append(self._end(session, "lost", "its host started a new broker"))
        ended = session.identity.incarnation if session is not None else 0
        inbound.rejoins.append(Rejoin(sender.rank, ended, routing_id, fd, hello))

    def rejoined(self, rejoin: Rejoin, incarnation: int | None, why: str, now: float) -> Inbound:
        """Rank 0's answer to a Rejoin: welcome the broker as `incarnation`, or refuse it."""
        inbound = Inbound()
        if incarnation is None:
            self._refuse_hello(rejoin.routing_id, rejoin.hello, Refusal(why, exitcodes.REFUSED))
            return inbound
        session = ChildSession(Identity(rejoin.rank, incarnation), shared=True)
        self.sessions[rejoin.rank] = session
        self._welcome(session, rejoin.routing_id, rejoin.fd, rejoin.hello, now, inbound)
        return inbound

    def _welcome(
        self,
        session: ChildSession,
        routing_id: bytes,
        fd: int,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        if session.routing_id is not None:
            self._by_routing.pop(session.routing_id, None)
        session.routing_id, session.fd = routing_id, fd
        session.liveness = Liveness(
            self.config.torpid, self.config.timeout, now, pause_after=3 * self.config.heartbeat
        )
        self._by_routing[routing_id] = session
        self._by_fd[(fd, self._fd_generation.get(fd, 0))] = session
        identity = session.identity
        welcome = _control(
            "welcome",
            rank=identity.rank,
            size=self.topology.size,
            incarnation=identity.incarnation,
        )
        self._send_raw(routing_id, welcome)
        host = str(hello.payload.get("hostname", ""))
        pid = hello.payload.get("pid")
        inbound.reports.append(
            Online(identity.rank, identity.incarnation, host, pid if isinstance(pid, int) else 0)
        )
        if not self._fd_open.get(fd, True):
            inbound.reports.append(self._end(session, "lost", "connection lost"))

    def _report(self, sender: Identity, message: Message, inbound: Inbound) -> None:
        try:
            event = decode_event(message.payload)
        except MessageError as error:
            log.warning("dropped a bad report from rank %d: %s", sender.rank, error)
            return
        if not 0 <= event.rank < self.topology.size or not self.topology.is_ancestor(
            sender.rank, event.rank
        ):
            log.warning("rank %d reported on rank %d, outside its subtree", sender.rank, event.rank)
            return
        inbound.reports.append(event)

    def _refuse_stale(self, routing_id: bytes, sender: Identity, message: Message) -> None:
        """Answer a broker whose incarnation has ended, so that it exits instead of lingering."""
        session = self.sessions.get(sender.rank)
        refusal = self._ended(sender)
        if (
            refusal is None
            and session is not None
            and (session.identity.incarnation > sender.incarnation)
        ):
            current = session.identity.incarnation
            reason = f"superseded: rank {sender.rank} is now incarnation {current}"
            refusal = Refusal(reason, exitcodes.REFUSED)
        if refusal is not None:
            self._refuse(routing_id, refusal)
        else:
            log.warning(
                "dropped %s %r from rank %d: not connected",
                message.kind,
                message.topic,
                sender.rank,
            )

    def _end(self, session: ChildSession, how: str, why: str) -> Event:
        """End a child's incarnation: revoke its key, forget its connection, report it. One
        that was retiring is retired whichever way it went: should it speak again, it is told
        so and exits 0."""
        identity = session.identity
        session.ended = f"was {how}: {why}" if how == "lost" else f"has {how}"
        if session.retiring:
            session.ended, session.end_code = "has retired", exitcodes.SHUTDOWN
            self._retired.add(identity)
        self.keyring.revoke(identity)
        if how == "lost":
            log.warning("rank %d lost: %s", identity.rank, why)
            return Lost(identity.rank, identity.incarnation, why)
        log.info("rank %d %s", identity.rank, "retired" if session.retiring else "departed")
        return Departed(identity.rank, identity.incarnation)

    def revoke(self, rank: int, incarnation: int, reason: str) -> None:
        """Rank 0 voided this incarnation (say, its reservation expired): drop its key, and cut
        its broker off if it got in. Nothing is reported: rank 0 already knows."""
        identity = Identity(rank, incarnation)
        self.keyring.revoke(identity)
        session = self.sessions.get(rank)
        if session is None or session.identity != identity or session.ended:
            return
        if session.connected and session.routing_id is not None:
            self._refuse(session.routing_id, Refusal(reason, exitcodes.REFUSED))
        session.ended, session.end_code = f"was revoked: {reason}", exitcodes.REFUSED
        log.warning("rank %d incarnation %d revoked: %s", rank, incarnation, reason)

    def retire(self, rank: int, incarnation: int, order: dict[str, Any]) -> str:
        """Rank 0 recorded (rank, incarnation) as retiring: record it here too, then tell its
        broker to drain and leave. Returns why that could not be done, or ""."""
        session = self.sessions.get(rank)
        if session is None or session.identity != Identity(rank, incarnation) or session.ended:
            return f"rank {rank} incarnation {incarnation} is not a current child of this broker"
        session.retiring = True
        if not self.send(rank, _control("retire", **order)):
            return f"rank {rank} is not connected"
        log.info("rank %d incarnation %d: retiring", rank, incarnation)
        return ""

    # --- output -----------------------------------------------------------------------------

    def send(self, rank: int, message: Message) -> bool:
        session = self.sessions.get(rank)
        if session is None or not session.connected or session.routing_id is None:
            return False
        return self._send_raw(session.routing_id, message)

    def _send_raw(self, routing_id: bytes, message: Message) -> bool:
        try:
            self.socket.send_multipart([routing_id, *encode(message)], flags=zmq.DONTWAIT)
        except zmq.ZMQError as error:
            if error.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
                raise
            return False
        return True

    def shutdown(self) -> None:
        """Ask every connected child to shut its subtree down (leaves go first)."""
        self.shutting_down = True
        for rank in self.connected():
            self.send(rank, _control("shutdown"))

    def tick(self, now: float) -> list[Event]:
        """Send heartbeats when due, and judge each child's silence."""
        reports: list[Event] = []
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat
            for rank in self.connected():
                self.send(rank, _control("heartbeat"))
        for session in self.sessions.values():
            if not session.connected or session.liveness is None:
                continue
            verdict = session.liveness.check(now)
            identity = session.identity
            if verdict is Verdict.TORPID:
                log.warning("rank %d is torpid", identity.rank)
                reports.append(Torpid(identity.rank, identity.incarnation, True))
            elif verdict is Verdict.LOST:
                silent = now - session.liveness.last_heard
                reports.append(self._end(session, "lost", f"silent for {silent:.1f}s"))
        return reports

    def verdict_due(self, now: float) -> bool:
        """Whether some child's silence is about to be judged (torpid or lost) at `now`."""
        return any(
            (deadline := session.liveness.deadline()) is not None and deadline <= now
            for session in self.sessions.values()
            if session.connected and session.liveness is not None
        )

    def next_deadline(self) -> float:
        deadlines = [self._next_heartbeat]
        for session in self.sessions.values():
            if session.connected and session.liveness is not None:
                deadline = session.liveness.deadline()
                if deadline is not None:
                    deadlines.append(deadline)
        return min(deadlines)

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        self.zap.close()


def _retired_reason(identity: Identity) -> str:
    return f"retired: rank {identity.rank} incarnation {identity.incarnation} has retired"


def _control(topic: str, **payload: Any) -> Message:
    return Message(Kind.CONTROL, topic, payload)
