"""A connection to an instance, for commands: requests, responses and streams.

A request names a target rank; the broker it reaches routes it through the tree and the answer
comes back the same way. Errors arrive as one-line TbonErrors.

Every command that talks to an instance imports this module first, so it imports little:
ACK_EVERY lives here rather than with exec's windows in wire/flow.py, which a ping never uses.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tbon.errors import TbonError
from tbon.overlay.connectors.patience import ANSWER_WAIT, Patience
from tbon.overlay.connectors.uri import Uri, parse_uri, parse_uri_list
from tbon.overlay.wire.frames import Buffer as Part
from tbon.overlay.wire.frames import FrameError, FrameReader, Outbox, frame_parts
from tbon.overlay.wire.message import ANY_RANK, Buffer, Kind, Message, decode_sized, encode

DEFAULT_TIMEOUT = ANSWER_WAIT  # seconds an answer is waited for, unless told otherwise
LIST_WAIT = 5.0
"""Seconds each URI of a list has to connect and answer a ping before the next is tried. The
broker a command connects to answers the ping itself, without the tree, so a live one answers
in milliseconds, a loaded one well within this; a stopped broker, an ssh host that does not
answer, a socket whose backlog is full cost this much each, and a whole list at most MAX_URIS
times as much."""
CHUNK = 256 << 10  # bytes read from the broker's socket at a time
ACK_EVERY = 1024 * 1024
"""A client acknowledges (`client.ack`) what it has read at least this often: the broker drops
one that leaves more than its backlog unread (docs/protocol.md §1.2, wire/flow.py)."""


class RequestError(TbonError):
    """The instance answered a request with an error."""

    def __init__(self, errnum: int, message: str) -> None:
        super().__init__(message)
        self.errnum = errnum


class NoAnswer(TbonError):
    """An answer did not come within the wait (exit 1, as any failure to reach the instance)."""


Progress = Callable[[str], None]
"""Where a command says whom it waits for ("" clears what it said): a terminal's line."""


class Client:
    def __init__(
        self, uri: str | Uri, progress: Progress | None = None, within: float | None = None
    ) -> None:
        """`within`: seconds the connection may take (a local socket's connect); None: as
        long as the system takes."""
        self.progress = progress  # None: say nothing while waiting (not at a terminal)
        self.uri = parse_uri(uri) if isinstance(uri, str) else uri
        self._transport: Transport
        if self.uri.scheme == "local":
            self._transport = LocalTransport(self.uri.path, within)
        else:
            from tbon.overlay.connectors.ssh import SshTransport

            self._transport = SshTransport(self.uri)
        self._tags = itertools.count(1)
        self._watches: set[int] = set()  # tags of this client's status.watch streams
        self.missed: set[int] = set()  # those whose update `answer` read while it waited
        self._read = ReadCount()

    def send(
        self,
        topic: str,
        payload: dict[str, Any] | None = None,
        nodeid: int = ANY_RANK,
        data: bytes = b"",
    ) -> int:
        tag = next(self._tags)
        message = Message(Kind.REQUEST, topic, payload or {}, nodeid=nodeid, tag=tag, data=data)
        self._transport.send(encode(message))
        if topic == "status.watch":
            self._watches.add(tag)
        return tag

    def wait(self, fds: list[int], timeout: float | None) -> tuple[bool, list[int]]:
        """Wait until a response is here or one of `fds` is readable (or `timeout` seconds
        pass): whether a response is, and which fds are."""
        return self._transport.wait(fds, None if timeout is None else int(timeout * 1000))

    def receive(self, timeout: float | None) -> Message | None:
        """The next response, or None if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._transport.poll(None if left is None else int(left * 1000)):
                return None
            size, reply = self._transport.recv()
            if (ack := self._read.read(size)) is not None:
                self._transport.send(ack)
            if reply is None:
                continue  # malformed, not ours to answer: skip it (its bytes were read)
            if reply.topic == "client.dropped" and reply.kind is Kind.RESPONSE:
                raise TbonError(reply.errstr or "the broker dropped this connection")
            if reply.tag in self._watches:
                self._read_table(reply)
            return reply

    def _read_table(self, reply: Message) -> None:
        """A status table is being read: rank 0 may send the next (services/status.py)."""
        if reply.streaming and not reply.errnum:
            self.send("status.ack", {"watch": reply.tag}, nodeid=0)
        else:
            self._watches.discard(reply.tag)  # the stream has ended

    def rpc(
        self,
        topic: str,
        payload: dict[str, Any] | None = None,
        nodeid: int = ANY_RANK,
        timeout: float | None = DEFAULT_TIMEOUT,
        quiet: bool = False,
    ) -> dict[str, Any]:
        """Ask and wait for the answer: `timeout` seconds at most (None: no limit), saying at
        a terminal whom it waits for unless `quiet` (for a request that is meant to wait)."""
        tag = self.send(topic, payload, nodeid)
        return _payload(self.answer(tag, nodeid, timeout, quiet))

    def answer(self, tag: int, nodeid: int, timeout: float | None, quiet: bool = False) -> Message:
        """The first reply to the request `tag` sent to `nodeid`, or NoAnswer once `timeout`
        seconds pass (None: none). Replies to other requests are dropped."""
        whom = f"rank {nodeid}" if nodeid != ANY_RANK else str(self.uri)
        started = time.monotonic()
        patience = Patience(whom, timeout, started, self.progress is not None and not quiet)
        shown = False
        try:
            while True:
                now = time.monotonic()
                if (line := patience.line(now)) is not None and self.progress is not None:
                    self.progress(line)
                    shown = True
                if patience.expired(now):
                    raise NoAnswer(patience.failure())
                reply = self.receive(patience.wait(now))
                if reply is not None and reply.tag == tag:
                    return reply
                if reply is not None and reply.tag in self._watches:
                    self.missed.add(reply.tag)
        finally:
            if shown and self.progress is not None:
                self.progress("")

    def watch_status(
        self, deadline: float | None = None, view: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """The status table as rank 0 pushes it (now, then after each change) until `deadline`
        (a time.monotonic() value; None: for ever); or the `view` asked for (`{"view":
        "summary", "rank": R}`, docs/protocol.md §7). A stream that rank 0 ends, as it does
        when the instance shuts down, raises RequestError (ENODATA)."""
        tag = self.send("status.watch", view or {}, nodeid=0)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            reply = self.receive(left)
            if reply is None:
                return
            if reply.tag == tag:
                yield _payload(reply)

    def table_pages(
        self, timeout: float | None = DEFAULT_TIMEOUT
    ) -> Iterator[tuple[dict[str, Any], bytes]]:
        """Rank 0's table a page at a time (status.get with `start`): each page's header
        (`size`, `topo`, `start`, `next`) and its entries, JSON text separated by commas. One
        page is held at a time, whatever the size."""
        start: int | None = 0
        while start is not None:
            tag = self.send("status.get", {"start": start}, nodeid=0)
            reply = self.answer(tag, 0, timeout)
            header = _payload(reply)
            yield header, bytes(reply.data)
            start = header.get("next")

    def close(self) -> None:
        self._transport.close()

    def abandon(self) -> None:
        """Close at once: an ssh session that hangs is killed, not waited for."""
        process = getattr(self._transport, "process", None)
        if process is not None:
            process.kill()
        self.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Transport(Protocol):
    """How a client's messages travel: a local socket, or an ssh session to a relay."""

    def send(self, frames: list[Buffer]) -> None: ...
    def poll(self, timeout_ms: int | None) -> bool: ...
    def wait(self, fds: list[int], timeout_ms: int | None) -> tuple[bool, list[int]]: ...
    def recv(self) -> tuple[int, Message | None]:
        """The next message's size on the wire, and the message (None if malformed)."""
        ...

    def close(self) -> None: ...


class ReadCount:
    """What this client has read from its broker, acknowledged every ACK_EVERY bytes: the
    broker drops a client that leaves too much unread (links/local.py)."""

    def __init__(self) -> None:
        self.total = 0
        self._acked = 0

    def read(self, size: int) -> list[Buffer] | None:
        """Count a message of `size` bytes; the frames of a `client.ack` if one is due."""
        self.total += size
        if self.total - self._acked < ACK_EVERY:
            return None
        self._acked = self.total
        return encode(Message(Kind.REQUEST, "client.ack", {"bytes": self.total}))


class LocalTransport:
    """A Unix stream socket to the broker, framed as wire/frames.py says: writes block (the
    broker always reads), reads are polled. A broker that dies or drops this client closes the
    connection: whatever it sent before is still read, and then waiting for more raises at once
    instead of lasting until the caller's timeout."""

    def __init__(self, path: str, within: float | None = None) -> None:
        self.path = path
        self.socket = open_socket(path, within)
        self._reader = FrameReader()
        self._ready: collections.deque[list[bytes]] = collections.deque()
        self._scratch = bytearray(CHUNK)
        self._poller = select.poll()  # poll(2): regular files too, which epoll refuses
        self._poller.register(self.socket, select.POLLIN)
        self._gone = ""  # why the connection ended, once its end of file is read
        self._broken = False  # writing failed: the broker's end is closed
        self._extra: tuple[tuple[int, ...], Any] | None = None  # fds -> their poller

    def send(self, frames: list[Buffer]) -> None:
        """Send a message. If the broker has closed the connection, nothing is: the next wait
        reads what it sent before (which may say why) and its end of file, and says so."""
        if self._broken:
            return
        try:
            Outbox().send(frame_parts(frames), self._sendmsg)  # blocking: all of it
        except OSError:
            self._broken = True

    def _sendmsg(self, parts: list[Part]) -> int:
        return self.socket.sendmsg(parts, (), socket.MSG_NOSIGNAL)

    def poll(self, timeout_ms: int | None) -> bool:
        return self.wait([], timeout_ms)[0]

    def wait(self, fds: list[int], timeout_ms: int | None) -> tuple[bool, list[int]]:
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        poller = self._poller if not fds else self._poller_for(tuple(fds))
        while True:
            if self._ready and not fds:
                return True, []  # the common case while reading a stream: no poll needed
            if self._gone and not self._ready:
                raise TbonError(f"lost the connection to local://{self.path}: {self._gone}")
            left = 0 if self._ready else _left_ms(deadline)
            ready = {fd for fd, _ in poller.poll(left)}
            if self.socket.fileno() in ready:
                self._fill()
            others = [fd for fd in fds if fd in ready]
            if self._ready or others:
                return bool(self._ready), others
            if left == 0 and not self._gone:
                return False, []

    def _poller_for(self, fds: tuple[int, ...]) -> Any:
        """A poller of the socket and `fds`, kept while the same fds are asked for (a loop
        that waits on stdin and a signal pipe asks at every message)."""
        if self._extra is None or self._extra[0] != fds:
            poller = select.poll()
            poller.register(self.socket, select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self._extra = (fds, poller)
        return self._extra[1]

    def _fill(self) -> None:
        """Read what the broker sent, keeping whole messages; note the connection's end."""
        try:
            size = self.socket.recv_into(self._scratch, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            size = 0  # reset: gone, as at end of file
        if size == 0:
            self._gone = "the broker ended it (it exited, or dropped this client)"
            return
        with memoryview(self._scratch) as view:
            self._reader.feed(view[:size])
        try:
            self._ready.extend(self._reader.drain())
        except FrameError as error:
            why = f"garbled answer from the broker ({error})"
            raise TbonError(f"local://{self.path}: {why}") from None

    def recv(self) -> tuple[int, Message | None]:
        return decode_sized(self._ready.popleft())

    def close(self) -> None:
        self.socket.close()


def _left_ms(deadline: float | None) -> int | None:
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


def _payload(reply: Message) -> dict[str, Any]:
    if reply.errnum:
        raise RequestError(reply.errnum, reply.errstr or os.strerror(reply.errnum))
    return reply.payload


def open_socket(path: str, within: float | None = None) -> socket.socket:
    """A connection to the broker's socket at `path` (within `within` seconds, if given: a
    broker whose backlog is full makes connect(2) wait), or one clear line saying why not."""
    uri = f"local://{path}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(within)
        sock.connect(path)
        sock.settimeout(None)
    except OSError as error:
        sock.close()
        raise TbonError(f"cannot connect to {uri}: {_why_not(error, path, within)}") from None
    return sock


def _why_not(error: OSError, path: str, within: float | None = None) -> str:
    if isinstance(error, TimeoutError):
        return f"no connection within {within:g}s (the broker does not accept)"
    if isinstance(error, FileNotFoundError):
        return "no such socket (is the instance running?)"
    if isinstance(error, PermissionError):
        return "permission denied"
    if not _is_socket(path):  # connect(2) says ECONNREFUSED for a plain file too
        return "not a socket (a broker's URI names its local socket: see tbon uri)"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused (the broker is gone)"
    return error.strerror or str(error)


def _is_socket(path: str) -> bool:
    import stat

    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return True  # cannot tell: let the error say what it says


def connect(uri: str | None, progress: Progress | None = None) -> Client:
    """A client for `uri`, or for $TBON_URI when none is given: a URI, or a comma-separated
    list of them tried in order (first_answering)."""
    text = uri or os.environ.get("TBON_URI")
    if not text:
        raise TbonError(
            "no URI given and TBON_URI is not set: pass the instance's URI, or run "
            "inside an instance",
            exit_code=2,
        )
    uris = parse_uri_list(text)
    if len(uris) == 1:
        return Client(uris[0], progress)
    return first_answering(uris, progress)


def given_list(uri: str | None) -> str | None:
    """The URI list a command was given (`uri`, or $TBON_URI) when it names more than one
    broker, so that the command can connect again through it (connect); None otherwise."""
    text = uri or os.environ.get("TBON_URI") or ""
    return text if len(parse_uri_list(text)) > 1 else None


def first_answering(uris: list[Uri], progress: Progress | None = None) -> Client:
    """A client of the first of `uris` whose broker answers a ping (broker.ping, answered by
    that broker itself) within LIST_WAIT seconds of the attempt, so that a list that names
    the root first and its standbys after serves a command after the root is gone. A broker
    that says it is adrift (no way to the current root's table: a root that stepped down, or
    one seeking an ancestor) is passed over for a later one, and used only if no later one
    answers. Those that failed are said only if all did: one line naming each and why (exit
    1)."""
    failures: list[str] = []
    adrift: Client | None = None
    for uri in uris:
        started = time.monotonic()
        try:
            client = Client(uri, progress, within=LIST_WAIT)
        except TbonError as error:
            failures.append(_failure(error, uri))
            continue
        left = max(0.1, LIST_WAIT - (time.monotonic() - started))
        try:
            answer = client.rpc("broker.ping", {}, ANY_RANK, timeout=left, quiet=True)
        except TbonError as error:
            client.abandon()
            failures.append(_failure(error, uri))
            continue
        if isinstance(answer, dict) and answer.get("adrift"):
            if adrift is None:
                adrift = client
            else:
                client.abandon()
            continue
        if adrift is not None:
            adrift.abandon()
        return client
    if adrift is not None:
        return adrift
    raise TbonError(f"no URI of the list answered: {'; '.join(failures)}")


def _failure(error: TbonError, uri: Uri) -> str:
    """`URI: why`, from an error that may name the URI already."""
    said = str(error)
    for verb in ("cannot connect to", "cannot reach", "lost the connection to"):
        said = said.removeprefix(f"{verb} {uri}: ")
    if isinstance(error, NoAnswer):
        said = f"no answer within {LIST_WAIT:g}s"
    return f"{uri}: {said}"
