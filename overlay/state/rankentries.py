"""Where the rank table keeps its entries: only the ranks something happened to.

An instance may have 262,144 ranks (tbon/limits.py) of which a few dozen are launched: the rest
are spares, vacant at incarnation 0 with a placeholder host, and every one of them reads the
same but for its number. `CompactEntries` keeps an entry only for a rank that was launched or
that an event has touched (a reserve, a hello); a spare nothing happened to is made up when it
is read, and costs nothing while it is not. Its interface is the one the table and its rules
use:

- `entries[rank]`: the entry, to read and to change; a spare is kept from then on, so that what
  a rule writes into it stays. The rules call it for the ranks an event names.
- `peek(rank)`: the entry to read only: a spare is made up and not kept. For walks over many
  ranks (a subtree, the status pages) that change nothing.
- `launched`, `created`: how many ranks were launched (a spare's host is `extra{rank -
  launched}`) and when the table was made (a spare's `since`).
- iteration, `len`, slices: every rank in order, spares made up; `held()`: the kept entries
  only, where whatever a spare cannot have (a key, a lease, an adrift deadline) is looked for;
  `pristine(rank)`: whether a rank is an untouched spare.

`PlainEntries` keeps every entry in a list. It is what the table used before, and the oracle
that tests/test_rankentries.py holds the compact store to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import overload

from tbon.overlay.state.rankstates import Phase, RankEntry


def spare(rank: int, launched: int, since: float) -> RankEntry:
    """The entry of a spare rank no broker has held: vacant, incarnation 0, host `extraN`."""
    return RankEntry(rank, Phase.VACANT, 0, f"extra{rank - launched}", None, since)


class CompactEntries:
    """Every rank's entry, kept only for the ranks launched or touched (see the module)."""

    def __init__(self, launched: list[RankEntry], size: int, since: float) -> None:
        self._kept: dict[int, RankEntry] = {entry.rank: entry for entry in launched}
        self.launched = len(launched)
        self._size = size
        self.created = since

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, rank: int) -> RankEntry: ...
    @overload
    def __getitem__(self, rank: slice) -> list[RankEntry]: ...
    def __getitem__(self, rank: int | slice) -> RankEntry | list[RankEntry]:
        if isinstance(rank, slice):
            return [self.peek(r) for r in range(self._size)[rank]]
        if not 0 <= rank < self._size:
            raise IndexError(f"rank {rank} is not in 0..{self._size - 1}")
        entry = self._kept.get(rank)
        if entry is None:
            entry = self._kept[rank] = spare(rank, self.launched, self.created)
        return entry

    def peek(self, rank: int) -> RankEntry:
        entry = self._kept.get(rank)
        return entry if entry is not None else spare(rank, self.launched, self.created)

    def pristine(self, rank: int) -> bool:
        """Whether `rank` is a spare that nothing has touched (kept entries are compared)."""
        entry = self._kept.get(rank)
        return entry is None or _untouched(entry, self.launched, self.created)

    def __iter__(self) -> Iterator[RankEntry]:
        kept, launched, since = self._kept, self.launched, self.created
        for rank in range(self._size):
            entry = kept.get(rank)
            yield entry if entry is not None else spare(rank, launched, since)

    def held(self) -> list[RankEntry]:
        """The kept entries, in rank order: every rank that is not an untouched spare is here."""
        return [self._kept[rank] for rank in sorted(self._kept)]

    def kept(self) -> Iterable[RankEntry]:
        """The kept entries in no order: `held()` without its sort, for a search of them."""
        return self._kept.values()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactEntries | PlainEntries | list):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


class PlainEntries:
    """Every rank's entry in a list: the simple store, and the oracle of the compact one."""

    def __init__(self, launched: list[RankEntry], size: int, since: float) -> None:
        self.launched = len(launched)
        self.created = since
        self._list = list(launched)
        self._list += [spare(rank, len(launched), since) for rank in range(len(launched), size)]

    def __len__(self) -> int:
        return len(self._list)

    @overload
    def __getitem__(self, rank: int) -> RankEntry: ...
    @overload
    def __getitem__(self, rank: slice) -> list[RankEntry]: ...
    def __getitem__(self, rank: int | slice) -> RankEntry | list[RankEntry]:
        if isinstance(rank, int) and rank < 0:
            raise IndexError(f"rank {rank} is not in 0..{len(self._list) - 1}")
        return self._list[rank]

    def peek(self, rank: int) -> RankEntry:
        return self._list[rank]

    def pristine(self, rank: int) -> bool:
        return _untouched(self._list[rank], self.launched, self.created)

    def __iter__(self) -> Iterator[RankEntry]:
        return iter(self._list)

    def held(self) -> list[RankEntry]:
        return list(self._list)

    def kept(self) -> Iterable[RankEntry]:
        return self._list

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactEntries | PlainEntries | list):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


def _untouched(entry: RankEntry, launched: int, since: float) -> bool:
    """Whether `entry` reads as its spare; a rank taken once is told by its incarnation,
    without making the spare up (a status view asks for every kept rank)."""
    if entry.incarnation != 0 or entry.phase is not Phase.VACANT or entry.rank < launched:
        return False
    return entry == spare(entry.rank, launched, since)


Entries = CompactEntries | PlainEntries
