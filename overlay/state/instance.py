"""What only rank 0 does: keep the rank table, answer status, and push changes to watchers."""

from __future__ import annotations

import errno
import logging
from typing import Any

from tbon.overlay.state.ranktable import Event, Outcome, RankTable
from tbon.overlay.wire.message import Message

log = logging.getLogger("tbon.instance")


class Instance:
    def __init__(self, table: RankTable) -> None:
        self.table = table
        self._watchers: list[Message] = []
        self._pushed_generation = -1

    def apply(self, event: Event, now: float) -> Outcome:
        outcome = self.table.apply(event, now)
        if not outcome.applied:
            log.info("ignored %s: %s", event, outcome.reason)
        return outcome

    def status(self, now: float) -> dict[str, Any]:
        return self.table.snapshot(now)

    def watch(self, request: Message, now: float) -> Message:
        """Register a status stream; its first response is the current table."""
        self._watchers.append(request)
        return request.respond(self.status(now), streaming=True)

    def forget(self, route: list[str]) -> None:
        """Drop the streams of a client that has gone (its route back is `route`)."""
        self._watchers = [w for w in self._watchers if w.route != route]

    def forget_watcher(self, watcher: Message) -> None:
        self._watchers = [w for w in self._watchers if w is not watcher]

    def pushes(self, now: float) -> list[tuple[Message, Message]]:
        """(watcher, update) pairs if the table changed since the last push: one per batch."""
        if self.table.generation == self._pushed_generation or not self._watchers:
            self._pushed_generation = self.table.generation
            return []
        self._pushed_generation = self.table.generation
        status = self.status(now)
        return [(w, w.respond(status, streaming=True)) for w in self._watchers]

    def end_watches(self) -> list[tuple[Message, Message]]:
        """Final responses that close every stream, sent as the instance shuts down."""
        ended = [(w, w.fail(errno.ENODATA, "the instance shut down")) for w in self._watchers]
        self._watchers = []
        return ended
