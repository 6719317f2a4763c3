"""`tbon retire`, at each of the three brokers involved (docs/protocol.md §8).

1. Rank 0 records the rank `retiring` in its table (refusing unsafe retires there), then
2. orders the rank's parent to record it too, and only then does the parent tell the broker;
3. the broker stops taking work, lets its jobs finish (or kills them: --force, drain timeout),
   says goodbye and exits 0. Its parent ends the incarnation as retired: the key is revoked and
   anything that incarnation says later is answered "retired". Rank 0 sees the rank vacant and
   answers the waiting `tbon retire`, which has been shown each step on the way.
"""

from __future__ import annotations

import errno
import signal
from typing import TYPE_CHECKING, Any

from tbon import exitcodes
from tbon.overlay.parse.numbers import is_int, is_number
from tbon.overlay.services.actions import (
    Action,
    Apply,
    Call,
    KillAllJobs,
    Leave,
    Respond,
    RetireChild,
    Send,
    info,
    warning,
)
from tbon.overlay.services.trust import unless_from_root
from tbon.overlay.state.rankevents import Outcome, Retire
from tbon.overlay.state.rankstates import RankState
from tbon.overlay.state.retirement import Retirement, Step
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

if TYPE_CHECKING:
    from tbon.overlay.state.ranktable import RankTable  # rank 0's, and a member's


class RetireWaiter:
    """A `retire.rank` request at rank 0, answered when that incarnation has ended."""

    __slots__ = ("already", "incarnation", "rank", "request", "started")

    def __init__(
        self, request: Message, rank: int, incarnation: int, started: float, already: bool
    ) -> None:
        self.request, self.rank, self.incarnation = request, rank, incarnation
        self.started, self.already = started, already


class RetireService:
    """retire.rank and retire.progress at rank 0; retire.order at a parent."""

    def __init__(self, rank: int, topology: Topology, table: RankTable | None) -> None:
        self.rank = rank
        self.topology = topology
        self.table = table
        self.waiters: list[RetireWaiter] = []
        self._settled_generation = -1

    # --- rank 0 -------------------------------------------------------------------------------

    def retire_rank(self, request: Message, now: float) -> list[Action]:
        """Record a rank retiring and set its retirement going; answered when it has left."""
        table = self.table
        assert table is not None
        payload = request.payload
        rank, force, timeout = payload.get("rank"), payload.get("force"), payload.get("timeout")
        if not is_int(rank) or not isinstance(force, bool):
            return [Respond(request.fail(errno.EINVAL, "retire.rank needs rank and force"))]
        if timeout is not None and (not is_number(timeout) or timeout < 0):
            why = "retire.rank: timeout must be seconds, or null"
            return [Respond(request.fail(errno.EINVAL, why))]
        assert isinstance(rank, int)
        if not 0 <= rank < table.size:
            why = f"no rank {rank} in this instance of size {table.size}"
            return [Respond(request.fail(errno.ENOENT, why))]
        incarnation = payload.get("incarnation", table.entry(rank).incarnation)
        if not is_int(incarnation):
            why = "retire.rank: incarnation must be a whole number"
            return [Respond(request.fail(errno.EINVAL, why))]
        was = table.entry(rank).state

        def recorded(outcome: Outcome, now: float) -> list[Action]:
            return self._recorded(request, rank, incarnation, was, outcome, now)

        return [Apply(Retire(rank, incarnation), then=recorded, request=request)]

    def _recorded(
        self,
        request: Message,
        rank: int,
        incarnation: int,
        was: RankState,
        outcome: Outcome,
        now: float,
    ) -> list[Action]:
        """The table's answer to the Retire (a refusal is logged on the one path): answered
        at once if retired already, else the rank's parent is ordered to retire it."""
        assert self.table is not None
        if not outcome.applied:
            return [Respond(request.fail(errno.EPERM, outcome.reason))]
        payload = request.payload
        force, timeout = payload.get("force"), payload.get("timeout")
        entry = self.table.entry(rank)
        if entry.state is RankState.VACANT:  # retired already
            return [Respond(request.respond({"rank": rank, "event": "retired", "already": True}))]
        already = was is RankState.RETIRING
        self.waiters.append(RetireWaiter(request, rank, incarnation, now, already))
        news = {
            "rank": rank,
            "event": "retiring",
            "already": already,
            "host": entry.host,
            "pid": entry.pid,
        }
        actions: list[Action] = [Respond(request.respond(news, streaming=True))]
        if not already:
            actions.append(info(f"rank {rank} incarnation {incarnation}: retiring"))
            actions.append(self._order(rank, incarnation, {"force": force, "timeout": timeout}))
        return actions

    def _order(self, rank: int, incarnation: int, order: dict[str, Any]) -> Call:
        """Order the broker the rank is attached to (its parent, or a foster parent) to retire
        it."""
        assert self.table is not None
        parent = self.table.entry(rank).attached_to
        if parent is None:
            parent = self.topology.parent(rank)
        assert parent is not None  # rank 0 never retires

        def ordered(reply: Message, now: float) -> list[Action]:
            if not reply.errnum:
                return []
            return [
                warning(f"rank {rank}: the order to retire did not arrive: {reply.errstr}"),
                *self._news(rank, incarnation, {"event": "unreachable", "reason": reply.errstr}),
            ]

        notice = {"rank": rank, "incarnation": incarnation, **order}
        return Call(Message(Kind.REQUEST, "retire.order", notice, nodeid=parent), ordered)

    def progress(self, request: Message, now: float) -> list[Action]:
        """News from a retiring broker (its running work, what it killed), for its waiters."""
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        if not (is_int(rank) and is_int(incarnation)):
            return []
        assert isinstance(rank, int) and isinstance(incarnation, int)
        news = {k: v for k, v in payload.items() if k in ("event", "running", "killed", "why")}
        return self._news(rank, incarnation, news)

    def _news(self, rank: int, incarnation: int, news: dict[str, Any]) -> list[Action]:
        return [
            Respond(waiter.request.respond({"rank": rank, **news}, streaming=True))
            for waiter in self.waiters
            if (waiter.rank, waiter.incarnation) == (rank, incarnation)
        ]

    def settle(self, now: float) -> list[Action]:
        """Answer every waiter whose incarnation has ended (looked at when the table changed)."""
        table = self.table
        if table is None or not self.waiters or table.generation == self._settled_generation:
            return []
        self._settled_generation = table.generation
        actions: list[Action] = []
        waiting = []
        for waiter in self.waiters:
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
            actions.append(Respond(waiter.request.respond(answer)))
        self.waiters = waiting
        return actions

    def end(self) -> list[Action]:
        """The instance shuts down: no retirement will be seen through."""
        ended: list[Action] = [
            Respond(waiter.request.fail(errno.ESHUTDOWN, "the instance shut down"))
            for waiter in self.waiters
        ]
        self.waiters = []
        return ended

    # --- the parent -------------------------------------------------------------------------

    def order(self, request: Message, now: float) -> list[Action]:
        """The root's order to retire one of this broker's children: record, then tell it."""
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        if (refused := unless_from_root(request)) is not None:
            return refused
        if not self.topology.children(self.rank) or not (is_int(rank) and is_int(incarnation)):
            why = "retire.order needs a child's rank and incarnation"
            return [Respond(request.fail(errno.EINVAL, why))]
        assert isinstance(rank, int) and isinstance(incarnation, int)
        order = {"force": bool(payload.get("force")), "timeout": payload.get("timeout")}
        return [RetireChild(request, rank, incarnation, order)]


class Draining:
    """The retiring broker itself: from the parent's order to its goodbye.

    It takes no new work from the moment it is told (the loop marks its Lifecycle). What runs
    may finish, until the drain deadline or at once under --force; then it is killed, and rank 0
    hears of it. When nothing runs any more the broker says goodbye and exits 0.
    """

    def __init__(self, rank: int, incarnation: int, order: dict[str, Any], now: float) -> None:
        self.rank = rank
        self.incarnation = incarnation
        timeout = order.get("timeout")
        limit = float(timeout) if is_number(timeout) else float("inf")
        self.retirement = Retirement(now + limit, bool(order.get("force")))

    def begin(self, running: int) -> list[Action]:
        actions: list[Action] = [info(f"retiring: taking no new work; {running} job(s) running")]
        if running:
            actions.append(self._tell_rank0({"event": "draining", "running": running}))
        return actions

    def step(self, now: float, running: int) -> list[Action]:
        """After every batch of input: wait, kill, or leave."""
        step = self.retirement.step(now, running)
        if step is Step.KILL:
            why = self.retirement.why_killed
            self.retirement.killing(now, running)
            return [
                warning(f"retiring: killing {running} running job(s) ({why})"),
                KillAllJobs(signal.SIGKILL, note=f"killed: rank {self.rank} retired ({why})"),
                self._tell_rank0({"event": "killed", "killed": running, "why": why}),
            ]
        if step is Step.LEAVE:
            said: list[Action] = [info("retired: leaving"), Leave(exitcodes.SHUTDOWN)]
            if running:  # killed KILL_GRACE ago, and still not reaped (a bug, or a wedged job)
                said.insert(0, warning(f"retiring: {running} killed job(s) did not end"))
            return said
        return []

    def next_deadline(self) -> float | None:
        return self.retirement.next_deadline()

    def _tell_rank0(self, news: dict[str, Any]) -> Send:
        payload = {"rank": self.rank, "incarnation": self.incarnation, **news}
        return Send(Message(Kind.REQUEST, "retire.progress", payload, nodeid=0))
