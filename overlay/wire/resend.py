"""Exactly once, in order, across heals: the numbering of one `tbon exec` stream, the sender
keeping what the receiver has not acknowledged, and the receiver taking each message once.

A tree link that dies takes with it what it had queued, and what its far broker had read but not
passed on; a stream that crossed it has a hole. The target's broker numbers every answer of a job
(`seq`, from 0), keeps each until the client acknowledges it, and sends everything kept again
once its way up has changed (a heal above it: docs/protocol.md §7.1 and §12). The client takes
only the next number it expects: a number it has taken is a duplicate (a resend of something that
had arrived after all), a larger one follows a hole (it is dropped too, and comes again with the
resend, in order). So the receiver never reorders, never buffers, and a gap costs one resend.

What is kept is bounded by the credit window: the client acknowledges with its credit returns
(exec.credit carries `seq`, the next number it expects), and a message it has not acknowledged
is credit not yet returned. Pure: no sockets, no clock but the one passed in.

The client's own broker acknowledges too, ahead of the client (Handoff): an answer it has put in
the client's connection, in order, cannot be lost by any heal (that connection is a byte stream,
and if it breaks the client is gone and its jobs with it). So what a target keeps is what is still
on its way through the tree, not also what waits, unread, in front of a client that stopped
reading: a stalled reader costs the window once (in its broker's queue), not twice.
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Generic, TypeVar

from tbon.record import Record

T = TypeVar("T")

ASK_AGAIN_S = 1.0
"""Seconds before a receiver that asked for a resend, and still misses the same message, asks
again (its request, or the resend, may have crossed a link that died too)."""

QUIET_S = 2.0
"""Seconds a client hears nothing from a rank still running before it asks that rank to send
again what it has not acknowledged (exec.resend): a rank's last answer, lost in a heal the client
never saw (the status table that showed it crossed a link that died too), leaves no hole behind
it to notice, so silence is the only sign. Asked again after twice as long each time, up to
QUIET_MAX_S: a job that is merely quiet costs a message now and then, not a stream."""

QUIET_MAX_S = 16.0
SCAN_S = 1.0  # how often the ranks still running are looked over for silence

ACK_MESSAGES = 64
"""A receiver acknowledges at least every this many messages taken, even with no credit to
return (answers that cost no credit: a job's `stdin` counts), so that what a sender keeps stays
bounded in messages too."""


class Outbox(Record, Generic[T]):
    """The sender's side: each message numbered, and kept until acknowledged. Mutable, so not
    hashable (this module's classes are Records for their equality and repr only)."""

    __slots__ = __match_args__ = ("keep", "next_seq", "kept")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, keep: bool = True, next_seq: int = 0, kept: deque[tuple[int, T]] | None = None
    ) -> None:
        self.keep = keep  # False: number only (the receiver does not acknowledge)
        self.next_seq = next_seq
        self.kept: deque[tuple[int, T]] = deque() if kept is None else kept

    def number(self, item: T) -> int:
        """The number of the next message, `item` (kept to send again if need be)."""
        seq = self.next_seq
        self.next_seq += 1
        if self.keep:
            self.kept.append((seq, item))
        return seq

    def acknowledged(self, upto: int) -> None:
        """The receiver has taken every message below `upto`: they need not be kept. A number
        beyond what was sent counts as all that was sent; an older one changes nothing."""
        while self.kept and self.kept[0][0] < upto:
            self.kept.popleft()

    def unacknowledged(self, start: int = 0) -> list[tuple[int, T]]:
        """What to send again, in order: every kept message numbered `start` or later."""
        return [(seq, item) for seq, item in self.kept if seq >= start]

    def stop_keeping(self) -> None:
        """Nobody will acknowledge any more (the client has gone): keep nothing."""
        self.keep = False
        self.kept.clear()

    @property
    def settled(self) -> bool:
        """Nothing is waiting for an acknowledgement."""
        return not self.kept


class Verdict(Enum):
    TAKE = "take"  # the next message: use it
    DUPLICATE = "duplicate"  # taken before: drop it
    AHEAD = "ahead"  # one before it is missing: drop it, it comes again after that one


class Inbox(Record):
    """The receiver's side of one stream: takes the next number only, and says when to
    acknowledge and when to ask for a resend."""

    __slots__ = __match_args__ = ("expected", "free", "asked")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, expected: int = 0, free: int = 0, asked: tuple[int, float] | None = None
    ) -> None:
        self.expected = expected  # the next number to take
        self.free = free  # messages taken that cost no credit, since the last acknowledgement
        self.asked = asked  # a resend asked for, from `expected`, at that time

    def take(self, seq: int) -> Verdict:
        if seq == self.expected:
            self.expected += 1
            return Verdict.TAKE
        return Verdict.DUPLICATE if seq < self.expected else Verdict.AHEAD

    def ask_resend(self, now: float) -> bool:
        """After an AHEAD: whether to ask the sender to send again from `expected` now (once per
        hole, and again only after ASK_AGAIN_S)."""
        asked = self.asked
        if asked is not None and asked[0] == self.expected and now < asked[1] + ASK_AGAIN_S:
            return False
        self.asked = (self.expected, now)
        return True

    def took_free(self) -> bool:
        """A message that costs no credit was taken (output is acknowledged with the credit it
        returns): whether enough of them wait to be acknowledged on their own."""
        self.free += 1
        return self.free >= ACK_MESSAGES

    def acked(self) -> int:
        """An acknowledgement is being sent: the number it carries."""
        self.free = 0
        return self.expected


class Handoff(Record):
    """The client's broker's side of one rank's stream: the answers it has handed to the local
    client's connection, and when to acknowledge them for the client (the same number the client
    will acknowledge once it reads them: it takes exactly what is handed to it, in order)."""

    __slots__ = __match_args__ = ("window", "expected", "owed", "count", "said")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, window: int, expected: int = 0, owed: int = 0, count: int = 0, said: int = -1
    ) -> None:
        self.window = window  # the stream's credit window: acknowledged at least every quarter
        self.expected = expected  # the next number to hand over in order
        self.owed = owed  # credit cost handed over since the last acknowledgement
        self.count = count  # messages handed over since the last acknowledgement
        self.said = said  # `expected` when a duplicate was last acknowledged

    def handed(self, seq: int, cost: int, last: bool = False) -> int | None:
        """Answer `seq`, of credit cost `cost`, went into the client's connection (`last`: the
        rank's last word): the number to acknowledge now, or None. A duplicate is acknowledged
        once (its sender still keeps what an acknowledgement lost in a heal should have freed);
        an answer after a hole is not counted: the client drops it too, and it comes again."""
        if seq != self.expected:
            if seq < self.expected and self.said != self.expected:
                self.said = self.expected
                return self.expected
            return None
        self.expected += 1
        self.owed += cost
        self.count += 1
        if last or self.owed * 4 >= self.window or self.count >= ACK_MESSAGES:
            self.owed = self.count = 0
            return self.expected
        return None


class Prompts(Record):
    """The client's side of answers that never come: which of the ranks still running to ask
    to send again, and when (QUIET_S). Hearing from a rank resets its clock; a rank asked is
    asked again only after its interval doubled. The ranks are looked over once a second at
    most, not at every answer (an exec may have many thousands).

    A rank not heard from yet is not silent while answers of other ranks still come in: at
    thousands of ranks the first answers take seconds to arrive through a busy rank 0, and
    asking then only doubles its load (each rank asked sends its answers again, and they arrive
    as duplicates). Its clock starts from the last answer of any rank, but never waits past
    QUIET_MAX_S from the start: a rank whose first answers died in a heal is asked for them
    even while others stream on. Before any answer at all it waits QUIET_MAX_S: the fan-out
    may still be on its way down (on a loaded machine, seconds at a thousand ranks), and a
    heal that took every answer shows in the status table, which asks at once (heal_over)."""

    __slots__ = __match_args__ = ("start", "due", "interval", "scan", "flowing")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        start: float,
        due: dict[int, float] | None = None,
        interval: dict[int, float] | None = None,
        flowing: float | None = None,
    ) -> None:
        self.start = start  # when the job started: the clock of a rank not heard from yet
        self.due: dict[int, float] = {} if due is None else due  # rank -> when to ask it
        # rank -> its interval, once asked
        self.interval: dict[int, float] = {} if interval is None else interval
        self.scan = start + QUIET_S  # when to look the ranks over next (its own: not given)
        self.flowing = flowing  # when any rank was last heard from

    def heard(self, rank: int, now: float) -> None:
        self.due[rank] = now + QUIET_S
        self.interval.pop(rank, None)
        self.flowing = now if self.flowing is None else max(self.flowing, now)

    def soon(self, now: float) -> None:
        """Something changed (a status table came): a rank asked before is due QUIET_S after
        it was asked, not at the end of a longer interval; the ranks are looked over now."""
        for rank, interval in self.interval.items():
            self.due[rank] = min(self.due[rank], self.due[rank] - interval + QUIET_S)
            self.interval[rank] = QUIET_S / 2
        self.scan = min(self.scan, now)

    def ask(self, pending: set[int], now: float) -> list[int]:
        """The ranks of `pending` to ask now; none is asked again within its interval."""
        if now < self.scan:
            return []
        self.scan = now + SCAN_S
        asked = []
        unheard = self.start + QUIET_MAX_S
        if self.flowing is not None:
            unheard = min(self.flowing + QUIET_S, unheard)
        for rank in pending:
            if self.due.get(rank, unheard) <= now:
                interval = min(QUIET_MAX_S, 2 * self.interval.get(rank, QUIET_S / 2))
                self.interval[rank] = interval
                self.due[rank] = now + interval
                asked.append(rank)
        return sorted(asked)

    def wait(self, now: float) -> float:
        """Seconds until the ranks are next looked over."""
        return max(0.0, self.scan - now)
