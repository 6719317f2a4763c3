"""Every rank's state as rank 0's `states` view says it, for `tbon exec`.

exec reads nothing of the table but each rank's state (its targets; the ranks it skips; the
ranks lost while its jobs run) and whether any rank is reattaching. Rank 0 sends that as one
idset per state (statusviews.states), a few bytes however many ranks, instead of every held
rank's entry. `RankStates` reads it as runs of ranks, expanding only the states asked for; it
is also made from a status object (`from_status`), as a broker of an older tbon answers only
the `held` view.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Any

from tbon.overlay.state.heldtable import said

Runs = tuple[tuple[int, ...], tuple[int, ...]]
"""Ranks as runs: the first rank of each, and the last, in order."""


class RankStates:
    """Each rank's state, by the idsets of a `states` view (every rank in one of them)."""

    __slots__ = ("_runs", "_text", "reattaching", "size")

    def __init__(self, view: Mapping[str, Any]) -> None:
        self.size = int(view["size"])
        self._text: dict[str, str] = {str(k): str(v) for k, v in view["states"].items()}
        self._runs: dict[str, Runs] = {}  # parsed when first asked
        self.reattaching = bool(view.get("reattaching"))  # some rank is reattaching

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> RankStates:
        """From a status object (a whole table, or a `held` view: its spares are vacant)."""
        ranks: dict[str, list[int]] = {}
        adrift = False
        for entry in said(dict(status)):
            ranks.setdefault(str(entry["state"]), []).append(int(entry["rank"]))
            adrift = adrift or bool(entry.get("reattaching"))
        named = {state: ",".join(map(str, found)) for state, found in ranks.items()}
        size = int(status["size"])
        listed = sorted(r for found in ranks.values() for r in found)
        if len(listed) < size:  # the spares of a held view
            spares = sorted(set(range(size)).difference(listed))
            named["vacant"] = ",".join(map(str, [*ranks.get("vacant", []), *spares]))
        return cls({"size": size, "states": named, "reattaching": "x" if adrift else ""})

    def ranks(self, state: str) -> list[int]:
        """The ranks in `state`, in order."""
        firsts, lasts = self._runs_of(state)
        return [r for a, b in zip(firsts, lasts, strict=True) for r in range(a, b + 1)]

    def state(self, rank: int) -> str:
        """`rank`'s state (a rank of the instance: 0 <= rank < size)."""
        for state in self._text:
            firsts, lasts = self._runs_of(state)
            at = bisect_right(firsts, rank) - 1
            if at >= 0 and rank <= lasts[at]:
                return state
        return "vacant"  # named by none: a spare, as rank 0 shows one

    def _runs_of(self, state: str) -> Runs:
        runs = self._runs.get(state)
        if runs is None:
            runs = self._runs[state] = _parse(self._text.get(state, ""))
        return runs


def _parse(text: str) -> Runs:
    """The runs of an idset as rank 0 writes it ("0-3,7"), sorted by their first rank."""
    pairs = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        pairs.append((int(first), int(last or first)))
    pairs.sort()
    return tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
