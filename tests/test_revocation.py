"""A revocation reaches every broker that could still admit the old incarnation (issue 20):
rank 0's record of whom it told to admit what (state/admissions.py), the revocations a new
incarnation or a void sends, and a parent's answer to the old broker once it is revoked. Pure:
tables, services and a Children without sockets."""

from __future__ import annotations

from typing import Any

from rank0 import AtRank0, report
from tables import started
from test_children_judge import ACCEPTED, CLOSED, bare_children, hello_message, public_key

from tbon import exitcodes
from tbon.overlay.links.children import Inbound
from tbon.overlay.links.keyring import Identity
from tbon.overlay.services.actions import Action, Call, Send
from tbon.overlay.services.flub import FlubService, flub_attributes
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state.admissions import Admissions
from tbon.overlay.state.ranktable import Lost, Online, RankTable, Reserve
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

CARD = {"endpoint": "tcp://10.0.0.1:5000", "public_key": "P" * 40, "hostname": "parent"}
TOPOLOGY = Topology("kary:2", 15)


def revokes(actions: list[Action]) -> list[tuple[int, int, int]]:
    """(parent, rank, incarnation) of every flub.revoke sent."""
    return [
        (a.message.nodeid, a.message.payload["rank"], a.message.payload["incarnation"])
        for a in actions
        if isinstance(a, Send) and a.message.topic == "flub.revoke"
    ]


def test_a_parent_told_is_remembered_for_that_incarnation_only() -> None:
    admissions = Admissions(TOPOLOGY)
    admissions.told(7, 1, 0)  # a foster parent, an ancestor of 7
    admissions.told(7, 1, 1)
    admissions.told(7, 1, 2)  # not an ancestor of 7: never told, never revoked there
    assert admissions.parents(7, 1) == {0, 1, 3}  # its topology parent always
    assert admissions.parents(7, 2) == {3}
    admissions.told(7, 2, 0)  # a newer incarnation: the older one's revocation has gone out
    assert admissions.parents(7, 1) == {3}
    assert admissions.withdraw(7, 2) == {0, 3}
    assert admissions.parents(7, 2) == {3}  # forgotten once withdrawn


def test_the_record_is_bounded_by_the_depth_of_the_tree() -> None:
    admissions = Admissions(TOPOLOGY)
    for parent in range(15):
        admissions.told(14, 1, parent)
    assert admissions.parents(14, 1) == set(TOPOLOGY.ancestors(14))


class RankZero:
    """Rank 0's table, its one path and FLUB service, as the broker wires them, with every rank
    of kary:2 size 7 online under its own parent, keys known."""

    def __init__(self) -> None:
        self.table: RankTable = started("kary:2", 7)
        attributes = flub_attributes(2, 10, 60, 30)
        self.path = RankPath(self.table)
        flub = FlubService(0, self.table.topology, self.table, Lifecycle(), CARD, attributes)
        self.flub = AtRank0(flub, self.path)
        self.now = 101.0
        for rank in range(1, 7):
            self.report(Online(rank, 1, f"node{rank}", 1000 + rank, None, public_key(rank)))

    def report(self, event: Any) -> list[Action]:
        """Broker.report at rank 0: the event on the one path, with all it calls for."""
        self.now += 1
        return report(self.path, event, self.now)

    def allocate(self, rank: int, key: str) -> list[Action]:
        ask = {"public_key": key, "hostname": "spare", "rank": rank}
        return self.flub.allocate(Message(Kind.REQUEST, "flub.allocate", ask, route=["l01"]), 1)


def test_a_replacement_revokes_the_old_incarnation_at_its_foster_parent_too() -> None:
    """Issue 20, item 1: rank 3, fostered by rank 0 since rank 1 died, is lost and replaced.
    The foster parent, which still keeps the lost broker's key, is told as well as rank 1."""
    zero = RankZero()
    fostered = zero.report(Lost(1, 1, "connection dropped", 0))
    [order] = [a for a in fostered if isinstance(a, Call)]
    assert order.request.topic == "heal.foster" and order.request.nodeid == 0
    zero.report(Online(3, 1, "node3", 1003, 0, public_key(3)))
    zero.report(Lost(3, 1, "silent for 1.5s", 0))
    actions = zero.allocate(3, public_key(33))
    assert sorted(revokes(actions)) == [(0, 3, 1), (1, 3, 1)]
    assert zero.table.entry(3).incarnation == 2


def test_an_old_incarnation_welcomed_back_is_revoked_where_it_was_welcomed() -> None:
    """Should a parent welcome an incarnation rank 0 replaced (its revocation still on the way),
    the Online is refused and the void goes to the parent that reported it, too."""
    zero = RankZero()
    zero.report(Lost(3, 1, "silent", 1))
    zero.allocate(3, public_key(33))
    actions = zero.report(Online(3, 1, "node3", 1003, 0, public_key(3)))
    assert (0, 3, 1) in revokes(actions)


def test_a_lost_foster_child_revoked_is_refused_as_superseded_when_it_knocks() -> None:
    """The foster parent's side: the lost broker's key was kept (it may come back from a
    partition); once rank 0 revokes that incarnation, its hello and its messages on the old
    connection are refused with 77, and it is never welcomed again."""
    children, sent = bare_children(TOPOLOGY, 0)
    children.authorize(3, 1, public_key(3), foster_until=1e9)
    children._connection_event(ACCEPTED, 11)
    first = Inbound()
    children._hello(b"old", 11, Identity(3, 1), hello_message(Identity(3, 1)), 1.0, first)
    assert first.reports[0] == Online(3, 1, "node3", 4242, 0, public_key(3))
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 0)]
    children.revoke(3, 1, "superseded: rank 3 is now incarnation 2")
    sent.clear()
    again = Inbound()
    children._connection_event(ACCEPTED, 12)
    children._hello(b"old2", 12, Identity(3, 1), hello_message(Identity(3, 1)), 2.0, again)
    assert again.reports == []
    assert [(m.topic, m.payload["exit_code"]) for m in sent] == [("refuse", exitcodes.REFUSED)]
    assert "superseded" in sent[0].payload["reason"]
    sent.clear()
    children._refuse_stale(b"old", Identity(3, 1), Message(Kind.CONTROL, "heartbeat", {}))
    assert [(m.topic, m.payload["exit_code"]) for m in sent] == [("refuse", exitcodes.REFUSED)]


# --- one broker, several links (issue 20, item 2) -----------------------------------------------


def welcomed_twice(first: int, second: int) -> RankTable:
    """Rank 7 of kary:2 size 15, adrift after rank 3 was lost, welcomed by rank `first` and
    then by rank `second` (a stale admission and a fresh one), in that order at rank 0."""
    table = started("kary:2", 15)
    for rank in range(1, 15):
        table.apply(Online(rank, 1, f"node{rank}", 1000 + rank, None, public_key(rank)), 101.0)
    assert table.apply(Lost(3, 1, "connection dropped", 1), 200.0).applied
    assert table.entry(7).attached_to is None
    for at, parent in ((201.0, first), (202.0, second)):
        assert table.apply(Online(7, 1, "node7", 1007, parent, public_key(7)), at).applied
    return table


def test_a_parent_the_broker_left_says_lost_and_the_rank_stays_with_the_other() -> None:
    """Both welcomed it; it kept one and left the other, whose `moved` did not arrive: that one
    reports `lost: connection dropped`. The broker runs on at the other, so the rank stays
    online there, and is not handed out again."""
    for kept, left in ((0, 1), (1, 0)):
        for first, second in ((kept, left), (left, kept)):
            table = welcomed_twice(first, second)
            outcome = table.apply(Lost(7, 1, "connection dropped", left), 203.0)
            assert outcome.applied
            entry = table.entry(7)
            assert (entry.state.value, entry.attached_to, entry.pid) == ("online", kept, 1007)
            assert entry.other_links == ()
            grant = table.apply(Reserve(public_key(77), "spare", 7, 30.0), 204.0).reservation
            assert grant is not None and not grant.granted
            # the one it kept reporting it lost is believed: it was its last link
            assert table.apply(Lost(7, 1, "connection dropped", kept), 205.0).applied
            assert table.entry(7).state.value == "lost"


def test_a_parent_with_a_second_link_that_ends_leaves_the_broker_on_the_other() -> None:
    """Rank 1 holds rank 7 by a second link when it is lost itself: rank 7 stays attached to
    rank 0, not adrift."""
    table = welcomed_twice(0, 1)
    assert table.apply(Lost(1, 1, "connection dropped", 0), 203.0).applied
    entry = table.entry(7)
    assert (entry.attached_to, entry.adrift_until, entry.other_links) == (0, None, ())


def test_a_foster_admission_is_withdrawn_once_its_rank_reaches_rank_0_without_it() -> None:
    """Issue 20, items 2 and 6: rank 1 dies and rank 0 admits everything below it; ranks 7
    and 8 never lost their parent. Once rank 3 is fostered, they reach rank 0 through it, so
    their admissions are withdrawn; rank 3's own was used and closes without a word."""
    table = started("kary:2", 15)
    path = RankPath(table)
    for rank in range(1, 15):
        table.apply(Online(rank, 1, f"node{rank}", 1000 + rank, None, public_key(rank)), 101.0)
    actions = report(path, Lost(1, 1, "connection dropped", 0), 200.0)
    assert not [a for a in actions if isinstance(a, Send)]  # nothing is moot yet
    actions = report(path, Online(3, 1, "node3", 1003, 0, public_key(3)), 201.0)
    [withdraw] = [a.message for a in actions if isinstance(a, Send)]
    assert (withdraw.topic, withdraw.nodeid) == ("heal.withdraw", 0)
    assert sorted(map(tuple, withdraw.payload["ranks"])) == [(7, 1), (8, 1)]
    assert sorted(rank for rank, _, _ in path.admissions.open()) == [4, 9, 10]


def test_a_withdrawn_admission_is_forgotten_unless_its_broker_came() -> None:
    children, _ = bare_children(TOPOLOGY, 0)
    children.authorize(7, 1, public_key(7), foster_until=1e9)
    children.authorize(3, 1, public_key(3), foster_until=1e9)
    children._connection_event(ACCEPTED, 11)
    children._hello(b"r3", 11, Identity(3, 1), hello_message(Identity(3, 1)), 1.0, Inbound())
    assert sorted(children.awaited()) == [3, 7]
    children.withdraw(7, 1)
    children.withdraw(3, 1)  # it came: left as it is
    assert children.awaited() == [3] and 7 not in children.sessions
