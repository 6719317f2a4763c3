"""Signals, turned into something the broker's poll loop can wait on.

SIGCHLD is caught only by a broker that needs it: one with an initial program (reaped when it
says so), or one with a job that has no pidfd (a kernel without them, no descriptor left:
`catch_children`). Otherwise each `tbon exec` job's end is seen on its pidfd (jobs.py), with its
pipes' ends, in one turn of the loop: a SIGCHLD caught would wake the broker once more for every
job (1024 wakes for `tbon exec -r all true` at 1024 ranks). Left at its default, SIGCHLD is not
delivered at all, and children stay zombies until they are reaped, as when it is caught.
"""

from __future__ import annotations

import os
import signal
from typing import Any


class SignalPipe:
    """Signals become bytes on a socket the poll loop watches, handled between messages.
    `children`: catch SIGCHLD too (else it is left at its default, inherited handlers undone)."""

    def __init__(self, children: bool = True) -> None:
        # A pipe, not a socketpair: the same to poll, a third of a millisecond less for every
        # broker forked by tbon start (socket objects are made in Python, pages copied)
        self._reader, self._writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pending: list[int] = []
        signal.set_wakeup_fd(self._writer, warn_on_full_buffer=False)
        # Under a launcher that ignores SIGINT (Ctrl-C meant for the initial program), keep
        # ignoring it, but through a handler: unlike SIG_IGN, a handler is not inherited by the
        # programs this broker starts.
        self.sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        self.children = children
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        # a broker forked by `tbon start` inherits its launcher's handler: undone if not wanted
        signal.signal(signal.SIGCHLD, self._on_signal if children else signal.SIG_DFL)

    def catch_children(self) -> None:
        """Catch SIGCHLD from now on (a job without a pidfd ends so): a child that ended
        before is not told of, so the caller looks for it once itself."""
        if not self.children:
            self.children = True
            signal.signal(signal.SIGCHLD, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._pending.append(signum)

    def fileno(self) -> int:
        """What the poll loop watches: readable once a signal has come."""
        return self._reader

    def take(self) -> list[int]:
        try:
            while os.read(self._reader, 512):
                pass
        except BlockingIOError:
            pass
        signals, self._pending = self._pending, []
        return signals

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        ends, (self._reader, self._writer) = (self._reader, self._writer), (-1, -1)
        for fd in ends:
            if fd >= 0:
                os.close(fd)
