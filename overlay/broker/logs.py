"""A broker's log lines on stderr: `tbon-broker[RANK]: LEVEL: message`."""

from __future__ import annotations

import logging


class _RankFormatter(logging.Formatter):
    rank: int | None = None

    def format(self, record: logging.LogRecord) -> str:
        where = "tbon-broker" if self.rank is None else f"tbon-broker[{self.rank}]"
        return f"{where}: {record.levelname.lower()}: {record.getMessage()}"


_formatter = _RankFormatter()


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_formatter)
    root = logging.getLogger("tbon")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def set_log_rank(rank: int) -> None:
    """Once bootstrap has told the rank, every line says it."""
    _formatter.rank = rank
