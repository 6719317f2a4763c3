"""The broker's local connector: a ZeroMQ ROUTER on a Unix-domain socket in its run directory.

Whoever can open the socket (the owner: the run directory is 0700) may talk to the instance.
Clients are DEALERs; each is known by the routing id the ROUTER gives it. The socket monitor tells
when a client's connection closes, so that what it started (exec jobs, status streams) can be
ended: a client killed outright never says goodbye.

Sending to a client never blocks, so one that stops reading delays no other; instead, what it
leaves unread is bounded. A client reports the bytes it has read (`client.ack`, which tbon's
client sends every megabyte); one that leaves more than `broker.client-backlog` unread is dropped:
told so in one last message, its streams cancelled and its jobs killed, as if it had hung up, and
nothing it sends afterwards is heard. Credit-based streams (exec, status.watch) stay far below the
bound; only a client that asks and asks without reading reaches it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os

import zmq

from tbon.overlay.links.connections import ConnectionLedger
from tbon.overlay.links.monitor import read_event
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.wire.message import Buffer, Kind, Message, MessageError, decode_frames, encode

log = logging.getLogger("tbon.local")

SOCKET_NAME = "local"
DEFAULT_BACKLOG = 64 << 20
MIN_BACKLOG = 32 << 20  # twice what a tbon exec lets be in flight (services/flow.py)


def local_uri(rundir: str) -> str:
    return f"local://{os.path.join(rundir, SOCKET_NAME)}"


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


class LocalServer:
    def __init__(self, context: zmq.Context, rundir: str, backlog: int = DEFAULT_BACKLOG) -> None:
        self.path = os.path.join(rundir, SOCKET_NAME)
        if len(self.path.encode()) > 100:
            from tbon.errors import UsageError

            raise UsageError(f"run directory path is too long for a Unix socket: {rundir}")
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.sndhwm = 0
        self.socket.rcvhwm = 0
        self.socket.router_mandatory = 1
        self.socket.maxmsgsize = 8 * 1024 * 1024
        # Bind under a temporary name and rename: once the socket's name exists it is listening,
        # so a client that sees the file never meets a refused connection.
        staging = f"{self.path}.{os.getpid()}"
        self.socket.bind(f"ipc://{staging}")
        os.chmod(staging, 0o600)
        os.replace(staging, self.path)
        self.uri = f"local://{self.path}"
        self.monitor = self.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._ledger: ConnectionLedger[str] = ConnectionLedger()
        self._gone: list[str] = []
        self.backlog = backlog
        self._backlogs: dict[str, Backlog] = {}
        self._dropped: set[str] = set()

    def gone(self) -> list[str]:
        """Hops of clients whose connections closed since the last call."""
        self._drain_monitor()
        hops, self._gone = self._gone, []
        return hops

    def _drain_monitor(self) -> None:
        while self.monitor.poll(0):
            event, fd = read_event(self.monitor.recv_multipart())
            if event == zmq.EVENT_ACCEPTED:
                self._ledger.accepted(fd)
            elif event == zmq.EVENT_DISCONNECTED:
                for hop in self._ledger.closed(fd):
                    self._gone.append(hop)
                    self._backlogs.pop(hop, None)
                    self._dropped.discard(hop)

    def read(self) -> tuple[str, Message] | None:
        """One request from a client as (client hop, message); None if it was malformed.

        Connection events are taken first, so that the message is tied to the right connection
        (see connections.py); a client found to have hung up already is reported by gone()."""
        self._drain_monitor()
        frames = self.socket.recv_multipart(copy=False)
        if len(frames) < 2:
            return None
        hop = "l" + frames[0].bytes.hex()
        with contextlib.suppress(zmq.ZMQError):
            if not self._ledger.heard(hop, frames[1].get(zmq.SRCFD)):
                self._gone.append(hop)
        if hop in self._dropped:
            return None  # it was dropped: nothing it says is heard any more
        try:
            message = decode_frames(frames[1:])
        except MessageError as error:
            log.warning("dropped a malformed message from a local client: %s", error)
            return None
        if message.topic == "client.ack":  # for this socket alone: never routed
            self._backlogs.setdefault(hop, Backlog()).ack(message.payload.get("bytes"))
            return None
        return hop, message

    def send(self, hop: str, message: Message) -> bool:
        """Send to the client named by route hop `l<hex id>`; False if it has gone away, or has
        been dropped, as it is now if this would leave more than the backlog unread."""
        if hop in self._dropped:
            return False
        frames = encode(message)
        backlog = self._backlogs.setdefault(hop, Backlog())
        size = sum(len(frame) for frame in frames)
        if backlog.unread_with(size) > self.backlog:
            self._drop(hop, backlog)
            return False
        if not self._send(hop, frames):
            return False
        backlog.sent += size
        return True

    def _send(self, hop: str, frames: list[Buffer]) -> bool:
        try:
            self.socket.send_multipart(
                [bytes.fromhex(hop[1:]), *frames], flags=zmq.DONTWAIT, copy=False
            )
        except (zmq.ZMQError, ValueError):
            return False
        return True

    def _drop(self, hop: str, backlog: Backlog) -> None:
        unread = backlog.sent - backlog.acked
        why = (
            f"the broker dropped this connection: {unread >> 20} MiB sent to it went unread "
            f"(broker.client-backlog is {self.backlog >> 20} MiB)"
        )
        log.warning("dropped local client %s: %d bytes sent to it unread", hop, unread)
        notice = Message(Kind.RESPONSE, "client.dropped", errnum=errno.ENOBUFS, errstr=why)
        self._send(hop, encode(notice))  # past the bound: one small last word
        self._dropped.add(hop)
        self._gone.append(hop)

    def dropped_since(self) -> list[str]:
        """Hops of clients dropped (or gone) since the last call, without reading the socket:
        a drop happens while sending, from anywhere in the loop."""
        hops, self._gone = self._gone, []
        return hops

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
