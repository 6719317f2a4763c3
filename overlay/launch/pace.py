"""How many of `tbon expand`'s brokers boot at once: a window, refilled as they come online.

A joiner's boot is CPU-bound (its key exchange, its sockets, its first messages), and a
thousand forked at once take every core for many seconds: a command such as `tbon ping 0`, run
meanwhile, waits for its own start behind them. Kept to a window of a few per core, the cores
are as busy (a joiner waits for round trips too, and another boots then), but a command run
meanwhile shares them with a few processes, not a thousand; and expand holds a bounded number
of processes, descriptors and pages in flight, however many it was asked for.

`Pace` is the decision alone (no I/O): told how many joiners settled (online, or ended), it says
how many to start next, in the order asked, so that a broker's vacant ancestors, asked first,
are started before it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PER_CPU = 128
"""Joiners booting at once for each CPU this process may run on, by default: enough that the
cores stay busy while some joiners wait for a round trip, few enough that a command run
meanwhile is not queued behind them (benchmarks/responsive.py, docs/flub.md §2)."""


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
