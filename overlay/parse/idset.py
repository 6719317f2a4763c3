"""Rank sets as users write them: `3`, `0,3-7`, or in brackets as Flux prints them, `[0-2]`,
`[0,3-5]`; `all` is the caller's business."""

from __future__ import annotations

from tbon.errors import UsageError
from tbon.overlay.parse.numbers import is_decimal

MAX_RANK = 1 << 20  # far beyond any instance; keeps a typo from eating the memory


def parse_idset(text: str) -> list[int]:
    """Sorted, distinct ranks in `text` (e.g. "0,3-7,9" or "[0,3-7,9]"); a UsageError for
    anything else."""
    ranks: set[int] = set()
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
        ranks.update(range(first, last + 1))
    return sorted(ranks)


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
