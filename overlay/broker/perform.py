"""Carrying out what the services ask: the one place where an action touches a link, a job or
the log. The services decide; this does, in the order given, and hands a reply to a Call's
continuation through the router.

It is total: every action in the `Action` union is carried out, or it raises CannotPerform
saying why (a child's key given to a broker that has no children). None is dropped because this
broker lacks what it needs, and the match ends in `assert_never`, so that a type checker proves
each kind of action has its case.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, assert_never

from tbon.overlay.broker.router import Router
from tbon.overlay.services.actions import (
    AbandonJob,
    Action,
    Apply,
    ApplyAll,
    Authorize,
    Call,
    ForgetWatches,
    Forward,
    Foster,
    GoHome,
    GrantCredit,
    KillAllJobs,
    KillJobsFrom,
    Leave,
    Log,
    PassOn,
    Readmit,
    Report,
    Respond,
    RetireChild,
    Revoke,
    Send,
    ShutDown,
    SignalJob,
    StartJob,
    Wake,
    Withdraw,
    WriteStdin,
)
from tbon.overlay.state.rankevents import Event
from tbon.overlay.wire.message import Buffer, Message

if TYPE_CHECKING:  # loaded by a broker that has children only; the path, by rank 0 only
    from tbon.overlay.links.children import Inbound, Rejoin
    from tbon.overlay.services.group import GroupService
    from tbon.overlay.services.rankpath import RankPath

log = logging.getLogger("tbon.broker")


class CannotPerform(RuntimeError):
    """A service asked this broker for an action it cannot carry out: a bug in that service,
    which the broker must not hide by skipping the action."""


class Loop(Protocol):
    """What only the broker's loop itself can do."""

    def report(self, events: Sequence[Event], now: float) -> None: ...
    def shut_down(self, end_program: bool, now: float) -> None: ...
    def leave(self, exit_code: int) -> None: ...
    def wake(self) -> None: ...
    def go_home(self, card: tuple[int, str, str]) -> str: ...


class ChildLinks(Protocol):
    """What the performer asks of a parent's side of its links (links/children.py)."""

    def authorize(
        self, rank: int, incarnation: int, public_z85: str, foster_until: float | None = None
    ) -> None: ...
    def revoke(self, rank: int, incarnation: int, reason: str) -> None: ...
    def withdraw(self, rank: int, incarnation: int) -> None: ...
    def retire(self, rank: int, incarnation: int, order: dict[str, Any]) -> str: ...
    def rejoined(
        self, rejoin: Rejoin, incarnation: int | None, why: str, now: float
    ) -> Inbound: ...


class Jobs(Protocol):
    """What the performer asks of this broker's jobs (broker/jobs.py)."""

    def start(self, request: Message) -> Message | None: ...
    def write_stdin(self, job_id: str, data: Buffer, eof: bool) -> None: ...
    def grant(self, job_id: str, amount: int) -> None: ...
    def acknowledge(self, job_id: str, upto: int) -> None: ...
    def resend(self, job_id: str | None = None, start: int = 0) -> None: ...
    def send_signal(self, job_id: str, signum: int) -> None: ...
    def abandon(self, job_id: str) -> None: ...
    def kill_from(self, route: tuple[str, ...]) -> None: ...
    def kill_all(self, signum: int, note: str = "") -> None: ...


class Watches(Protocol):
    """Rank 0's status streams (services/status.py)."""

    def forget(self, route: tuple[str, ...]) -> None: ...


class Performer:
    def __init__(
        self,
        rank: int,
        loop: Loop,
        router: Router,
        children: ChildLinks | None,
        jobs: Jobs,
        status: Watches | None,
        path: RankPath | None = None,
        group: GroupService | None = None,
    ) -> None:
        """`children`: None on a broker whose rank has no children; `status` and `path` (the
        one way into the rank table): None but at rank 0."""
        self.rank = rank
        self.loop = loop
        self.router = router
        self.children = children
        self.jobs = jobs
        self.status = status
        self.path = path
        self.group = group  # the root group: with standbys, an Apply waits for its commit

    def perform(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self._perform(action, time.monotonic())

    def _perform(self, action: Action, now: float) -> None:
        match action:
            case Respond(message):
                self.router.respond(message)
            case PassOn(message):
                self.router.respond(message, gather=False)
            case Send(message):
                self.router.send(message)
            case Call(request, then):
                self.router.call(request, then, now)
                self.loop.wake()  # a new deadline: its answer's
            case Forward(child, message, otherwise):
                if not self.router.send_down(child, message):
                    self.perform(otherwise() if callable(otherwise) else otherwise)
            case Log(level, text):
                log.log(level, "%s", text)
            case Report(event):
                self.loop.report([event], now)
            case Apply(event, then):
                if self.path is None:
                    raise self._cannot(action, "no rank table (rank 0 alone has one)")
                if self.group is not None and self.group.active:
                    self.perform(self.group.propose(action, now))  # applied once committed
                    return
                applied = self.path.handle(event, now)
                self.perform(applied.actions)  # every follow-up, then the asker's own
                if then is not None:
                    self.perform(then(applied.outcome, now))
            case ApplyAll(events):
                if self.path is None:
                    raise self._cannot(action, "no rank table (rank 0 alone has one)")
                if self.group is not None and self.group.active:
                    for event in events:  # each committed in turn, in the order reported
                        self.perform(self.group.propose(Apply(event), now))
                    return
                self.perform(self.path.handle_all(events, now).actions)
            case Wake():
                self.loop.wake()
            case Authorize(rank, incarnation, key):
                self._children(action).authorize(rank, incarnation, key)
            case Foster(admissions, until):
                for rank, incarnation, key in admissions:  # none: nothing asked of children
                    self._children(action).authorize(rank, incarnation, key, foster_until=until)
                self.loop.wake()  # a foster child that never comes is forgotten on time
            case Withdraw(admissions):
                for rank, incarnation in admissions:
                    self._children(action).withdraw(rank, incarnation)
            case GoHome(request, card):
                why = self.loop.go_home(card)
                reply = request.fail(errno.EHOSTUNREACH, why) if why else request.respond({})
                self.router.respond(reply)
            case Revoke(rank, incarnation, reason):
                self._children(action).revoke(rank, incarnation, reason)
            case RetireChild(request, rank, incarnation, order):
                why = self._children(action).retire(rank, incarnation, order)
                reply = request.fail(errno.EHOSTUNREACH, why) if why else request.respond({})
                self.router.respond(reply)
            case Readmit(rejoin, incarnation, why):
                inbound = self._children(action).rejoined(rejoin, incarnation, why, now)
                self.loop.report(inbound.reports, now)
                self.loop.wake()
            case StartJob(request):
                if (refused := self.jobs.start(request)) is not None:
                    answer = {"rank": self.rank, "error": refused.errstr}
                    self.router.respond(request.respond(answer, streaming=True))
            case WriteStdin(job_id, data, eof):
                self.jobs.write_stdin(job_id, data, eof)
            case GrantCredit(job_id, amount, seq, resend):
                if seq is not None:
                    self.jobs.acknowledge(job_id, seq)
                if amount:
                    self.jobs.grant(job_id, amount)
                if resend and seq is not None:
                    self.jobs.resend(job_id, seq)
            case SignalJob(job_id, signum):
                self.jobs.send_signal(job_id, signum)
            case AbandonJob(job_id):
                self.jobs.abandon(job_id)
            case KillJobsFrom(route):
                self.jobs.kill_from(route)
            case KillAllJobs(signum, note):
                self.jobs.kill_all(signum, note=note)
                self.loop.wake()
            case ForgetWatches(route):
                if self.status is None:
                    raise self._cannot(action, "no status streams (rank 0 alone has them)")
                self.status.forget(route)
            case ShutDown(end_program):
                self.loop.shut_down(end_program, now)
            case Leave(exit_code):
                self.loop.leave(exit_code)
            case _:
                assert_never(action)

    def _children(self, action: Action) -> ChildLinks:
        """The children's side, for an action that needs one."""
        if self.children is None:
            raise self._cannot(action, "no children")
        return self.children

    def _cannot(self, action: Action, lacking: str) -> CannotPerform:
        name = type(action).__name__
        return CannotPerform(f"{name} on a broker with {lacking} (rank {self.rank}): {action}")
