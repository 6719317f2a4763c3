"""When the broker's loop next wakes: the soonest deadline of all its sources, asked in one place.

Every turn of the loop that did anything (read a request, a report, a connection event; ran the
timers) asks every source again, so that whatever deadline the turn added (a `heal.wait`, a
flood's next log line, a blocklist entry's expiry, a held exit) reaches the next wake-up without
its author having to say so: a new source is one more entry in the broker's list, nothing else.

A turn that only exchanged heartbeats (answered inside the link up, or heard from children by
their header's bytes) is the one thing an idle broker does, once per `tbon.heartbeat`; it asks
nothing again but the link up, whose own beat and silence that heartbeat moved (later, never
sooner). The rest is kept from the last full asking (`rest`): a heard heartbeat only puts
deadlines off, so the kept value is at worst early, a wake-up that finds nothing due.

Something that may have brought a deadline sooner (a lease given, a child come: `Wake`) makes the
next turn ask every source again (`recompute`, `stale`), but does not run the timers: they run
when the soonest deadline so found is due, at once if it already is. A thousand joins are then a
thousand askings, not a thousand walks of every child's clock.

Pure: deadlines in, the next wake-up out (monotonic seconds).
"""

from __future__ import annotations

from collections.abc import Iterable

NEVER = float("inf")


class WakeUp:
    def __init__(self) -> None:
        self.due = 0.0  # the next wake-up; 0: the loop's first turn runs its timers
        self.rest = NEVER  # the soonest of every source but the link up, at the last asking
        self.stale = True  # whether the next turn must ask every source (`recompute`)

    def asked(self, now: float, rest: Iterable[float | None], up: float | None) -> None:
        """After a turn that did anything: every source's deadline (`up`, the link up's)."""
        self.rest = min((d for d in rest if d is not None), default=NEVER)
        self.stale = False
        self._set(now, up)

    def beat(self, now: float, up: float | None) -> None:
        """After a turn that only exchanged heartbeats: the link up's deadline, asked again."""
        self._set(now, up)

    def sooner(self, deadline: float) -> None:
        """A deadline known to come before the next wake-up (a report to send)."""
        self.due = min(self.due, deadline)

    def recompute(self) -> None:
        """Ask every source on the next turn, whatever it does; the timers run only if what
        they then say is due."""
        self.stale = True

    def timeout_ms(self, now: float) -> int | None:
        """The poll's timeout: None to sleep until input, else milliseconds, rounded up."""
        if self.due == NEVER:
            return None
        return max(0, int((self.due - now) * 1000) + 1)

    def _set(self, now: float, up: float | None) -> None:
        soonest = self.rest if up is None else min(self.rest, up)
        self.due = soonest if soonest == NEVER else max(now, soonest)
