"""A raw client of a broker's local socket, for tests that speak the wire protocol themselves.

It does only what a test tells it: it frames and sends messages (overlay/wire/frames.py), and
reads them back, but never acknowledges what it read (client.ack) unless asked. Writes block, as
a real client's do; every wait has a deadline.
"""

from __future__ import annotations

import itertools
import select
import socket
import time
from collections import deque
from collections.abc import Callable

from tbon.overlay.wire.frames import FrameReader, encode_frames


class RawClient:
    def __init__(self, uri_or_path: str) -> None:
        path = uri_or_path.removeprefix("local://")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = FrameReader()
        self.ready: deque[list[bytes]] = deque()
        self.ended = False  # the broker closed its end

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sock.sendall(encode_frames(frames))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def poll(self, timeout_ms: int) -> bool:
        """Whether a whole message is here within `timeout_ms` (False at once once the broker
        has closed the connection and nothing is left)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.ready and not self.ended and self._read(deadline):
            pass
        return bool(self.ready)

    def recv_multipart(self, timeout_ms: int = 30_000) -> list[bytes]:
        if not self.poll(timeout_ms):
            raise AssertionError("connection closed" if self.ended else "no message in time")
        return self.ready.popleft()

    def wait_closed(self, timeout_s: float) -> bool:
        """Whether the broker closes the connection within `timeout_s` (the messages it sent
        before are kept)."""
        deadline = time.monotonic() + timeout_s
        while not self.ended and self._read(deadline):
            pass
        return self.ended

    def _read(self, deadline: float) -> bool:
        """Read once, unless `deadline` passes first (False then)."""
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.ended = True
            return True
        self.reader.feed(data)
        self.ready.extend(self.reader.drain())
        return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def partial_writes(takes: list[int]) -> tuple[Callable[[list[bytes]], int], bytearray]:
    """A socket's sendmsg for an Outbox (overlay/wire/frames.py) that accepts `takes[i]` bytes
    at its i-th call, in turn (-1: none, BlockingIOError, as a full socket), and what it took."""
    written, turn = bytearray(), itertools.count()

    def sendmsg(parts: list[bytes]) -> int:
        take = takes[next(turn) % len(takes)]
        if take < 0:
            raise BlockingIOError
        data = b"".join(bytes(part) for part in parts)[:take]
        written.extend(data)
        return len(data)

    return sendmsg, written
