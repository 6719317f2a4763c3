"""Rank sets as users write them: `3`, `0,3-7`, or in brackets as Flux prints them, `[0-2]`,
`[0,3-5]`; `all` is the caller's business."""

from __future__ import annotations

from tbon.errors import UsageError
from tbon.overlay.parse.numbers import is_decimal

MAX_RANK = 1 << 20  # far beyond any instance; keeps a typo from eating the memory


def parse_idset(text: str) -> list[int]:
    """Sorted, distinct ranks in `text` (e.g. "0,3-7,9" or "[0,3-7,9]"); a UsageError for
    anything else."""
    return [rank for first, last in idset_runs(text) for rank in range(first, last + 1)]


def idset_runs(text: str) -> list[tuple[int, int]]:
    """The ranges of `text` as (first, last), in order, overlapping ones merged, without
    listing their ranks: how a broker reads a client's idset (an exec.start's targets), whose
    ranges may repeat (`0-1048575`, a hundred thousand times in one message), in time that
    grows with the text, not with the ranks it spans. A UsageError as parse_idset's."""
    runs: list[tuple[int, int]] = []
    for part in _unbracketed(text).split(","):
        low, dash, high = part.strip().partition("-")
        if not is_decimal(low) or (dash and not is_decimal(high)):
            raise UsageError(
                f"invalid rank set {text!r}: use ranks and ranges like 0,3-7 or [0,3-7]"
            )
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise UsageError(f"invalid rank set {text!r}: range {part.strip()} runs backwards")
        if last >= MAX_RANK:
            raise UsageError(f"invalid rank set {text!r}: ranks go up to {MAX_RANK - 1}")
        runs.append((first, last))
    runs.sort()
    merged = [runs[0]]
    for first, last in runs[1:]:
        if first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def _unbracketed(text: str) -> str:
    """The list inside one pair of brackets around the whole set, or `text` if it has none."""
    inner = text.strip()
    opens, closes = inner.startswith("["), inner.endswith("]")
    if opens and closes:
        inner = inner[1:-1]
    elif opens or closes:
        missing = "']' after '['" if opens else "'[' before ']'"
        raise UsageError(f"invalid rank set {text!r}: {missing}")
    if "[" in inner or "]" in inner:
        raise UsageError(f"invalid rank set {text!r}: brackets go around the whole set, once")
    return inner if opens else text


def format_idset(ranks: list[int] | set[int]) -> str:
    """The shortest form of `ranks`: consecutive runs become ranges."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    start = previous = None
    for rank in [*ordered, None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    return ",".join(parts)
