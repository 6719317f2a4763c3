"""Connections to the tree port that have not authenticated yet, and when to close them. Pure.

Anyone who can reach a parent's port can open TCP connections to it, and ZeroMQ's I/O thread
accepts each one, a file descriptor, before the CURVE handshake says whether the peer holds an
admitted key. Left alone, a flood of them takes every descriptor of the broker (docs/design.md
§14). The handshake timeout (`broker.handshake-timeout`) bounds how long each one lasts; this
machine bounds how many there are at once.

A connection is a stranger from its accept (by its descriptor and the address it comes from)
until the first message read from it (only an authenticated peer's messages are delivered) or
its close. Two caps hold, `per_source` strangers from one address and `in_all` strangers in
all. When an accept goes past one, the oldest stranger of the address that holds the most (the
newcomer's own, when it is that address that is past its cap) is closed: a newcomer always gets
its turn to complete the handshake, and a flood from one address pushes out its own connections,
not those of others. Closing is the adapter's to do (children.py); the close it causes comes
back as `closed`.

`FloodLog` turns what the caps did into one log line per interval with counts, never one per
connection.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Caps:
    """How many strangers at once: from one address, and in all."""

    per_source: int
    in_all: int


def caps_for(nofile: int, reserve: int, children: int = 0) -> Caps:
    """The caps for a broker with `nofile` descriptors, `reserve` of them kept back: a quarter
    of the rest for strangers (8 to 1024), half of that for one address (at least 4); and on
    top of both, room for its own `children`, who may all connect at once from one host (a
    test instance, or a node's brokers) before any has authenticated: a cap below that shut
    out the brokers of `tbon start --test-size=9 --force` under `ulimit -n 40`."""
    in_all = max(8, min(1024, (nofile - reserve) // 4))
    return Caps(per_source=max(4, in_all // 2) + children, in_all=in_all + children)


class Strangers:
    """The strangers by descriptor, oldest first per source address."""

    def __init__(self, caps: Caps) -> None:
        self.caps = caps
        self._source: dict[int, str] = {}  # fd: address
        self._by_source: dict[str, OrderedDict[int, None]] = {}  # address: fds, oldest first

    def __len__(self) -> int:
        return len(self._source)

    def from_source(self, source: str) -> int:
        fds = self._by_source.get(source)
        return len(fds) if fds is not None else 0

    def accepted(self, fd: int, source: str) -> list[tuple[int, str]]:
        """A connection was accepted on `fd` from `source`: the strangers to close now, with
        their addresses (each forgotten here at once: its close is not counted twice)."""
        self.forget(fd)  # a descriptor reused: its last connection's close was not seen
        self._source[fd] = source
        self._by_source.setdefault(source, OrderedDict())[fd] = None
        close: list[tuple[int, str]] = []
        while self.from_source(source) > self.caps.per_source:
            close.append(self._evict(source))
        while len(self._source) > self.caps.in_all:
            close.append(self._evict(max(self._by_source, key=self.from_source)))
        return close

    def forget(self, fd: int) -> bool:
        """`fd` authenticated (a message came on it) or closed: no longer a stranger. False if
        it was not one."""
        source = self._source.pop(fd, None)
        if source is None:
            return False
        fds = self._by_source[source]
        del fds[fd]
        if not fds:
            del self._by_source[source]
        return True

    def _evict(self, source: str) -> tuple[int, str]:
        fd = next(iter(self._by_source[source]))
        self.forget(fd)
        return fd, source


@dataclass(slots=True)
class _Window:
    accepted: int = 0
    closed: int = 0  # over a cap
    sources: set[str] = field(default_factory=set)  # of the connections closed


class FloodLog:
    """What to log of the strangers: nothing while no cap was reached; while they are, one line
    per `every` seconds with the counts of that interval; one line when an interval passes
    without any."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._window = _Window()
        self._since = float("-inf")  # start of the interval being counted
        self._flooding = False

    def accepted(self) -> None:
        self._window.accepted += 1

    def closed(self, sources: list[str]) -> None:
        """Strangers from these addresses were closed over a cap."""
        self._window.closed += len(sources)
        self._window.sources.update(sources)

    def line(self, now: float, caps: Caps) -> str | None:
        """The line to log at `now`, if one is due."""
        window = self._window
        if not self._flooding:
            if not window.closed:
                self._window = _Window()  # accepts under the caps: nobody floods
                return None
            self._flooding, self._since, self._window = True, now, _Window()
            return (
                f"connection flood on the tree port: a stranger (not yet authenticated) was "
                f"closed over the caps ({caps.per_source} per address, {caps.in_all} in all); "
                f"counts follow every {self.every:g}s while it lasts"
            )
        if now < self._since + self.every:
            return None
        seconds = now - self._since
        self._since, self._window = now, _Window()
        if not window.closed:
            self._flooding = False
            return "the connection flood on the tree port is over"
        return (
            f"connection flood on the tree port: {window.accepted} accepted and {window.closed} "
            f"closed over the caps in {seconds:.0f}s, from {len(window.sources)} "
            f"address{'es' if len(window.sources) != 1 else ''}"
        )

    def next_deadline(self) -> float | None:
        return self._since + self.every if self._flooding else None
