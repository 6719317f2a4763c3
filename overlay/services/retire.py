"""The broker's side of `tbon retire`, at each of the three brokers involved. A mixin of Broker.

1. Rank 0 records the rank `retiring` in its table (refusing unsafe retires there), then
2. orders the rank's parent to record it too, and only then does the parent tell the broker;
3. the broker stops taking work, lets its jobs finish (or kills them: --force, drain timeout),
   says goodbye and exits 0. Its parent ends the incarnation as retired: the key is revoked and
   anything that incarnation says later is answered "retired". Rank 0 sees the rank vacant and
   answers the waiting `tbon retire`, which has been shown each step on the way.
"""

from __future__ import annotations

import errno
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tbon.overlay.links.children import Children
from tbon.overlay.links.parent import ParentLink
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.jobs import ExecService
from tbon.overlay.state.instance import Instance
from tbon.overlay.state.ranktable import RankState, Retire
from tbon.overlay.state.retirement import Retirement, Step
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

log = logging.getLogger("tbon.broker")


@dataclass
class RetireWaiter:
    """A `retire.rank` request at rank 0, answered when that incarnation has ended."""

    request: Message
    rank: int
    incarnation: int
    started: float
    already: bool


class RetireServices:
    """retire.rank and retire.progress (rank 0), retire.order (a parent), and draining."""

    rank: int
    incarnation: int
    topology: Topology
    children: Children | None
    parent: ParentLink | None
    instance: Instance | None
    execd: ExecService
    exit_code: int | None
    _due: float
    _respond: Callable[[Message], bool]
    _route: Callable[[Message, str, float], None]
    _call: Callable[[Message, Callable[[Message], None]], None]
    _unless_from_rank0: Callable[[Message], Message | None]

    retirement: Retirement | None
    _retire_waiters: list[RetireWaiter]
    _retire_generation: int

    # --- rank 0 -----------------------------------------------------------------------------

    def _retire_rank(self, request: Message, now: float) -> Message | None:
        """Record a rank retiring and set its retirement going; answered when it has left."""
        assert self.instance is not None
        payload = request.payload
        rank, force, timeout = payload.get("rank"), payload.get("force"), payload.get("timeout")
        if not is_int(rank) or not isinstance(force, bool):
            return request.fail(errno.EINVAL, "retire.rank needs rank and force")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
            return request.fail(errno.EINVAL, "retire.rank: timeout must be seconds, or null")
        assert isinstance(rank, int)
        table = self.instance.table
        if not 0 <= rank < table.size:
            return request.fail(
                errno.ENOENT, f"no rank {rank} in this instance of size {table.size}"
            )
        incarnation = payload.get("incarnation", table.entry(rank).incarnation)
        if not is_int(incarnation):
            return request.fail(errno.EINVAL, "retire.rank: incarnation must be a whole number")
        was = table.entry(rank).state
        outcome = self.instance.apply(Retire(rank, incarnation), now)
        if not outcome.applied:
            return request.fail(errno.EPERM, outcome.reason)
        entry = table.entry(rank)
        if entry.state is RankState.VACANT:  # retired already
            return request.respond({"rank": rank, "event": "retired", "already": True})
        already = was is RankState.RETIRING
        self._retire_waiters.append(RetireWaiter(request, rank, incarnation, now, already))
        self._respond(
            request.respond(
                {
                    "rank": rank,
                    "event": "retiring",
                    "already": already,
                    "host": entry.host,
                    "pid": entry.pid,
                },
                streaming=True,
            )
        )
        if not already:
            log.info("rank %d incarnation %d: retiring", rank, incarnation)
            order = {"force": force, "timeout": timeout}
            self._order_retirement(rank, incarnation, order)
        return None

    def _order_retirement(self, rank: int, incarnation: int, order: dict[str, Any]) -> None:
        parent = self.topology.parent(rank)
        assert parent is not None  # rank 0 never retires

        def ordered(reply: Message) -> None:
            if reply.errnum:
                log.warning("rank %d: the order to retire did not arrive: %s", rank, reply.errstr)
                self._retire_news(
                    rank, incarnation, {"event": "unreachable", "reason": reply.errstr}
                )

        notice = {"rank": rank, "incarnation": incarnation, **order}
        self._call(Message(Kind.REQUEST, "retire.order", notice, nodeid=parent), ordered)

    def _retire_progress(self, request: Message) -> None:
        """News from a retiring broker (its running work, what it killed), for its waiters."""
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        if is_int(rank) and is_int(incarnation):
            assert isinstance(rank, int) and isinstance(incarnation, int)
            news = {k: v for k, v in payload.items() if k in ("event", "running", "killed", "why")}
            self._retire_news(rank, incarnation, news)

    def _retire_news(self, rank: int, incarnation: int, news: dict[str, Any]) -> None:
        for waiter in self._retire_waiters:
            if (waiter.rank, waiter.incarnation) == (rank, incarnation):
                self._respond(waiter.request.respond({"rank": rank, **news}, streaming=True))

    def _settle_retirements(self, now: float) -> None:
        """Answer every waiter whose incarnation has ended (checked when the table changed)."""
        assert self.instance is not None
        table = self.instance.table
        if not self._retire_waiters or table.generation == self._retire_generation:
            return
        self._retire_generation = table.generation
        waiting = []
        for waiter in self._retire_waiters:
            entry = table.entry(waiter.rank)
            if entry.incarnation == waiter.incarnation and entry.state is RankState.RETIRING:
                waiting.append(waiter)
                continue
            answer: dict[str, Any] = {
                "rank": waiter.rank,
                "event": "retired",
                "already": waiter.already,
                "seconds": round(now - waiter.started, 6),
            }
            if entry.incarnation == waiter.incarnation and entry.state is RankState.LOST:
                answer["lost"] = True  # it never said goodbye; should it wake, it is told "retired"
            self._respond(waiter.request.respond(answer))
        self._retire_waiters = waiting

    def _end_retirements(self) -> None:
        for waiter in self._retire_waiters:
            self._respond(waiter.request.fail(errno.ESHUTDOWN, "the instance shut down"))
        self._retire_waiters = []

    # --- the parent -------------------------------------------------------------------------

    def _retire_order(self, request: Message) -> Message | None:
        """Rank 0's order to retire one of this broker's children: record, then tell it."""
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        if (refused := self._unless_from_rank0(request)) is not None:
            return refused
        if self.children is None or not (is_int(rank) and is_int(incarnation)):
            return request.fail(errno.EINVAL, "retire.order needs a child's rank and incarnation")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        order = {"force": bool(payload.get("force")), "timeout": payload.get("timeout")}
        why = self.children.retire(rank, incarnation, order)
        return request.fail(errno.EHOSTUNREACH, why) if why else request.respond({})

    # --- the retiring broker ----------------------------------------------------------------

    def _begin_retirement(self, order: dict[str, Any], now: float) -> None:
        if self.retirement is not None:
            return
        timeout = order.get("timeout")
        limit = float(timeout) if isinstance(timeout, int | float) else float("inf")
        self.retirement = Retirement(now + limit, bool(order.get("force")))
        running = len(self.execd.jobs)
        log.info("retiring: taking no new work; %d job(s) running", running)
        if running:
            self._tell_rank0({"event": "draining", "running": running})
        self._due = 0.0

    def _drain(self, now: float) -> None:
        """After every batch of input while retiring: wait, kill, or leave."""
        retirement = self.retirement
        if retirement is None or self.exit_code is not None:
            return
        running = len(self.execd.jobs)
        step = retirement.step(now, running)

        if step is Step.KILL:
            why = retirement.why_killed
            log.warning("retiring: killing %d running job(s) (%s)", running, why)
            retirement.killing(now, running)
            self.execd.kill_all(signal.SIGKILL, note=f"killed: rank {self.rank} retired ({why})")
            self._tell_rank0({"event": "killed", "killed": running, "why": why})
            self._due = 0.0
        elif step is Step.LEAVE:
            log.info("retired: leaving")
            assert self.parent is not None
            self.parent.goodbye()
            self.exit_code = 0

    def _tell_rank0(self, news: dict[str, Any]) -> None:
        payload = {"rank": self.rank, "incarnation": self.incarnation, **news}
        progress = Message(Kind.REQUEST, "retire.progress", payload, nodeid=0)
        self._route(progress, "s", time.monotonic())  # one-way: no tag, no answer awaited
