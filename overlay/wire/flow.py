"""Credit-based flow control for `tbon exec` streams: the numbers both ends agree on, and the
arithmetic of a window.

Output: the client grants each target rank a window of bytes in `exec.start`. A rank reads its
job's pipes only while it has credit, and every data message it sends costs its bytes plus
MESSAGE_COST (the last may overdraw the window by up to a chunk: lines go whole). The client
gives credit back (`exec.credit`) as it writes what it received to its own stdout. A reader that
stops therefore stops the jobs (their pipes fill, they block on write) and nothing piles up in
between: at most the window (and a chunk) per rank is ever in flight.

Input: each rank takes at most STDIN_WINDOW bytes of a job's stdin that the job has not read yet,
and tells the client (a `stdin` answer) as the job reads them, so a job that never reads its input
makes no broker buffer it. The per-message cost bounds the number of messages in flight, not
only their bytes, so that a job that prints one short line at a time is bounded too.

A third bound is not per stream but per client: a broker drops a local client that leaves more
than its backlog unread (overlay/links/local.py), and the client says what it has read every
ACK_EVERY bytes (overlay/connectors/client.py, its only user, which every command imports).

docs/protocol.md §7.1 is the reference.
"""

from __future__ import annotations

from tbon.record import Record

MESSAGE_COST = 1024
"""Credit a data message costs beyond its bytes: what its header and frames cost, rounded up."""

CHUNK = 256 * 1024
"""The most bytes one data message carries, and the pipe size asked for a job's output."""

OUTPUT_BUDGET = 16 * 1024 * 1024
"""What one `tbon exec` lets all of its targets have in flight together, split among them."""

MIN_WINDOW = 4 * 1024
MAX_WINDOW = 4 * 1024 * 1024
DEFAULT_WINDOW = 1024 * 1024
"""The window of an `exec.start` that names none (a client of an older tbon, a script)."""

STDIN_WINDOW = 1024 * 1024
"""Bytes of a job's stdin a rank holds for it, unread, at most."""

LINK_HWM = 65536
"""High-water mark, in messages, of each tree link, each way. Flow control keeps a link far below
it; a link that reaches it has a peer that stopped reading, which is then treated as gone."""


def output_window(targets: int) -> int:
    """Each target's share of the budget: wide for a few ranks (throughput), narrow for many
    (memory), always between MIN_WINDOW and MAX_WINDOW."""
    return max(MIN_WINDOW, min(MAX_WINDOW, OUTPUT_BUDGET // max(1, targets)))


class Window(Record):
    """The sender's side: credit left to spend. It may go below zero by one message, never
    further, because the sender stops as soon as it is spent. Mutable, so not hashable."""

    __slots__ = __match_args__ = ("size", "credit")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, size: int, credit: int) -> None:
        self.size, self.credit = size, credit

    @classmethod
    def full(cls, size: int) -> Window:
        return cls(size, size)

    @property
    def open(self) -> bool:
        return self.credit > 0

    def spend(self, amount: int) -> None:
        self.credit -= amount

    def grant(self, amount: int) -> bool:
        """Add returned credit (never above the window: a duplicated grant cannot widen it);
        True if this reopened a spent window."""
        was_open = self.open
        self.credit = min(self.size, self.credit + amount)
        return self.open and not was_open


class Returns(Record):
    """The receiver's side: bytes consumed and not yet given back, returned in batches of a
    quarter window so that credit flows back without a message per message."""

    __slots__ = __match_args__ = ("size", "owed")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, size: int, owed: int = 0) -> None:
        self.size, self.owed = size, owed

    def consumed(self, amount: int) -> int:
        """Note `amount` consumed; the credit to give back now (0: not yet)."""
        self.owed += amount
        if self.owed * 4 < self.size:
            return 0
        owed, self.owed = self.owed, 0
        return owed


class StdinRoom(Record):
    """The client's side of stdin: one stream copied to every rank still taking input, so it
    may send what the fullest of them has room for."""

    __slots__ = __match_args__ = ("room",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, room: dict[int, int]) -> None:
        self.room = room

    @classmethod
    def for_ranks(cls, ranks: list[int]) -> StdinRoom:
        return cls(dict.fromkeys(ranks, STDIN_WINDOW))

    @property
    def ranks(self) -> list[int]:
        return sorted(self.room)

    def available(self) -> int:
        return min(self.room.values(), default=0)

    def sent(self, amount: int) -> None:
        for rank in self.room:
            self.room[rank] -= amount

    def read(self, rank: int, amount: int) -> None:
        """Rank `rank`'s job read `amount` bytes: room for that much more there."""
        if rank in self.room:
            self.room[rank] = min(STDIN_WINDOW, self.room[rank] + amount)

    def done(self, rank: int) -> None:
        """The rank takes no more input: its job ended or closed its stdin."""
        self.room.pop(rank, None)
