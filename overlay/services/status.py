"""status.get and status.watch, served by rank 0 from its rank table.

A watcher's first answer is the whole table; after that it gets the whole table again whenever
the table changed, at most once per batch of input the broker reads (the loop asks for `pushes`
after each batch), so a burst of changes costs one message per watcher, not one per change.
"""

from __future__ import annotations

import errno
from typing import Any

from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.wire.message import Message


class StatusService:
    def __init__(self, table: RankTable, lifecycle: Lifecycle) -> None:
        self.table = table
        self.lifecycle = lifecycle
        self.watchers: list[Message] = []
        self._pushed_generation = -1

    def snapshot(self, now: float) -> dict[str, Any]:
        return snapshot(self.table, now)

    def get(self, request: Message, now: float) -> list[Action]:
        return [Respond(request.respond(self.snapshot(now)))]

    def watch(self, request: Message, now: float) -> list[Action]:
        """Register a status stream; its first response is the current table."""
        if self.lifecycle.stopping:
            return [Respond(request.fail(errno.ENODATA, "the instance is shutting down"))]
        self.watchers.append(request)
        return [Respond(request.respond(self.snapshot(now), streaming=True))]

    def forget(self, route: tuple[str, ...]) -> None:
        """Drop the streams of a client that has gone (its route back is `route`)."""
        self.watchers = [w for w in self.watchers if tuple(w.route) != route]

    def forget_watcher(self, watcher: Message) -> None:
        self.watchers = [w for w in self.watchers if w is not watcher]

    def pushes(self, now: float) -> list[tuple[Message, Message]]:
        """(watcher, update) pairs if the table changed since the last push."""
        changed = self.table.generation != self._pushed_generation
        self._pushed_generation = self.table.generation
        if not changed or not self.watchers:
            return []
        status = self.snapshot(now)
        return [(w, w.respond(status, streaming=True)) for w in self.watchers]

    def end(self) -> list[Action]:
        """Final responses that close every stream, as the instance shuts down."""
        ended = [Respond(w.fail(errno.ENODATA, "the instance shut down")) for w in self.watchers]
        self.watchers = []
        return ended
