"""status.get and status.watch, served by rank 0 from its rank table.

A watcher's first answer is the whole table; after that it gets the whole table again whenever
the table changed, at most once per batch of input the broker reads (the loop asks for `pushes`
after each batch), so a burst of changes costs one message per watcher, not one per change.

A watcher needs the newest table, not every table in between, so it has one table in flight at a
time: it acknowledges each one it reads (`status.ack`, which tbon's client sends as it reads),
and the next goes only then. Changes meanwhile are coalesced: a watcher that stops reading holds
one table, and gets the latest when it next reads.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.wire.message import Message


@dataclass(slots=True)
class Watcher:
    request: Message  # the status.watch: its route and tag address every table sent
    sent: int  # the generation of the table last sent
    unread: bool = True  # that table is in flight: the next waits for its acknowledgement

    @property
    def route(self) -> list[str]:
        return self.request.route


class StatusService:
    def __init__(self, table: RankTable, lifecycle: Lifecycle) -> None:
        self.table = table
        self.lifecycle = lifecycle
        self.watchers: list[Watcher] = []
        self._pushed_generation = -1

    def snapshot(self, now: float) -> dict[str, Any]:
        return snapshot(self.table, now)

    def get(self, request: Message, now: float) -> list[Action]:
        return [Respond(request.respond(self.snapshot(now)))]

    def watch(self, request: Message, now: float) -> list[Action]:
        """Register a status stream; its first response is the current table."""
        if self.lifecycle.stopping:
            return [Respond(request.fail(errno.ENODATA, "the instance is shutting down"))]
        watcher = Watcher(request, self.table.generation)
        self.watchers.append(watcher)
        return [Respond(request.respond(self.snapshot(now), streaming=True))]

    def ack(self, request: Message, now: float) -> list[Action]:
        """status.ack: the watcher whose status.watch had tag `watch` (from the same client: the
        same route) read its table. If the table changed meanwhile, the latest goes now.
        One-way: nothing is answered, and an ack that matches no watcher is dropped."""
        tag = request.payload.get("watch")
        for watcher in self.watchers:
            if watcher.request.tag == tag and watcher.route == request.route:
                watcher.unread = False
                if watcher.sent != self.table.generation:
                    return [Respond(self._send(watcher, self.snapshot(now)))]
                return []
        return []

    def forget(self, route: tuple[str, ...]) -> None:
        """Drop the streams of a client that has gone (its route back is `route`)."""
        self.watchers = [w for w in self.watchers if tuple(w.route) != route]

    def forget_watcher(self, watcher: Watcher) -> None:
        self.watchers = [w for w in self.watchers if w is not watcher]

    def pushes(self, now: float) -> list[tuple[Watcher, Message]]:
        """(watcher, update) pairs if the table changed since the last push, for each watcher
        that has read its last table and has not seen this one; the others get it on their
        acknowledgement."""
        generation = self.table.generation
        if generation == self._pushed_generation or not self.watchers:
            return []
        self._pushed_generation = generation
        due = [w for w in self.watchers if not w.unread and w.sent != generation]
        if not due:
            return []
        status = self.snapshot(now)
        return [(watcher, self._send(watcher, status)) for watcher in due]

    def _send(self, watcher: Watcher, status: dict[str, Any]) -> Message:
        watcher.sent, watcher.unread = self.table.generation, True
        return watcher.request.respond(status, streaming=True)

    def end(self) -> list[Action]:
        """Final responses that close every stream, as the instance shuts down."""
        ended: list[Action] = [
            Respond(w.request.fail(errno.ENODATA, "the instance shut down")) for w in self.watchers
        ]
        self.watchers = []
        return ended
