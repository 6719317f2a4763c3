"""Which ranks a `tbon exec` runs on, from rank 0's `states` view: one rule for both places
that choose them. Rank 0 chooses them for an exec.start that names its targets as `all` or an
idset (docs/protocol.md §7: so the client need not first wait for a view of its own), and
`tbon exec` reads the same view to say which ranks it skipped, or could not run on, and why;
against a broker of an older tbon, the client chooses them itself, by the same rule."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from tbon.overlay.parse.idset import idset_runs, parse_idset
from tbon.overlay.state.statesview import RankStates

SKIPPED_STATES = ("lost", "offline")
"""What `-r all` leaves out and says so: ranks whose broker is down. (Vacant and reserved ranks
have none yet, and retiring ones are said apart: they still finish what they run.)"""

Picked = tuple[list[int], dict[int, str], dict[str, list[int]]]
"""The ranks to run on, in order; why each asked-for rank that cannot be, cannot; and, for
`all`, the ranks left out by state (lost, offline, retiring)."""


def pick_targets(states: RankStates, ranks: str, exclude: str | None) -> Picked:
    """`ranks` (`all`: every online rank; else an idset) but those of `exclude` (an idset), as
    rank 0's view `states` shows them. A bad idset is parse_idset's UsageError."""
    size = states.size
    excluded = set(parse_idset(exclude)) if exclude else set()
    problems: dict[int, str] = {}
    if ranks == "all":
        chosen = states.ranks("online")
        skipped: dict[str, list[int]] = {}
        for state in (*SKIPPED_STATES, "retiring"):
            if left := [r for r in states.ranks(state) if r not in excluded]:
                skipped[state] = left
        return [r for r in chosen if r not in excluded], problems, skipped
    chosen = []
    for rank in parse_idset(ranks):
        if rank in excluded:
            continue
        if rank >= size:
            problems[rank] = f"no such rank in this instance of size {size}"
        elif (state := states.state(rank)) != "online":
            problems[rank] = f"rank {rank} is {state}"
        else:
            chosen.append(rank)
    return chosen, problems, {}


def chosen_targets(states: RankStates, ranks: str, exclude: str | None) -> list[int]:
    """The ranks `pick_targets` runs on, without saying why the others are left out: rank 0's
    part (the client says that, from the same view). An idset's ranks beyond the instance are
    passed over, not each named. A client wrote `ranks` and `exclude`: their ranges are never
    listed (idset_runs), so rank 0's work grows with the online ranks and the text's length."""
    online = states.ranks("online")
    if exclude:
        left_out = _within(idset_runs(exclude))
        online = [r for r in online if not left_out(r)]
    if ranks == "all":
        return online
    asked = _within(idset_runs(ranks))
    return [r for r in online if asked(r)]


def _within(runs: list[tuple[int, int]]) -> Callable[[int], bool]:
    """Whether a rank lies in one of `runs` (in order, apart), by bisection."""
    firsts = [first for first, _ in runs]

    def within(rank: int) -> bool:
        at = bisect_right(firsts, rank) - 1
        return at >= 0 and rank <= runs[at][1]

    return within
