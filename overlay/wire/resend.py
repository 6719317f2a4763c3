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
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")

ASK_AGAIN_S = 1.0
"""Seconds before a receiver that asked for a resend, and still misses the same message, asks
again (its request, or the resend, may have crossed a link that died too)."""

ACK_MESSAGES = 64
"""A receiver acknowledges at least every this many messages taken, even with no credit to
return (answers that cost no credit: a job's `stdin` counts), so that what a sender keeps stays
bounded in messages too."""


@dataclass(slots=True)
class Outbox(Generic[T]):
    """The sender's side: each message numbered, and kept until acknowledged."""

    keep: bool = True  # False: number only (the receiver does not acknowledge)
    next_seq: int = 0
    kept: deque[tuple[int, T]] = field(default_factory=deque)

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


@dataclass(slots=True)
class Inbox:
    """The receiver's side of one stream: takes the next number only, and says when to
    acknowledge and when to ask for a resend."""

    expected: int = 0  # the next number to take
    free: int = 0  # messages taken that cost no credit, since the last acknowledgement
    asked: tuple[int, float] | None = None  # a resend asked for, from `expected`, at that time

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


@dataclass(slots=True)
class Handoff:
    """The client's broker's side of one rank's stream: the answers it has handed to the local
    client's connection, and when to acknowledge them for the client (the same number the client
    will acknowledge once it reads them: it takes exactly what is handed to it, in order)."""

    window: int  # the stream's credit window: acknowledged at least every quarter of it
    expected: int = 0  # the next number to hand over in order
    owed: int = 0  # credit cost handed over since the last acknowledgement
    count: int = 0  # messages handed over since the last acknowledgement
    said: int = -1  # `expected` when a duplicate was last acknowledged

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
