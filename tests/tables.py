"""Rank tables built as the broker builds them, and tree shapes, for the state-machine tests."""

from __future__ import annotations

from hypothesis import strategies as st

from tbon.overlay.state.ranktable import UNKNOWN_HOST, Online, RankTable, Reservation, Reserve
from tbon.overlay.state.topology import Topology, explicit_parents

NAMED_SPECS = ["kary:0", "kary:1", "kary:2", "kary:3", "binomial"]


def table(
    spec: str,
    size: int,
    launched: int,
    now: float = 100.0,
    fixed: bool = False,
    unknown: bool = False,
) -> RankTable:
    """A fresh table: ranks below `launched` offline (from bootstrap), the rest vacant spares.
    `fixed`: booted from a config file, so the launched ranks belong to their hosts. `unknown`:
    as PMI boots rank 0, the other launched ranks' hosts unknown until they come online."""
    hosts = [f"node{rank}" for rank in range(launched)]
    if unknown:
        hosts[1:] = [UNKNOWN_HOST] * (launched - 1)
    return RankTable(Topology(spec, size), hosts, now, fixed=fixed)


def started(
    spec: str, size: int, launched: int | None = None, now: float = 100.0, fixed: bool = False
) -> RankTable:
    """A table whose rank 0 has come online, as the broker does right after creating it."""
    result = table(spec, size, size if launched is None else launched, now, fixed)
    assert result.apply(Online(0, 1, "node0", 1000), now).applied
    return result


def bring_up(result: RankTable, ranks: list[int], now: float = 101.0) -> None:
    """Welcome each rank's current incarnation, in order (parents first)."""
    for rank in ranks:
        entry = result.entry(rank)
        outcome = result.apply(Online(rank, entry.incarnation, f"node{rank}", 1000 + rank), now)
        assert outcome.applied and outcome.changed == (rank,), outcome


@st.composite
def shuffled_tree(draw: st.DrawFn, size: int) -> str:
    """A `parents:` spec for a random tree of `size` ranks numbered in any order, so that a
    parent may have a higher rank than its child, as a config file may draw it."""
    order = draw(st.permutations(range(1, size)))
    parents = [0] * size
    for index, rank in enumerate(order):
        parents[rank] = draw(st.sampled_from([0, *order[:index]]), label=f"parent of {rank}")
    return explicit_parents(parents[1:])


def specs(size: int) -> st.SearchStrategy[str]:
    """Any tree for `size` ranks: a named shape, or a shuffled one."""
    return st.sampled_from(NAMED_SPECS) | shuffled_tree(size)


def reserve(result: RankTable, request: Reserve, now: float) -> Reservation:
    """A FLUB reservation through the table's `apply`, as the FLUB service asks for one."""
    reservation = result.apply(request, now).reservation
    assert reservation is not None
    return reservation
