"""A connection flood against a broker's tree port, as an unauthenticated peer would make it.

Standard library only (benchmarks/flood.py uses it too). The flooder holds up to `size` TCP
connections to one address: half of them half-open (connected, silent), half greeting-only (the
64-byte ZMTP 3.0 greeting for the CURVE mechanism as a client, then nothing, so the handshake
never completes). Each one the broker closes is opened again at the next `pump`, so the flood
lasts as long as the flooder is pumped. Every socket is non-blocking and closed by `close()`
(use it as a context manager); nothing here waits on the broker.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
from types import TracebackType

# signature (0xFF, 8 bytes of padding, 0x7F), version 3.0, mechanism, as-server 0, filler
GREETING = (
    b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" + bytes(31)
)
assert len(GREETING) == 64


class Flooder:
    """Up to `size` connections to `address`, from `source` (an address of this host)."""

    def __init__(self, address: tuple[str, int], size: int, source: str = "127.0.0.1") -> None:
        self.address = address
        self.size = size
        self.source = source
        self.opened = 0  # connections opened in all
        self.closed_by_peer = 0  # connections the broker closed (reset or end of file)
        self._selector = selectors.DefaultSelector()
        self._sockets: dict[int, socket.socket] = {}  # by descriptor

    def __enter__(self) -> Flooder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def held(self) -> int:
        return len(self._sockets)

    def pump(self, timeout: float = 0.0) -> None:
        """Note the connections the broker closed (waiting up to `timeout` for one), then open
        new ones up to `size`."""
        for key, events in self._selector.select(timeout):
            sock = self._sockets[key.fd]
            if events & selectors.EVENT_WRITE:  # connected: greet once, then only listen
                with contextlib.suppress(OSError):  # a refusal shows as end of file
                    sock.send(GREETING)
                self._selector.modify(sock, selectors.EVENT_READ)
                if not events & selectors.EVENT_READ:
                    continue
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._drop(key.fd)
                self.closed_by_peer += 1
        while len(self._sockets) < self.size:
            if not self._open(greets=self.opened % 2 == 1):
                break

    def _open(self, greets: bool) -> bool:
        """One more connection (connect under way, or done); False if none could be made now."""
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return False
        try:
            sock.setblocking(False)
            sock.bind((self.source, 0))
            if sock.connect_ex(self.address) not in (0, errno.EINPROGRESS):
                sock.close()
                return False
        except OSError:
            sock.close()
            return False
        self.opened += 1
        self._sockets[sock.fileno()] = sock
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if greets else 0)
        self._selector.register(sock, mask)  # a greeting is sent once connected (pump)
        return True

    def _drop(self, fd: int) -> None:
        sock = self._sockets.pop(fd)
        self._selector.unregister(sock)
        sock.close()

    def close(self) -> None:
        for fd in list(self._sockets):
            self._drop(fd)
        self._selector.close()
