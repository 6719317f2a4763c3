"""The local launcher's PMI-1 server on real sockets: ``PmiServer`` (pmi_server.py), which
decides every reply, wired to one ``AF_UNIX`` socketpair per rank and the launcher's selector."""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import socket
from collections import deque

from tbon.overlay.launch.pmi_server import PmiClientError, PmiServer, Reply

__all__ = ["SocketPmiServer"]


class SocketPmiServer:
    """``PmiServer`` over one ``AF_UNIX`` socketpair per rank, driven by the caller's selector.

    For each rank: ``make_pair(rank)`` returns the client end; start the broker with its fileno
    as ``PMI_FD`` (``subprocess`` needs it in ``pass_fds``: socketpair ends are not inheritable)
    and close it in the launcher afterwards, or EOF from an exited broker is never seen.
    Register with the selector, and call ``handle(key.fileobj)`` when ``key.data is server``.
    A child made with a bare ``os.fork`` (no exec) inherits the server ends too and must close
    them (``close_in_child``), or the server's hang-up is hidden from the other ranks.

    With ``fd_floor``, both ends of every connection are moved to descriptors at or above it,
    where nothing else lives (the caller picks a floor above every descriptor it has open, with
    room for the N server ends and the client ends it holds at once): a forked child then closes
    all the server ends it inherited, and every other rank's client end, with one
    ``close_range(2)`` on each side of its own, whatever the size, rather than one ``close`` per
    rank (O(N) per broker, O(N²) across an instance).

    A reply is written without blocking, and what the socket does not take at once with a
    blocking ``sendall`` bounded by ``send_timeout``; a rank that stops reading for that long,
    that sends garbage, or that closes, is disconnected.
    """

    def __init__(
        self,
        size: int,
        kvsname: str = "tbon",
        appnum: int = 0,
        *,
        send_timeout: float = 10.0,
        fd_floor: int | None = None,
    ) -> None:
        self.core = PmiServer(size, kvsname, appnum)
        self.send_timeout = send_timeout
        self.protocol_errors: list[str] = []
        self._by_rank: dict[int, socket.socket] = {}
        self._by_sock: dict[socket.socket, int] = {}
        self._paired: set[int] = set()
        self._selectors: list[selectors.BaseSelector] = []
        self._floor = fd_floor
        self._highest = -1  # the highest descriptor a server end has had

    @property
    def size(self) -> int:
        return self.core.size

    @property
    def finalized(self) -> set[int]:
        return self.core.finalized

    @property
    def aborted(self) -> tuple[int, int, str] | None:
        return self.core.aborted

    @property
    def connected(self) -> set[int]:
        """Ranks whose server end is still open."""
        return set(self._by_rank)

    def make_pair(self, rank: int) -> socket.socket:
        """Create rank's connection; keep the server end and return the client end."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside this PMI job of size {self.size}")
        if rank in self._paired:
            raise ValueError(f"PMI rank {rank} already has a connection")
        server_end, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if self._floor is not None:
            try:
                server_end = self._above_floor(server_end)
                client_end = self._above_floor(client_end)
            except OSError:
                server_end.close()
                client_end.close()
                raise
            self._highest = max(self._highest, client_end.fileno())
        server_end.setblocking(False)
        self._highest = max(self._highest, server_end.fileno())
        self._paired.add(rank)
        self._by_rank[rank] = server_end
        self._by_sock[server_end] = rank
        for selector in self._selectors:
            selector.register(server_end, selectors.EVENT_READ, self)
        return client_end

    def _above_floor(self, sock: socket.socket) -> socket.socket:
        """`sock` moved to the lowest free descriptor at or above the floor (the old one closed)."""
        assert self._floor is not None
        try:
            moved = fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD_CLOEXEC, self._floor)
        finally:
            sock.close()
        return socket.socket(fileno=moved)

    @property
    def floored(self) -> bool:
        """Whether both ends of every connection sit above the floor: a forked child's
        ``close_in_child`` then closes the other ranks' client ends as well, so the caller may
        make several connections before it forks the first of their children."""
        return self._floor is not None

    def fileobjs(self) -> list[socket.socket]:
        """The open server ends, for callers that poll without a selector."""
        return list(self._by_rank.values())

    def close_in_child(self, keep: int) -> None:
        """In a child made with a bare ``os.fork``: close every server end it inherited, but not
        descriptor ``keep`` (its own client end); with ``fd_floor``, every other rank's client end
        too (those the parent has not closed yet). With ``fd_floor`` the socket objects are left
        untouched (their descriptors closed under them), so the child must never use or close
        them afterwards: it has to leave by ``os._exit``, as a forked broker does."""
        if self._floor is None:
            for sock in self._by_rank.values():
                sock.close()
            return
        os.closerange(self._floor, keep)
        os.closerange(max(self._floor, keep + 1), self._highest + 1)

    def register(self, selector: selectors.BaseSelector) -> None:
        """Watch every server end (present and future) for reading, with ``data=self``."""
        if selector in self._selectors:
            return
        self._selectors.append(selector)
        for sock in self._by_rank.values():
            selector.register(sock, selectors.EVENT_READ, self)

    def handle(self, sock: socket.socket) -> None:
        """Read what ``sock`` has, answer it, and close the connection on EOF or garbage."""
        rank = self._by_sock.get(sock)
        if rank is None:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._deliver(self._close(rank))
            return
        try:
            replies = self.core.receive(rank, data)
        except PmiClientError as exc:
            self.protocol_errors.append(str(exc))
            self._deliver(exc.replies)
            self._deliver(self._close(rank))
            return
        self._deliver(replies)

    def close(self) -> None:
        """Close every server end (the brokers then see EOF on their PMI connection)."""
        for rank in list(self._by_rank):
            self._close(rank)

    def __enter__(self) -> SocketPmiServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _deliver(self, replies: list[Reply]) -> None:
        queue = deque(replies)
        while queue:
            rank, line = queue.popleft()
            sock = self._by_rank.get(rank)
            if sock is None:
                continue
            try:
                sent = sock.send(line)  # a reply is small: it goes at once, almost always
            except BlockingIOError:
                sent = 0
            except OSError:
                queue.extend(self._close(rank))
                continue
            if sent == len(line):
                continue
            try:  # the rest, blocking (four more system calls): a rank slow to read
                sock.settimeout(self.send_timeout)
                sock.sendall(line[sent:])
            except OSError:  # includes TimeoutError: a rank that stopped reading
                queue.extend(self._close(rank))
            else:
                sock.setblocking(False)

    def _close(self, rank: int) -> list[Reply]:
        sock = self._by_rank.pop(rank, None)
        if sock is not None:
            del self._by_sock[sock]
            for selector in self._selectors:
                with contextlib.suppress(KeyError, ValueError):
                    selector.unregister(sock)
            sock.close()
        return self.core.disconnect(rank)
