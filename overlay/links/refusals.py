"""When a parent says that it refused a key at the CURVE handshake, and how loudly. Pure.

During a heal an orphan knocks at each of its ancestors every 50 ms (upward.py's
RETRY_AFTER_KEY) before rank 0's order to admit it reaches the one that takes it in, and the
others refuse it until it is welcomed there and stops knocking: those refusals are expected, and
a warning for each would cry wolf on every heal. So a key is said at debug level the first time
it is refused; only a key still refused past a grace (longer than a heal takes) is warned about,
then once per `quiet` seconds, however often it knocks. The memory is bounded: a flood of fresh
keys empties it, never grows it (a key forgotten so starts its grace again).
"""

from __future__ import annotations

import logging

REFUSAL_GRACE = 3.0
"""Seconds a key may be refused before it is warned about, at least: rank 0 admits an orphan
where it is fostered within a round trip of seeing the loss, which its parent sees within a
heartbeat of the orphan."""
REFUSAL_QUIET = 60.0
"""Seconds during which a key warned about is not said again."""
MAX_REFUSALS_SAID = 4096
"""Keys remembered."""


def refusal_grace(heartbeat: float) -> float:
    """The grace for a parent whose links beat every `heartbeat` seconds."""
    return max(REFUSAL_GRACE, 2 * heartbeat)


class Refusals:
    def __init__(
        self, grace: float, quiet: float = REFUSAL_QUIET, capacity: int = MAX_REFUSALS_SAID
    ) -> None:
        self.grace, self.quiet, self.capacity = grace, quiet, capacity
        self._said: dict[str, _Said] = {}

    def level(self, key: str, now: float) -> int | None:
        """How to log this refusal of `key` at `now`: a logging level, or None (not at all). A
        key that had not knocked for a grace starts afresh: a broker fostered again in a later
        heal knocks with the key it had."""
        said = self._said.get(key)
        if said is None or now - said.last > self.grace:
            if said is None and len(self._said) >= self.capacity:
                self._said.clear()
            self._said[key] = _Said(now, now)
            return logging.DEBUG
        said.last = now
        if now - said.first < self.grace or now < said.next:
            return None
        said.next = now + self.quiet
        return logging.WARNING


class _Said:
    __slots__ = ("first", "last", "next")

    def __init__(self, first: float, last: float) -> None:
        self.first = first  # when this run of refusals began
        self.last = last  # the latest refusal
        self.next = 0.0  # when it may be warned about again
