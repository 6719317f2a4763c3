"""Ctrl-C while `tbon exec` runs: each press sends the jobs a harder signal. The first sends
SIGINT; a second within ESCALATE_WITHIN seconds of the one before sends SIGTERM; a third
SIGKILL, which also ends tbon exec (130). A press after a longer pause starts again at SIGINT.
Pure: the time of each press in, the signal to send out."""

from __future__ import annotations

import signal
from dataclasses import dataclass

LADDER = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
ESCALATE_WITHIN = 1.0


@dataclass
class Interrupts:
    step: int = -1  # the rung of the last press
    last: float | None = None  # when it came

    def press(self, now: float) -> signal.Signals:
        """A Ctrl-C at `now`: the signal for every job."""
        soon = self.last is not None and now - self.last <= ESCALATE_WITHIN
        self.step = min(self.step + 1, len(LADDER) - 1) if soon else 0
        self.last = now
        return LADDER[self.step]
