"""When rank 0 asks PMI where the brokers that never came online were started.

Rank 0 learns a host from its rank's Online (pmi.py reads no cards for it at the start), so a
rank whose broker never comes online would show its host as unknown. Rank 0 keeps its PMI
session open until every launched rank is online, and then finalizes with nothing to read; if
the wire-up instead goes quiet (its table unchanged for QUIET seconds) with some still offline,
it reads the cards of those ranks only, then finalizes. A read blocks the loop for a round trip
per rank, which is why it waits for a quiet spell rather than compete with the hellos.

A plain machine with a next deadline, as the broker's others: it is told the table's generation
after each turn, and says when the read falls due.
"""

from __future__ import annotations

QUIET = 5.0
"""Seconds without a change to rank 0's table before the missing hosts are read."""


class LateHosts:
    def __init__(self, now: float, quiet: float = QUIET) -> None:
        self.quiet = quiet
        self.due = now + quiet
        self._generation: int | None = None

    def saw(self, generation: int, now: float) -> None:
        """The table's generation after a turn of the loop: a change puts the read off."""
        if generation != self._generation:
            self._generation = generation
            self.due = now + self.quiet

    def next_deadline(self) -> float:
        return self.due

    def is_due(self, now: float) -> bool:
        return now >= self.due
