"""The broker's router without sockets: dispatch by topic, routing by rank, and the calls a
broker makes itself (overlay/broker/router.py). Links are recorders: each keeps what it was
asked to send."""

from __future__ import annotations

import errno
from collections.abc import Set as AbstractSet
from typing import Any

from tables import bring_up, started

from tbon.overlay.broker.router import Router
from tbon.overlay.links.downward import (
    Accepted,
    Admit,
    Closed,
    Downward,
    Hello,
    Settle,
    Tick,
    Timing,
)
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.uplink import _skip_to
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message


class Recorder:
    """Stands in for a link: records what it is given, and says whether the peer is there."""

    def __init__(self, present: bool = True) -> None:
        self.sent: list[Any] = []
        self.present = present

    def send(self, *args: Any) -> bool:
        self.sent.append(args[-1] if len(args) > 1 else args[0])
        return self.present

    welcomed = True  # as the link up: attached to its parent
    fosters: frozenset[int] = frozenset()  # as the children: no foster child attached

    def send_response(self, reply: Any, came_from: int | None) -> bool:
        return self.send(reply)

    def attached(self, rank: int) -> bool:
        """As the children: whether `rank` is attached here."""
        return self.present


class Setup:
    def __init__(self, rank: int = 0, table: RankTable | None = None, **handlers: Any) -> None:
        self.topology = table.topology if table is not None else Topology("kary:2", 7)
        self.parent = Recorder() if rank else None
        self.children = Recorder()
        self.local = Recorder()
        self.performed: list[Action] = []
        self.local_requests: list[tuple[str, str]] = []
        self.router = Router(
            rank,
            self.topology,
            table,
            (self.parent, self.children, self.local),  # type: ignore[arg-type]
            {topic.replace("_", "."): handler for topic, handler in handlers.items()},
            frozenset({"status.get"}),
            self.perform,
            lambda hop, message: self.local_requests.append((hop, message.topic)),
            call_timeout=5.0,
        )

    def perform(self, actions: list[Action]) -> None:
        self.performed += actions
        for action in actions:
            if isinstance(action, Respond):
                self.router.respond(action.message)


def request(topic: str, nodeid: int = 0, **payload: Any) -> Message:
    return Message(Kind.REQUEST, topic, payload, nodeid=nodeid, tag=3)


def test_a_topic_is_served_by_the_handler_its_table_names() -> None:
    def echo(message: Message, now: float) -> list[Action]:
        return [Respond(message.respond({"now": now, **message.payload}))]

    setup = Setup(broker_ping=echo)
    setup.router.route(request("broker.ping", x=1), "l0a", 9.0)
    [answer] = setup.local.sent
    assert answer.payload == {"now": 9.0, "x": 1} and answer.kind is Kind.RESPONSE
    assert setup.local_requests == [("l0a", "broker.ping")]


def test_unknown_topics_are_enosys_and_a_failing_handler_is_an_answer_not_a_crash() -> None:
    def broken(message: Message, now: float) -> list[Action]:
        raise RuntimeError("boom")

    setup = Setup(broker_ping=broken)
    setup.router.route(request("no.such"), "l0a", 0.0)
    setup.router.route(request("broker.ping"), "l0a", 0.0)
    unknown, failed = setup.local.sent
    assert unknown.errnum == errno.ENOSYS and "no.such" in unknown.errstr
    assert failed.errnum == errno.EPROTO and "Traceback" not in failed.errstr


def test_requests_travel_one_hop_toward_their_rank() -> None:
    setup = Setup(rank=1)
    setup.router.route(request("broker.ping", nodeid=4), "l0a", 0.0)  # 4 is below 1 (kary:2)
    setup.router.route(request("broker.ping", nodeid=2), "l0a", 0.0)  # 2 is 0's: up
    assert [m.nodeid for m in setup.children.sent] == [4]
    assert [m.nodeid for m in setup.parent.sent] == [2]  # type: ignore[union-attr]
    assert setup.children.sent[0].route == ["l0a"]


def test_rank0_refuses_ranks_that_do_not_exist_or_are_not_connected() -> None:
    table = started("kary:2", 4)
    bring_up(table, [1])
    setup = Setup(table=table)
    setup.router.route(request("broker.ping", nodeid=9), "l0a", 0.0)
    setup.router.route(request("broker.ping", nodeid=3), "l0a", 0.0)  # offline
    missing, offline = setup.local.sent
    assert missing.errnum == errno.ENOENT
    assert offline.errnum == errno.EHOSTUNREACH and offline.errstr == "rank 3 is offline"
    setup.children.present = False
    setup.router.route(request("broker.ping", nodeid=1), "l0a", 0.0)
    assert setup.local.sent[-1].errstr == "rank 1 is not connected"


def test_a_call_gets_the_answer_that_comes_back_by_its_own_link() -> None:
    setup = Setup()
    answers: list[Message] = []
    setup.router.call(
        request("flub.authorize", nodeid=1), lambda r, now: answers.append(r) or [], 0.0
    )
    [sent] = setup.children.sent
    assert sent.route == ["s"] and sent.tag > 0
    forged = sent.respond({"endpoint": "tcp://attacker:1"})
    setup.router.route(forged, "l0b", 0.1)  # a local client answering in the parent's place
    from_elsewhere = sent.respond({"endpoint": "tcp://attacker:2"})
    setup.router.route(from_elsewhere, "c2", 0.1)  # another child
    assert answers == []
    genuine = sent.respond({"endpoint": "tcp://parent:1"})
    setup.router.route(genuine, "c1", 0.2)
    assert [a.payload["endpoint"] for a in answers] == ["tcp://parent:1"]
    setup.router.route(sent.respond({"endpoint": "again"}), "c1", 0.3)
    assert len(answers) == 1  # one answer per call


def test_a_call_that_cannot_leave_is_answered_here_and_an_unanswered_one_times_out() -> None:
    setup = Setup()
    answers: list[Message] = []
    setup.children.present = False
    setup.router.call(request("retire.order", nodeid=1), lambda r, now: answers.append(r) or [], 0)
    assert answers[-1].errnum == errno.EHOSTUNREACH
    setup.children.present = True
    setup.router.call(request("retire.order", nodeid=2), lambda r, now: answers.append(r) or [], 0)
    assert setup.router.next_deadline() == 5.0
    setup.router.expire(4.9)
    assert len(answers) == 1
    setup.router.expire(5.0)
    assert answers[-1].errnum == errno.ETIMEDOUT and answers[-1].topic == "retire.order"
    assert setup.router.next_deadline() is None


def test_tags_of_calls_are_not_a_counter() -> None:
    setup = Setup()
    for _ in range(3):
        setup.router.call(request("broker.ping", nodeid=1), lambda r, now: [], 0.0)
    tags = [m.tag for m in setup.children.sent]
    assert len(set(tags)) == 3 and tags != [1, 2, 3]


# --- a tree that healed: foster children and the hops of brokers that went (protocol.md §12) ---


class Fostering:
    """Stands in for a parent's children where some are foster children: records (rank, what)."""

    def __init__(self, attached: set[int], fosters: set[int]) -> None:
        self.attached_ranks = attached
        self.fosters = fosters
        self.sent: list[tuple[int, Message]] = []

    def attached(self, rank: int) -> bool:
        return rank in self.attached_ranks

    def send(self, rank: int, message: Message) -> bool:
        if rank not in self.attached_ranks:
            return False
        self.sent.append((rank, message))
        return True


def fostering_router(rank: int, attached: set[int], fosters: set[int]) -> tuple[Router, Fostering]:
    children = Fostering(attached, fosters)
    router = Router(
        rank,
        Topology("kary:2", 31),  # 0 - 1 - 3 - 7 - 15
        None,
        (Recorder() if rank else None, children, Recorder()),  # type: ignore[arg-type]
        {},
        frozenset(),
        lambda actions: None,
        lambda hop, message: None,
        call_timeout=5.0,
    )
    return router, children


def test_a_request_goes_to_the_deepest_broker_on_its_way_that_is_attached_here() -> None:
    router, _ = fostering_router(0, attached={2, 7}, fosters={7})  # 1 and 3 are gone
    assert router.hop_down(15) == 7 and router.hop_down(7) == 7
    assert router.hop_down(5) == 2
    assert router.hop_down(4) == 1  # nobody on its way is attached: the topology's child


def test_a_response_skips_the_hops_of_brokers_that_went_on_its_way_down() -> None:
    """A request from a client of rank 15 went up 15 -> 7 -> 3 -> 1 -> 0; since then 1 and 3
    have gone and 7 is fostered at 0: the answer skips their hops and reaches 7."""
    router, children = fostering_router(0, attached={2, 7}, fosters={7})
    reply = Message(Kind.RESPONSE, "x", route=["l5", "c15", "c7", "c3", "c1"])
    assert router.respond(reply, "here")
    assert children.sent == [(7, reply)] and reply.route == ["l5", "c15"]
    lost = Message(Kind.RESPONSE, "x", route=["l5", "c4", "c1"])  # 4's way: nobody attached
    assert not router.respond(lost, "here")


def test_a_response_going_up_skips_the_hops_of_brokers_that_went() -> None:
    """Rank 0's client asked rank 7 by way of 1 and 3; rank 7 is now fostered at rank 1."""
    reply = Message(Kind.RESPONSE, "x", route=["l9", "p0", "p1"])  # 1 and 3 pushed these
    assert _skip_to(reply, 3, 1) and reply.route == ["l9", "p0"]  # 3's hop off: 1's on top
    same = Message(Kind.RESPONSE, "x", route=["l9", "p0"])
    assert _skip_to(same, 1, 1) and same.route == ["l9", "p0"]
    nowhere = Message(Kind.RESPONSE, "x", route=["l9"])  # 3 answered its own client
    assert not _skip_to(nowhere, 3, 1)
    past = Message(Kind.RESPONSE, "x", route=["l9", "p0", "p1"])  # its new parent not on the way
    assert not _skip_to(past, 3, 2)


# --- a root that took over (protocol.md §13.4): answers that went down through the dead root ---


def test_an_answer_down_through_the_dead_root_comes_back_to_the_new_root_and_its_client() -> None:
    """Rank 1 took over from rank 0 (no parent now). A job's output at rank 3 for a client of
    rank 1 went up to rank 0 ("c1") and down again ("p0" at 1, "p1" at 3): it skips rank 0."""
    setup = Setup(rank=1)
    setup.router.parent = None
    reply = request("exec.start", nodeid=3).respond({"rank": 3}, streaming=True)
    reply.route = ["l05", "c1", "p0"]  # "p1" was popped at rank 3
    assert setup.router.respond(reply, "c3")
    assert setup.local.sent == [reply] and reply.route == []
    # from a client of another child of the dead root: down to it, if it is attached here
    other = request("exec.start", nodeid=3).respond({"rank": 3}, streaming=True)
    other.route = ["l07", "c2", "p0"]
    assert setup.router.respond(other, "c3")
    assert setup.children.sent == [other] and other.route == ["l07"]


def test_an_answer_for_the_dead_roots_own_client_goes_nowhere() -> None:
    setup = Setup(rank=1)
    setup.router.parent = None
    for route in (["l05", "p0"], ["s", "p0"], ["p0"]):
        reply = request("exec.start", nodeid=3).respond({"rank": 3}, streaming=True)
        reply.route = list(route)
        assert not setup.router.respond(reply, "c3")
    assert setup.local.sent == [] and setup.children.sent == []


def test_a_member_that_moved_here_is_reached_directly_not_by_the_way_it_came_up_before() -> None:
    """Rank 1 took over. Rank 5's requests once came up by rank 2 (5 hung under member 2 across
    the dead root), so rank 2 was its way down; then rank 5 moved and is attached here itself:
    that link wins over the older news (a request sent to 2 would find no way to 5 there)."""
    router, children = fostering_router(1, attached={2}, fosters={2})
    router.parent = None
    router._learn_across(["s", "c5", "c2"])
    assert router._link_toward(5) == "c2"
    children.attached_ranks.add(5)
    children.fosters.add(5)
    assert router._link_toward(5) == "c5"


def test_exec_fan_out_at_a_new_root_finds_a_member_hung_under_another_member() -> None:
    """Rank 1 took over; rank 2's requests came up by rank 5, attached here across the dead
    root: exec's fan-out (hop_down) sends rank 2's copy there, as a request is routed, not to
    the dead rank 0 (`rank 0 is not connected`)."""
    router, _ = fostering_router(1, attached={5}, fosters={5})
    router.parent = None
    router._learn_across(["s", "c2", "c5"])
    assert router.hop_down(2) == 5 == int(router._link_toward(2)[1:])
    assert router.hop_down(3) == 3  # below it: the topology's child, as ever


class Attached:
    """The router's view of a parent's children, read from a real Downward machine."""

    def __init__(self, machine: Downward) -> None:
        self.machine = machine

    @property
    def fosters(self) -> AbstractSet[int]:
        return self.machine.fosters

    def attached(self, rank: int) -> bool:
        return self.machine.attached(rank)


def test_a_foster_child_that_comes_and_goes_is_seen_by_the_very_next_hop_down() -> None:
    """The foster set the router asks per target is kept by the sessions (links/sessions.py),
    not found by a walk: a foster admission that connects, and one that goes, change the next
    hop_down at once."""
    topology = Topology("kary:2", 31)  # 0 - 1 - 3 - 7 - 15
    machine = Downward(0, topology, Timing(heartbeat=1.0, torpid=5.0, timeout=10.0))
    router = Router(
        0,
        topology,
        None,
        (None, Attached(machine), Recorder()),  # type: ignore[arg-type]
        {},
        frozenset(),
        lambda actions: None,
        lambda hop, message: None,
        call_timeout=5.0,
    )
    key = "k" * 40
    machine.handle(Admit(7, 1, key, foster_until=5.0), 0.0)  # 1 and 3 went: 7 may come here
    assert machine.fosters == {7} and router.hop_down(15) == 1  # not yet come
    machine.handle(Tick(), 6.0)  # it did not come within its grace: forgotten
    assert machine.fosters == set() and router.hop_down(15) == 1
    machine.handle(Admit(7, 2, key, foster_until=10.0), 6.0)
    machine.handle(Accepted(11), 6.0)
    hello = {"rank": 7, "incarnation": 2, "version": PROTOCOL_VERSION, "hostname": "n", "pid": 9}
    machine.handle(Hello(b"r7", 11, Identity(7, 2), Message(Kind.CONTROL, "hello", hello)), 6.0)
    assert machine.attached(7) and router.hop_down(15) == 7 and router.hop_down(8) == 1
    machine.handle(Closed(11), 7.0)
    machine.handle(Settle(), 7.0)  # lost here: its session ended, not attached
    assert router.hop_down(15) == 1
