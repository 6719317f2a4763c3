"""A parent's side of its links: the ROUTER its children connect to, and their sessions.

The ROUTER is a CURVE server whose ZAP handler accepts exactly the keys in the KeyRing, each bound
to one (rank, incarnation) and stamped on the child's messages as the ZeroMQ User-Id. A child is
believed about nothing but itself and its own subtree. Whether its hello is welcomed is judged in
hello.py; each incarnation's session is kept in sessions.py. Its death is seen the moment its
connection drops (the socket monitor), or when it falls silent past tbon.timeout.

A session is on the connection its latest welcomed hello came on (connections.py). A child whose
TCP connection went half-dead may connect again and say hello on the new one: it is welcomed
there, the old connection's close, whenever it comes, ends nothing, and the new connection's close
ends the session. A close of the connection a session is on is what proves it gone; an old one
closing proves only that the child left it. Only the same broker (host and pid) moves a session:
another process holding the same key is refused, so that one incarnation never has two brokers.

The module is a little over 400 lines: it is the ROUTER's whole input (monitor events, hellos,
reports, goodbyes) and output (welcome, refuse, heartbeats, orders), which read best in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from tbon import exitcodes
from tbon.overlay.config.attributes import BrokerConfig
from tbon.overlay.links.connections import Connection, ConnectionLedger
from tbon.overlay.links.hello import (
    AskRankZero,
    Parent,
    Refusal,
    Welcome,
    hello_broker,
    judge_hello,
    judge_stale,
)
from tbon.overlay.links.keyring import SHARED_USER_ID, Identity, KeyRing, ZapHandler
from tbon.overlay.links.liveness import Liveness, Verdict
from tbon.overlay.links.monitor import read_event
from tbon.overlay.links.sessions import ChildSession
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.ranktable import Dropped, Event, Lost, Moved, Online, Torpid
from tbon.overlay.state.reports import decode_event
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.flow import LINK_HWM
from tbon.overlay.wire.message import Kind, Message, MessageError, decode_frames, encode

log = logging.getLogger("tbon.children")

REFUSAL_QUIET = 60.0
"""Seconds during which a refused key is not logged again."""
MAX_REFUSALS_SAID = 4096
"""Keys remembered as logged: a flood of fresh keys empties the memory, never grows it."""

MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH


@dataclass(slots=True)
class Inbound:
    """What one read of the ROUTER produced for the broker to act on."""

    reports: list[Event] = field(default_factory=list)
    messages: list[tuple[int, Message]] = field(default_factory=list)
    rejoins: list[Rejoin] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Rejoin:
    """A config-booted rank's broker is back (restarted on its host): rank 0 must raise the
    rank's incarnation before it is welcomed. `incarnation` is the one that ended. `fd` and
    `generation` name the connection the hello came on, which may close while rank 0 answers
    (no generation: whichever connection is on `fd` when it is welcomed)."""

    rank: int
    incarnation: int
    routing_id: bytes
    fd: int
    hello: Message
    generation: int | None = None


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
        self._full: set[bytes] = set()  # routing ids of children whose link is full
        self._refusals_said: dict[str, float] = {}  # refused key -> when to log it again
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.sndhwm = LINK_HWM  # per child; see _send_raw
        self.socket.rcvhwm = LINK_HWM
        self.socket.router_mandatory = 1
        self.socket.curve_server = True
        self.socket.curve_secretkey = secret_z85.encode()
        self.socket.zap_domain = b"tbon"
        self.socket.maxmsgsize = 8 * 1024 * 1024
        self.monitor = self.socket.get_monitor_socket(MONITORED)
        self._start_sessions()

    def _start_sessions(self) -> None:
        """The state with no sockets in it (tests build a Children from this alone)."""
        self.sessions: dict[int, ChildSession] = {}
        self.fosters: set[int] = set()  # ranks whose session here is a foster child's
        self._retired: set[Identity] = set()  # answered "retired" even once the rank is refilled
        self._by_routing: dict[bytes, ChildSession] = {}
        self._ledger: ConnectionLedger[ChildSession] = ConnectionLedger()
        self._gone: list[ChildSession] = []  # off a closed connection; judged by `settle`
        self.shutting_down = False
        self._next_heartbeat = 0.0
        # the cards (rank, endpoint, public key) of this broker's ancestors and its own, rank 0
        # first: what a child needs to seek a live ancestor should this broker go
        self.lineage: list[list[Any]] = []
        # the seconds left of this broker's search for a parent (or its parent's), said to a
        # child right after its welcome; None: nobody above seeks (the broker sets it: uplink.py)
        self.seeking_for: Callable[[float], float | None] = lambda now: None

    def bind(self, endpoint: str) -> str:
        """Bind to `endpoint` (a port of `*` picks a free one); returns the address bound."""
        self.socket.bind(endpoint)
        return self.socket.last_endpoint.decode()

    def authorize(
        self,
        rank: int,
        incarnation: int,
        public_z85: str,
        foster_until: float | None = None,
    ) -> None:
        """Admit `public_z85` as (rank, incarnation) ("": a config-booted broker holding the
        instance's shared key, which must claim exactly that incarnation). Asking again for the
        same incarnation changes nothing: a repeated key exchange must not orphan a broker
        already connected. With `foster_until`, the rank is a foster child (docs/protocol.md
        §12): expected until then, and forgotten if it has not come."""
        identity = Identity(rank, incarnation)
        old = self.sessions.get(rank)
        if old is not None and old.identity == identity and old.connected:
            return
        if public_z85:
            self.keyring.authorize(public_z85, identity)
        else:
            self.keyring.revoke_rank(rank)
        if old is not None and old.routing_id is not None:
            self._by_routing.pop(old.routing_id, None)
        foster = self.topology.parent(rank) != self.rank
        if foster:
            self.fosters.add(rank)
        else:
            self.fosters.discard(rank)
        self.sessions[rank] = ChildSession(
            identity,
            parent=self.rank,
            key=public_z85,
            shared=not public_z85,
            foster=foster,
            expected=foster or not public_z85,
            expected_until=foster_until if foster else None,
        )

    def attached(self, rank: int) -> bool:
        """Whether `rank`'s broker is connected here (as a child or a foster child)."""
        session = self.sessions.get(rank)
        return session is not None and session.connected

    def connected(self) -> list[int]:
        return [rank for rank, session in self.sessions.items() if session.connected]

    def awaited(self) -> list[int]:
        """What a shutdown waits for: the children connected, and the foster children rank 0
        said to expect, which are told the instance is shutting down when they come."""
        return [
            rank
            for rank, session in self.sessions.items()
            if session.connected or (session.foster and session.expected_until is not None)
        ]

    # --- input ------------------------------------------------------------------------------

    def drain_monitor(self) -> None:
        """Take in pending connection events. A disconnect is only noted here: it is applied by
        `settle`, after the messages that the connection delivered before it closed (a goodbye)."""
        while self.monitor.poll(0):
            kind, fd = read_event(self.monitor.recv_multipart())
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                now = time.monotonic()
                for address, key in self.zap.refusals:
                    if now < self._refusals_said.get(key, 0.0):
                        continue  # a broker seeking a parent knocks every 50 ms: said once
                    if len(self._refusals_said) >= MAX_REFUSALS_SAID:
                        self._refusals_said.clear()
                    self._refusals_said[key] = now + REFUSAL_QUIET
                    log.warning(
                        "refused a child from %s: CURVE key %s is not authorized", address, key
                    )
                self.zap.refusals.clear()
            else:
                self._connection_event(kind, fd)

    def _connection_event(self, kind: int, fd: int) -> None:
        if kind == zmq.EVENT_ACCEPTED:
            self._ledger.accepted(fd)
        elif kind == zmq.EVENT_DISCONNECTED:
            self._gone += self._ledger.closed(fd)

    def settle(self) -> list[Event]:
        """Declare lost every child whose connection closed without a goodbye. One that said
        hello again on another connection since is not: it is tied to that one now."""
        reports: list[Event] = []
        gone, self._gone = self._gone, []
        for session in gone:
            if session.connected and not self._ledger.tied(session):
                reports.append(self._end(session, "lost", "connection dropped"))
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
        session = self._by_routing.get(routing_id)
        if session is None or session.identity != sender or not session.connected:
            self._refuse_stale(routing_id, sender, message)
            return inbound
        assert session.liveness is not None
        if session.liveness.heard(now) is Verdict.ALIVE:
            inbound.reports.append(Torpid(sender.rank, sender.incarnation, False, self.rank))
        if message.kind is not Kind.CONTROL:
            inbound.messages.append((sender.rank, message))
        elif message.topic == "goodbye":
            inbound.reports.append(self._end(session, "departed", "said goodbye"))
        elif message.topic == "moved":
            to = message.payload.get("to")
            if is_int(to):
                inbound.reports.append(self._moved(session, int(to)))
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
                return Identity(int(rank), int(incarnation))
            return None
        session = self._by_routing.get(routing_id)
        return session.identity if session is not None else None

    def _parent(self) -> Parent:
        """This parent as the hello judge sees it."""
        children = {rank: session.standing() for rank, session in self.sessions.items()}
        return Parent(self.rank, self.topology, children, self._retired, self.shutting_down)

    def _hello(
        self,
        routing_id: bytes,
        fd: int,
        key: Identity | None,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        """Act on the judge's word on a hello from the holder of `key` (None: the shared key)."""
        connection = self._ledger.connection(fd)
        match judge_hello(hello.payload, key, self._parent()):
            case Refusal() as refusal:
                self._refuse_hello(routing_id, hello, refusal)
            case Welcome(identity):
                session = self.sessions[identity.rank]
                if session.broker is not None and not self._ledger.is_open(connection):
                    # A broker welcomed before (back from a partition, or seeking a parent)
                    # that has already left the connection this hello came on: it says
                    # nothing of where that broker is now, so it is not news.
                    log.info("ignored a hello of rank %d from a closed connection", identity.rank)
                    return
                self._welcome(session, routing_id, connection, hello, now, inbound)
            case AskRankZero(rank, ended, replaces):
                old = self.sessions.get(rank)
                if replaces and old is not None:  # its host's old broker: the new one wins
                    inbound.reports.append(self._end(old, "lost", "its host started a new broker"))
                rejoin = Rejoin(rank, ended, routing_id, fd, hello, connection.generation)
                inbound.rejoins.append(rejoin)

    def _refuse_hello(self, routing_id: bytes, hello: Message, refusal: Refusal) -> None:
        rank = hello.payload.get("rank")
        log.warning("refused hello from rank %s: %s", rank, refusal.reason)
        self._refuse(routing_id, refusal)
        session = self.sessions.get(rank) if is_int(rank) else None
        if session is not None and session.foster and refusal.exit_code == exitcodes.SHUTDOWN:
            self._forget_foster(session)  # told: it leaves, and nobody waits for it

    def _refuse(self, routing_id: bytes, refusal: Refusal) -> None:
        self._send_raw(
            routing_id, _control("refuse", reason=refusal.reason, exit_code=refusal.exit_code)
        )

    def rejoined(self, rejoin: Rejoin, incarnation: int | None, why: str, now: float) -> Inbound:
        """Rank 0's answer to a Rejoin: welcome the broker as `incarnation`, or refuse it."""
        inbound = Inbound()
        if incarnation is None:
            self._refuse_hello(rejoin.routing_id, rejoin.hello, Refusal(why, exitcodes.REFUSED))
            return inbound
        session = ChildSession(Identity(rejoin.rank, incarnation), shared=True, parent=self.rank)
        self.sessions[rejoin.rank] = session
        connection = (
            self._ledger.connection(rejoin.fd)
            if rejoin.generation is None
            else Connection(rejoin.fd, rejoin.generation)
        )
        self._welcome(session, rejoin.routing_id, connection, rejoin.hello, now, inbound)
        return inbound

    def _welcome(
        self,
        session: ChildSession,
        routing_id: bytes,
        connection: Connection,
        hello: Message,
        now: float,
        inbound: Inbound,
    ) -> None:
        """Welcome a child on `connection`, which its session is tied to from now on (if it had
        said hello on another, that one's close is no longer news)."""
        if session.routing_id is not None:
            self._by_routing.pop(session.routing_id, None)
        session.routing_id = routing_id
        session.liveness = Liveness(
            self.config.torpid, self.config.timeout, now, pause_after=3 * self.config.heartbeat
        )
        self._by_routing[routing_id] = session
        identity = session.identity
        welcome = _control(
            "welcome",
            rank=identity.rank,
            size=self.topology.size,
            incarnation=identity.incarnation,
            lineage=self.lineage,
        )
        self._send_raw(routing_id, welcome)
        if (left := self.seeking_for(now)) is not None:  # docs/protocol.md §5.6
            self._send_raw(routing_id, _control("seeking", **{"for": left}))
        session.broker = host, pid = hello_broker(hello.payload)
        session.ended, session.returnable = "", False  # a lost one back, if it was
        session.expected_until = None
        online = Online(identity.rank, identity.incarnation, host, pid, self.rank, session.key)
        inbound.reports.append(online)
        if not self._ledger.tie(session, connection):
            inbound.reports.append(self._end(session, "lost", "connection dropped"))

    def _report(self, sender: Identity, message: Message, inbound: Inbound) -> None:
        try:
            event = decode_event(message.payload)
        except MessageError as error:
            log.warning("dropped a bad report from rank %d: %s", sender.rank, error)
            return
        own = isinstance(event, Dropped) and event.rank == sender.rank  # its word on itself
        if not 0 <= event.rank < self.topology.size or not (
            own or self.topology.is_ancestor(sender.rank, event.rank)
        ):
            log.warning("rank %d reported on rank %d, outside its subtree", sender.rank, event.rank)
            return
        seen_by = event.parent
        if seen_by is None or not (
            seen_by == sender.rank
            or (
                0 <= seen_by < self.topology.size
                and self.topology.is_ancestor(sender.rank, seen_by)
            )
        ):
            log.warning("rank %d reported an event seen by rank %s", sender.rank, seen_by)
            return
        inbound.reports.append(event)

    def _refuse_stale(self, routing_id: bytes, sender: Identity, message: Message) -> None:
        """Answer a broker whose incarnation has ended, so that it exits instead of lingering."""
        refusal = judge_stale(sender, self._parent())
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
        event = session.end(how, why)
        self._release(session)
        return event

    def _release(self, session: ChildSession) -> None:
        """Its incarnation has ended: forget its connection, revoke its key unless it was lost
        (its own broker may come back when a partition heals, and rank 0 decides then whether
        that incarnation is still current; a new incarnation's key replaces it), and remember
        it if it retired, to tell it so should it speak again."""
        if session.retiring:
            self._retired.add(session.identity)
        if not session.returnable:
            self.keyring.revoke(session.identity)
        self._ledger.forget(session)

    def _moved(self, session: ChildSession, to: int) -> Event:
        """The child went home to its own parent (or on to another ancestor, `to`): this link
        ends without ending its incarnation."""
        identity = session.identity
        log.info("rank %d moved to rank %d", identity.rank, to)
        session.ended, session.end_code = "has moved to another parent", exitcodes.LOST
        self.keyring.revoke(session.identity)
        self._ledger.forget(session)
        if session.routing_id is not None:
            self._by_routing.pop(session.routing_id, None)
        if session.foster and self.sessions.get(identity.rank) is session:
            del self.sessions[identity.rank]
            self.fosters.discard(identity.rank)
        return Moved(identity.rank, identity.incarnation, self.rank, to)

    def send_lineage(self) -> None:
        """This broker's ancestors changed (it was welcomed again, by a foster parent or a new
        one): tell every child, so that each can seek a live ancestor should this one go."""
        for rank in self.connected():
            self.send(rank, _control("lineage", lineage=self.lineage))

    def revoke(self, rank: int, incarnation: int, reason: str) -> None:
        """Rank 0 ended this incarnation for good (replaced, voided): cut its broker off if it
        got in, and end its session so that its broker, should it knock again (a lost one back
        from a partition), is refused with 77 rather than welcomed or left to seek. The key
        stays bound to the ended incarnation until the rank's next admission replaces it, so
        that the broker's hello is heard and answered. Nothing is reported: rank 0 knows."""
        identity = Identity(rank, incarnation)
        session = self.sessions.get(rank)
        if session is None or session.identity != identity:
            self.keyring.revoke(identity)
            return
        if session.ended and not session.returnable:
            return  # ended for good already, and answered so
        if session.connected and session.routing_id is not None:
            self._refuse(session.routing_id, Refusal(reason, exitcodes.REFUSED))
        session.ended, session.end_code = f"was revoked: {reason}", exitcodes.REFUSED
        session.returnable = False
        session.expected_until = None
        self._ledger.forget(session)
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
            self.socket.send_multipart(
                [routing_id, *encode(message)], flags=zmq.DONTWAIT, copy=False
            )
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
        for session in list(self.sessions.values()):
            event = session.judge_silence(now)
            if event is not None:
                reports.append(event)
            if isinstance(event, Lost):
                self._release(session)
            until = session.expected_until
            if until is not None and now >= until and not session.connected:
                self._forget_foster(session)
        return reports

    def withdraw(self, rank: int, incarnation: int) -> None:
        """Rank 0 withdrew a foster admission it found moot (the rank reaches rank 0 through
        another broker, or its incarnation ended): forget it unless its broker came. A child
        that did come is left as it is: its own link's end is reported as any other."""
        session = self.sessions.get(rank)
        if (
            session is not None
            and session.foster
            and session.identity == Identity(rank, incarnation)
            and session.expected_until is not None
            and not session.connected
        ):
            log.info("rank %d incarnation %d: foster admission withdrawn", rank, incarnation)
            self._forget_foster(session)

    def _forget_foster(self, session: ChildSession) -> None:
        """A foster child rank 0 said to expect never came: its parent was alive after all."""
        self.keyring.revoke(session.identity)
        if self.sessions.get(session.identity.rank) is session:
            del self.sessions[session.identity.rank]
            self.fosters.discard(session.identity.rank)

    def verdict_due(self, now: float) -> bool:
        """Whether some child's silence is about to be judged (torpid or lost) at `now`."""
        return any(
            (deadline := session.deadline()) is not None and deadline <= now
            for session in self.sessions.values()
        )

    def next_deadline(self) -> float:
        deadlines = [session.deadline() for session in self.sessions.values()]
        deadlines += [s.expected_until for s in self.sessions.values() if not s.connected]
        return min([self._next_heartbeat, *(d for d in deadlines if d is not None)])

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        self.zap.close()


def _control(topic: str, **payload: Any) -> Message:
    return Message(Kind.CONTROL, topic, payload)
