"""The broker's local connector: a ZeroMQ ROUTER on a Unix-domain socket in its run directory.

Whoever can open the socket (the owner: the run directory is 0700) may talk to the instance.
Clients are DEALERs; each is known by the routing id the ROUTER gives it. The socket monitor tells
when a client's connection closes, so that what it started (exec jobs, status streams) can be
ended: a client killed outright never says goodbye.
"""

from __future__ import annotations

import contextlib
import logging
import os

import zmq

from tbon.overlay.links.connections import ConnectionLedger
from tbon.overlay.links.monitor import read_event
from tbon.overlay.wire.message import Message, MessageError, decode_frames, encode

log = logging.getLogger("tbon.local")

SOCKET_NAME = "local"


def local_uri(rundir: str) -> str:
    return f"local://{os.path.join(rundir, SOCKET_NAME)}"


class LocalServer:
    def __init__(self, context: zmq.Context, rundir: str) -> None:
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
                self._gone += self._ledger.closed(fd)

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
        try:
            return hop, decode_frames(frames[1:])
        except MessageError as error:
            log.warning("dropped a malformed message from a local client: %s", error)
            return None

    def send(self, hop: str, message: Message) -> bool:
        """Send to the client named by route hop `l<hex id>`; False if it has gone away."""
        try:
            self.socket.send_multipart(
                [bytes.fromhex(hop[1:]), *encode(message)], flags=zmq.DONTWAIT, copy=False
            )
        except (zmq.ZMQError, ValueError):
            return False
        return True

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.socket.close(linger=0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
