"""A broker's file descriptors: its limit raised at start, and a reserve kept back for its own.

Connections to the tree port take descriptors in ZeroMQ's I/O thread, which the broker does not
run: a flood of them could take the last one, and with it the broker's means to serve its local
clients and start its jobs (docs/design.md §14). So a broker raises its soft RLIMIT_NOFILE to
the hard one as it starts, and holds `reserve_size` descriptors open on /dev/null that nothing
else can take. When accepting a local client or starting a job fails for want of a descriptor,
it lends from the reserve (closes some, tries again) and fills it up again afterwards. The caps
on strangers (strangers.py) keep ZeroMQ below the limit less the reserve, so that lending is the
exception, and what is lent goes to the broker's own thread, not to a flood.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
from collections.abc import Iterator

log = logging.getLogger("tbon.descriptors")

OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
NR_OPEN = "/proc/sys/fs/nr_open"


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE in force (2^20 if unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def reserve_size(nofile: int) -> int:
    """Descriptors kept back for local clients and jobs: an eighth of the limit, at most 256
    and at least 2 (one to lend, one to accept and refuse with). No fixed floor above that: at
    a tiny limit (`ulimit -n 40`, tbon start --force) a floor of 16 took the descriptors the
    brokers' own connections needed."""
    return max(2, min(256, nofile // 8))


def target_limit(soft: int, hard: int, nr_open: int | None) -> int:
    """The soft limit to ask for: the hard one (at most the kernel's nr_open when it is
    unlimited), never below the soft one."""
    ceiling = hard
    if hard == resource.RLIM_INFINITY:
        ceiling = nr_open if nr_open is not None else 1 << 20
    return soft if soft != resource.RLIM_INFINITY and ceiling <= soft else ceiling


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; returns the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nr_open = None
    if hard == resource.RLIM_INFINITY:  # the kernel's ceiling matters only then
        with contextlib.suppress(OSError, ValueError), open(NR_OPEN) as file:
            nr_open = int(file.read())
    target = target_limit(soft, hard, nr_open)
    if target == soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as error:
        log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target, error)
        return soft
    log.debug("raised the soft descriptor limit from %d to %d", soft, target)
    return target


_handed_down: list[int] = []
"""Descriptors of a reserve opened before a fork, for the child's first Reserve (hand_down)."""
_handed_by: list[int] = []
"""The process that handed them down (its PID): only a process forked from it takes them."""


def hand_down(reserve: Reserve | None) -> None:
    """Let the first Reserve that a process forked from now on makes take `reserve`'s
    descriptors, which it inherited, as its own if it is of the same size, or close them if
    not (None: no longer). `tbon start`'s launcher opens one reserve for all the brokers it
    forks (overlay/launch/local.py): each broker would otherwise make one system call per
    descriptor to open its own (a third of a millisecond a broker, 256 descriptors)."""
    _handed_down[:] = reserve._held if reserve is not None else []
    _handed_by[:] = [os.getpid()] if reserve is not None else []


def _inherited() -> list[int]:
    """The descriptors handed down to this process, once (none in the process that handed
    them down: they are its own reserve)."""
    if not _handed_down or _handed_by == [os.getpid()]:
        return []
    taken, _handed_down[:] = list(_handed_down), []
    return taken


def _close_all(fds: list[int]) -> None:
    """Close `fds`, each run of consecutive ones with one close_range(2): a reserve opened at
    once (a forked broker's, inherited) is one run, not 256 closes, found by its ends alone."""
    if not fds:
        return
    low, high = min(fds), max(fds)
    if high - low == len(fds) - 1:  # distinct descriptors: exactly low..high, one run
        os.closerange(low, high + 1)
        return
    held = sorted(fds)
    first = 0
    for i in range(1, len(held) + 1):
        if i == len(held) or held[i] != held[i - 1] + 1:
            os.closerange(held[first], held[i - 1] + 1)
            first = i


class Reserve:
    """`size` descriptors held open on /dev/null, to be lent to the broker's own thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: list[int] = []
        if inherited := _inherited():  # a forked broker's first: opened by its launcher
            if size and len(inherited) == size:
                self._held = inherited
            else:  # opened at another limit: closed, rather than left open and unused
                _close_all(inherited)
        self.refill()

    def __len__(self) -> int:
        return len(self._held)

    def refill(self) -> None:
        """Hold `size` again, as many as can be opened now: one open of /dev/null, the rest
        dup(2)s of it (no path walk, no new open file each: a third of the cost, paid by every
        broker as it starts)."""
        while len(self._held) < self.size:
            try:
                if self._held:
                    self._held.append(os.dup(self._held[0]))  # non-inheritable, as the open
                else:
                    self._held.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return

    def release(self, count: int = 1) -> int:
        """Close up to `count` held descriptors (for the caller to take at once); how many."""
        count = min(count, len(self._held))
        for _ in range(count):
            os.close(self._held.pop())
        return count

    @contextlib.contextmanager
    def lending(self) -> Iterator[None]:
        """Around a use of what `release` freed: the reserve is filled again after it."""
        try:
            yield
        finally:
            self.refill()

    def close(self) -> None:
        """Close every held descriptor (_close_all)."""
        _close_all(self._held)
        self._held.clear()
        self.size = 0
