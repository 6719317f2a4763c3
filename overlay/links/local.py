"""The broker's local connector: a Unix stream socket in its run directory, for clients on its host.

Whoever can open the socket (the owner: the run directory is 0700, the socket 0600) may talk to the
instance. Each connection carries framed messages both ways (wire/frames.py) and is one client,
named by a hop `l<hex>` from a counter that never goes back, so a late answer can never reach a
newer client that got the same descriptor. The counter starts at a number drawn at random when the
server starts (`first_number`), not at 1: a route names a client by its broker's rank and this hop
(wire/route.py `origin`), and the jobs a client owns are judged by that (services/trust.py), so a
later broker of the same rank (a joiner refilling it, a restarted broker) must never number a client
as one of an earlier broker's, whose jobs may still run elsewhere. A connection that ends (end of
file, or reset: a client killed outright never says goodbye) is a client gone: what it started (exec
jobs, status streams) is ended. A stream that cannot be framed (a count or a length out of bounds)
is closed at once, with one log line and a last notice saying why; one message that frames but does
not decode is dropped and the connection goes on, as on every link.

The broker never blocks on a client: every socket is non-blocking, and what a client has not
taken yet waits in its outbox, watched for POLLOUT only while there is some. What a client leaves
unread is bounded instead. It reports the bytes it has read (`client.ack`, which tbon's client
sends every megabyte, handled here and never routed); one that would leave more than
`broker.client-backlog` unread is dropped: told so in one last message, its streams cancelled and
its jobs killed, as if it had hung up, and nothing it sends afterwards is heard; what was queued
for it and not begun is freed at once. All clients together are held to
`broker.client-backlog-total` too: past it, the one holding the most is dropped (backlogs.py
decides, this module carries it out). Credit-based streams (exec, status.watch) stay far below
the bound; only a client that asks and asks without reading reaches it. What a client sends is
bounded too: one message's frames at most 8 MiB (`MAX_INPUT`), and one connection is read until
`READ_BUDGET` bytes or `MESSAGE_BUDGET` messages before the others get a turn (the rest of a read
is taken too: poll would not tell of it).

At most `client_cap()` connections are served at once (a quarter of RLIMIT_NOFILE, between 16 and
4096): the broker needs its descriptors for its children and its jobs too. A connection over the
cap is accepted, told why, and closed (logged at most once every `REFUSAL_LOG_EVERY` seconds).
When the process is out of descriptors, a client is taken with one lent from the broker's
reserve (descriptors.py), which a flood on the tree port cannot reach; the reserve's last one
only serves to refuse, so that the listener never stays readable.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator

from tbon.overlay.config.attributes import default_total
from tbon.overlay.connectors.uri import SOCKET_NAME
from tbon.overlay.links.backlogs import Drop, Ledger
from tbon.overlay.links.descriptors import (
    OUT_OF_DESCRIPTORS,
    Reserve,
    descriptor_limit,
    reserve_size,
)
from tbon.overlay.links.release import TRIM_ABOVE, give_back
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.wire.frames import MAX_FRAME, Buffer, FrameError, FrameReader, Outbox, frame_parts
from tbon.overlay.wire.message import Kind, Message, MessageError, decode, encode

log = logging.getLogger("tbon.local")

DEFAULT_BACKLOG = 64 << 20
MAX_INPUT = MAX_FRAME  # one message's frames together, as ZeroMQ's maxmsgsize was per frame
CHUNK = 64 << 10  # bytes taken from a connection per read
READ_BUDGET = 1 << 20  # bytes read from one connection per turn
MESSAGE_BUDGET = 256  # messages read from one connection per turn (and what is left of a read)
ACCEPTS = 64  # connections accepted per turn
REFUSAL_LOG_EVERY = 10.0
_SEND_FLAGS = socket.MSG_NOSIGNAL  # a client gone is an error to handle, not SIGPIPE

Watch = Callable[[int, "bool | None"], None]
"""Tells the loop how to poll a connection's descriptor: for input, for output too (True), or
not at all any more (None: it is about to be closed)."""


def local_uri(rundir: str) -> str:
    return f"local://{os.path.join(rundir, SOCKET_NAME)}"


FIRST_NUMBER_BYTES = 8
"""How wide the random first connection number is: 64 bits. Two brokers that held one rank share
a number only if their ranges of numbers overlap: for ranges of n1 and n2 connections, with a
chance below (n1 + n2) / 2**64. Even a rank refilled a thousand times, each broker taking a
million connections, gives half a million pairs at 2e6 / 1.8e19 each: about 5e-8 in all. A hop
is then at most 17 characters (`l` and 16 hex digits), on a client's requests only."""


def first_number() -> int:
    """The first connection number of a new local server: random, drawn from the kernel, so that
    no other broker that held this rank, before or after, numbers its clients alike (above).
    Its incarnation would not do, though every broker knows it before it serves a client: a
    broker restarted with its key (`broker.cert`) is taken back as the same incarnation
    (docs/protocol.md §5), while the jobs of its former process may still run."""
    return int.from_bytes(os.urandom(FIRST_NUMBER_BYTES), "big")


def client_cap(nofile: int | None = None) -> int:
    """How many clients a broker serves at once: a quarter of its descriptors."""
    return max(16, min(4096, (descriptor_limit() if nofile is None else nofile) // 4))


class Backlog:
    """Bytes sent to one client and bytes it said it has read: the difference is unread."""

    __slots__ = ("acked", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.acked = 0

    def ack(self, total: object) -> None:
        """The client has read `total` bytes in all: never more than was sent, never less than
        it said before (a replayed ack changes nothing)."""
        if is_int(total):
            self.acked = max(self.acked, min(total, self.sent))

    def unread_with(self, size: int) -> int:
        return self.sent + size - self.acked


class RateLimit:
    """Whether to log now, at most once per `every` seconds, and how many went unlogged."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._next = float("-inf")
        self.missed = 0

    def due(self, now: float) -> bool:
        if now < self._next:
            self.missed += 1
            return False
        self._next = now + self.every
        return True


class _Client:
    """One connection: its framing both ways, what it left unread, and how it ends."""

    __slots__ = ("backlog", "dropped", "fd", "heard", "hop", "outbox", "reader", "sock", "writing")

    def __init__(self, sock: socket.socket, hop: str) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.hop = hop
        self.reader = FrameReader(MAX_INPUT)
        self.outbox = Outbox()
        self.backlog = Backlog()
        self.heard = False  # said something: only then can it have started anything
        self.dropped = False  # past its backlog: output still flushed, input ignored
        self.writing = False  # polled for output

    def sendmsg(self, parts: list[Buffer]) -> int:
        return self.sock.sendmsg(parts, (), _SEND_FLAGS)

    def unread_with(self, size: int) -> int:
        """What would be unread after `size` more: by its acks, and at least what is queued here
        (a client that acknowledges what it never read gains nothing)."""
        return max(self.backlog.unread_with(size), self.outbox.size + size)

    def held(self) -> int:
        """What it makes the broker hold, for the ledger: its unread bytes; once dropped, only
        what is still queued for it (what it was sent before can never be asked for again)."""
        return self.outbox.size if self.dropped else self.unread_with(0)


class LocalServer:
    def __init__(
        self,
        rundir: str,
        backlog: int = DEFAULT_BACKLOG,
        cap: int | None = None,
        reserve: int | None = None,
        total: int | None = None,
        first: int | None = None,
    ) -> None:
        """`backlog` bounds what one client leaves unread, `total` what all of them do (by
        default five quarters of `backlog`: config/attributes.py); `first` is the first
        connection's number (by default drawn at random: `first_number`)."""
        self.path = os.path.join(rundir, SOCKET_NAME)
        if len(self.path.encode()) > 100:
            from tbon.errors import UsageError

            raise UsageError(f"run directory path is too long for a Unix socket: {rundir}")
        self.listener = _listen(self.path)
        self.uri = f"local://{self.path}"
        self.backlog = backlog
        self.ledger = Ledger(backlog, default_total(backlog) if total is None else total)
        self.cap = client_cap() if cap is None else cap
        self._clients: dict[int, _Client] = {}  # by descriptor
        self._hops: dict[str, _Client] = {}
        self._numbers = itertools.count(first_number() if first is None else first)
        self._gone: list[str] = []
        self._watch: Watch = lambda fd, writing: None
        self._scratch = bytearray(CHUNK)
        self.reserve = Reserve(reserve_size(descriptor_limit()) if reserve is None else reserve)
        self._refusals = RateLimit(REFUSAL_LOG_EVERY)
        self._freed = 0  # bytes dropped and closed clients gave up since the last release()

    def fileno(self) -> int:
        """The listener's descriptor: readable when a client connects (call accept())."""
        return self.listener.fileno()

    def watch_with(self, watch: Watch) -> None:
        """How the loop is told which connections to poll, and for what."""
        self._watch = watch
        for client in self._clients.values():
            watch(client.fd, client.writing)

    # --- connections ------------------------------------------------------------------------

    def accept(self) -> None:
        """Take the clients waiting to connect (each polled from now on), or refuse them."""
        for _ in range(ACCEPTS):
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in OUT_OF_DESCRIPTORS and self._from_reserve():
                    continue
                if self._refusals.due(time.monotonic()):
                    log.warning("could not accept a local client: %s", error.strerror)
                return
            self._take(sock)

    def _take(self, sock: socket.socket) -> None:
        if len(self._clients) >= self.cap:
            self._refuse(sock, f"it already serves {self.cap} local clients, its limit")
            return
        sock.setblocking(False)
        client = _Client(sock, f"l{next(self._numbers):x}")
        self._clients[client.fd] = client
        self._hops[client.hop] = client
        self._watch(client.fd, False)

    def _from_reserve(self) -> bool:
        """Out of descriptors: take the waiting client with one from the reserve
        (descriptors.py), or, with the last one, refuse it, so that the listener does not stay
        readable (the loop would spin on it). False if no client could be taken."""
        with self.reserve.lending():
            while (last := len(self.reserve) == 1) or self.reserve:
                self.reserve.release(1)
                try:
                    sock, _ = self.listener.accept()
                except BlockingIOError:
                    return False
                except OSError as error:
                    if error.errno in OUT_OF_DESCRIPTORS:
                        continue  # taken by another thread first: try the next one
                    return False
                if last:
                    self._refuse(sock, "it is out of file descriptors")
                else:
                    self._take(sock)
                return True
        return False

    def _refuse(self, sock: socket.socket, why: str) -> None:
        """Tell a client it is not served, and close it."""
        notice = Message(
            Kind.RESPONSE,
            "client.dropped",
            errnum=errno.EMFILE,
            errstr=f"the broker refused this connection: {why}",
        )
        with contextlib.suppress(OSError), sock:
            sock.setblocking(False)
            sock.sendmsg(frame_parts(encode(notice)), (), _SEND_FLAGS)
        if self._refusals.due(time.monotonic()):
            missed, self._refusals.missed = self._refusals.missed, 0
            more = f" (and {missed} more since the last such line)" if missed else ""
            log.warning("refused a local client%s: %s", more, why)

    def _close(self, client: _Client) -> None:
        """The connection is over: the loop stops polling it, and the client is gone (if it
        ever said anything, so ever started anything)."""
        if self._clients.pop(client.fd, None) is None:
            return
        del self._hops[client.hop]
        self._freed += self.ledger.unread.get(client.hop, 0)
        self.ledger.forget(client.hop)
        self._watch(client.fd, None)
        client.sock.close()
        if client.heard and not client.dropped:
            self._gone.append(client.hop)  # a dropped client was reported when dropped

    def gone(self) -> list[str]:
        """Hops of clients whose connections closed, or that were dropped, since the last call."""
        hops, self._gone = self._gone, []
        return hops

    dropped_since = gone  # a drop happens while sending, from anywhere in the loop

    # --- input ------------------------------------------------------------------------------

    def read(self, fd: int) -> Iterator[tuple[str, Message]]:
        """Requests from the client on `fd` as (client hop, message), in order; what it was
        waiting to be sent goes first. A connection that ends or garbles its stream is closed
        (see gone())."""
        client = self._clients.get(fd)
        if client is None:
            return
        if client.outbox:
            self._flush(client)
        budget, count = READ_BUDGET, 0
        while budget > 0 and count < MESSAGE_BUDGET and self._clients.get(fd) is client:
            size = self._receive(client)
            if size is None:
                return
            budget -= size
            while (frames := self._next(client)) is not None:
                if client.dropped or self._clients.get(fd) is not client:
                    return  # dropped while its earlier requests were routed: no more is heard
                count += 1
                message = self._decode(client, frames)
                if message is not None:
                    yield client.hop, message

    def _next(self, client: _Client) -> list[bytes] | None:
        """The client's next whole message; None if there is none yet, or if its stream is
        garbled (then it is closed)."""
        try:
            return client.reader.next()
        except FrameError as error:
            self._garbled(client, str(error))
            return None

    def _receive(self, client: _Client) -> int | None:
        """Read once into the client's reader: the bytes read, None if there were none now (or
        the connection ended, and is closed)."""
        try:
            size = client.sock.recv_into(self._scratch)
        except BlockingIOError:
            return None
        except OSError:
            size = 0  # reset: gone, as at end of file
        if size == 0:
            self._close(client)
            return None
        if not client.dropped:
            with memoryview(self._scratch) as view:
                client.reader.feed(view[:size])
        return size

    def _decode(self, client: _Client, frames: list[bytes]) -> Message | None:
        client.heard = True
        try:
            message = decode(frames)
        except MessageError as error:
            log.warning("dropped a malformed message from local client %s: %s", client.hop, error)
            return None
        if message.topic == "client.ack":  # for this socket alone: never routed
            client.backlog.ack(message.payload.get("bytes"))
            self.ledger.set(client.hop, client.held())
            return None
        return message

    def _garbled(self, client: _Client, why: str) -> None:
        """A stream out of step: nothing more on it can be trusted. The client is told why (if
        it reads), and closed."""
        log.warning("closed local client %s: garbled input (%s)", client.hop, why)
        client.heard = True  # it may have started something before
        notice = Message(
            Kind.RESPONSE,
            "client.dropped",
            errnum=errno.EPROTO,
            errstr=f"the broker closed this connection: garbled input ({why})",
        )
        client.outbox.push(frame_parts(encode(notice)))
        with contextlib.suppress(OSError):
            client.outbox.flush(client.sendmsg)
        self._close(client)

    # --- output -----------------------------------------------------------------------------

    def send(self, hop: str, message: Message) -> bool:
        """Send to the client named by route hop `l<hex>`; False if it has gone away, or has
        been dropped, as it is now if this would leave more than the backlog unread."""
        client = self._hops.get(hop)
        if client is None or client.dropped:
            return False
        frames = encode(message)
        size = sum(len(frame) for frame in frames)
        admission = self.ledger.admit(hop, client.unread_with(size))
        for drop in admission.drops:
            self._drop(self._hops[drop.hop], drop)
        if not admission.send:
            return False
        client.backlog.sent += size
        if client.writing:  # it waits its turn behind what is queued
            client.outbox.push(frame_parts(frames))
            self.ledger.set(hop, client.held())
            return True
        self._flush(client, frame_parts(frames))
        return self._clients.get(client.fd) is client

    def flush(self, fd: int) -> None:
        """The client on `fd` can take more: write what waits for it."""
        if (client := self._clients.get(fd)) is not None and client.outbox:
            self._flush(client)

    def _flush(self, client: _Client, parts: list[Buffer] | None = None) -> None:
        """Write what waits for the client, then `parts`, as far as its socket takes them; poll
        for output only while some is left."""
        try:
            if parts is None:
                client.outbox.flush(client.sendmsg)
            else:
                client.outbox.send(parts, client.sendmsg)
        except OSError:
            self._close(client)  # it went away: its end of file or reset is read next
            return
        self.ledger.set(client.hop, client.held())
        writing = bool(client.outbox)
        if writing != client.writing:
            client.writing = writing
            self._watch(client.fd, writing)
        if not writing and client.dropped:
            with contextlib.suppress(OSError):
                client.sock.shutdown(socket.SHUT_WR)  # all it was sent, then end of file

    def _drop(self, client: _Client, drop: Drop) -> None:
        """Drop a client past its bound, or the greediest when all are past theirs: what was
        queued for it and not begun is given up at once, and it is told why. One dropped
        already, that would still hold the most, is closed outright."""
        if client.dropped:
            log.warning("closed dropped local client %s: it still held the most", client.hop)
            self._close(client)
            return
        unread = client.unread_with(0)
        if drop.total:
            total = _mib(self.ledger.total_bound)
            bound = f"the most of all local clients, past broker.client-backlog-total, {total}"
        else:
            bound = f"past broker.client-backlog, {_mib(self.backlog)}"
        why = f"the broker dropped this connection: {_mib(unread)} sent to it went unread ({bound})"
        log.warning(
            "dropped local client %s: %d bytes sent to it unread (%s)", client.hop, unread, bound
        )
        self._freed += client.outbox.give_up()  # released now, not when (if ever) it reads
        notice = Message(Kind.RESPONSE, "client.dropped", errnum=errno.ENOBUFS, errstr=why)
        client.outbox.push(frame_parts(encode(notice)))  # past the bound: one small last word
        client.dropped = True
        client.reader = FrameReader(MAX_INPUT)  # whatever it sends from now on is not heard
        self._gone.append(client.hop)
        self._flush(client)

    def release(self) -> None:
        """After clients were dropped or closed holding much, give the memory they held back
        to the system (release.py): once per turn of the loop, however many went."""
        if self._freed >= TRIM_ABOVE:
            give_back()
        self._freed = 0

    def close(self) -> None:
        for client in list(self._clients.values()):
            self._close(client)
        self.listener.close()
        self.reserve.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.2f}".rstrip("0").rstrip(".") + " MiB"


def _listen(path: str) -> socket.socket:
    """A non-blocking listener at `path`. It binds under a temporary name and is renamed into
    place once listening, so a client that sees the file never meets a refused connection."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)  # left by an earlier process of this pid
        listener.bind(staging)
        os.chmod(staging, 0o600)
        listener.listen(socket.SOMAXCONN)
        listener.setblocking(False)
        os.replace(staging, path)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise
    return listener
