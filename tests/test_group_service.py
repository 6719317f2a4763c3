"""The root group on a broker (overlay/services/group.py, docs/protocol.md §13.2) without
sockets: group messages and proposals in as plain Messages and Applies, with the time as a
plain number; actions out. The root proposes, sends appends, and acts on an event only once a
majority holds it; a standby keeps its own copy through its own RankPath and gives no orders.
"""

from __future__ import annotations

import errno
from typing import Any

from tables import bring_up, started
from test_perform import Broker, client_request

from tbon.overlay.services.actions import Action, Apply, Call, Respond, Send, Wake
from tbon.overlay.services.group import PAUSED, GroupService, digest
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state import grouptopics, groupwire
from tbon.overlay.state.groupwire import Proposal
from tbon.overlay.state.leadership import AppendEntries, AppendReply, Timing
from tbon.overlay.state.ranktable import Lost, Online, Outcome, RankTable, Reboot
from tbon.overlay.state.replicalog import Entry
from tbon.overlay.state.terms import StaleTerm
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

SPEC, SIZE = "kary:2", 4  # rank 1's child is 3
T0 = 100.0
WAIT = 15.0  # half of broker.join-timeout 30s
GONE = Lost(1, 1, "gone", 0)  # rank 1 lost: its child 3 is fostered (follow-ups)
ORIGIN = {"hosts": [f"node{r}" for r in range(SIZE)], "fixed": False, "grace": 120.0, "now": T0}


KEY = "k" * 40


def root_table() -> Any:
    """Ranks 0 to 3 online; rank 3 (below 1) with a key, so that a foster parent may admit it."""
    table = started(SPEC, SIZE, now=T0)
    bring_up(table, [1, 2], now=T0)
    assert table.apply(Online(3, 1, "node3", 1003, None, KEY), T0).applied
    return table


def root(members: tuple[int, ...] = (0, 1, 2)) -> GroupService:
    return GroupService(
        0, Topology(SPEC, SIZE), members, lambda: 1, T0, WAIT, RankPath(root_table()), ORIGIN
    )


class Asker:
    """A service waiting for its event: its request, and what its continuation was given."""

    def __init__(self) -> None:
        self.request = client_request("flub.allocate")
        self.outcomes: list[Outcome] = []

    def then(self, outcome: Outcome, now: float) -> list[Action]:
        self.outcomes.append(outcome)
        return [Respond(self.request.respond({"answered": True}))]

    def apply(self, event: Any = GONE) -> Apply:
        return Apply(event, self.then, self.request)


def reply_from(
    member: int, match: int, sent_at: float, incarnation: int = 1, ok: bool = True
) -> Message:
    """A standby's group.append-reply as it reaches the root: sent by that broker itself,
    pushed by rank 0's children's side as "c<member>"."""
    payload = groupwire.encode(AppendReply(member, incarnation, 1, ok, match, sent_at))
    return Message(
        Kind.REQUEST, grouptopics.APPEND_REPLY, payload, nodeid=0, route=["s", f"c{member}"]
    )


def group_sends(actions: list[Action]) -> list[Message]:
    return [
        a.message for a in actions if isinstance(a, Send) and a.message.topic.startswith("group.")
    ]


def orders(actions: list[Action]) -> list[Action]:
    """Everything that tells anyone anything: a response, an order down the tree, a call."""
    return [
        a
        for a in actions
        if isinstance(a, Respond | Call)
        or (isinstance(a, Send) and not a.message.topic.startswith("group."))
    ]


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    """Each action by kind and topic (a Call's continuation is a closure: never equal)."""
    shown = []
    for action in actions:
        message = getattr(action, "message", None) or getattr(action, "request", None)
        shown.append((type(action).__name__, message.topic if message is not None else ""))
    return shown


# --- the root ---------------------------------------------------------------------------------


def test_the_root_proposes_and_tells_nobody_until_one_standby_holds_it() -> None:
    group, asker = root(), Asker()
    assert group.active
    before = group.path.table.generation
    out = group.propose(asker.apply(), T0)
    appends = group_sends(out)
    assert sorted(m.nodeid for m in appends) == [1, 2]
    for message in appends:
        sent = groupwire.decode(message.topic, message.payload)
        assert isinstance(sent, AppendEntries) and (sent.prev, sent.commit) == (0, 0)
        assert [e.payload.event for e in sent.entries] == [GONE]  # type: ignore[union-attr]
        assert message.payload["members"] == [0, 1, 2] and message.payload["origin"] == ORIGIN
    assert orders(out) == [] and asker.outcomes == []
    assert group.path.table.generation == before  # not applied: not yet committed
    assert group.next_deadline() is not None and group.waiting

    done = group.receive(reply_from(1, 1, T0), T0 + 0.01)  # one standby: a majority of 3
    assert group.path.table.generation > before
    assert [o.applied for o in asker.outcomes] == [True]
    twin = RankPath(root_table()).handle(GONE, T0)  # the same event on the same table
    assert twin.actions and any(isinstance(a, Call) for a in twin.actions)  # fosters rank 3
    answer = Respond(asker.request.respond({"answered": True}))
    assert kinds(done) == kinds([*twin.actions, answer])  # follow-ups, then the continuation
    assert done[-1] == answer


def test_a_repeated_or_replayed_reply_changes_nothing() -> None:
    group, asker = root(), Asker()
    group.propose(asker.apply(), T0)
    group.receive(reply_from(1, 1, T0), T0 + 0.01)
    generation, commit = group.path.table.generation, group.member.log.commit
    for message in (reply_from(1, 1, T0), reply_from(1, 1, T0), reply_from(2, 1, T0)):
        assert group.receive(message, T0 + 0.02) == []
    assert (group.path.table.generation, group.member.log.commit) == (generation, commit)
    assert len(asker.outcomes) == 1  # the continuation ran once


def test_an_ack_from_an_older_incarnation_of_a_standby_is_ignored() -> None:
    """Rank 1 was refilled (incarnation 2, holding nothing); a late reply of its first
    incarnation, which held the entry, does not commit it."""
    group, asker = root(), Asker()
    group.propose(asker.apply(), T0)
    group.receive(reply_from(1, 0, T0, incarnation=2), T0 + 0.01)
    assert group.receive(reply_from(1, 1, T0, incarnation=1), T0 + 0.02) == []
    assert group.member.log.commit == 0 and asker.outcomes == []
    group.receive(reply_from(1, 1, T0, incarnation=2), T0 + 0.03)  # the new one holds it
    assert group.member.log.commit == 1 and len(asker.outcomes) == 1


def test_a_refusal_or_a_reply_of_nothing_held_does_not_commit() -> None:
    group, asker = root(), Asker()
    group.propose(asker.apply(), T0)
    out = group.receive(reply_from(1, 0, T0, ok=False), T0 + 0.01)
    assert group_sends(out) and orders(out) == []  # the root steps back and sends again
    group.receive(reply_from(2, 0, T0), T0 + 0.01)
    assert group.member.log.commit == 0 and asker.outcomes == []


def test_with_no_standby_answering_the_waiting_request_is_refused_etimedout() -> None:
    group, asker = root(), Asker()
    group.propose(asker.apply(), T0)
    refusals: list[Message] = []
    now = T0
    while now < T0 + WAIT + 1:  # the loop's turns, a heartbeat apart
        now += Timing().heartbeat
        refusals += [a.message for a in group.tick(now) if isinstance(a, Respond)]
        if not refusals:
            assert now < T0 + WAIT + 1e-9, "refused only at its deadline, if not before"
    [refused] = refusals
    assert refused.errnum == errno.ETIMEDOUT
    assert refused.errstr == PAUSED.format("0,1,2")
    assert (
        refused.errstr == "grants are paused: no majority of the root group (ranks 0,1,2) answers"
    )
    assert asker.outcomes == [] and group.view(now)["paused"] is True  # type: ignore[index]


def test_a_request_while_grants_are_paused_waits_out_its_time_then_is_refused() -> None:
    group = root()
    now = T0
    while group.member.is_root:  # no standby answers: the root steps down
        now += Timing().heartbeat
        group.tick(now)
    asker = Asker()
    out = group.propose(asker.apply(), now)
    assert group_sends(out) == [] and orders(out) == [] and group.waiting
    assert [a for a in group.tick(now + WAIT - 0.01) if isinstance(a, Respond)] == []
    [refused] = [a.message for a in group.tick(now + WAIT) if isinstance(a, Respond)]
    assert (refused.errnum, refused.errstr) == (errno.ETIMEDOUT, PAUSED.format("0,1,2"))
    assert not any(isinstance(a, Respond) for a in group.tick(now + WAIT + 1))  # once
    assert asker.outcomes == []


# --- a root that steps down: every waiting request is answered (protocol §13.3, §13.5) ---------


SUPERSEDED = "superseded: rank 1 is the root in term 2; ask again"


def refused(actions: list[Action]) -> list[tuple[int, str]]:
    return [(a.message.errnum, a.message.errstr) for a in actions if isinstance(a, Respond)]


def superseded_root() -> tuple[GroupService, list[tuple[int, int]]]:
    group = root()
    told: list[tuple[int, int]] = []
    group.on_superseded = lambda root, term: told.append((root, term))
    return group, told


def test_a_stale_term_with_its_root_answers_each_waiting_request_and_supersedes() -> None:
    group, told = superseded_root()
    first, second = Asker(), Asker()
    group.propose(first.apply(), T0)
    group.propose(second.apply(Lost(2, 1, "gone", 0)), T0)
    out = group.stale(StaleTerm(2), 1, T0 + 0.01)  # an ESTALE answer: rank 1 leads term 2
    assert refused(out) == [(errno.ETIMEDOUT, SUPERSEDED)] * 2
    assert told == [(1, 2)] and not group.leads and not group.waiting
    assert group.member.term == 2 and not group.member.is_root
    assert first.outcomes == second.outcomes == []
    assert refused(group.tick(T0 + WAIT + 1)) == []  # once: nothing is left to answer


def test_a_stale_term_of_no_known_root_steps_down_and_the_broker_stays() -> None:
    group, told = superseded_root()
    asker = Asker()
    group.propose(asker.apply(), T0)
    out = group.stale(StaleTerm(3), None, T0 + 0.01)
    assert refused(out) == [(errno.ETIMEDOUT, PAUSED.format("0,1,2"))]
    assert told == [] and group.leads and not group.member.is_root
    late = Asker()  # asked now: it waits, queued, for a root, then its time runs out
    assert refused(group.propose(late.apply(Lost(2, 1, "gone", 0)), T0 + 0.02)) == []
    assert refused(group.tick(T0 + 0.02 + WAIT)) == [(errno.ETIMEDOUT, PAUSED.format("0,1,2"))]


def test_a_request_queued_at_a_root_that_stepped_down_is_answered_when_a_successor_leads() -> None:
    group, told = superseded_root()
    now = T0
    while group.member.is_root:  # no standby answers: the root steps down, grants paused
        now += Timing().heartbeat
        group.tick(now)
    asker = Asker()
    group.propose(asker.apply(), now)
    assert group.waiting and told == []
    # rank 1 was elected in term 2 and its first append reaches rank 0
    payload = groupwire.encode(AppendEntries(1, 2, 0, 0, (), 0, now)) | {"members": [0, 1, 2]}
    append = Message(Kind.REQUEST, grouptopics.APPEND, payload, nodeid=0, route=["s", "c1"])
    out = group.receive(append, now + 0.01)
    assert refused(out) == [(errno.ETIMEDOUT, SUPERSEDED)]
    assert told == [(1, 2)] and not group.waiting and asker.outcomes == []


def test_without_standbys_the_service_is_idle_and_an_apply_goes_straight_through() -> None:
    broker = Broker()
    group = GroupService(0, Topology("kary:2", 7), (), lambda: 1, T0, WAIT, broker.path, ORIGIN)
    assert not group.active and group.view(T0) is None and group.next_deadline() is None
    assert group.tick(T0 + 100) == []
    broker.performer.group = group
    asker = Asker()
    before = broker.table.generation
    broker.perform(Apply(Online(1, 1, "node1", 11), asker.then, asker.request))
    assert broker.table.generation > before and [o.applied for o in asker.outcomes] == [True]
    sent = broker.down.sent + broker.local.sent
    assert not any(m.topic.startswith("group.") for m in sent)


def test_with_standbys_the_performer_proposes_and_the_appends_go_down() -> None:
    broker = Broker()
    group = GroupService(
        0, Topology("kary:2", 7), (0, 1, 2), lambda: 1, T0, WAIT, broker.path, ORIGIN
    )
    broker.performer.group = group
    asker = Asker()
    before = broker.table.generation
    broker.perform(Apply(Online(1, 1, "node1", 11), asker.then, asker.request))
    assert broker.table.generation == before and asker.outcomes == []
    assert sorted((m.topic, m.nodeid) for m in broker.down.sent) == [
        (grouptopics.APPEND, 1),
        (grouptopics.APPEND, 2),
    ]
    assert broker.local.sent == []  # the asker hears nothing yet


# --- a standby --------------------------------------------------------------------------------


def append_to(
    member: int, entries: tuple[Entry[Proposal], ...], commit: int, prev: int = 0, route: Any = None
) -> Message:
    message = AppendEntries(0, 1, prev, 1 if prev else 0, entries, commit, T0)
    payload = groupwire.encode(message) | {"members": [0, 1, 2], "origin": ORIGIN}
    return Message(
        Kind.REQUEST, grouptopics.APPEND, payload, nodeid=member, route=route or ["s", "p0"]
    )


def standby(rank: int = 1, incarnation: int = 1) -> GroupService:
    return GroupService(rank, Topology(SPEC, SIZE), (), lambda: incarnation, T0, WAIT)


LOG = (
    Entry(1, Proposal(Online(0, 1, "node0", 1000), T0)),
    Entry(1, Proposal(Online(1, 1, "node1", 1001), T0)),
    Entry(1, Proposal(Online(3, 1, "node3", 1003, None, KEY), T0)),
    Entry(1, Proposal(GONE, T0 + 1)),
)


def test_a_standby_applies_what_is_committed_and_drops_the_orders() -> None:
    group = standby()
    assert not group.active
    out = group.receive(append_to(1, LOG, commit=3), T0 + 1)
    [reply] = group_sends(out)
    assert (reply.topic, reply.nodeid) == (grouptopics.APPEND_REPLY, 0)
    answered = groupwire.decode(reply.topic, reply.payload)
    assert isinstance(answered, AppendReply) and (answered.ok, answered.match) == (True, 4)
    assert group.member.applied == 3 and group.path.table.entry(3).state.name == "ONLINE"
    out = group.receive(append_to(1, (), commit=4, prev=4), T0 + 1.1)  # commits GONE
    assert group.path.table.entry(1).state.name == "LOST"
    assert orders(out) == [] and not any(isinstance(a, Wake) for a in out)  # no foster order

    twin = RankPath(RankTable(Topology(SPEC, SIZE), ORIGIN["hosts"], T0))  # as the root's
    followed = [twin.handle(e.payload.event, e.payload.now) for e in LOG]  # type: ignore[union-attr]
    assert any(isinstance(a, Call) for a in followed[-1].actions)  # the root fosters rank 3
    assert digest(group.path.table) == digest(twin.table)
    assert digest(twin.table) != digest(root_table())


def test_a_standby_refuses_appends_from_anyone_but_the_root() -> None:
    group = standby()
    forged = [
        append_to(1, LOG, 3, route=["s", "p2", "p1"]),  # rank 2's own request, down through 1?
        append_to(1, LOG, 3, route=["l0a", "p0"]),  # a client of rank 0
        append_to(1, LOG, 3, route=["s", "c3"]),  # rank 3, its child, going up
    ]
    for message in forged:
        out = group.receive(message, T0)
        assert group_sends(out) == [] and group.member is None and group.path is None
        assert "not from a member" in out[0].text  # type: ignore[attr-defined]
    other = append_to(1, LOG, 3)
    other.payload["sender"] = 2  # says it is rank 2, yet came down from rank 0
    out = group.receive(other, T0)
    assert group_sends(out) == [] and group.member is None


def test_a_rank_outside_the_group_or_a_bad_append_is_ignored() -> None:
    group = standby(rank=3)  # not in the members the root names
    out = group.receive(append_to(3, LOG, 3), T0)
    assert group_sends(out) == [] and group.member is None
    group = standby()
    bad = append_to(1, LOG, 3)
    bad.payload["entries"] = "[]"
    out = group.receive(bad, T0)
    assert group_sends(out) == [] and "ignored" in out[0].text  # type: ignore[attr-defined]


def test_group_state_answers_term_indexes_and_digest() -> None:
    group = standby()
    request = client_request("group.state", nodeid=1)
    [refused] = group.state(request, T0)
    assert refused.message.errnum == errno.ENOENT  # type: ignore[attr-defined]
    group.receive(append_to(1, LOG, commit=2), T0)
    [answer] = group.state(request, T0)
    assert isinstance(answer, Respond)
    assert answer.message.payload == {
        "rank": 1,
        "term": 1,
        "root": False,
        "last": 4,
        "commit": 2,
        "applied": 2,
        "digest": digest(group.path.table),
    }
    at_root = root()
    [answer] = at_root.state(request, T0)
    assert answer.message.payload["root"] is True and answer.message.payload["last"] == 0  # type: ignore[attr-defined]


def test_status_view_shows_each_standbys_acknowledged_index_and_lag() -> None:
    group = root()
    for _ in range(3):
        group.propose(Asker().apply(Online(2, 1, "node2", 2)), T0)
    group.receive(reply_from(1, 2, T0), T0 + 0.01)
    view = group.view(T0 + 0.02)
    assert view == {
        "term": 1,
        "index": 3,
        "commit": 2,
        "paused": False,
        "standbys": [
            {"rank": 1, "acked": 2, "lag": 1, "voter": True},  # its reply said so
            {"rank": 2, "acked": 0, "lag": 3, "voter": False},  # not heard from yet
        ],
    }
    assert group.view(T0 + 5)["paused"] is True  # type: ignore[index]  # the lease ran out


def test_an_unasked_event_repeated_while_it_waits_is_proposed_once() -> None:
    """The loop's timers find the same lapsed reservation or adrift rank at each turn until it
    is applied: a report's event is not proposed again meanwhile; a request's always is."""
    group = root()
    assert group_sends(group.propose(Apply(GONE), T0))
    assert group.propose(Apply(GONE), T0 + 0.01) == []
    assert group_sends(group.propose(Asker().apply(), T0 + 0.02))
    assert group.member.log.last == 2


def config_root() -> GroupService:
    """The founding root of a config-booted instance: every other rank booting, none online."""
    table = started(SPEC, SIZE, now=T0, fixed=True)
    origin = {**ORIGIN, "fixed": True}
    return GroupService(
        0, Topology(SPEC, SIZE), (0, 1, 2), lambda: 1, T0, WAIT, RankPath(table), origin
    )


def test_a_config_ranks_first_hello_is_answered_before_the_group_has_formed() -> None:
    """The members of a config-booted instance are at rank 0's door with the shared key: their
    first Reboot changes nothing (incarnation 1, the launch's), and no member has answered yet,
    so no other root can exist: answered at once, or the group could never form (§13.2)."""
    service = config_root()
    asker = Asker()
    generation = service.path.table.generation
    actions = service.propose(asker.apply(Reboot(1, 0)), T0)
    assert [o.applied for o in asker.outcomes] == [True]
    assert any(isinstance(a, Respond) for a in actions)
    assert service.path.table.generation == generation and not service.waiting
    assert service.path.table.entry(1).incarnation == 1


def test_once_a_member_has_answered_every_event_waits_for_the_group() -> None:
    service = config_root()
    service.propose(Asker().apply(Reboot(1, 0)), T0)
    service.receive(reply_from(1, 0, T0), T0 + 0.01)  # rank 1 answers: the group has formed
    asker = Asker()
    service.propose(asker.apply(Reboot(2, 0)), T0 + 0.02)
    assert asker.outcomes == [] and service.waiting  # proposed: waits for a majority


def test_an_event_that_changes_the_table_waits_for_the_group_even_before_it_formed() -> None:
    service = config_root()
    asker = Asker()
    service.propose(asker.apply(GONE), T0)  # not a no-op: rank 1's loss
    assert asker.outcomes == [] and service.waiting
