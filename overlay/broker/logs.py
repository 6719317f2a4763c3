"""A broker's log: lines on stderr, `TIME tbon-broker[RANK]: LEVEL: message`, and a ring of
its recent records that `tbon dmesg` reads (services/dmesg.py).

The two have levels of their own. Stderr shows `log-stderr-level` and above (warning by default,
so that a terminal stays quiet); the ring keeps info and above whatever that is (debug too if
stderr shows it), so that what a broker did is there to read when something went wrong.
"""

from __future__ import annotations

import logging
import time

from tbon.overlay.services.dmesg import LogRing

RING_LEVEL = logging.INFO


def local_time(seconds: float) -> str:
    """`2026-11-23T22:31:05.123`: local time to the millisecond, as people read a log."""
    whole, millis = divmod(round(seconds * 1000), 1000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(whole))}.{millis:03d}"


class _RankFormatter(logging.Formatter):
    rank: int | None = None

    def format(self, record: logging.LogRecord) -> str:
        where = "tbon-broker" if self.rank is None else f"tbon-broker[{self.rank}]"
        level = record.levelname.lower()
        return f"{local_time(record.created)} {where}: {level}: {record.getMessage()}"


class RingHandler(logging.Handler):
    """Keeps each record in the ring: its time, level and message (the rank is the broker's)."""

    def __init__(self, ring: LogRing, level: int) -> None:
        super().__init__(level)
        self.ring = ring

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.ring.append(record.created, record.levelno, record.getMessage())
        except Exception:  # as logging's own handlers: a bad record never stops a broker
            self.handleError(record)


_formatter = _RankFormatter()
_ring = LogRing()


def setup_logging(level: str) -> None:
    """Stderr at `level`, the ring at info (or `level`, if lower), both fed by logger "tbon"."""
    stderr = logging.StreamHandler()
    stderr.setFormatter(_formatter)
    stderr.setLevel(level.upper())
    keep = min(RING_LEVEL, stderr.level)
    global _ring
    _ring = LogRing()  # a broker forked by tbon start keeps nothing of its launcher's
    root = logging.getLogger("tbon")
    root.handlers[:] = [stderr, RingHandler(_ring, keep)]
    root.setLevel(keep)
    root.propagate = False


def set_log_rank(rank: int) -> None:
    """Once bootstrap has told the rank, every line says it."""
    _formatter.rank = rank


def recent() -> LogRing:
    """This broker's ring of recent records."""
    return _ring
