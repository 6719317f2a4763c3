"""What a service asks the broker to do: the whole vocabulary between services and the loop.

A service is handed a request (or a timer's turn) and the time, changes only its own plain state,
and returns a list of these instructions. It never touches a socket, a process or a log file:
the broker's loop carries the instructions out, in order, and feeds whatever comes back (a reply
to a Call) to the continuation the service gave. So every decision a service makes can be tested
by building it with a table, a topology and a fixed time, and reading the list it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tbon.overlay.links.children import Rejoin
from tbon.overlay.state.ranktable import Event
from tbon.overlay.wire.message import Message


@dataclass(frozen=True, slots=True)
class Respond:
    """Send a response back along the route its request came by."""

    message: Message


@dataclass(frozen=True, slots=True)
class Send:
    """Route a one-way request of this broker's own (no answer is awaited)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Call:
    """Route a request of this broker's own; `then(reply, now)` gives what to do next."""

    request: Message
    then: Callable[[Message, float], list[Action]]


@dataclass(frozen=True, slots=True)
class Forward:
    """Send a copy of a request down to one child; if that child is not connected, do
    `otherwise` instead."""

    child: int
    message: Message
    otherwise: tuple[Action, ...] = ()


@dataclass(frozen=True, slots=True)
class Log:
    level: int
    text: str


@dataclass(frozen=True, slots=True)
class Report:
    """A rank-table event seen here: applied at rank 0, sent up the tree anywhere else."""

    event: Event


@dataclass(frozen=True, slots=True)
class Authorize:
    """Admit a child's key for exactly (rank, incarnation) at this broker's ROUTER."""

    rank: int
    incarnation: int
    public_key: str


@dataclass(frozen=True, slots=True)
class Revoke:
    """Drop a child incarnation's key, and cut its broker off if it is connected."""

    rank: int
    incarnation: int
    reason: str


@dataclass(frozen=True, slots=True)
class RetireChild:
    """Record a child as retiring and tell its broker; answer `request` with how that went."""

    request: Message
    rank: int
    incarnation: int
    order: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True)
class Readmit:
    """Rank 0 answered for a config-booted child at the door: welcome it as `incarnation`, or
    refuse it with `why` (None)."""

    rejoin: Rejoin
    incarnation: int | None
    why: str


@dataclass(frozen=True, slots=True)
class StartJob:
    """Start the command of an `exec.start` request on this broker."""

    request: Message


@dataclass(frozen=True, slots=True)
class WriteStdin:
    job_id: str
    data: str
    eof: bool


@dataclass(frozen=True, slots=True)
class SignalJob:
    job_id: str
    signum: int


@dataclass(frozen=True, slots=True)
class KillJobsFrom:
    """Kill the jobs whose answers travel along `route`: their client has gone."""

    route: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KillAllJobs:
    signum: int
    note: str = ""


@dataclass(frozen=True, slots=True)
class ForgetWatches:
    """End the status streams of a client that has gone (rank 0)."""

    route: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShutDown:
    """Shut this broker's subtree down, leaves first; `end_program` ends rank 0's initial
    program first (an `instance.shutdown` request, a signal)."""

    end_program: bool = True


@dataclass(frozen=True, slots=True)
class Leave:
    """Say goodbye to the parent and exit with `exit_code` (a retired broker)."""

    exit_code: int


Action = (
    Respond
    | Send
    | Call
    | Forward
    | Log
    | Report
    | Authorize
    | Revoke
    | RetireChild
    | Readmit
    | StartJob
    | WriteStdin
    | SignalJob
    | KillJobsFrom
    | KillAllJobs
    | ForgetWatches
    | ShutDown
    | Leave
)


def info(text: str) -> Log:
    return Log(logging.INFO, text)


def warning(text: str) -> Log:
    return Log(logging.WARNING, text)
