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
- Compaction. Entries up to `base` may be discarded (`compact`) once applied: the table as of
  `base` stands for them (a snapshot, held by the caller), and only the term of the entry at
  `base` is kept, for log matching. They are committed, so every root's log agrees with them: an
  append whose previous entry lies below `base` matches there. A snapshot received from the root
  (`install`) replaces what it covers; entries after it are kept if they follow it.
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
        self.entries: list[Entry[P]] = []  # the entries after `base`, the first at base + 1
        self.commit = 0
        self.base = 0  # entries up to here are discarded: a snapshot stands for them
        self.base_term = 0

    @property
    def last(self) -> int:
        return self.base + len(self.entries)

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index` (0 for index 0); None: not held (or discarded)."""
        if index == self.base:
            return self.base_term
        if self.base < index <= self.last:
            return self.entries[index - self.base - 1].term
        return None

    @property
    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.base_term

    def at(self, index: int) -> Entry[P]:
        if not self.base < index <= self.last:
            raise IndexError(f"entry {index} is not held (held: {self.base + 1} to {self.last})")
        return self.entries[index - self.base - 1]

    def after(self, index: int, limit: int) -> tuple[Entry[P], ...]:
        """Up to `limit` entries that follow `index` (not below `base`)."""
        start = index - self.base
        if start < 0:
            raise IndexError(f"entries after {index} are discarded up to {self.base}")
        return tuple(self.entries[start : start + limit])

    def between(self, first: int, last: int) -> tuple[Entry[P], ...]:
        """The entries held from `first` to `last`, both included (none below `base`)."""
        first = max(first, self.base + 1)
        return tuple(self.entries[first - self.base - 1 : max(0, last - self.base)])

    def compact(self, upto: int) -> None:
        """Discard the entries up to `upto`, which the caller's table has applied."""
        if upto <= self.base:
            return
        if upto > self.commit:
            raise CommittedLost(f"entry {upto} is not committed (commit {self.commit})")
        term = self.term_at(upto)
        assert term is not None
        del self.entries[: upto - self.base]
        self.base, self.base_term = upto, term

    def install(self, index: int, term: int) -> None:
        """A snapshot as of `index` (of `term`) replaces the log up to it. Entries after it are
        kept if the log holds `index` of `term` (a late snapshot); otherwise all go."""
        if index <= self.base:
            return
        if self.term_at(index) == term:
            del self.entries[: index - self.base]
        else:
            if index <= self.commit:
                raise CommittedLost(f"committed entry {index} is not of term {term}")
            self.entries = []
        self.base, self.base_term = index, term
        self.commit = max(self.commit, index)

    def up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (last_index, last_term) is at least as complete as this one:
        a later last term, or the same term and at least as long (Raft's election rule)."""
        return (last_term, last_index) >= (self.last_term, self.last)

    def append(self, entry: Entry[P]) -> int:
        self.entries.append(entry)
        return self.last

    def accept(self, prev: int, prev_term: int, entries: tuple[Entry[P], ...]) -> int | None:
        """Append `entries` after `prev`, if this log holds `prev` of `prev_term`. Returns the
        index up to which this log now matches the sender's; None: no match at `prev`."""
        if prev < self.base:  # discarded: committed, so the sender's log agrees up to `base`
            skip = self.base - prev
            if len(entries) >= skip and entries[skip - 1].term != self.base_term:
                raise CommittedLost(
                    f"entry {self.base} of term {self.base_term} is committed; an append"
                    f" holds it of term {entries[skip - 1].term}"
                )
            if len(entries) < skip:
                return self.base
            prev, prev_term, entries = self.base, self.base_term, entries[skip:]
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
                del self.entries[index - self.base - 1 :]
            self.entries.append(entry)
        return prev + len(entries)
