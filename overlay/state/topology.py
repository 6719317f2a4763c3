"""Tree shapes: who is whose parent.

A topology is a pure function of (spec, size). `kary:K` puts rank i>0 under (i-1)//K;
`kary:0` is flat (every rank under 0); `kary:1` is a chain; `binomial` is the binomial tree
rooted at 0, where rank i's parent is i with its highest set bit cleared. `parents:P1,P2,...`
lists the parent of every rank from 1 on, for trees a config file draws by hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property

from tbon.errors import UsageError
from tbon.overlay.parse.numbers import is_decimal

DEFAULT_SPEC = "kary:32"
_KARY = re.compile(r"^kary:(\d+)$")
_PARENTS = re.compile(r"^parents:(\d+(?:,\d+)*)?$")


def parse_spec(spec: str) -> str:
    """Normalise a topology spec; a clear UsageError for anything we cannot build."""
    text = spec.strip()
    if text == "binomial" or _PARENTS.match(text):
        return text
    match = _KARY.match(text)
    if not match:
        raise UsageError(
            f"invalid topology {spec!r}: use kary:K (K >= 0; 0 flat, 1 chain) or binomial"
        )
    return f"kary:{int(match.group(1))}"


def spec_from_fanout(fanout: str) -> str:
    """`tbon.fanout=K` is an alias for `tbon.topo=kary:K`."""
    if not is_decimal(fanout.strip()):
        raise UsageError(f"invalid tbon.fanout {fanout!r}: use a whole number K >= 0")
    return f"kary:{int(fanout)}"


class Topology:
    """The tree of `size` ranks for one spec; every query is O(depth) or O(children).

    Building one costs O(1) for `kary:K` and `binomial`: a broker asks only about itself, its
    parent and its children, which are arithmetic, so N brokers do not each build an N-rank
    table (O(N²) across an instance). The whole children table is built, once, on the first
    query that needs it: `postorder`, `descendants` (rank 0's roll-ups), or a `parents:` tree.
    """

    # A plain class, not a dataclass (tbon/record.py says why); not a Record either, since its
    # cached properties need an instance dict. Equal, and hashed alike, by (spec, size).

    def __init__(self, spec: str, size: int) -> None:
        self.spec = parse_spec(spec)
        self.size = size
        if size < 1:
            raise UsageError(f"invalid size {size}: an instance has at least one rank")
        if self.spec.startswith("parents:"):
            _check_parents(self.spec, size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology) or type(other) is not type(self):
            return NotImplemented
        return (self.spec, self.size) == (other.spec, other.size)

    def __hash__(self) -> int:
        return hash((self.spec, self.size))

    def __repr__(self) -> str:
        return f"Topology(spec={self.spec!r}, size={self.size!r})"

    @cached_property
    def _fanout(self) -> int | None:
        """K of `kary:K`; None for the other shapes."""
        return int(self.spec[len("kary:") :]) if self.spec.startswith("kary:") else None

    @cached_property
    def _parents(self) -> tuple[int, ...]:
        """The parent of every rank of a `parents:` tree (rank 0's is 0), parsed once."""
        text = self.spec[len("parents:") :]
        return (0, *map(int, text.split(","))) if text else (0,)

    @cached_property
    def _children(self) -> tuple[tuple[int, ...], ...]:
        """Every rank's children: O(size), built only when a query needs the whole tree."""
        children: list[list[int]] = [[] for _ in range(self.size)]
        for rank in range(1, self.size):
            children[self._parent_of(rank)].append(rank)
        return tuple(tuple(c) for c in children)

    @cached_property
    def _postorder(self) -> tuple[int, ...]:
        return self._walk_postorder()

    def _parent_of(self, rank: int) -> int:
        k = self._fanout
        if k is None:
            if self.spec == "binomial":
                return rank & ~(1 << (rank.bit_length() - 1))
            return self._parents[rank]
        if k == 0:
            return 0
        if k == 1:
            return rank - 1
        return (rank - 1) // k

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is not in 0..{self.size - 1}")

    @cached_property
    def _k(self) -> int:
        """K of `kary:K` for K >= 2 (a parent is one division away); 0 for every other shape.
        Rank 0 asks `parent` and `is_ancestor` a few times for each event it applies: the usual
        shape is answered inline, without the calls of `_check` and `_parent_of`."""
        k = self._fanout
        return k if k is not None and k >= 2 else 0

    def parent(self, rank: int) -> int | None:
        """The parent of `rank`, or None for the root."""
        k = self._k
        if k and 0 < rank < self.size:
            return (rank - 1) // k
        self._check(rank)
        return None if rank == 0 else self._parent_of(rank)

    def children(self, rank: int) -> tuple[int, ...]:
        """`rank`'s children in ascending order: arithmetic, except for a `parents:` tree."""
        arity = self._k
        if arity and 0 <= rank < self.size:
            first = rank * arity + 1
            return tuple(range(first, min(first + arity, self.size)))
        self._check(rank)
        k = self._fanout
        if k is None:
            if self.spec != "binomial":
                return self._children[rank]
            # rank | 2^j for every bit j above rank's highest set bit (rank 0: every power of 2).
            bit = 1 << rank.bit_length()
            found = []
            while rank + bit < self.size:
                found.append(rank + bit)
                bit <<= 1
            return tuple(found)
        if k == 0:
            return tuple(range(1, self.size)) if rank == 0 else ()
        first = rank * k + 1
        return tuple(range(first, min(first + k, self.size)))

    def ancestors(self, rank: int) -> Iterator[int]:
        """Parent, grandparent, ... up to and including rank 0."""
        current = self.parent(rank)
        while current is not None:
            yield current
            current = self.parent(current)

    def level(self, rank: int) -> int:
        return sum(1 for _ in self.ancestors(rank))

    def descendants(self, rank: int) -> list[int]:
        """Every rank below `rank`, in pre-order."""
        found: list[int] = []
        stack = list(reversed(self.children(rank)))
        while stack:
            current = stack.pop()
            found.append(current)
            stack.extend(reversed(self._children[current]))
        return found

    def postorder(self) -> tuple[int, ...]:
        """Every rank, each after all of its descendants (children in order, the root last).

        A roll-up from the leaves must walk this, not descending rank numbers: a `parents:`
        tree (a config file) may give a rank a parent with a higher number than its own."""
        return self._postorder

    def bottom_up(self) -> Iterable[int]:
        """Every rank, each after all of its descendants: for `kary:K` and `binomial`, where a
        parent's number is below its children's, simply from the highest rank down (no walk of
        the tree, which at 2^18 ranks costs a second); else `postorder`."""
        if self.spec.startswith("parents:"):
            return self.postorder()
        return range(self.size - 1, -1, -1)

    def parents(self) -> list[int | None]:
        """Every rank's parent (None for rank 0), by arithmetic where the shape allows."""
        k = self._fanout
        if k is not None and k >= 2:  # the usual shape, at every start: no call per rank
            return [None, *((rank - 1) // k for rank in range(1, self.size))]
        return [None, *(self._parent_of(rank) for rank in range(1, self.size))]

    def _walk_postorder(self) -> tuple[int, ...]:
        # A pre-order that takes the children right to left, reversed, is the post-order that
        # takes them left to right; iterative, so a long chain does not hit the recursion limit.
        found: list[int] = []
        stack = [0]
        while stack:
            current = stack.pop()
            found.append(current)
            stack.extend(self._children[current])
        return tuple(reversed(found))

    def is_ancestor(self, ancestor: int, rank: int) -> bool:
        """Whether `ancestor` is above `rank`: a loop, not `ancestors`, since rank 0 asks it of
        every event it applies, most often of the rank's parent, found at the first step."""
        self._check(rank)
        k = self._k
        if k:
            while rank != 0:
                rank = (rank - 1) // k
                if rank == ancestor:
                    return True
            return False
        while rank != 0:
            rank = self._parent_of(rank)
            if rank == ancestor:
                return True
        return False

    def next_hop(self, rank: int, target: int) -> int:
        """The neighbour of `rank` that a message for `target` goes to: a child or the parent.
        Rank 0 asks it once per target of an exec: the usual shape is walked inline."""
        self._check(target)
        if target == rank:
            return rank
        k = self._k
        if k and 0 <= rank < self.size:
            previous = target
            while previous != 0:
                above = (previous - 1) // k
                if above == rank:
                    return previous
                previous = above
            return (rank - 1) // k  # not above `target` (so not rank 0): up
        previous = target
        for ancestor in self.ancestors(target):
            if ancestor == rank:
                return previous
            previous = ancestor
        parent = self.parent(rank)
        assert parent is not None  # rank 0 is an ancestor of every other rank
        return parent

    def split_below(self, rank: int, targets: list[int]) -> dict[int, list[int]]:
        """`targets` (ranks of the instance, none of them `rank`) grouped by `next_hop` from
        `rank`, in their order within each group. Rank 0 splits every exec request this way,
        a thousand targets at a time: the usual shape in one inline loop, not a call per rank."""
        k = self._k
        if not (k and 0 <= rank < self.size):
            return grouped(targets, lambda target: self.next_hop(rank, target))
        groups: dict[int, list[int]] = {}
        size = self.size
        for target in targets:
            if not 0 < target < size:
                self._check(target)  # raises, as next_hop would
            previous = target
            above = (previous - 1) // k
            while above > rank:  # a parent's number is below its children's
                previous = above
                above = (previous - 1) // k
            hop = previous if above == rank else (rank - 1) // k  # not below `rank`: up
            if target == rank:
                hop = rank
            groups.setdefault(hop, []).append(target)
        return groups

    def max_level(self) -> int:
        return max(self.level(rank) for rank in range(self.size))


def _check_parents(spec: str, size: int) -> None:
    """An explicit parent list must name one parent per rank 1..size-1, each chain reaching 0."""
    text = spec[len("parents:") :]
    parents = [0, *map(int, text.split(","))] if text else [0]
    if len(parents) != size:
        raise UsageError(f"invalid topology {spec!r}: {len(parents) - 1} parents for size {size}")
    for rank in range(1, size):
        seen, current = set(), rank
        while current != 0:
            if current in seen or not 0 <= parents[current] < size or parents[current] == current:
                raise UsageError(f"invalid topology {spec!r}: rank {rank} never reaches rank 0")
            seen.add(current)
            current = parents[current]


def explicit_parents(parents: list[int]) -> str:
    """The spec of a tree given as the parent of each rank from 1 on."""
    return "parents:" + ",".join(map(str, parents))


def grouped(targets: list[int], hop: Callable[[int], int]) -> dict[int, list[int]]:
    """`targets` grouped by `hop` (the broker each is reached through), one call per target,
    in their order within each group: how a request for many ranks is split among children."""
    groups: dict[int, list[int]] = {}
    for target in targets:
        groups.setdefault(hop(target), []).append(target)
    return groups
