"""What several commands share: the URI argument, durations, and where progress goes."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from tbon.limits import check_duration
from tbon.overlay.parse.duration import parse_duration

URI_HELP = "The instance to talk to (local://PATH or ssh://...); default: $TBON_URI."


def duration(text: str | None, what: str) -> float | None:
    return None if text is None else check_duration(parse_duration(text, what), what)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=None, separators=(",", ":")))


def interactive() -> bool:
    """Progress and colour only for a person at a terminal, never in a pipe or a batch log."""
    return sys.stderr.isatty()
