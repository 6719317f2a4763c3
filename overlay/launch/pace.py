"""How many of `tbon expand`'s brokers boot at once: a window, refilled as they come online.

Without one, `tbon expand -n 100000` would fork a hundred thousand brokers before the first came
online: processes, descriptors and pages without bound, all booting at once. With a window of
`N`, at most `N` are in flight; the next start, in the order asked, as those booting come online
or end, so that a broker's vacant ancestors, asked first, are started before it.

The window does not keep the machine free for other commands: a joiner's boot waits for round
trips (its parent's own join among them) as well as for a CPU, so a window small enough to leave
the cores idle slows the expand far more than it helps a `tbon ping` run meanwhile (measured on
2 cores: a window of 2 to 64 took expand -n 1024 from 17-20 s to 25-30 s). That is the session's
part (launch/forker.py: the brokers of one expand share one session).

`Pace` is the decision alone (no I/O): told how many joiners settled, it says how many to start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PER_CPU = 128
"""Joiners booting at once for each CPU this process may run on, by default: a bound on what a
large expand holds in flight, wide enough not to slow one of a thousand brokers."""


def default_window() -> int:
    """PER_CPU joiners for each CPU this process may run on (its affinity, not the machine's)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return PER_CPU * max(1, cpus)


@dataclass
class Pace:
    """The joiners of one expand: `waiting` not started yet, `booting` started and not settled.
    `window` bounds `booting`; 0: no bound (start all at once, as before the window)."""

    waiting: int
    window: int
    booting: int = 0

    def due(self) -> int:
        """How many to start now (the next ones in order), counted as booting from here."""
        room = self.waiting if self.window == 0 else max(0, self.window - self.booting)
        count = min(self.waiting, room)
        self.waiting -= count
        self.booting += count
        return count

    def settled(self, count: int = 1) -> None:
        """`count` joiners that were booting are online, or ended: their places are free."""
        if not 0 <= count <= self.booting:
            raise ValueError(f"{count} settled of {self.booting} booting")
        self.booting -= count

    def abandon(self) -> int:
        """The joiners not started, which will never be (their start failed, or time ran out):
        how many, now counted as neither waiting nor booting."""
        count, self.waiting = self.waiting, 0
        return count

    @property
    def over(self) -> bool:
        """Nothing left to start, and nothing booting."""
        return self.waiting == 0 and self.booting == 0
