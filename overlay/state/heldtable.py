"""The status object rebuilt from rank 0's `held` view, for commands that look ranks up.

`tbon expand`, `retire`, `dmesg`, `exec` and a joining broker read the status table by rank
(`status["ranks"][rank]`). At 262,144 ranks rank 0 does not send the table whole: it sends the
entries of the ranks something happened to, and says which ranks are untouched spares
(statusviews.held), a page of at most 1 MiB at a time. `HeldPages` puts the pages of one view
together (a watch sends them one after another), and `whole` gives the object back with `ranks`
a sequence of every rank's entry, a spare's made up from the topology when it is read, so that
such a command reads a table of any size as it read a small one, and holds only the entries
that say something.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

from tbon.overlay.state.topology import Topology


class Ranks(Sequence[dict[str, Any]]):
    """Every rank's entry, in rank order; those of untouched spares made when read."""

    def __init__(self, view: dict[str, Any]) -> None:
        self.size = int(view["size"])
        self.topology = Topology(str(view["topo"]), self.size)
        self.held = {int(entry["rank"]): entry for entry in view["ranks"]}
        self.launched = int(view.get("launched", 0))
        self.since = view.get("spare_since", 0.0)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, rank: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, rank: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, rank: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(rank, slice):
            return [self[r] for r in range(self.size)[rank]]
        if not 0 <= rank < self.size:
            raise IndexError(f"rank {rank} is not in 0..{self.size - 1}")
        entry = self.held.get(rank)
        return entry if entry is not None else self.spare(rank)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for rank in range(self.size):
            yield self[rank]

    def spare(self, rank: int) -> dict[str, Any]:
        """An untouched spare's entry, as rank 0 would show it (snapshot.shown)."""
        return {
            "rank": rank,
            "state": "vacant",
            "host": f"extra{rank - self.launched}",
            "pid": None,
            "incarnation": 0,
            "parent": self.topology.parent(rank),
            "children": list(self.topology.children(rank)),
            "subtree": "offline",
            "torpid": False,
            "since": self.since,
        }


def said(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of a status object that are not untouched spares' (all, for a table sent
    whole): what a command that looks for brokers walks, without making up 2^18 spares."""
    ranks = status["ranks"]
    if isinstance(ranks, Ranks):
        return [ranks.held[rank] for rank in sorted(ranks.held)]
    return list(ranks)


def whole(view: dict[str, Any]) -> dict[str, Any]:
    """The status object of a `held` view, all its pages (or a whole table, returned as it is)."""
    if "launched" not in view:
        return view
    return {**view, "ranks": Ranks(view)}


class HeldPages:
    """A `held` view put together from its pages (`start`, `next`), in the order they come:
    a page from rank 0 begins a view, the one whose `next` is None ends it."""

    def __init__(self) -> None:
        self.ranks: list[dict[str, Any]] = []

    def take(self, page: dict[str, Any]) -> dict[str, Any] | None:
        """The status object (as `whole` makes it) once `page` ends a view; else None."""
        if not page.get("start"):
            self.ranks = []
        self.ranks += page["ranks"]
        if page.get("next") is not None:
            return None
        view, self.ranks = {**page, "ranks": self.ranks, "start": 0}, []
        return whole(view)
