"""Durations as users write them: `250ms`, `2s`, `5m`, `1h`, `1.5` (seconds)."""

from __future__ import annotations

import re

from tbon.errors import UsageError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_PATTERN = r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|)\s*$"
"""Compiled (and cached by `re`) when first matched: every command imports this module, and
most are given no duration."""


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in `text`; a clear UsageError for anything else (negative, no number, bad unit)."""
    match = re.match(_PATTERN, text)
    if not match:
        raise UsageError(f"invalid {what} {text!r}: use a number with a unit: 250ms, 2s, 5m, 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """A short human form, the inverse of parse_duration up to rounding."""
    # Each unit covers what rounds to under 1000 of it at 3 significant digits, so that the
    # result never turns exponential (0.9996s is "1s", not "1e+03ms").
    for unit, size, limit in (
        ("ms", 0.001, 999.5),
        ("s", 1, 59.95),
        ("m", 60, 59.95),
        ("h", 3600, 23.95),
    ):
        if seconds / size < limit:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds / 86400:.3g}d"
