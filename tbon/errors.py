"""Errors a user may see, each carrying the exit code that reports it."""

from __future__ import annotations

import os


def debugging() -> bool:
    """TBON_DEBUG=1 (any value but empty or 0) shows tracebacks instead of one-line errors."""
    return os.environ.get("TBON_DEBUG", "") not in ("", "0")


class TbonError(Exception):
    """A failure to report on one line, with the process exit code that goes with it."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(TbonError):
    """Bad flags or attribute values: exit 2, as for any command-line usage error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=2)
