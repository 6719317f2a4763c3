"""A broker being retired: what it does next, decided from the clock and its running work.

The broker takes no new work from the moment it is told. What it runs may finish, until the
drain deadline passes or at once under --force; then it is killed, and the broker says so. When
nothing runs any more the broker says goodbye and exits 0. A plain state machine: the broker
feeds it the time and the number of running jobs and does what it answers.
"""

from __future__ import annotations

import enum

KILL_GRACE = 5.0
"""How long killed jobs may take to be reaped before the broker leaves without them."""


class Step(enum.Enum):
    WAIT = "wait"  # work is running and may go on
    KILL = "kill"  # kill the running work now
    LEAVE = "leave"  # nothing left to wait for: goodbye, exit 0


class Retirement:
    __slots__ = ("deadline", "force", "killed", "killed_at")

    def __init__(self, deadline: float, force: bool) -> None:
        self.deadline = deadline  # when running work is killed (float("inf"): never)
        self.force = force
        self.killed = 0
        self.killed_at: float | None = None

    def step(self, now: float, running: int) -> Step:
        if running == 0:
            return Step.LEAVE
        if self.killed_at is None:
            return Step.KILL if self.force or now >= self.deadline else Step.WAIT
        return Step.LEAVE if now >= self.killed_at + KILL_GRACE else Step.WAIT

    def killing(self, now: float, running: int) -> None:
        self.killed, self.killed_at = running, now

    def next_deadline(self) -> float | None:
        """When step() may answer differently with the same running work."""
        if self.killed_at is not None:
            return self.killed_at + KILL_GRACE
        return None if self.deadline == float("inf") else self.deadline

    @property
    def why_killed(self) -> str:
        return "--force" if self.force else "the drain timeout passed"
