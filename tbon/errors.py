"""Errors a user may see, each carrying the exit code that reports it."""

from __future__ import annotations

import os

RANK_TROUBLE = 68  # a rank named does not exist, is not online, or was lost while in use


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


class Signalled(BaseException):
    """SIGTERM or SIGHUP (or a second SIGINT) ended the command: it exits 128+N at once, as a
    shell reports a command a signal killed. A BaseException, as KeyboardInterrupt is, so that
    no `except Exception` takes it for a failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RankError(TbonError):
    """A rank named that is not in the instance, or has no broker online: exit 68, whichever
    command (docs/design.md §10)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=RANK_TROUBLE)
