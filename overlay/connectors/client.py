"""A connection to an instance, for commands: requests, responses and streams.

A request names a target rank; the broker it reaches routes it through the tree and the answer
comes back the same way. Errors arrive as one-line TbonErrors.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Iterator
from typing import Any, Protocol

import zmq

from tbon.errors import TbonError
from tbon.overlay.connectors.uri import Uri, parse_uri
from tbon.overlay.links.monitor import read_event
from tbon.overlay.services.flow import ACK_EVERY
from tbon.overlay.wire.message import (
    ANY_RANK,
    Buffer,
    Kind,
    Message,
    MessageError,
    decode_frames,
    encode,
)

DEFAULT_TIMEOUT = 30.0


class RequestError(TbonError):
    """The instance answered a request with an error."""

    def __init__(self, errnum: int, message: str) -> None:
        super().__init__(message)
        self.errnum = errnum


class Client:
    def __init__(self, uri: str | Uri) -> None:
        self.uri = parse_uri(uri) if isinstance(uri, str) else uri
        self._transport: Transport
        if self.uri.scheme == "local":
            _probe(self.uri.path, str(self.uri))
            self._transport = LocalTransport(self.uri.path)
        else:
            from tbon.overlay.connectors.ssh import SshTransport

            self._transport = SshTransport(self.uri)
        self._tags = itertools.count(1)
        self._watches: set[int] = set()  # tags of this client's status.watch streams
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
    ) -> dict[str, Any]:
        tag = self.send(topic, payload, nodeid)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            reply = self.receive(left)
            if reply is None:
                where = f"rank {nodeid}" if nodeid != ANY_RANK else str(self.uri)
                raise TbonError(f"no answer from {where} within {timeout:g}s")
            if reply.tag == tag:
                return _payload(reply)

    def watch_status(self, deadline: float | None = None) -> Iterator[dict[str, Any]]:
        """The status table as rank 0 pushes it (now, then after each change) until `deadline`
        (a time.monotonic() value; None: for ever). A stream that rank 0 ends, as it does when
        the instance shuts down, raises RequestError (ENODATA)."""
        tag = self.send("status.watch", {}, nodeid=0)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            reply = self.receive(left)
            if reply is None:
                return
            if reply.tag == tag:
                yield _payload(reply)

    def close(self) -> None:
        self._transport.close()

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
    """A DEALER on the broker's Unix socket. ZeroMQ hides a broker that dies (it just tries to
    reconnect), so a socket monitor watches the connection: once it has ended, whatever the
    broker sent before is still read, and then waiting for more raises at once instead of
    lasting until the caller's timeout."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._context = zmq.Context()
        self.socket = self._context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.rcvhwm = 0
        self._monitor = self.socket.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
        )
        self._gone = ""  # why the connection ended, once it has
        self.socket.connect(f"ipc://{path}")

    def send(self, frames: list[Buffer]) -> None:
        self.socket.send_multipart(frames, copy=False)

    def poll(self, timeout_ms: int | None) -> bool:
        return self.wait([], timeout_ms)[0]

    def wait(self, fds: list[int], timeout_ms: int | None) -> tuple[bool, list[int]]:
        if not fds and self.socket.get(zmq.EVENTS) & zmq.POLLIN:
            return True, []  # the common case while reading a stream: no poller needed
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        poller = zmq.Poller()  # poll(2): regular files too, which epoll refuses
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        for fd in fds:
            poller.register(fd, zmq.POLLIN)
        while True:
            if self._gone and not self.socket.poll(0):
                raise TbonError(f"lost the connection to local://{self.path}: {self._gone}")
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            ready = dict(poller.poll(left))
            if self._monitor in ready:
                self._read_monitor()
                if len(ready) == 1:
                    continue  # only news of the connection: wait on (or raise, above)
            return self.socket in ready, [fd for fd in fds if fd in ready]

    def _read_monitor(self) -> None:
        while self._monitor.poll(0):
            event, _ = read_event(self._monitor.recv_multipart())
            if event == zmq.EVENT_DISCONNECTED:
                self._gone = "the broker ended it (it exited, or dropped this client)"
            elif event == zmq.EVENT_CONNECT_RETRIED and not self._gone and _refused(self.path):
                self._gone = "the broker no longer listens there"

    def recv(self) -> tuple[int, Message | None]:
        frames = self.socket.recv_multipart(copy=False)
        size = sum(len(frame.buffer) for frame in frames)
        try:
            return size, decode_frames(frames)
        except MessageError:
            return size, None

    def close(self) -> None:
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        self.socket.close(linger=0)
        self._context.term()


def _payload(reply: Message) -> dict[str, Any]:
    if reply.errnum:
        raise RequestError(reply.errnum, reply.errstr or os.strerror(reply.errnum))
    return reply.payload


def _probe(path: str, uri: str) -> None:
    """Fail fast and clearly on a URI nobody serves: ZeroMQ would wait forever instead."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except FileNotFoundError:
        raise TbonError(
            f"cannot connect to {uri}: no such socket (is the instance running?)"
        ) from None
    except PermissionError:
        raise TbonError(f"cannot connect to {uri}: permission denied") from None
    except ConnectionRefusedError:
        raise TbonError(
            f"cannot connect to {uri}: connection refused (the broker is gone)"
        ) from None
    except OSError as error:
        raise TbonError(f"cannot connect to {uri}: {error.strerror}") from None
    finally:
        probe.close()


def _refused(path: str) -> bool:
    """Whether nobody listens at `path` any more (no socket, or connection refused). Asked
    without blocking: a listener whose queue of connections is full is still there."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return True
    except OSError:
        return False  # busy (EAGAIN), or not ours to judge: ZeroMQ keeps trying
    finally:
        probe.close()
    return False


def connect(uri: str | None) -> Client:
    """A client for `uri`, or for $TBON_URI when none is given."""
    text = uri or os.environ.get("TBON_URI")
    if not text:
        raise TbonError(
            "no URI given and TBON_URI is not set: pass the instance's URI, or run "
            "inside an instance",
            exit_code=2,
        )
    return Client(text)
