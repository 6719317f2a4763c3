"""Durations as users write them: `250ms`, `2s`, `5m`, `1h`, `1.5` (seconds)."""

from __future__ import annotations

import re

from tbon.overlay.errors import UsageError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|)\s*$")


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in `text`; a clear UsageError for anything else (negative, no number, bad unit)."""
    match = _PATTERN.match(text)
    if not match:
        raise UsageError(f"invalid {what} {text!r}: use a number with a unit: 250ms, 2s, 5m, 1h")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """A short human form, the inverse of parse_duration up to rounding."""
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    if seconds < 3600:
        return f"{seconds / 60:.3g}m"
    if seconds < 86400:
        return f"{seconds / 3600:.3g}h"
    return f"{seconds / 86400:.3g}d"
