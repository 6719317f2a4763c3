"""When an interior broker sends up its subtree's exits of a `tbon exec` job as one answer: a
plain machine, stimulus in, instructions out. The exec service (services/exec.py) feeds it the
jobs it fans out and the exits that pass it on their way up, and sends what it says to flush.

Without it, rank 0 and the client read one exit per rank: 1024 messages for `tbon exec -r all
true` at 1024 ranks. With it, each broker that fanned a job out holds the exits that reach it
from below (and its own) and sends them on together (wire/exits.py):

- **Complete.** Once every target of its subtree has had its last word pass (an exit held, or
  an error, which is not merged and passes at once), it flushes what it holds and forgets the
  job: the last exit is never delayed, so a job's end is not either.
- **Held no longer than HOLD_S.** A subtree that is not complete (a rank still running, or one
  whose broker died) does not hold the others' exits back: what is held HOLD_S after the first
  of it is flushed.
- **What is not a job here passes as it came.** An exit resent after the job was forgotten (a
  heal, a prompt), the exits of a job whose exec.start did not ask for merging, and every
  answer at a broker that does not merge (an older one) reach the client one per rank, which
  it takes as it always did. So holding never loses an answer that the tree would have
  delivered: what a broker holds lives as long as the broker, and a target keeps its exit
  until the client acknowledges it (resend.py), so a broker that dies holding exits costs a
  resend after the heal, as the messages queued on its links always did.
- **Forgotten** when its client has gone, or FORGET_S after anything was last heard of it
  with nothing held (a job that runs that long has its exits passed one by one).
"""

from __future__ import annotations

from collections.abc import Iterable

from tbon.overlay.wire.exits import Exit
from tbon.record import Record

HOLD_S = 0.05
"""Seconds an exit is held at most, waiting for the rest of its subtree's: a fraction of what a
job takes to start across a tree, and far below the client's 2 s before it asks a silent rank."""

FORGET_S = 600.0
"""Seconds a job with nothing held is remembered after anything was last heard of it."""

Key = tuple[int, tuple[str, ...]]
"""A job as its answers reach this broker: its exec.start's tag, and the route back from here."""


class Flush(Record):
    """Send these exits on, as one merged answer (or a few: wire/exits.py), along the job's route
    from here; `origin` is the rank the exec.start was addressed to here (the answer's `n`)."""

    __slots__ = __match_args__ = ("key", "origin", "exits")

    def __init__(self, key: Key, origin: int, exits: tuple[Exit, ...]) -> None:
        self.key, self.origin, self.exits = key, origin, exits


class _Job(Record):
    """Mutable, so not hashable (a Record for its equality and repr only)."""

    __slots__ = __match_args__ = ("job", "origin", "waiting", "heard", "held", "since")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        job: str,
        origin: int,
        waiting: set[int],
        heard: float,
        held: dict[int, Exit] | None = None,
        since: float | None = None,
    ) -> None:
        self.job, self.origin, self.heard = job, origin, heard
        self.waiting = waiting  # targets of the subtree whose last word has not passed here yet
        self.held: dict[int, Exit] = {} if held is None else held
        self.since = since  # when the oldest exit held was taken


class ExitMerge(Record):
    """The jobs whose exits are held here (mutable, so not hashable)."""

    __slots__ = __match_args__ = ("jobs",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, jobs: dict[Key, _Job] | None = None) -> None:
        self.jobs: dict[Key, _Job] = {} if jobs is None else jobs

    def open(self, key: Key, job: str, targets: Iterable[int], origin: int, now: float) -> None:
        """This broker fanned out an exec.start that asked for merging: its targets here are
        those of its subtree (and itself, if it is one)."""
        self.jobs[key] = _Job(job, origin, set(targets), now)

    def merges(self, key: Key) -> bool:
        return key in self.jobs

    def take(self, key: Key, exits: Iterable[Exit], now: float) -> list[Flush] | None:
        """Exits on their way up: None if the job is not merged here (send them on as they
        came); else held, and what to flush now (all of it, if the subtree is complete)."""
        job = self.jobs.get(key)
        if job is None:
            return None
        job.heard = now
        for one in exits:
            job.held[one.rank] = one  # a duplicate (a resend) goes on once from here
            job.waiting.discard(one.rank)
        if not job.waiting:
            del self.jobs[key]
            return [self._flush(key, job)] if job.held else []
        if job.since is None and job.held:
            job.since = now
        return []

    def passed(self, key: Key, rank: int, now: float) -> list[Flush]:
        """A rank's last word that is not merged (an error, sent on as it came) passed here:
        that target is done. If it was the last, what is held goes now."""
        job = self.jobs.get(key)
        if job is None:
            return []
        job.heard = now
        job.waiting.discard(rank)
        if job.waiting:
            return []
        del self.jobs[key]
        return [self._flush(key, job)] if job.held else []

    def gone(self, job_id: str) -> None:
        """The job's client has gone: nobody takes its exits any more."""
        for key in [k for k, job in self.jobs.items() if job.job == job_id]:
            del self.jobs[key]

    def due(self, now: float) -> list[Flush]:
        """What has been held long enough to go without the rest of its subtree's; jobs idle
        for FORGET_S are forgotten."""
        flushes = []
        for key, job in list(self.jobs.items()):
            if job.since is not None and now >= job.since + HOLD_S:
                flushes.append(self._flush(key, job))
            elif not job.held and now >= job.heard + FORGET_S:
                del self.jobs[key]
        return flushes

    def next_deadline(self) -> float | None:
        return min(
            (j.since + HOLD_S if j.since is not None else j.heard + FORGET_S)
            for j in self.jobs.values()
        ) if self.jobs else None

    @staticmethod
    def _flush(key: Key, job: _Job) -> Flush:
        flush = Flush(key, job.origin, tuple(job.held.values()))
        job.held = {}
        job.since = None
        return flush
