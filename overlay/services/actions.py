"""What a service asks the broker to do: the whole vocabulary between services and the loop.

A service is handed a request (or a timer's turn) and the time, changes only its own plain state,
and returns a list of these instructions. It never touches a socket, a process or a log file:
the broker's loop carries the instructions out, in order, and feeds whatever comes back (a reply
to a Call) to the continuation the service gave. So every decision a service makes can be tested
by building it with a table, a topology and a fixed time, and reading the list it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tbon.overlay.state.rankevents import Event
from tbon.overlay.wire.message import Buffer, Message
from tbon.record import Record

if TYPE_CHECKING:  # the children's side is loaded by a broker that has children only
    from tbon.overlay.links.children import Rejoin
    from tbon.overlay.state.rankevents import Outcome, Reserve  # records, but not actions


class Respond(Record):
    """Send a response back along the route its request came by."""

    __slots__ = __match_args__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message


class PassOn(Record):
    """Send a response on along its route from here, as it is: exec's exits merged here
    (services/exec.py), which this broker must not take to merge again."""

    __slots__ = __match_args__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message


class Send(Record):
    """Route a one-way request of this broker's own (no answer is awaited)."""

    __slots__ = __match_args__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message


class Call(Record):
    """Route a request of this broker's own; `then(reply, now)` gives what to do next."""

    __slots__ = __match_args__ = ("request", "then")

    def __init__(self, request: Message, then: Callable[[Message, float], list[Action]]) -> None:
        self.request = request
        self.then = then


class Forward(Record):
    """Send a copy of a request down to one child; if that child is not connected, do
    `otherwise` instead: actions, or what a function returns, made only then (exec.start's
    answer for each target below that child: thousands at rank 0, almost never needed)."""

    __slots__ = __match_args__ = ("child", "message", "otherwise")

    def __init__(
        self,
        child: int,
        message: Message,
        otherwise: tuple[Action, ...] | Callable[[], list[Action]] = (),
    ) -> None:
        self.child = child
        self.message = message
        self.otherwise = otherwise


class Log(Record):
    __slots__ = __match_args__ = ("level", "text")

    def __init__(self, level: int, text: str) -> None:
        self.level = level
        self.text = text


class Report(Record):
    """A rank-table event seen here: applied at rank 0, sent up the tree anywhere else."""

    __slots__ = __match_args__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


class ApplyAll(Record):
    """Rank 0: apply a report's events to the rank table in one pass of its one path
    (`RankPath.handle_all`), each with its follow-ups, in the order they came."""

    __slots__ = __match_args__ = ("events",)

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events


class Apply(Record):
    """Rank 0: apply an event to the rank table through its one path (services/rankpath.py),
    which carries out every follow-up; then `then(outcome, now)`, if given, says what the asking
    service does with the table's answer. `request`: the client request that waits for it, which
    the root refuses (EAGAIN) if its root group cannot commit the event in time (group.py)."""

    __slots__ = __match_args__ = ("event", "then", "request")

    def __init__(
        self,
        event: Event | Reserve,
        then: Callable[[Outcome, float], list[Action]] | None = None,
        request: Message | None = None,
    ) -> None:
        self.event = event
        self.then = then
        self.request = request


class Wake(Record):
    """Something changed what the loop's timers wait for (a lease, a rank adrift): recompute
    them on its next turn."""

    __slots__ = __match_args__ = ()


class Authorize(Record):
    """Admit a child's key for exactly (rank, incarnation) at this broker's ROUTER."""

    __slots__ = __match_args__ = ("rank", "incarnation", "public_key")

    def __init__(self, rank: int, incarnation: int, public_key: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.public_key = public_key


class Foster(Record):
    """Admit each (rank, incarnation, key) as a foster child until `until` (protocol.md §12)."""

    __slots__ = __match_args__ = ("admissions", "until")

    def __init__(self, admissions: tuple[tuple[int, int, str], ...], until: float) -> None:
        self.admissions = admissions
        self.until = until


class Withdraw(Record):
    """Forget each (rank, incarnation) fostered here that has not come: rank 0 found it moot."""

    __slots__ = __match_args__ = ("admissions",)

    def __init__(self, admissions: tuple[tuple[int, int], ...]) -> None:
        self.admissions = admissions


class GoHome(Record):
    """Open a link to this broker's own parent at `card` (rank, endpoint, key), and answer
    `request` with whether that could start."""

    __slots__ = __match_args__ = ("request", "card")

    def __init__(self, request: Message, card: tuple[int, str, str]) -> None:
        self.request = request
        self.card = card


class Revoke(Record):
    """Drop a child incarnation's key, and cut its broker off if it is connected."""

    __slots__ = __match_args__ = ("rank", "incarnation", "reason")

    def __init__(self, rank: int, incarnation: int, reason: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.reason = reason


class RetireChild(Record):
    """Record a child as retiring and tell its broker; answer `request` with how that went."""

    __slots__ = __match_args__ = ("request", "rank", "incarnation", "order")

    def __init__(
        self, request: Message, rank: int, incarnation: int, order: dict[str, Any]
    ) -> None:
        self.request = request
        self.rank = rank
        self.incarnation = incarnation
        self.order = order


class Readmit(Record):
    """Rank 0 answered for a config-booted child at the door: welcome it as `incarnation`, or
    refuse it with `why` (None)."""

    __slots__ = __match_args__ = ("rejoin", "incarnation", "why")

    def __init__(self, rejoin: Rejoin, incarnation: int | None, why: str) -> None:
        self.rejoin = rejoin
        self.incarnation = incarnation
        self.why = why


class StartJob(Record):
    """Start the command of an `exec.start` request on this broker."""

    __slots__ = __match_args__ = ("request",)

    def __init__(self, request: Message) -> None:
        self.request = request


class WriteStdin(Record):
    __slots__ = __match_args__ = ("job_id", "data", "eof")

    def __init__(self, job_id: str, data: Buffer, eof: bool) -> None:
        self.job_id = job_id
        self.data = data
        self.eof = eof


class GrantCredit(Record):
    """The client of a job has written out `amount` bytes of its output: it may send more. With
    `seq`, it has taken every answer numbered below it; with `resend`, it missed the one
    numbered `seq` and wants everything from there again."""

    __slots__ = __match_args__ = ("job_id", "amount", "seq", "resend")

    def __init__(
        self, job_id: str, amount: int, seq: int | None = None, resend: bool = False
    ) -> None:
        self.job_id = job_id
        self.amount = amount
        self.seq = seq
        self.resend = resend


class SignalJob(Record):
    __slots__ = __match_args__ = ("job_id", "signum")

    def __init__(self, job_id: str, signum: int) -> None:
        self.job_id = job_id
        self.signum = signum


class AbandonJob(Record):
    """Kill a job (SIGKILL) and keep nothing of its answers: its client has gone (exec.signal's
    `gone`, from the client's broker)."""

    __slots__ = __match_args__ = ("job_id",)

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class KillJobsFrom(Record):
    """Kill the jobs whose answers travel along `route`: their client has gone."""

    __slots__ = __match_args__ = ("route",)

    def __init__(self, route: tuple[str, ...]) -> None:
        self.route = route


class KillAllJobs(Record):
    __slots__ = __match_args__ = ("signum", "note")

    def __init__(self, signum: int, note: str = "") -> None:
        self.signum = signum
        self.note = note


class ForgetWatches(Record):
    """End the status streams of a client that has gone (rank 0)."""

    __slots__ = __match_args__ = ("route",)

    def __init__(self, route: tuple[str, ...]) -> None:
        self.route = route


class ShutDown(Record):
    """Shut this broker's subtree down, leaves first; `end_program` ends rank 0's initial
    program first (an `instance.shutdown` request, a signal)."""

    __slots__ = __match_args__ = ("end_program",)

    def __init__(self, end_program: bool = True) -> None:
        self.end_program = end_program


class Leave(Record):
    """Say goodbye to the parent and exit with `exit_code` (a retired broker)."""

    __slots__ = __match_args__ = ("exit_code",)

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code


Action = (
    Respond
    | PassOn
    | Send
    | Call
    | Forward
    | Log
    | Report
    | Apply
    | ApplyAll
    | Wake
    | Authorize
    | Foster
    | Withdraw
    | GoHome
    | Revoke
    | RetireChild
    | Readmit
    | StartJob
    | WriteStdin
    | GrantCredit
    | SignalJob
    | AbandonJob
    | KillJobsFrom
    | KillAllJobs
    | ForgetWatches
    | ShutDown
    | Leave
)


def fail(request: Message, errnum: int, errstr: str) -> list[Action]:
    """Answer `request` with an error, and do nothing else."""
    return [Respond(request.fail(errnum, errstr))]


def info(text: str) -> Log:
    return Log(logging.INFO, text)


def warning(text: str) -> Log:
    return Log(logging.WARNING, text)
