"""Which parents rank 0 told to admit which incarnation, so that a revocation reaches them all.

A parent admits a child's key at rank 0's word only (docs/protocol.md §12.3): its topology
parent through bootstrap, `flub.authorize` or `heal.adopt`, a foster parent through
`heal.foster`, and whichever broker welcomed it (an Online names it). Any of them may still hold
the key, and welcome the broker again, after the incarnation ended in rank 0's table: a lost
incarnation's own broker is let back (a healed partition). So when rank 0 ends an incarnation for
good (a new one replaces it, or it is voided), the revocation goes to every parent ever told to
expect it, not only to the one it is attached to now (issue 20: a foster parent never told of
the new incarnation welcomed the old broker back as a second holder of its rank).

Pure and bounded: a parent is always an ancestor of the rank (healing.py, rule 1), so each
incarnation names at most the tree's depth of parents; an incarnation is forgotten when it is
revoked, and an older one of the same rank when a newer one is recorded (its revocation has gone
out by then).

A foster admission is also *withdrawn* once it is moot (docs/protocol.md §12.1; the rule is
healing.py's `admission_fate`): the rank it names is attached to another broker that reaches
rank 0, or its incarnation ended. Left open it
would let a later seek be welcomed by two parents (issue 20, item 2), and its parent would wait
at a shutdown for a child that never comes (item 6).
"""

from __future__ import annotations

from tbon.overlay.state.healing import may_admit
from tbon.overlay.state.topology import Topology


class Admissions:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._told: dict[int, tuple[int, set[int]]] = {}  # rank -> (incarnation, parents)
        # foster admissions still open: (rank, foster parent) -> incarnation
        self._open: dict[tuple[int, int], int] = {}

    def fostered(self, rank: int, incarnation: int, parent: int) -> None:
        """`parent` was told to foster (rank, incarnation) for a while (heal.foster)."""
        self.told(rank, incarnation, parent)
        if may_admit(self.topology, parent, rank):
            self._open[(rank, parent)] = incarnation

    def open(self) -> list[tuple[int, int, int]]:
        """The foster admissions not yet used or withdrawn: (rank, incarnation, parent)."""
        return [(rank, inc, parent) for (rank, parent), inc in self._open.items()]

    def any_open(self) -> bool:
        return bool(self._open)

    def close(self, rank: int, parent: int) -> None:
        """That admission was used, withdrawn, or is moot."""
        self._open.pop((rank, parent), None)

    def told(self, rank: int, incarnation: int, parent: int) -> None:
        """`parent` was told to admit (rank, incarnation), or welcomed it. An ancestor only.
        The topology parent is one always (`parents`): only an older incarnation is forgotten,
        which keeps the Online of every rank wiring up under its own parent cheap."""
        if 0 < rank < self.topology.size and parent == self.topology.parent(rank):
            self.told_at_home(rank, incarnation)
            return
        known = self._told.get(rank)
        if not may_admit(self.topology, parent, rank):
            return
        if known is None or known[0] < incarnation:
            self._told[rank] = (incarnation, {parent})
        elif known[0] == incarnation:
            known[1].add(parent)

    def told_at_home(self, rank: int, incarnation: int) -> None:
        """`told` by the topology parent of `rank` (0 < rank < size), known by the caller: only
        an older incarnation's record goes. Rank 0's pass over a wire-up's Onlines, each welcomed
        at home, says so for every rank without asking the topology again (rankpath.py)."""
        known = self._told.get(rank)
        if known is not None and known[0] < incarnation:
            del self._told[rank]

    def parents(self, rank: int, incarnation: int) -> set[int]:
        """Every parent that may still admit (rank, incarnation): its topology parent always."""
        found = set()
        home = self.topology.parent(rank)
        if home is not None:
            found.add(home)
        known = self._told.get(rank)
        if known is not None and known[0] == incarnation:
            found |= known[1]
        return found

    def withdraw(self, rank: int, incarnation: int) -> set[int]:
        """The parents to revoke (rank, incarnation) at, which is forgotten here."""
        found = self.parents(rank, incarnation)
        known = self._told.get(rank)
        if known is not None and known[0] == incarnation:
            del self._told[rank]
        return found
