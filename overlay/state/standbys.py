"""Which ranks stand by for the root, and who the root is now: what `tbon status` shows.

`-S tbon.standbys=K` asks for K warm standbys of rank 0's rank table (issue 23). They are the
ranks nearest the root: the first K after it in breadth-first order of the topology (children
in rank order), which for `kary:K` and a flat tree are simply ranks 1..K. A K larger than the
ranks there are (size - 1) is clamped, not refused: K is how many standbys an instance keeps at
most, and one setting then serves instances of every size (a singleton has none).

Pure: the topology in, ranks out.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tbon.overlay.state.topology import Topology
from tbon.record import Record

DEFAULT_STANDBYS = 0
"""tbon.standbys when it is not set. 0 keeps the behaviour of an instance without failover:
no rank keeps a copy of the table, and the root's death ends the instance. The replication
model (docs/protocol.md §13) proposes the default an instance should run with; change it here."""

MAX_STANDBYS = 4
"""The most standbys tbon.standbys may ask for: each is one more copy that rank 0 must reach
before it acknowledges a change of its table."""


def kept_standbys(
    topology: Topology, asked: int, launched: int | None = None
) -> tuple[tuple[int, ...], str | None]:
    """The standbys an instance keeps for tbon.standbys=`asked`, and a line to log if that is
    fewer than asked. First clamped to the ranks there are, and to those `launched` at the
    start (a spare has no broker: a member that is a spare would count against every majority
    from the start, and with it one more loss would pause every grant, the one that would fill
    it included); then the root group (root and standbys) must be odd, since a takeover needs a
    majority of it (docs/protocol.md §13.1): an even group buys nothing (with one standby, both
    members make the majority, so the standby could never take over, and its death would stop
    every grant). So 1 runs as 0 and 3 as 2."""
    ranks = standby_ranks(topology, asked)
    if launched is not None:
        ranks = tuple(rank for rank in ranks if rank < launched)
    kept = ranks[: len(ranks) - len(ranks) % 2]
    if len(kept) == len(ranks):
        return kept, None
    spares = launched is not None and launched < topology.size
    where = f"{launched} launched ranks" if spares else f"a size of {topology.size}"
    clamped = f" ({len(ranks)} in {where})" if len(ranks) < asked else ""
    return kept, (
        f"tbon.standbys={asked}{clamped} adds no failover (the root group must be odd): "
        f"running with {len(kept)}"
    )


def standby_ranks(topology: Topology, count: int) -> tuple[int, ...]:
    """The first `count` ranks after the root in breadth-first order (fewer if the instance
    has fewer). Visits at most `count` ranks' children lists, so it costs nothing at 2^18."""
    found: list[int] = []
    queue = deque([0])
    while queue and len(found) < count:
        for child in topology.children(queue.popleft()):
            if len(found) == count:
                break
            found.append(child)
            queue.append(child)
    return tuple(found)


class Roles(Record):
    """Who the root is now and which ranks stand by: added to every status answer, so that a
    command shows the root the instance has, not the one it started with."""

    __slots__ = __match_args__ = ("root", "standbys")

    def __init__(self, root: int = 0, standbys: tuple[int, ...] = ()) -> None:
        self.root, self.standbys = root, standbys

    def wire(self) -> dict[str, Any]:
        return {"root": self.root, "standbys": list(self.standbys)}
