"""How long a peer has been silent, and what that makes it: a plain state machine per link.

Any message counts as a sign of life. Past `torpid_after` the peer is torpid (still a member, but
flagged); past `lost_after` it is lost. A limit of 0 disables that step.

Silence is counted only over time the judge was awake to hear: when two checks are further apart
than `pause_after` (the judge's own process was stopped or starved), that gap is not held against
the peer. Otherwise a broker woken from SIGSTOP would condemn peers whose messages are still
waiting, unread, in its own queues.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    ALIVE = "alive"
    TORPID = "torpid"
    LOST = "lost"


class Liveness:
    def __init__(
        self, torpid_after: float, lost_after: float, now: float, pause_after: float = 0.0
    ) -> None:
        self.torpid_after = torpid_after
        self.lost_after = lost_after
        self.pause_after = pause_after
        self.last_heard = now
        self.last_check = now
        self.verdict = Verdict.ALIVE

    def heard(self, now: float) -> Verdict | None:
        """Record a sign of life; returns the new verdict if that changed it (torpid → alive).
        Hearing is also being awake: a judge that hears its peer often and checks it seldom (a
        child answering its parent's beats, docs/protocol.md §5.2) was not paused meanwhile."""
        self.last_heard = self.last_check = now
        if self.verdict is Verdict.TORPID:
            self.verdict = Verdict.ALIVE
            return self.verdict
        return None

    def check(self, now: float) -> Verdict | None:
        """Re-judge the peer at `now`; returns the new verdict only when it changed."""
        if self.verdict is Verdict.LOST:
            return None
        if self.pause_after and now - self.last_check > self.pause_after:
            self.last_heard += now - self.last_check  # we were not awake to hear it
        self.last_check = now
        silent = now - self.last_heard
        if self.lost_after and silent >= self.lost_after:
            self.verdict = Verdict.LOST
            return self.verdict
        if self.torpid_after and silent >= self.torpid_after and self.verdict is Verdict.ALIVE:
            self.verdict = Verdict.TORPID
            return self.verdict
        return None

    def deadline(self) -> float | None:
        """When `check` next may change the verdict (for the broker's poll timeout)."""
        verdict = self.verdict
        if verdict is Verdict.LOST:
            return None
        lost = self.lost_after
        torpid = self.torpid_after if verdict is Verdict.ALIVE else 0.0
        if lost and torpid:
            return self.last_heard + min(lost, torpid)
        if lost or torpid:
            return self.last_heard + (lost or torpid)
        return None
