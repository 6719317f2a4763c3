"""The performer (overlay/broker/perform.py): each action reaches the collaborator that carries
it out, and an action this broker cannot carry out is an error, never dropped.

The router is the real one, over links that record what they are given (it needs no socket);
rank 0's status service is the real one; the loop, the children's side and the jobs are
recorders of the protocols the performer declares, which is all it may ask of them.
"""

from __future__ import annotations

import errno
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any, get_args

import pytest
from tables import started

from tbon.overlay.broker.perform import CannotPerform, Performer
from tbon.overlay.broker.router import Router
from tbon.overlay.links.children import Inbound, Rejoin
from tbon.overlay.services import actions
from tbon.overlay.services.actions import (
    Action,
    Apply,
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
    Wake,
    Withdraw,
    WriteStdin,
)
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.services.status import StatusService, Watcher
from tbon.overlay.state.ranktable import Event, Lost, Online, Outcome, RankState
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Buffer, Kind, Message
from tbon.record import Record

KEY = "k" * 40


class Link:
    """A link as the router sees one: records what it is given; `present` says whether the
    peer is there."""

    def __init__(self, present: bool = True) -> None:
        self.sent: list[Message] = []
        self.present = present

    def send(self, *args: Any) -> bool:
        self.sent.append(args[-1])
        return self.present

    welcomed = True  # as the link up: attached to its parent
    fosters: frozenset[int] = frozenset()  # as the children: no foster child attached

    def send_response(self, reply: Message, came_from: int | None) -> bool:
        return self.send(reply)

    def attached(self, rank: int) -> bool:
        return self.present


class Loop:
    def __init__(self, home: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.home = home  # what go_home answers: why it could not start ("": it did)

    def report(self, events: Sequence[Event], now: float) -> None:
        self.calls.append(("report", list(events)))

    def shut_down(self, end_program: bool, now: float) -> None:
        self.calls.append(("shut_down", end_program))

    def leave(self, exit_code: int) -> None:
        self.calls.append(("leave", exit_code))

    def wake(self) -> None:
        self.calls.append(("wake",))

    def go_home(self, card: tuple[int, str, str]) -> str:
        self.calls.append(("go_home", card))
        return self.home


class ChildLinks:
    def __init__(self, retire_says: str = "", inbound: Inbound | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.retire_says = retire_says
        self.inbound = inbound or Inbound()

    def authorize(
        self, rank: int, incarnation: int, public_z85: str, foster_until: float | None = None
    ) -> None:
        self.calls.append(("authorize", rank, incarnation, public_z85, foster_until))

    def revoke(self, rank: int, incarnation: int, reason: str) -> None:
        self.calls.append(("revoke", rank, incarnation, reason))

    def withdraw(self, rank: int, incarnation: int) -> None:
        self.calls.append(("withdraw", rank, incarnation))

    def retire(self, rank: int, incarnation: int, order: dict[str, Any]) -> str:
        self.calls.append(("retire", rank, incarnation, order))
        return self.retire_says

    def rejoined(self, rejoin: Rejoin, incarnation: int | None, why: str, now: float) -> Inbound:
        self.calls.append(("rejoined", rejoin, incarnation, why))
        return self.inbound


class Jobs:
    def __init__(self, refusal: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refusal = refusal  # start refuses the job with this errstr ("": takes it)

    def start(self, request: Message) -> Message | None:
        self.calls.append(("start", request.topic))
        return request.fail(errno.EAGAIN, self.refusal) if self.refusal else None

    def write_stdin(self, job_id: str, data: Buffer, eof: bool) -> None:
        self.calls.append(("write_stdin", job_id, bytes(data), eof))

    def grant(self, job_id: str, amount: int) -> None:
        self.calls.append(("grant", job_id, amount))

    def send_signal(self, job_id: str, signum: int) -> None:
        self.calls.append(("send_signal", job_id, signum))

    def kill_from(self, route: tuple[str, ...]) -> None:
        self.calls.append(("kill_from", route))

    def kill_all(self, signum: int, note: str = "") -> None:
        self.calls.append(("kill_all", signum, note))


class Broker:
    """A performer of rank `rank` of kary:2 (7 ranks) with its collaborators; `children` and
    `rank0` say whether it has a children's side and rank 0's status service."""

    def __init__(
        self,
        rank: int = 0,
        children: bool = True,
        loop: Loop | None = None,
        child_links: ChildLinks | None = None,
        jobs: Jobs | None = None,
    ) -> None:
        topology = Topology("kary:2", 7)
        self.up = Link() if rank else None
        self.down = Link()
        self.local = Link()
        self.loop = loop or Loop()
        self.children = (child_links or ChildLinks()) if children else None
        self.jobs = jobs or Jobs()
        self.table = started("kary:2", 7)
        self.status = StatusService(self.table, Lifecycle()) if rank == 0 else None
        self.path = RankPath(self.table) if rank == 0 else None
        self.router = Router(
            rank,
            topology,
            None,
            (self.up, self.down if children else None, self.local),  # type: ignore[arg-type]
            {},
            frozenset(),
            lambda done: self.performer.perform(done),
            lambda hop, message: None,
            call_timeout=5.0,
        )
        self.performer = Performer(
            rank, self.loop, self.router, self.children, self.jobs, self.status, self.path
        )

    def perform(self, *done: Action) -> None:
        self.performer.perform(list(done))


def client_request(topic: str, nodeid: int = 0, **payload: Any) -> Message:
    """A request as it reaches a service: it came from local client l0a."""
    return Message(Kind.REQUEST, topic, payload, nodeid=nodeid, tag=3, route=["l0a"])


# --- each action reaches its collaborator ---------------------------------------------------


def test_respond_send_and_call_go_through_the_router() -> None:
    broker = Broker()
    request = client_request("broker.ping")
    answers: list[Message] = []

    def then(reply: Message, now: float) -> list[Action]:
        answers.append(reply)
        return [Report(Lost(2, 1, "seen in the answer", 0))]

    broker.perform(
        Respond(request.respond({"pong": 1})),
        Send(Message(Kind.REQUEST, "heal.home", nodeid=1)),
        Call(Message(Kind.REQUEST, "flub.authorize", nodeid=2), then),
    )
    [answer] = broker.local.sent
    assert answer.payload == {"pong": 1} and answer.route == []
    sent, called = broker.down.sent
    assert (sent.topic, sent.nodeid, sent.route, sent.tag) == ("heal.home", 1, ["s"], 0)
    assert called.topic == "flub.authorize" and called.tag > 0
    assert broker.loop.calls == [("wake",)]  # the call's deadline is a new one
    broker.router.route(called.respond({"ok": True}), "c2", 0.0)  # its answer, by its link
    assert [a.payload for a in answers] == [{"ok": True}]
    assert broker.loop.calls[-1] == ("report", [Lost(2, 1, "seen in the answer", 0)])


def test_forward_goes_to_a_connected_child_and_falls_back_to_otherwise() -> None:
    broker = Broker()
    request = client_request("exec.start", nodeid=1)
    fallback = Respond(request.fail(errno.EHOSTUNREACH, "rank 1 is not connected"))
    broker.perform(Forward(1, request, (fallback,)))
    assert broker.down.sent == [request] and broker.local.sent == []
    broker.down.present = False
    broker.perform(Forward(1, request, (fallback, Report(Lost(1, 1, "gone", 0)))))
    [answer] = broker.local.sent
    assert answer.errnum == errno.EHOSTUNREACH and answer.errstr == "rank 1 is not connected"
    assert broker.loop.calls == [("report", [Lost(1, 1, "gone", 0)])]


def test_forward_on_a_broker_without_children_falls_back_too() -> None:
    broker = Broker(rank=3, children=False)
    request = client_request("exec.start", nodeid=3)
    broker.perform(Forward(7, request, (Respond(request.fail(errno.EHOSTUNREACH, "none")),)))
    assert [a.errstr for a in broker.local.sent] == ["none"]


def test_log_and_report(caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker()
    online = Online(1, 1, "node1", 4321, 0, KEY)
    with caplog.at_level(logging.INFO, logger="tbon.broker"):
        broker.perform(Log(logging.WARNING, "a warning of its own"), Report(online))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "a warning of its own")
    ]
    assert broker.loop.calls == [("report", [online])]


def test_the_childrens_side_is_asked_to_admit_foster_revoke_withdraw_and_readmit() -> None:
    rejoin = Rejoin(2, 1, b"\x00id", 9, Message(Kind.CONTROL, "hello"))
    reported = Online(2, 2, "node2", 99, 0, "")
    child_links = ChildLinks(inbound=Inbound(reports=[reported]))
    broker = Broker(child_links=child_links)
    broker.perform(
        Authorize(1, 1, KEY),
        Foster(((3, 2, KEY), (4, 1, "")), 50.0),
        Revoke(1, 1, "reservation expired"),
        Withdraw(((3, 2), (4, 1))),
        Readmit(rejoin, 2, ""),
    )
    assert child_links.calls == [
        ("authorize", 1, 1, KEY, None),
        ("authorize", 3, 2, KEY, 50.0),
        ("authorize", 4, 1, "", 50.0),
        ("revoke", 1, 1, "reservation expired"),
        ("withdraw", 3, 2),
        ("withdraw", 4, 1),
        ("rejoined", rejoin, 2, ""),
    ]
    assert broker.loop.calls == [("wake",), ("report", [reported]), ("wake",)]


@pytest.mark.parametrize("why", ["", "rank 1 is not connected"])
def test_retire_child_is_answered_with_what_the_childrens_side_said(why: str) -> None:
    child_links = ChildLinks(retire_says=why)
    broker = Broker(child_links=child_links)
    request = client_request("retire.order", rank=1, incarnation=1)
    broker.perform(RetireChild(request, 1, 1, {"force": False, "timeout": None}))
    assert child_links.calls == [("retire", 1, 1, {"force": False, "timeout": None})]
    [answer] = broker.local.sent
    assert (answer.errnum, answer.errstr) == ((errno.EHOSTUNREACH, why) if why else (0, ""))


@pytest.mark.parametrize("why", ["", "no route to rank 0's card"])
def test_go_home_asks_the_loop_and_answers_with_what_it_said(why: str) -> None:
    loop = Loop(home=why)
    broker = Broker(rank=3, children=False, loop=loop)
    request = client_request("heal.home", nodeid=3)
    broker.perform(GoHome(request, (1, "tcp://127.0.0.1:5000", KEY)))
    assert loop.calls == [("go_home", (1, "tcp://127.0.0.1:5000", KEY))]
    [answer] = broker.local.sent
    assert (answer.errnum, answer.errstr) == ((errno.EHOSTUNREACH, why) if why else (0, ""))


def test_job_actions_reach_the_jobs() -> None:
    jobs = Jobs()
    broker = Broker(rank=3, children=False, jobs=jobs)
    broker.perform(
        StartJob(client_request("exec.start", nodeid=3)),
        WriteStdin("j1", memoryview(b"input"), True),
        GrantCredit("j1", 4096),
        SignalJob("j1", signal.SIGINT),
        KillJobsFrom(("l0a",)),
        KillAllJobs(signal.SIGTERM, "the broker is shutting down"),
    )
    assert jobs.calls == [
        ("start", "exec.start"),
        ("write_stdin", "j1", b"input", True),
        ("grant", "j1", 4096),
        ("send_signal", "j1", signal.SIGINT),
        ("kill_from", ("l0a",)),
        ("kill_all", signal.SIGTERM, "the broker is shutting down"),
    ]
    assert broker.local.sent == []  # a job taken is answered by the jobs as it runs
    assert broker.loop.calls == [("wake",)]  # after kill_all: the kills have deadlines


def test_a_job_the_runner_refuses_is_answered_with_this_rank_and_why() -> None:
    broker = Broker(rank=3, children=False, jobs=Jobs(refusal="too many jobs"))
    broker.perform(StartJob(client_request("exec.start", nodeid=3)))
    [answer] = broker.local.sent
    assert answer.payload == {"rank": 3, "error": "too many jobs"} and answer.streaming


def test_forget_watches_ends_a_gone_clients_status_streams_at_rank0() -> None:
    broker = Broker()
    assert broker.status is not None
    mine, other = client_request("status.watch"), client_request("status.watch")
    other.route = ["l0b"]
    broker.status.watchers = [Watcher(mine, 0), Watcher(other, 0)]
    broker.perform(ForgetWatches(("l0a",)))
    assert [w.request for w in broker.status.watchers] == [other]


def test_apply_takes_the_event_through_the_one_path_then_the_continuation() -> None:
    """At rank 0: the table changes, its follow-ups are carried out (here the void of an Online
    refused: a revoke down to rank 1), then the asker's continuation sees the outcome."""
    broker = Broker()
    seen: list[tuple[bool, RankState]] = []

    def then(outcome: Outcome, now: float) -> list[Action]:
        rank = outcome.changed[0] if outcome.changed else 3
        seen.append((outcome.applied, broker.table.entry(rank).state))
        return [Log(logging.INFO, "seen")]

    broker.perform(Apply(Online(1, 1, "node1", 11), then))
    assert seen == [(True, RankState.ONLINE)]  # seen after the table changed
    assert broker.loop.calls == []  # the table changed, but gave no deadline: no wake-up
    broker.perform(Apply(Online(3, 1, "node3", 33)), Apply(Online(3, 1, "node3", 34), then))
    assert seen[-1] == (False, RankState.LOST)  # another broker's hello: voided first
    [revoke] = [m for m in broker.down.sent if m.topic == "flub.revoke"]
    assert (revoke.nodeid, revoke.payload["rank"], revoke.payload["incarnation"]) == (1, 3, 1)


def test_wake_goes_to_the_loop() -> None:
    broker = Broker(rank=3, children=False)
    broker.perform(Wake())
    assert broker.loop.calls == [("wake",)]


def test_apply_anywhere_but_rank0_raises() -> None:
    broker = Broker(rank=1)
    with pytest.raises(CannotPerform, match=r"^Apply on a broker with no rank table"):
        broker.perform(Apply(Lost(3, 1, "gone", 1)))
    assert broker.loop.calls == []


def test_shut_down_and_leave_go_to_the_loop() -> None:
    broker = Broker(rank=3, children=False)
    broker.perform(ShutDown(end_program=False), Leave(0))
    assert broker.loop.calls == [("shut_down", False), ("leave", 0)]


# --- what cannot be performed is an error ---------------------------------------------------

NEEDS_CHILDREN: list[Callable[[], Action]] = [
    lambda: Authorize(1, 1, KEY),
    lambda: Foster(((3, 1, KEY),), 50.0),
    lambda: Revoke(1, 1, "revoked"),
    lambda: Withdraw(((1, 1),)),
    lambda: RetireChild(client_request("retire.order"), 1, 1, {}),
    lambda: Readmit(Rejoin(1, 1, b"id", 9, Message(Kind.CONTROL, "hello")), None, "refused"),
]


@pytest.mark.parametrize("make", NEEDS_CHILDREN)
def test_an_action_for_children_on_a_broker_without_any_raises(
    make: Callable[[], Action],
) -> None:
    broker = Broker(rank=5, children=False)
    action = make()
    name = type(action).__name__
    with pytest.raises(CannotPerform, match=rf"^{name} on a broker with no children \(rank 5\)"):
        broker.perform(action)
    assert broker.local.sent == [] and broker.loop.calls == []


def test_forget_watches_anywhere_but_rank0_raises() -> None:
    broker = Broker(rank=1)
    with pytest.raises(CannotPerform, match=r"^ForgetWatches on a broker with no status"):
        broker.perform(ForgetWatches(("l0a",)))


def test_fostering_nobody_asks_nothing_of_children_a_broker_lacks() -> None:
    broker = Broker(rank=5, children=False)
    broker.perform(Foster((), 50.0))
    assert broker.loop.calls == [("wake",)]


def test_actions_after_one_that_raises_are_not_performed() -> None:
    broker = Broker(rank=5, children=False)
    with pytest.raises(CannotPerform):
        broker.perform(Revoke(1, 1, "revoked"), Leave(0))
    assert broker.loop.calls == []


def test_something_that_is_not_an_action_is_an_error() -> None:
    broker = Broker()
    with pytest.raises(AssertionError):
        broker.perform("respond")  # type: ignore[arg-type]


def test_the_action_union_lists_every_action_the_module_defines() -> None:
    defined = {
        value
        for value in vars(actions).values()
        if isinstance(value, type) and issubclass(value, Record) and value is not Record
    }
    assert set(get_args(Action)) == defined
    assert "GrantCredit" in {kind.__name__ for kind in defined}
