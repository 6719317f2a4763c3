"""Rank tables built as the broker builds them, for the pure state-machine tests."""

from __future__ import annotations

from tbon.overlay.state.ranktable import Online, RankTable
from tbon.overlay.state.topology import Topology


def table(spec: str, size: int, launched: int, now: float = 100.0) -> RankTable:
    """A fresh table: ranks below `launched` offline (from bootstrap), the rest vacant spares."""
    return RankTable(Topology(spec, size), [f"node{rank}" for rank in range(launched)], now)


def started(spec: str, size: int, launched: int | None = None, now: float = 100.0) -> RankTable:
    """A table whose rank 0 has come online, as the broker does right after creating it."""
    result = table(spec, size, size if launched is None else launched, now)
    assert result.apply(Online(0, 1, "node0", 1000), now).applied
    return result


def bring_up(result: RankTable, ranks: list[int], now: float = 101.0) -> None:
    """Welcome each rank's current incarnation, in order (parents first)."""
    for rank in ranks:
        entry = result.entry(rank)
        outcome = result.apply(Online(rank, entry.incarnation, f"node{rank}", 1000 + rank), now)
        assert outcome.applied and outcome.changed == (rank,), outcome
