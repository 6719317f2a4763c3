"""The replicated log of the root group (docs/protocol.md §13): rank-table events, each with the
index it holds and the term of the root that appended it. Plain data, no I/O; leadership.py
decides who writes it.

Rules.
- Indexes start at 1; index 0 is the empty prefix, of term 0.
- Log matching: an entry is appended after `prev` only if this log holds `prev` with the same
  term. Two logs that hold an entry of one index and term hold the same prefix up to it (each
  root appends once per index in its term, and appends only after a matching prefix).
- An entry that conflicts with a new one (same index, another term) is dropped with all that
  follow it; an entry that is already held (a duplicate, or a message that was overtaken) is
  kept, so a late or repeated append never shortens the log.
- Nothing at or below `commit` is ever dropped: a root commits an entry only once a majority of
  the group holds it, and no root can be elected without it. Dropping one is a bug, and raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Entry(Generic[P]):
    """One log entry. `payload` None is a root's mark at the start of its term: it carries no
    table event, and lets the root commit what earlier roots left (docs/protocol.md §13.4)."""

    term: int
    payload: P | None


class CommittedLost(Exception):
    """An append would drop a committed entry: the protocol's safety was broken."""


class ReplicaLog(Generic[P]):
    def __init__(self) -> None:
        self.entries: list[Entry[P]] = []
        self.commit = 0

    @property
    def last(self) -> int:
        return len(self.entries)

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index` (0 for index 0); None: not held."""
        if index == 0:
            return 0
        if 1 <= index <= len(self.entries):
            return self.entries[index - 1].term
        return None

    @property
    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else 0

    def at(self, index: int) -> Entry[P]:
        return self.entries[index - 1]

    def after(self, index: int, limit: int) -> tuple[Entry[P], ...]:
        """Up to `limit` entries that follow `index`."""
        return tuple(self.entries[index : index + limit])

    def up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as complete as this one:
        a later last term, or the same term and at least as long (Raft's election rule)."""
        return (last_term, last_index) >= (self.last_term, self.last)

    def append(self, entry: Entry[P]) -> int:
        self.entries.append(entry)
        return len(self.entries)

    def accept(self, prev: int, prev_term: int, entries: tuple[Entry[P], ...]) -> int | None:
        """Append `entries` after `prev`, if this log holds `prev` of `prev_term`. Returns the
        index up to which this log now matches the sender's; None: no match at `prev`."""
        if self.term_at(prev) != prev_term:
            return None
        for offset, entry in enumerate(entries):
            index = prev + 1 + offset
            held = self.term_at(index)
            if held == entry.term:
                continue
            if held is not None:
                if index <= self.commit:
                    raise CommittedLost(
                        f"entry {index} of term {held} is committed; an append of term"
                        f" {entry.term} would replace it"
                    )
                del self.entries[index - 1 :]
            self.entries.append(entry)
        return prev + len(entries)
