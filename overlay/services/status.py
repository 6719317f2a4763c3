"""status.get and status.watch, and the views computed at rank 0 (status.summary, status.errors,
status.tree), served by rank 0 from its rank table.

A table of more than WHOLE_TABLE_MAX ranks is never sent whole: status.get gives it in pages
(`start`: the entries from that rank on, as JSON text in the data frame, and `next`), and a
status.watch asks for a view (`view`: `summary` of a `rank`; `held`, the entries of the ranks
something happened to; `states`, each rank's state only; `online`, each online rank's pid and
incarnation only) or is refused EFBIG (docs/protocol.md §7). The held and online views go in
pages too, of at most PAGE_BYTES each: status.get asks for a held one (`start`), and a held or
online watcher is sent the pages of each update one after another, each once it acknowledged
the one before.

Every answer (the table, a page's header, each view) also says which rank is the root now and
which ranks stand by for it (`root`, `standbys`: state/standbys.py), from `roles`, which whoever
changes the root updates: a command shows the root the instance has now.

A watcher's first answer is the whole table; after that it gets the whole table again whenever
what it shows changed, at most once per batch of input the broker reads (the loop asks for
`pushes` after each batch), so a burst of changes costs one message per watcher, not one per
change. What it shows is the table (its generation) and, beside it, the roles and the root
group (`stamp`): a standby's `acked` or `voter`, or grants paused, change no rank's entry but
are news all the same.

A watcher needs the newest table, not every table in between, so it has one table in flight at a
time: it acknowledges each one it reads (`status.ack`, which tbon's client sends as it reads),
and the next goes only then. Changes meanwhile are coalesced: a watcher that stops reading holds
one table, and gets the latest when it next reads.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from tbon.limits import WHOLE_TABLE_MAX
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state import statusviews
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.state.standbys import Roles
from tbon.overlay.wire.message import Message

VIEWS = ("table", "summary", "held", "states", "online")
"""What a status.watch may follow: the whole table (the default), a subtree's summary, the
entries of the ranks something happened to, every rank's state as an idset per state, or the
online ranks' pids and incarnations."""

PAGED = ("held", "online")
"""The views sent in pages (`start`, `next`): each update is its pages one after another."""


Stamp = tuple[int, object]
"""What a watcher was last sent: the table's generation, and the roles and root group (compared
as values: made anew at each call, never changed after, and not encoded at every turn)."""


class Watcher:
    """A status.watch being served. A plain class, not a dataclass (tbon/record.py)."""

    __slots__ = ("cursor", "rank", "request", "sent", "unread", "view")

    def __init__(self, request: Message, sent: Stamp, view: str = "table", rank: int = 0) -> None:
        self.request = request  # the status.watch: its route and tag address every table sent
        self.sent = sent  # the stamp of the table last sent
        self.unread = True  # that table is in flight: the next waits for its acknowledgement
        self.view = view  # VIEWS
        self.rank = rank  # the subtree of a summary
        self.cursor: int | None = None  # PAGED: where the next page of the update being sent starts

    @property
    def route(self) -> list[str]:
        return self.request.route


class StatusService:
    def __init__(self, table: RankTable, lifecycle: Lifecycle, roles: Roles | None = None) -> None:
        self.table = table
        self.lifecycle = lifecycle
        self.roles = roles or Roles()
        # the root group, when it has standbys (services/group.py): shown as `group`
        self.group: Callable[[float], dict[str, Any] | None] = lambda now: None
        self.watchers: list[Watcher] = []
        self._pushed: Stamp = (-1, None)
        # the views that read no clock (`states`, `online` pages by their start), as built at
        # the table's generation `_built_at`: the same again is free until an event changes the
        # table (a `tbon exec` asks for `states` twice: its watch, and its exec.start's targets)
        self._built: dict[tuple[str, int], dict[str, Any]] = {}
        self._built_at = -1

    def stamp(self, now: float) -> Stamp:
        """What watchers are shown now, beyond the entries: the table's generation, and the
        roles and the root group (`acked`, `voter`, `paused`...), which change no entry."""
        return self.table.generation, (self.roles.root, self.roles.standbys, self.group(now))

    def snapshot(self, now: float, watcher: Watcher | None = None) -> dict[str, Any]:
        """The object a watcher follows (the whole table by default)."""
        if watcher is not None and watcher.view == "summary":
            return self._said(now, statusviews.summary(self.table, now, watcher.rank))
        if watcher is not None and watcher.view == "held":
            return self._said(now, statusviews.held(self.table, now, watcher.cursor or 0))
        if watcher is not None and watcher.view == "states":
            return self._said(now, self.states())
        if watcher is not None and watcher.view == "online":
            start = watcher.cursor or 0
            view = self._once(("online", start), lambda: statusviews.online(self.table, start))
            return self._said(now, view)
        return self._said(now, snapshot(self.table, now))

    def states(self) -> dict[str, Any]:
        """The `states` view (statusviews.states), built once per generation of the table: what
        rank 0 chooses an exec.start's targets by, and what that exec's watch is sent."""
        return self._once(("states", 0), lambda: statusviews.states(self.table))

    def _once(self, key: tuple[str, int], build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A view that reads no clock, as built at this generation of the table (no event
        since: the same view), or built now. Never changed once built (`_said` copies it)."""
        if self._built_at != self.table.generation:
            self._built, self._built_at = {}, self.table.generation
        found = self._built.get(key)
        if found is None:
            found = self._built[key] = build()
        return found

    def _said(self, now: float, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer` with the roles, before its `ranks` (a page's header is written first)."""
        head = {k: v for k, v in answer.items() if k in ("size", "topo")}
        group = self.group(now)
        extra = {"group": group} if group is not None else {}
        return {**head, **self.roles.wire(), **extra, **answer}

    def _too_big(self, request: Message) -> Message | None:
        if self.table.size <= WHOLE_TABLE_MAX:
            return None
        why = (
            f"the table of {self.table.size} ranks is not sent whole (at most "
            f"{WHOLE_TABLE_MAX}): read it in pages, or ask for a view"
        )
        return request.fail(errno.EFBIG, why)

    def get(self, request: Message, now: float) -> list[Action]:
        """The whole table; with `start` a page of it: the entries from that rank on, as JSON
        text in the data frame, with `next`, the rank the next page starts at (null at the
        end); with `view` `held`, a page of the entries of the ranks something happened to,
        from `start` (default 0) on."""
        start = request.payload.get("start")
        if request.payload.get("view") == "held":
            start = 0 if start is None else start
            if type(start) is not int or not 0 <= start < self.table.size:
                why = f"status.get: start must be a rank from 0 to {self.table.size - 1}"
                return [Respond(request.fail(errno.EINVAL, why))]
            return [
                Respond(request.respond(self._said(now, statusviews.held(self.table, now, start))))
            ]
        if start is None:
            refusal = self._too_big(request)
            return [Respond(refusal or request.respond(self.snapshot(now)))]
        if type(start) is not int or not 0 <= start < self.table.size:
            why = f"status.get: start must be a rank from 0 to {self.table.size - 1}"
            return [Respond(request.fail(errno.EINVAL, why))]
        data, after = statusviews.page(self.table, now, start)
        reply = request.respond(
            self._said(
                now,
                {
                    "size": self.table.size,
                    "topo": self.table.topology.spec,
                    "start": start,
                    "next": after if after < self.table.size else None,
                },
            )
        )
        reply.data = data
        return [Respond(reply)]

    def _rank(self, request: Message) -> int | Message:
        """The `rank` of a view's request (default 0), or the refusal of a bad one."""
        rank = request.payload.get("rank", 0)
        if type(rank) is not int or not 0 <= rank < self.table.size:
            why = f"no such rank in this instance of size {self.table.size}"
            return request.fail(errno.ENOENT, why)
        return rank

    def summary(self, request: Message, now: float) -> list[Action]:
        rank = self._rank(request)
        if isinstance(rank, Message):
            return [Respond(rank)]
        return [
            Respond(request.respond(self._said(now, statusviews.summary(self.table, now, rank))))
        ]

    def errors(self, request: Message, now: float) -> list[Action]:
        rank = self._rank(request)
        if isinstance(rank, Message):
            return [Respond(rank)]
        each = request.payload.get("each", False) is True
        answer = statusviews.errors(self.table, now, rank, each)
        return [Respond(request.respond(self._said(now, answer)))]

    def tree(self, request: Message, now: float) -> list[Action]:
        rank = self._rank(request)
        if isinstance(rank, Message):
            return [Respond(rank)]
        depth = request.payload.get("depth")
        if depth is not None and (type(depth) is not int or depth < 0):
            why = "status.tree: depth must be a whole number or null"
            return [Respond(request.fail(errno.EINVAL, why))]
        merge = request.payload.get("merge", True) is not False
        apart = frozenset((self.roles.root, *self.roles.standbys))  # each on a line of its own
        answer = statusviews.tree(self.table, now, rank, depth, merge, apart)
        return [Respond(request.respond(self._said(now, answer)))]

    def watch(self, request: Message, now: float) -> list[Action]:
        """Register a status stream; its first response is the current table (or view)."""
        if self.lifecycle.stopping:
            return [Respond(request.fail(errno.ENODATA, "the instance is shutting down"))]
        view = request.payload.get("view", "table")
        if view not in VIEWS:
            why = f"status.watch: view must be one of {', '.join(VIEWS)}"
            return [Respond(request.fail(errno.EINVAL, why))]
        rank = self._rank(request)
        if isinstance(rank, Message):
            return [Respond(rank)]
        if view == "table" and (refusal := self._too_big(request)) is not None:
            return [Respond(refusal)]
        watcher = Watcher(request, self.stamp(now), view=view, rank=rank)
        first = self.snapshot(now, watcher)
        if view in PAGED:
            watcher.cursor = first["next"]
        self.watchers.append(watcher)
        return [Respond(request.respond(first, streaming=True))]

    def ack(self, request: Message, now: float) -> list[Action]:
        """status.ack: the watcher whose status.watch had tag `watch` (from the same client: the
        same route) read its table. If the table changed meanwhile, the latest goes now; the
        next page of a paged update goes whether it did or not.
        One-way: nothing is answered, and an ack that matches no watcher is dropped."""
        tag = request.payload.get("watch")
        for watcher in self.watchers:
            if watcher.request.tag == tag and watcher.route == request.route:
                watcher.unread = False
                if watcher.cursor is not None or watcher.sent != self.stamp(now):
                    return [Respond(self._update(watcher, now, {}))]
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
        if not self.watchers:
            return []
        stamp = self.stamp(now)
        if stamp == self._pushed:
            return []
        self._pushed = stamp
        due = [w for w in self.watchers if not w.unread and w.cursor is None and w.sent != stamp]
        if not due:
            return []
        made: dict[tuple[str, int], dict[str, Any]] = {}  # each view built once a push
        return [(watcher, self._update(watcher, now, made)) for watcher in due]

    def _update(
        self, watcher: Watcher, now: float, made: dict[tuple[str, int], dict[str, Any]]
    ) -> Message:
        """The watcher's next update: the newest view, or the next page of a paged update
        under way (made for it alone: the others read their pages at their own pace)."""
        if watcher.cursor is not None:
            status = self.snapshot(now, watcher)
        else:
            key = (watcher.view, watcher.rank if watcher.view == "summary" else 0)
            if key not in made:
                made[key] = self.snapshot(now, watcher)
            status = made[key]
            watcher.sent = self.stamp(now)
        if watcher.view in PAGED:
            watcher.cursor = status["next"]
        watcher.unread = True
        return watcher.request.respond(status, streaming=True)

    def end(self) -> list[Action]:
        """Final responses that close every stream, as the instance shuts down."""
        ended: list[Action] = [
            Respond(w.request.fail(errno.ENODATA, "the instance shut down")) for w in self.watchers
        ]
        self.watchers = []
        return ended
