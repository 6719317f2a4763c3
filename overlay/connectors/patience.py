"""How long a command waits for the instance, and what it says meanwhile: the one home of
waiting on the client side. Pure: the caller brings the clock and does the I/O.

A request that one broker answers (status.get, broker.info, a ping) gets ANSWER_WAIT seconds
unless the command was given a --timeout: long enough for a loaded broker of a big instance and
for a tree that is healing (a fostered subtree is reachable again well within a second, and a
request a healing tree cannot route fails at once with EHOSTUNREACH, which is retried after the
heal, not waited out), and as long as a broker's parent stays silent before it flags it
torpid (`tbon.torpid`'s default). Flux's RPCs wait 0.5 s; a tree under heal needs more.

What legitimately takes long (the jobs of `tbon exec`, `status --wait`, `dmesg --follow`) has
no bound of its own; on a terminal it says, after PROGRESS_AFTER seconds of silence, whom it is
waiting for: `tbon exec: waiting for rank 3: no answer for 3 s`.

Every command that talks to an instance imports this module (connectors/client.py does), so
its classes are plain ones: a dataclass is built at import, ~0.3 ms each on a quiet machine,
which a `tbon ping` of ~200 ms would pay for nothing.
"""

from __future__ import annotations

import math

ANSWER_WAIT = 10.0
"""Seconds a command waits for one answer when it has no --timeout of its own."""
PROGRESS_AFTER = 1.0
"""Seconds of silence before a command at a terminal says whom it waits for."""
PROGRESS_EVERY = 1.0
"""Seconds between two updates of that line."""
PROBE_AFTER = PROGRESS_AFTER / 2
"""Seconds a target of `tbon exec` may say nothing before its broker is pinged; one that does
not answer that ping within as long again is shown as silent."""
PROBE_MOST = 64  # pings a second at most, however many ranks are quiet


def limit_of(timeout: float | None) -> float | None:
    """A --timeout as a limit: 0 means none (as `tbon.timeout=0` and Flux's `--timeout=0`),
    and no --timeout means ANSWER_WAIT."""
    if timeout is None:
        return ANSWER_WAIT
    return None if timeout == 0 else timeout


def silence_line(whom: str, silent: float) -> str:
    """`waiting for rank 3: no answer for 3 s`."""
    return f"waiting for {whom}: no answer for {math.floor(silent)} s"


class Patience:
    """One awaited answer: when to give up (`limit` seconds after `started`; None: never), and
    when to say, at a terminal, that it has not come."""

    __slots__ = ("_next_line", "limit", "progress", "started", "whom")

    def __init__(
        self, whom: str, limit: float | None, started: float, progress: bool = False
    ) -> None:
        self.whom = whom  # "rank 0", "local:///..."
        self.limit = limit
        self.started = started
        self.progress = progress  # say so (a person is at a terminal)
        self._next_line = started + PROGRESS_AFTER

    def expired(self, now: float) -> bool:
        return self.limit is not None and now >= self.started + self.limit

    def wait(self, now: float) -> float | None:
        """Seconds to wait for the answer before asking again (None: no reason to wake)."""
        wakes = []
        if self.limit is not None:
            wakes.append(self.started + self.limit)
        if self.progress:
            wakes.append(self._next_line)
        return max(0.0, min(wakes) - now) if wakes else None

    def line(self, now: float) -> str | None:
        """The progress line due now, if one is."""
        if not self.progress or now < self._next_line:
            return None
        self._next_line = now + PROGRESS_EVERY
        return silence_line(self.whom, now - self.started)

    def failure(self) -> str:
        return f"no answer from {self.whom} within {self.limit:g}s (is it stopped or overloaded?)"


class Silence:
    """Many ranks that each answer now and then (the targets of `tbon exec`): which to probe
    with a ping to learn whether their broker is still there, and the line to show for those
    whose broker has not answered either. Used at a terminal only: a round of at most
    PROBE_MOST pings a second, the longest silent first, whatever the size of the instance."""

    __slots__ = ("_next_line", "_next_round", "heard", "probing")

    def __init__(self, heard: dict[int, float], next_round: float = 0.0) -> None:
        self.heard = heard  # rank -> when something last came from it
        self.probing: dict[int, float] = {}  # rank -> when its ping went
        self._next_round = next_round
        self._next_line = 0.0

    @classmethod
    def of(cls, ranks: list[int], now: float) -> Silence:
        return cls({rank: now for rank in ranks}, next_round=now + PROBE_AFTER)

    def hear(self, rank: int, now: float) -> None:
        if rank in self.heard:
            self.heard[rank] = now
            self.probing.pop(rank, None)

    def done(self, rank: int) -> None:
        self.heard.pop(rank, None)
        self.probing.pop(rank, None)

    def probes(self, now: float) -> list[int]:
        """The ranks to ping now: quiet for PROBE_AFTER, with no ping on its way."""
        if now < self._next_round:
            return []
        self._next_round = now + PROGRESS_EVERY
        quiet = [r for r, heard in self.heard.items() if now - heard >= PROBE_AFTER]
        due = sorted((r for r in quiet if r not in self.probing), key=self.heard.__getitem__)
        for rank in due[:PROBE_MOST]:
            self.probing[rank] = now
        return due[:PROBE_MOST]

    def wait(self, now: float) -> float | None:
        """Seconds until a round of probes or a line is due (None: nothing to wait for)."""
        wakes = [self._next_round] if len(self.probing) < len(self.heard) else []
        if self.probing:
            wakes.append(max(self._next_line, min(self.probing.values()) + PROBE_AFTER))
        return max(0.0, min(wakes) - now) if wakes else None

    def line(self, now: float) -> str | None:
        """What to show now: the ranks whose ping has gone unanswered for PROBE_AFTER; "" to
        clear a line shown before; None when nothing is due."""
        if now < self._next_line:
            return None
        silent = sorted(rank for rank, sent in self.probing.items() if now - sent >= PROBE_AFTER)
        if not silent:
            return ""
        self._next_line = now + PROGRESS_EVERY
        from tbon.overlay.parse.idset import format_idset

        whom = f"rank{'s' * (len(silent) > 1)} {format_idset(silent)}"
        return silence_line(whom, now - min(self.heard[r] for r in silent))
