"""What a child says of its CURVE handshakes with one parent, as they fail and succeed. Pure.

A handshake that ends with the connection (ZeroMQ's "no detail" failure, with an errno such as
EPIPE or ECONNRESET) is retried by ZeroMQ itself, and most often succeeds: the parent closes a
handshake it has not finished within its `broker.handshake-timeout`, and a parent that answers
its ZAP requests late (rank 0 still booting while a thousand brokers start on a few cores) does
so to children it then welcomes on their next try. Such a failure is a step of the wire-up, not a
fault: it is logged at info level (kept by `tbon dmesg`), and only a run of them that goes on
is a warning: at the WARN_AFTER-th failure in a row, then at ten and a hundred times that. A
protocol error (a key or a peer that does not speak CURVE as this broker does) is a warning each
time. With a parent whose refusals are expected (`quiet`), every failure is a debug line.
"""

from __future__ import annotations

import logging

WARN_AFTER = 3
"""Failures in a row after which the retries are a warning: a wrong key or an unreachable parent
fails again within ZeroMQ's reconnect interval, a busy parent once per handshake timeout."""


class Handshakes:
    """The count of failed handshakes in a row with the parent at `endpoint`, and the line
    (level, text) each failure or the success after them calls for."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.failed = 0  # in a row, since the last success (or the link's start)

    def failure(self, why: str, protocol: bool, quiet: bool) -> tuple[int, str]:
        """A handshake failed (`why`: the errno's text or the protocol error): the line to log."""
        self.failed += 1
        where = f"CURVE handshake with the parent at {self.endpoint}"
        if quiet:
            return logging.DEBUG, f"{where} failed: {why}"
        if protocol:
            return logging.WARNING, f"{where} failed: {why}"
        if self.failed < WARN_AFTER:
            return logging.INFO, (
                f"{where} did not complete ({why}): retrying (a busy parent closes a "
                "handshake it has not finished within its broker.handshake-timeout)"
            )
        if self.failed % WARN_AFTER == 0 and _power_of_ten(self.failed // WARN_AFTER):
            return logging.WARNING, (
                f"{where} failed {self.failed} times in a row ({why}): still retrying"
            )
        return logging.INFO, f"{where} failed again ({why}): retrying"

    def success(self) -> tuple[int, str] | None:
        """A handshake succeeded: the line to log if it came after failures, else None."""
        failed, self.failed = self.failed, 0
        if not failed:
            return None
        tries = "try" if failed == 1 else "tries"
        return logging.INFO, (
            f"CURVE handshake with the parent at {self.endpoint} done after {failed} failed {tries}"
        )


def _power_of_ten(count: int) -> bool:
    """Whether `count` is 1, 10, 100, ..."""
    while count >= 10 and count % 10 == 0:
        count //= 10
    return count == 1
