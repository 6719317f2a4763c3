"""What `tbon exec` says of the ranks whose command failed: one line per failure, ranks that
failed alike on one line (`ranks 1-3: exit 1`, `rank 5: killed by SIGKILL`), as `flux exec`
names them. Pure: statuses in, lines out."""

from __future__ import annotations

import signal
from collections.abc import Collection, Mapping

from tbon.overlay.parse.idset import format_idset


def failure(status: int, signum: int | None, note: str | None) -> str | None:
    """How a rank's command ended, in words, if that was a failure; None for exit 0. A note
    (why it could not start, or why its broker killed it) says it best."""
    if note:
        return note
    if signum is not None:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"killed by signal {signum}"
    return f"exit {status}" if status else None


def failure_lines(
    status: Mapping[int, int],
    signals: Mapping[int, int],
    notes: Mapping[int, str],
    passed: Collection[int] = (),
) -> list[str]:
    """One line for each way the commands failed, naming its ranks, ordered by their lowest
    rank. A rank killed by a signal that tbon exec passed on (`passed`: Ctrl-C, SIGTERM) is
    not named: it did what it was asked."""
    ranks: dict[str, list[int]] = {}
    for rank in sorted(status):
        signum = signals.get(rank)
        if signum is not None and signum in passed and rank not in notes:
            continue
        words = failure(status[rank], signum, notes.get(rank))
        if words is not None:
            ranks.setdefault(words, []).append(rank)
    return [f"{name_ranks(members)}: {words}" for words, members in ranks.items()]


def name_ranks(ranks: list[int]) -> str:
    """`rank 5`, or `ranks 1-3,7`."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {format_idset(ranks)}"
