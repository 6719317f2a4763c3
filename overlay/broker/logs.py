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
_set_up: tuple[str, list[logging.Handler]] | None = None  # the level and handlers set up last


def setup_logging(level: str) -> None:
    """Stderr at `level`, the ring at info (or `level`, if lower), both fed by logger "tbon".
    Once for a level: `tbon start`'s launcher sets it up before it forks its brokers, all at the
    same level, so that each finds it done (0.5 ms and a hundred pages copied less each)."""
    global _ring, _set_up
    root = logging.getLogger("tbon")
    if _set_up is not None and _set_up[0] == level and root.handlers == _set_up[1]:
        return
    stderr = logging.StreamHandler()
    stderr.setFormatter(_formatter)
    stderr.setLevel(level.upper())
    keep = min(RING_LEVEL, stderr.level)
    _ring = LogRing()  # a broker forked by tbon start keeps nothing of its launcher's
    root.handlers[:] = [stderr, RingHandler(_ring, keep)]
    root.setLevel(keep)
    root.propagate = False
    _set_up = (level, root.handlers[:])


def forget_logging() -> None:
    """Undo setup_logging: the launcher's own lines, once its brokers are forked, are not a
    broker's."""
    global _set_up
    root = logging.getLogger("tbon")
    root.handlers[:] = []
    root.setLevel(logging.NOTSET)
    root.propagate = True
    _set_up = None


def set_log_rank(rank: int) -> None:
    """Once bootstrap has told the rank, every line says it."""
    _formatter.rank = rank


def recent() -> LogRing:
    """This broker's ring of recent records."""
    return _ring
