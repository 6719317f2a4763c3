"""When the client's broker tells the ranks of a `tbon exec` job that their last answers were
taken (exec.taken): a plain machine, stimulus in, instructions out.

Each rank keeps its job's answers, its exit last, until the client has them (resend.py), and
`exec.taken` tells it to keep nothing more: one message fanned out to every rank of the job. Sent
as the exits arrive, it would wake every finished rank while the others still start their
jobs (1024 ranks of `tbon exec -r all true` share two cores on a test machine), so the ranks
handed over are held here and told together:

- **when the job is over** at this broker (every target's last word handed to the client), so
  that the whole job is told with one exec.taken fanned out once;
- **when its client has gone**, since nothing more of the job is handed over then;
- **HOLD_S after the first of them was held**, so that the ranks of a job that runs on
  elsewhere are not kept waiting without end: what they keep is a few answers each, bounded.
"""

from __future__ import annotations

from tbon.record import Record

HOLD_S = 5.0
"""Seconds the ranks handed over are held at most before they are told: longer than the fan-out
of a short job across thousands of ranks, short beside the 600 s a rank keeps what is never
acknowledged."""


class _Held(Record):
    __slots__ = __match_args__ = ("ranks", "since")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, ranks: list[int] | None = None, since: float | None = None) -> None:
        self.ranks: list[int] = [] if ranks is None else ranks
        self.since = since  # when first flushed held (the broker's clock comes with `due`)


class TakenHold:
    """Ranks whose last answer of a job was handed to its client, by job id, until told."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._over: set[str] = set()

    def __bool__(self) -> bool:
        """Whether any rank is held."""
        return bool(self._held)

    def taken(self, job: str, rank: int) -> None:
        """`rank`'s last answer of `job` was handed to the client, in order."""
        self._held.setdefault(job, _Held()).ranks.append(rank)

    def taken_all(self, job: str, ranks: list[int]) -> None:
        """The last answers of these ranks of `job` were handed over, in order (`taken`)."""
        self._held.setdefault(job, _Held()).ranks.extend(ranks)

    def over(self, job: str) -> bool:
        """Nothing more of `job` will be handed over: its targets are all done, or its client
        has gone. Its ranks are told at the next `due`; whether any are held."""
        if job not in self._held:
            return False
        self._over.add(job)
        return True

    def due(self, now: float) -> list[tuple[str, list[int]]]:
        """The jobs whose ranks to tell now, each with its ranks; the others held from `now`
        on, if not held already."""
        told = []
        for job, held in list(self._held.items()):
            if held.since is None and job not in self._over:
                held.since = now
            if job in self._over or (held.since is not None and now >= held.since + HOLD_S):
                told.append((job, held.ranks))
                del self._held[job]
        self._over.clear()
        return told

    def next_deadline(self) -> float | None:
        """When the job held longest is to be told whatever else happens (0: a job is over, and
        its ranks are to be told at once)."""
        if self._over:
            return 0.0
        starts = [held.since for held in self._held.values() if held.since is not None]
        return min(starts) + HOLD_S if starts else None
