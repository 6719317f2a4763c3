"""A `tbon exec` job's life on its broker: when its process group is killed, when its output
may be read without credit, and when it is done. A plain machine: the job runner (broker/jobs.py)
feeds it what happened and carries out what it answers.

A job is its process group: the command leads a session of its own, and what it starts stays in
that group unless it leaves on purpose (setsid). The rules:

- **Its main process ends: the group is killed** (SIGKILL), so nothing it started outlives it. A
  background `sleep 100 &` holding the job's stdout would otherwise keep the job, and its client,
  waiting for as long as it runs.
- **Abandoned.** A job its client killed (SIGKILL) or its broker ended (retire, shutdown, its
  client gone) owes nobody a window: once its main process has ended, and with it the group,
  what is left in its pipes is all there will ever be (a pipe's worth per stream at most), so it
  is read without waiting for credit. A client that has gone returns none, and a broker that is
  leaving cannot wait for it. A job still running keeps its window, abandoned or not: reading a
  live command freely would let it flood the tree.
- **Done** once its main process has ended and both output streams are closed. Its exit is sent
  last.
"""

from __future__ import annotations

import enum
import signal

from tbon.record import Record


class Life(enum.Enum):
    RUNNING = "running"  # its main process has not ended
    ENDED = "ended"  # its main process ended and its group was killed; output still open
    DONE = "done"  # ended, and its output closed: its exit is sent


class SignalGroup(Record):
    """Send `signum` to the job's process group (before its leader is reaped, for Exited)."""

    __slots__ = __match_args__ = ("signum",)

    def __init__(self, signum: int) -> None:
        self.signum = signum


class ReadFreely(Record):
    """Read what is left of its output without credit (and watch its pipes again if paused)."""

    __slots__ = __match_args__ = ()


class Finish(Record):
    """Close its input and send its exit: nothing of it is left."""

    __slots__ = __match_args__ = ()


Instruction = SignalGroup | ReadFreely | Finish


class JobLife(Record):
    """A job's life at its broker: a plain state machine (mutable, so not hashable)."""

    __slots__ = __match_args__ = ("streams", "life", "abandoned")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, streams: int = 2, life: Life = Life.RUNNING, abandoned: bool = False
    ) -> None:
        self.streams = streams  # output streams not yet at their end
        self.life, self.abandoned = life, abandoned

    def signalled(self, signum: int, by_broker: bool = False) -> list[Instruction]:
        """A signal for the job: from its client (exec.signal), or from its broker ending it
        (`by_broker`: retire, shutdown, its client gone), which abandons it, as SIGKILL does."""
        abandons = by_broker or signum == signal.SIGKILL
        if self.life is Life.RUNNING:
            self.abandoned |= abandons
            return [SignalGroup(signum)]
        if self.life is Life.ENDED and abandons and not self.abandoned:
            self.abandoned = True
            return [ReadFreely()]
        return []  # the group is dead already

    def exited(self) -> list[Instruction]:
        """Its main process ended (not yet reaped: its PID still names the group)."""
        if self.life is not Life.RUNNING:
            return []
        self.life = Life.ENDED
        done: list[Instruction] = [SignalGroup(signal.SIGKILL)]
        if self.abandoned:
            done.append(ReadFreely())
        return done + self._maybe_done()

    def stream_closed(self) -> list[Instruction]:
        """One output stream reached its end (or could not be read any more)."""
        self.streams = max(0, self.streams - 1)
        return self._maybe_done()

    def may_read(self, credit_left: bool) -> bool:
        """Whether its output may be read now: credit is left, or nobody is owed any."""
        return credit_left or (self.life is Life.ENDED and self.abandoned)

    def _maybe_done(self) -> list[Instruction]:
        if self.life is Life.ENDED and self.streams == 0:
            self.life = Life.DONE
            return [Finish()]
        return []
