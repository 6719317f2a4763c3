"""Carrying out what the services ask: the one place where an action touches a link, a job or
the log. The services decide; this does, in the order given, and hands a reply to a Call's
continuation through the router."""

from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING, Protocol

from tbon.overlay.broker.jobs import JobRunner
from tbon.overlay.broker.router import Router
from tbon.overlay.services.actions import (
    Action,
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
    Readmit,
    Report,
    Respond,
    RetireChild,
    Revoke,
    Send,
    ShutDown,
    SignalJob,
    StartJob,
    Withdraw,
    WriteStdin,
)
from tbon.overlay.state.ranktable import Event

if TYPE_CHECKING:  # loaded by a broker that has children, by rank 0, only
    from tbon.overlay.links.children import Children
    from tbon.overlay.services.status import StatusService

log = logging.getLogger("tbon.broker")


class Loop(Protocol):
    """What only the broker's loop itself can do."""

    def report(self, events: list[Event], now: float) -> None: ...
    def shut_down(self, end_program: bool, now: float) -> None: ...
    def leave(self, exit_code: int) -> None: ...
    def wake(self) -> None: ...
    def go_home(self, card: tuple[int, str, str]) -> str: ...


class Performer:
    def __init__(
        self,
        rank: int,
        loop: Loop,
        router: Router,
        children: Children | None,
        jobs: JobRunner,
        status: StatusService | None,
    ) -> None:
        self.rank = rank
        self.loop = loop
        self.router = router
        self.children = children
        self.jobs = jobs
        self.status = status

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            self._perform(action, time.monotonic())

    def _perform(self, action: Action, now: float) -> None:
        children = self.children
        match action:
            case Respond(message):
                self.router.respond(message)
            case Send(message):
                self.router.send(message)
            case Call(request, then):
                self.router.call(request, then, now)
                self.loop.wake()  # a new deadline: its answer's
            case Forward(child, message, otherwise):
                if not self.router.send_down(child, message):
                    self.perform(list(otherwise))
            case Log(level, text):
                log.log(level, "%s", text)
            case Report(event):
                self.loop.report([event], now)
            case Authorize(rank, incarnation, key) if children is not None:
                children.authorize(rank, incarnation, key)
            case Foster(admissions, until) if children is not None:
                for rank, incarnation, key in admissions:
                    children.authorize(rank, incarnation, key, foster_until=until)
                self.loop.wake()  # a foster child that never comes is forgotten on time
            case Withdraw(admissions) if children is not None:
                for rank, incarnation in admissions:
                    children.withdraw(rank, incarnation)
            case GoHome(request, card):
                why = self.loop.go_home(card)
                reply = request.fail(errno.EHOSTUNREACH, why) if why else request.respond({})
                self.router.respond(reply)
            case Revoke(rank, incarnation, reason) if children is not None:
                children.revoke(rank, incarnation, reason)
            case RetireChild(request, rank, incarnation, order) if children is not None:
                why = children.retire(rank, incarnation, order)
                reply = request.fail(errno.EHOSTUNREACH, why) if why else request.respond({})
                self.router.respond(reply)
            case Readmit(rejoin, incarnation, why) if children is not None:
                inbound = children.rejoined(rejoin, incarnation, why, now)
                self.loop.report(inbound.reports, now)
                self.loop.wake()
            case StartJob(request):
                if (refused := self.jobs.start(request)) is not None:
                    answer = {"rank": self.rank, "error": refused.errstr}
                    self.router.respond(request.respond(answer, streaming=True))
            case WriteStdin(job_id, data, eof):
                self.jobs.write_stdin(job_id, data, eof)
            case GrantCredit(job_id, amount):
                self.jobs.grant(job_id, amount)
            case SignalJob(job_id, signum):
                self.jobs.send_signal(job_id, signum)
            case KillJobsFrom(route):
                self.jobs.kill_from(route)
            case KillAllJobs(signum, note):
                self.jobs.kill_all(signum, note=note)
                self.loop.wake()
            case ForgetWatches(route) if self.status is not None:
                self.status.forget(route)
            case ShutDown(end_program):
                self.loop.shut_down(end_program, now)
            case Leave(exit_code):
                self.loop.leave(exit_code)
