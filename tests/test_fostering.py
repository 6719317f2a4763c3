"""The self-healing tree in rank 0's table (issue 12): ranks attached, adrift, fostered, sent
home and returning; the planner that says who fosters whom (healing.py); and the reports that
carry the new fields and events up the tree.

The table is pure, so every rule of ranktable.py's "ranks below one that ended" and "link
events" is tested here directly, then driven at random by a hypothesis state machine against
invariants that do not restate how the table computes them: who reaches rank 0 is found from the
top down, while the table walks up.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tables import specs
from zmq.utils import z85

from tbon.overlay.state.healing import (
    away_from_home,
    cut_off_below,
    foster_parents,
    may_report,
)
from tbon.overlay.state.rankstates import CONFIG_PHASES, roll_up
from tbon.overlay.state.ranktable import (
    CONNECTED,
    Departed,
    Dropped,
    Event,
    Expire,
    Lost,
    Moved,
    Online,
    Outcome,
    Phase,
    RankState,
    RankTable,
    Reboot,
    Reserve,
    Retire,
    Torpid,
    Void,
)
from tbon.overlay.state.reports import decode_event, encode_event
from tbon.overlay.state.snapshot import snapshot as status_json
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import MessageError

GRACE = 10.0
"""A short reattach grace, so that the machine sees ranks expire within a few steps."""


def public_key(seed: int) -> str:
    """A well-formed CURVE public key (Z85, 40 characters), a different one for each seed."""
    return z85.encode(seed.to_bytes(32, "big")).decode()


def healing_table(
    spec: str, size: int, *, fixed: bool = False, launched: int | None = None, now: float = 100.0
) -> RankTable:
    """A table with a short reattach grace whose rank 0 is online, as the broker makes it."""
    hosts = [f"node{rank}" for rank in range(size if launched is None else launched)]
    result = RankTable(Topology(spec, size), hosts, now, fixed=fixed, reattach_grace=GRACE)
    assert result.apply(Online(0, 1, "node0", 1000), now).applied
    return result


def hello(result: RankTable, rank: int, parent: int | None = None, keyed: bool = True) -> Online:
    """The Online a parent reports for `rank`'s current broker (its pid is 1000 + rank, unless
    a broker already holds it): with its own key, the joiner's, or "" for the shared one."""
    entry = result.entry(rank)
    shared = entry.phase in CONFIG_PHASES or not keyed
    key = "" if shared else entry.key or public_key(rank)
    pid = entry.pid if entry.pid is not None else 1000 + rank
    return Online(rank, entry.incarnation, entry.host, pid, parent, key)


def up(result: RankTable, ranks: list[int], now: float = 101.0, keyed: bool = True) -> None:
    """Welcome each rank under its topology parent, in order (parents first)."""
    for rank in ranks:
        assert result.apply(hello(result, rank, keyed=keyed), now).applied, rank


def frozen(result: RankTable) -> tuple[Any, ...]:
    """Everything the table holds, to tell that a refused event touched nothing."""
    entries = tuple(entry.fields() for entry in result.entries)
    return result.generation, entries, dict(result.retired_keys)


def chain(size: int = 5, **kwargs: Any) -> RankTable:
    """0 - 1 - 2 - ... (kary:1), every rank online under its parent."""
    result = healing_table("kary:1", size, **kwargs)
    up(result, list(range(1, size)))
    return result


# --- attached and adrift ----------------------------------------------------------------------


def test_online_attaches_a_rank_to_the_broker_that_welcomed_it() -> None:
    #        0
    #      1   2
    #     3 4 5 6
    result = healing_table("kary:2", 7)
    up(result, [1, 3])
    assert [result.entry(rank).attached_to for rank in (0, 1, 3)] == [None, 0, 1]
    assert result.entry(3).key == public_key(3)
    fostered = result.apply(hello(result, 4, parent=0), 102.0)  # welcomed by its grandparent
    assert fostered.applied and result.entry(4).attached_to == 0
    stranger = result.apply(hello(result, 5, parent=1), 102.0)  # rank 1 is not above rank 5
    assert not stranger.applied and stranger.reason == "rank 1 is not an ancestor of rank 5"
    away = result.apply(hello(result, 6, parent=2), 102.0)  # its own parent, which is not up
    assert not away.applied and away.reason == "rank 6's parent is not online"
    assert all(result.entry(rank).adrift_until is None for rank in range(7))


def test_the_ranks_attached_to_one_that_ends_go_adrift_and_stay_online() -> None:
    """Only the links that went to the rank that ended are cut; those below keep theirs."""
    result = chain(5)
    outcome = result.apply(Lost(2, 1, "connection dropped", parent=1), 200.0)
    assert outcome.applied and outcome.changed == (2, 3)
    states = [entry.state.value for entry in result.entries]
    assert states == ["online", "online", "lost", "online", "online"]
    assert (result.entry(3).attached_to, result.entry(3).adrift_until) == (None, 200.0 + GRACE)
    assert (result.entry(4).attached_to, result.entry(4).adrift_until) == (3, None)
    assert [result.reachable(rank) for rank in range(5)] == [True, True, False, False, False]
    assert [status.value for status in result.subtree_statuses()] == [
        "degraded",
        "degraded",
        "lost",
        "full",
        "full",
    ]


def test_an_online_repeat_from_a_foster_parent_reattaches_it() -> None:
    result = chain(4)
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    generation = result.generation
    outcome = result.apply(hello(result, 2, parent=0), 201.0)
    assert outcome.applied and outcome.changed == (2,) and result.generation == generation + 1
    assert (result.entry(2).attached_to, result.entry(2).adrift_until) == (0, None)
    assert result.entry(2).since == 101.0  # it never stopped being online
    assert result.reachable(3)  # the whole subtree is reachable again at once
    again = result.apply(hello(result, 2, parent=0), 202.0)
    assert again.applied and again.changed == () and result.generation == generation + 1
    other = Online(2, 1, "node2", 4242, 0, public_key(2))
    assert not result.apply(other, 203.0).applied  # another broker as the same incarnation
    home = result.apply(hello(result, 2, parent=1), 203.0)  # rank 1 is lost
    assert not home.applied and home.reason == "rank 2's parent is not online"


@pytest.mark.parametrize(
    "event",
    [
        Lost(2, 1, "late", parent=1),
        Departed(2, 1, parent=1),
        Torpid(2, 1, True, parent=1),
        Moved(2, 1, 1, 0),
        Lost(2, 1, "wrong", parent=3),
    ],
    ids=["lost", "departed", "torpid", "moved", "not-a-link"],
)
def test_link_events_from_a_link_the_rank_left_change_nothing(event: Event) -> None:
    """Its old parent, woken from a stop, reports on a link the rank has left."""
    result = chain(4)
    result.apply(Lost(1, 1, "silent for 5.0s", parent=0), 200.0)
    adrift = frozen(result)
    refused = result.apply(event, 201.0)
    assert not refused.applied and refused.changed == ()
    assert refused.reason == f"rank 2 is reattaching: rank {event.parent}'s word on it is stale"
    assert frozen(result) == adrift
    result.apply(hello(result, 2, parent=0), 202.0)
    fostered = frozen(result)
    refused = result.apply(event, 203.0)
    assert not refused.applied
    assert refused.reason == f"rank 2 is attached to rank 0, not to rank {event.parent}"
    assert frozen(result) == fostered


def test_link_events_from_the_link_it_is_on_or_from_rank_0_are_believed() -> None:
    result = chain(4)
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    result.apply(hello(result, 2, parent=0), 201.0)
    assert result.apply(Torpid(2, 1, True, parent=0), 202.0).changed == (2,)
    assert result.apply(Torpid(3, 1, True, parent=2), 202.0).changed == (3,)
    assert result.apply(Departed(3, 1), 203.0).applied  # rank 0's own word
    assert result.apply(Lost(2, 1, "connection dropped", parent=0), 204.0).applied
    assert result.entry(2).state is RankState.LOST


def fostered_then_parent_replaced() -> RankTable:
    """chain(4) after rank 1 was lost (rank 2 fostered at rank 0) and refilled by a joiner, as
    incarnation 2, by time 203: rank 2 is away from home."""
    result = chain(4)
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    result.apply(hello(result, 2, parent=0), 201.0)
    grant = result.apply(Reserve(public_key(101), "joiner", 1, 30.0), 202.0).reservation
    assert grant is not None and grant.granted
    assert result.apply(Online(1, 2, "joiner", 77, None, public_key(101)), 203.0).applied
    return result


def test_moved_ends_the_old_link_for_a_new_one_in_either_order() -> None:
    """Rank 2, fostered at rank 0, goes home to rank 1's replacement: the new parent's Online
    and the old one's Moved may reach rank 0 in either order."""
    for moved_first in (True, False):
        result = fostered_then_parent_replaced()
        assert away_from_home(result, 1) == [(2, 1, public_key(2))]
        moved, online = Moved(2, 1, 0, to=1), hello(result, 2, parent=1)
        first, second = (moved, online) if moved_first else (online, moved)
        assert result.apply(first, 204.0).changed == (2,)
        later = result.apply(second, 205.0)
        if moved_first:  # the Online then only repeats the move
            assert later.applied and later.changed == ()
        else:  # the Moved after ends the old link, which the table kept until then
            assert later.applied and result.entry(2).other_links == ()
        assert (result.entry(2).attached_to, result.entry(2).adrift_until) == (1, None)
        assert away_from_home(result, 1) == []


def test_a_rank_that_went_home_and_died_is_fostered_on_its_old_chain_too() -> None:
    """Rank 2, fostered at rank 0, went home to rank 1's replacement and then died: its child,
    rank 3, may never have read the lineage [0, 1, 2] (it dies with rank 2, or waits unread
    behind the dropped connection), and knows only [0, 2]. So rank 0 fosters it as well as
    rank 1, whichever order the Moved and the Online reached the table in, and however long
    ago: the table cannot know when rank 3 read it (issue 20's CI race, session 15)."""
    for moved_first in (True, False):
        result = fostered_then_parent_replaced()
        moved, online = Moved(2, 1, 0, to=1), hello(result, 2, parent=1)
        for event in (moved, online) if moved_first else (online, moved):
            assert result.apply(event, 204.0).applied
        assert result.links_above(2) == [[1, 0], [0]]
        chains = result.links_above(2)
        assert result.apply(Lost(2, 1, "connection dropped", parent=1), 900.0).applied
        assert foster_parents(result, 2, chains) == [1, 0]  # nearest first
        assert cut_off_below(result, 2) == [(3, 1, public_key(3))]


@pytest.mark.parametrize("to", [-1, 2, 3, 9], ids=["outside", "itself", "below", "too-big"])
def test_moved_to_a_rank_that_cannot_hold_it_leaves_it_where_it_was(to: int) -> None:
    result = chain(4)
    before = frozen(result)
    outcome = result.apply(Moved(2, 1, 1, to), 200.0)
    assert outcome.applied and outcome.changed == () and frozen(result) == before


def test_moved_to_an_ancestor_that_is_not_connected_leaves_it_where_it_was() -> None:
    result = healing_table("kary:1", 4)
    up(result, [1, 2])
    result.apply(hello(result, 3, parent=1), 101.0)  # rank 3 on rank 1, foster style
    result.apply(Departed(2, 1, parent=1), 102.0)
    before = frozen(result)
    assert result.apply(Moved(3, 1, 1, to=2), 103.0).changed == ()
    assert frozen(result) == before
    assert result.apply(Moved(3, 1, 1, to=0), 104.0).changed == (3,)
    assert result.entry(3).attached_to == 0


def test_rank_0_declares_lost_a_rank_adrift_past_its_grace_and_its_attachees_go_adrift() -> None:
    """Its attachees keep its deadline (they searched no longer than it did), so a dead chain
    reads lost one grace after its top, not one grace per level."""
    result = chain(4)
    assert result.next_expiry() is None
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    assert result.next_expiry() == 200.0 + GRACE
    assert result.adrift(200.0 + GRACE - 0.01) == []
    expired = result.adrift(200.0 + GRACE)
    assert expired == [Lost(2, 1, "did not reattach in time")] and expired[0].parent is None
    outcome = result.apply(expired[0], 200.0 + GRACE)
    assert outcome.applied and outcome.changed == (2, 3)
    assert result.entry(2).reason == "did not reattach in time"
    assert result.entry(3).adrift_until == 200.0 + GRACE
    assert result.next_expiry() == 200.0 + GRACE
    assert result.adrift(200.0 + GRACE) == [Lost(3, 1, "did not reattach in time")]


def test_the_attachees_of_a_rank_lost_while_adrift_keep_its_deadline() -> None:
    """Rank 2 adrift, then lost before its grace ends: rank 3, attached to it, is adrift until
    rank 2's grace would have ended, not a whole grace from now; a rank lost while attached
    gives its attachees a whole grace."""
    result = chain(5)
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    outcome = result.apply(Lost(2, 1, "connection dropped, seen by rank 3 below it"), 203.0)
    assert outcome.applied and result.entry(2).state is RankState.LOST
    assert result.entry(3).adrift_until == 200.0 + GRACE
    result.apply(Lost(3, 1, "did not reattach in time"), 200.0 + GRACE)
    assert result.entry(4).adrift_until == 200.0 + GRACE
    attached = chain(5)
    attached.apply(Lost(2, 1, "connection dropped", parent=1), 203.0)
    assert attached.entry(3).adrift_until == 203.0 + GRACE


def test_a_reservation_and_an_adrift_rank_share_the_next_expiry() -> None:
    result = healing_table("kary:1", 4, launched=3)
    up(result, [1, 2])
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    result.apply(Reserve(public_key(50), "joiner", 3, 5.0), 201.0)
    assert result.next_expiry() == 206.0
    assert result.expired(206.0) == [Expire(3, 1)] and result.adrift(206.0) == []
    result.apply(Expire(3, 1), 206.0)
    assert result.next_expiry() == 200.0 + GRACE


def test_a_lost_broker_that_returns_is_online_again_as_the_same_incarnation() -> None:
    """A healed partition: the broker declared lost says hello again, its rank not replaced."""
    result = chain(3)
    result.apply(Lost(1, 1, "silent for 5.0s", parent=0), 200.0)
    for stranger in (
        Online(1, 1, "node1", 4242, 0, public_key(1)),  # another pid
        Online(1, 1, "elsewhere", 1001, 0, public_key(1)),  # another host
    ):
        refused = result.apply(stranger, 201.0)
        assert not refused.applied
        assert refused.reason == "rank 1 is lost: only its last broker (pid 1001) may return"
    back = result.apply(hello(result, 1, parent=0), 202.0)
    assert back.applied and back.changed == (1,)
    entry = result.entry(1)
    assert (entry.state, entry.incarnation, entry.pid, entry.reason) == (
        RankState.ONLINE,
        1,
        1001,
        "",
    )
    assert (entry.attached_to, entry.since) == (0, 202.0)
    assert not result.reachable(2)  # its child went adrift when it was lost, and still seeks
    assert result.apply(hello(result, 2, parent=1), 203.0).changed == (2,)
    assert result.reachable(2)


def test_a_lost_rank_that_was_replaced_does_not_return() -> None:
    result = chain(3)
    result.apply(Lost(1, 1, "silent for 5.0s", parent=0), 200.0)
    result.apply(Reserve(public_key(60), "joiner", 1, 30.0), 201.0)
    refused = result.apply(Online(1, 1, "node1", 1001, 0, public_key(1)), 202.0)
    assert not refused.applied and "not current" in refused.reason


def test_a_broker_lost_while_retiring_does_not_return() -> None:
    """Its key was barred when it was lost: a healed partition does not bring it back."""
    result = chain(3)
    assert result.apply(Retire(2, 1), 200.0).applied
    assert result.apply(Lost(2, 1, "connection dropped", parent=1), 201.0).applied
    assert result.retired_keys == {public_key(2): 2}
    refused = result.apply(hello(result, 2, parent=1), 202.0)
    assert not refused.applied
    assert refused.reason == "rank 2 was lost while retiring: a retired broker does not come back"


def test_the_snapshot_shows_where_a_rank_is_attached_and_that_it_is_reattaching() -> None:
    result = chain(4)
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    result.apply(hello(result, 2, parent=0), 201.0)
    result.apply(Departed(2, 1, parent=0), 202.0)
    ranks = status_json(result, 203.0)["ranks"]
    assert [rank.get("attached_to", "-") for rank in ranks] == [None, "-", "-", None]
    assert [rank.get("reattaching", False) for rank in ranks] == [False, False, False, True]
    assert [rank["parent"] for rank in ranks] == [None, 0, 1, 2]  # the topology's, always
    result.apply(hello(result, 3, parent=0), 204.0)
    ranks = status_json(result, 205.0)["ranks"]
    assert ranks[3]["attached_to"] == 0 and "reattaching" not in ranks[3]


# --- a child's word on its parent (Dropped): issue 20, item 4 -----------------------------------


def killed_with_its_parent() -> RankTable:
    """kary:2 of 9: ranks 1 and 3 die together. Rank 0 sees rank 1 go: ranks 3 and 4 go adrift
    (rank 3 is dead, but nobody above it can tell). Rank 3's child 7 saw its connection drop,
    and rank 0 fosters it.

    ::

               0
           1       2
         3   4   5   6
        7 8
    """
    result = healing_table("kary:2", 9)
    up(result, list(range(1, 9)))
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    assert result.apply(hello(result, 7, parent=0), 200.1).changed == (7,)
    assert (result.entry(7).attached_to, result.entry(7).other_links) == (0, (3,))
    return result


def test_a_child_s_dropped_connection_ends_its_adrift_parent_at_once() -> None:
    result = killed_with_its_parent()
    outcome = result.apply(Dropped(7, 1, 3, "connection dropped"), 200.2)
    assert outcome.applied and outcome.changed == (7, 3, 8)
    three = result.entry(3)
    assert (three.state, three.reason) == (
        RankState.LOST,
        "connection dropped, seen by rank 7 below it",
    )
    assert (three.pid, three.last_pid) == (None, 1003)
    assert result.entry(7).other_links == () and result.reachable(7)
    # rank 8 was still attached to rank 3: adrift now, until rank 3's own grace would end
    assert (result.entry(8).attached_to, result.entry(8).adrift_until) == (None, 200.0 + GRACE)
    assert result.entry(4).adrift_until == 200.0 + GRACE  # rank 1's other child: untouched
    assert cut_off_below(result, 3) == [(8, 1, public_key(8))]
    assert foster_parents(result, 3)[0] == 0
    # rank 8 said it too, after its own foster parent's Online: the link is gone already
    assert result.apply(hello(result, 8, parent=0), 200.3).applied
    late = result.apply(Dropped(8, 1, 3, "connection dropped"), 200.4)
    assert not late.applied
    assert late.reason == "rank 8 holds no other link to rank 3: its word on it is stale"


def test_a_parent_declared_lost_by_its_child_that_is_alive_after_all_returns() -> None:
    """Should the parent's broker be alive (it closed that connection and goes on seeking), its
    own hello brings it back as the same incarnation, as any lost broker's."""
    result = killed_with_its_parent()
    result.apply(Dropped(7, 1, 3, "connection dropped"), 200.2)
    back = result.apply(hello(result, 3, parent=0), 201.0)
    assert back.applied and result.entry(3).state is RankState.ONLINE
    assert (result.entry(3).incarnation, result.entry(3).pid) == (1, 1003)


def test_a_child_s_dropped_connection_to_an_attached_parent_ends_only_the_link() -> None:
    """Rank 2 is attached to rank 1, which is alive and will speak for it: rank 3's word ends
    rank 3's link, nothing more, and a late Lost from rank 2 on that link is stale."""
    result = chain(4)
    assert result.apply(hello(result, 3, parent=1), 200.0).applied
    assert result.entry(3).other_links == (2,)
    before = result.entry(2).fields()
    outcome = result.apply(Dropped(3, 1, 2, "connection dropped"), 200.1)
    assert outcome.applied and outcome.changed == (3,)
    assert result.entry(2).fields() == before
    assert (result.entry(3).attached_to, result.entry(3).other_links) == (1, ())
    stale = result.apply(Lost(3, 1, "connection dropped", parent=2), 200.2)
    assert not stale.applied and stale.reason == "rank 3 is attached to rank 1, not to rank 2"


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (Dropped(7, 1, 0, "connection dropped"), "rank 7 holds no other link to rank 0"),
        (Dropped(8, 1, 3, "connection dropped"), "rank 8 holds no other link to rank 3"),
        (Dropped(7, 1, 1, "connection dropped"), "rank 7 holds no other link to rank 1"),
        (Dropped(7, 2, 3, "connection dropped"), "rank 7 incarnation 2 is not current (1)"),
        (Dropped(1, 1, 0, "connection dropped"), "rank 1 is lost"),
    ],
    ids=["its-parent-now", "still-attached", "not-a-link", "old-incarnation", "ended"],
)
def test_a_dropped_about_a_link_the_table_does_not_keep_is_refused(
    event: Dropped, why: str
) -> None:
    result = killed_with_its_parent()
    before = frozen(result)
    refused = result.apply(event, 200.2)
    assert not refused.applied and refused.reason.startswith(why)
    assert frozen(result) == before


# --- healing.py: who fosters, who is admitted, who goes home --------------------------------


@pytest.mark.parametrize(
    ("sender", "rank", "seen_by", "own", "may"),
    [
        (1, 3, 1, False, True),  # its child, seen by itself
        (1, 7, 3, False, True),  # a grandchild, seen by the child in between
        (1, 7, 7, False, True),  # seen by the rank itself (a child's word on itself, below)
        (1, 1, 1, False, False),  # on itself: only as its own link's word (Dropped)
        (1, 1, 1, True, True),
        (1, 2, 1, False, False),  # a rank outside its subtree
        (1, 3, 2, False, False),  # seen by a broker outside its subtree
        (1, 3, None, False, False),  # seen by nobody it names
        (3, 7, 1, False, False),  # seen by its own parent: not below it
        (1, 99, 1, False, False),  # no such rank
    ],
)
def test_a_child_reports_on_its_subtree_as_seen_there(
    sender: int, rank: int, seen_by: int | None, own: bool, may: bool
) -> None:
    assert may_report(Topology("kary:2", 15), sender, rank, seen_by, own) is may


def test_the_foster_parent_is_the_nearest_ancestor_that_reaches_rank_0() -> None:
    result = chain(6)
    assert [foster_parents(result, rank)[0] for rank in range(6)] == [0, 0, 1, 2, 3, 4]
    result.apply(Lost(3, 1, "connection dropped", parent=2), 200.0)
    assert foster_parents(result, 3)[0] == 2
    assert foster_parents(result, 5)[0] == 2  # rank 4 is adrift, rank 3 lost
    result.apply(Lost(1, 1, "connection dropped", parent=0), 201.0)  # rank 2 adrift in turn
    assert [foster_parents(result, rank)[0] for rank in (2, 3, 4, 5)] == [0, 0, 0, 0]
    result.apply(hello(result, 2, parent=0), 202.0)
    assert [foster_parents(result, rank)[0] for rank in (3, 4, 5)] == [2, 2, 2]


def test_cut_off_below_names_every_unreachable_broker_rank_0_knows() -> None:
    #        0
    #      1   2
    #     3 4 5 6
    #    7
    result = healing_table("kary:2", 8)
    up(result, [1, 2, 3, 7])
    up(result, [4], keyed=False)  # came online before keys were reported
    assert cut_off_below(result, 0) == []
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    # rank 7 is still attached to rank 3, but rank 3 is adrift: it cannot reach rank 0 either
    assert cut_off_below(result, 1) == [(3, 1, public_key(3)), (7, 1, public_key(7))]
    assert cut_off_below(result, 0) == cut_off_below(result, 1)
    assert cut_off_below(result, 2) == []
    result.apply(hello(result, 3, parent=0), 201.0)
    assert cut_off_below(result, 1) == []


def test_cut_off_below_admits_config_ranks_by_the_shared_key() -> None:
    result = healing_table("kary:1", 4, fixed=True)
    up(result, [1, 2, 3])
    assert result.entry(2).key is None
    result.apply(Lost(1, 1, "connection dropped", parent=0), 200.0)
    assert cut_off_below(result, 1) == [(2, 1, ""), (3, 1, "")]


def test_away_from_home_names_the_children_that_live_elsewhere() -> None:
    #        0
    #      1   2
    #     3 4 5 6
    result = healing_table("kary:2", 7)
    up(result, [1, 2, 3, 4, 5])
    up(result, [6], keyed=False)
    assert [away_from_home(result, rank) for rank in (0, 1, 2)] == [[], [], []]
    result.apply(Lost(2, 1, "connection dropped", parent=0), 200.0)
    result.apply(hello(result, 5, parent=0), 201.0)  # rank 6 stays adrift
    result.apply(Online(2, 1, "node2", 1002, 0, public_key(2)), 202.0)  # back, on rank 0
    # rank 5 is fostered and rank 6 adrift; rank 6's key is unknown: it waits out its grace
    assert away_from_home(result, 2) == [(5, 1, public_key(5))]
    assert away_from_home(result, 0) == []  # rank 2 is attached to rank 0, home or not


# --- reports: the new fields and event on the wire --------------------------------------------

KEY = public_key(7)


@pytest.mark.parametrize(
    "event",
    [
        Online(3, 2, "node3", 77),
        Online(3, 2, "node3", 77, 1, KEY),
        Online(3, 2, "node3", 77, None, KEY),
        Lost(3, 2, "connection dropped", 1),
        Lost(3, 2, "did not reattach in time"),
        Departed(3, 2, 0),
        Torpid(3, 2, True, 1),
        Torpid(3, 2, False),
        Moved(3, 2, 1, 0),
        Moved(3, 2, None, 1),
        Dropped(3, 2, 1, "connection dropped"),
    ],
    ids=str,
)
def test_reports_carry_each_event_whole(event: Event) -> None:
    encoded = encode_event(event)
    assert decode_event(encoded) == event
    assert ("parent" in encoded) == (event.parent is not None)  # absent: rank 0's own word


def test_the_encoding_of_online_and_moved() -> None:
    assert encode_event(Online(3, 2, "h", 77, 1, KEY)) == {
        "event": "online",
        "host": "h",
        "pid": 77,
        "key": KEY,
        "rank": 3,
        "incarnation": 2,
        "parent": 1,
    }
    assert encode_event(Moved(3, 2, 1, 0)) == {
        "event": "moved",
        "to": 0,
        "rank": 3,
        "incarnation": 2,
        "parent": 1,
    }


def test_an_online_report_from_an_older_broker_has_no_key() -> None:
    decoded = decode_event({"event": "online", "rank": 1, "incarnation": 1, "host": "h", "pid": 5})
    assert decoded == Online(1, 1, "h", 5, None, "")


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"event": "online", "host": "h", "pid": 5, "key": "short"}, "report with bad key"),
        ({"event": "online", "host": "h", "pid": 5, "key": 7}, "report with bad key"),
        ({"event": "online", "host": "h", "pid": 5, "parent": "0"}, "report with bad parent"),
        ({"event": "lost", "reason": "x", "parent": True}, "report with bad parent"),
        ({"event": "moved", "parent": 1}, "report without 'to'"),
        ({"event": "moved", "parent": 1, "to": "0"}, "report with bad to"),
        ({"event": "moved", "parent": 1, "to": False}, "report with bad to"),
        ({"event": "moved", "parent": 1.5, "to": 0}, "report with bad parent"),
        ({"event": "dropped", "gone": 0, "reason": "x"}, "names itself"),
        ({"event": "dropped", "gone": 0, "reason": "x", "parent": 0}, "names itself"),
        ({"event": "dropped", "reason": "x", "parent": 1}, "report without 'gone'"),
        ({"event": "dropped", "gone": "0", "reason": "x", "parent": 1}, "bad gone or reason"),
        ({"event": "dropped", "gone": 0, "parent": 1}, "report without 'reason'"),
    ],
)
def test_bad_reports_are_refused(payload: dict[str, Any], why: str) -> None:
    with pytest.raises(MessageError, match=why):
        decode_event({"rank": 1, "incarnation": 1} | payload)


def test_only_link_events_travel_as_reports() -> None:
    with pytest.raises(TypeError):
        encode_event(Void(1, 1, "voided"))


# --- properties: fostering heals the whole subtree, and sending home restores the tree ---------


@st.composite
def trees(draw: st.DrawFn, max_size: int) -> tuple[str, int]:
    """(spec, size): a named shape or a shuffled `parents:` tree."""
    size = draw(st.integers(2, max_size), label="size")
    return draw(specs(size), label="spec"), size


def reaching(result: RankTable) -> set[int]:
    """The ranks whose links lead to rank 0, grown from rank 0 down (the table walks up)."""
    found = {0}
    grown = True
    while grown:
        grown = False
        for entry in result.entries:
            if entry.rank not in found and entry.state in CONNECTED and entry.attached_to in found:
                found.add(entry.rank)
                grown = True
    return found


@given(trees(24), st.booleans(), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_fostering_then_going_home_heals_the_tree(
    tree: tuple[str, int], fixed: bool, seed: int
) -> None:
    """Ranks end one after another, in a random order. After each, rank 0's plan is carried
    out: the brokers that lost their own link say hello to the foster parent, and at once every
    connected rank reaches rank 0 again. Then each lost rank is replaced and its children sent
    home: every connected rank is attached to its topology parent again, and none moved
    incarnation."""
    spec, size = tree
    result = healing_table(spec, size, fixed=fixed)
    up(result, list(result.topology.descendants(0)))
    incarnations = [e.incarnation for e in result.entries]
    rng = random.Random(seed)
    now = 200.0
    for rank in rng.sample(range(1, size), rng.randint(1, size - 1)):
        entry = result.entry(rank)
        if entry.state not in CONNECTED:
            continue
        now += 1
        ending: Event = rng.choice(
            [
                Lost(rank, entry.incarnation, "killed", entry.attached_to),
                Departed(rank, entry.incarnation, entry.attached_to),
                Void(rank, entry.incarnation, "voided"),
            ]
        )
        assert result.apply(ending, now).applied
        foster = foster_parents(result, rank)[0]
        assert result.reachable(foster) and result.topology.is_ancestor(foster, rank)
        for below, incarnation, _key in cut_off_below(result, rank):
            held = result.entry(below)
            assert held.incarnation == incarnation
            if held.attached_to is None:  # its own link ended: it seeks the foster parent
                assert result.apply(hello(result, below, parent=foster), now).changed == (below,)
        assert cut_off_below(result, rank) == []
        connected = {e.rank for e in result.entries if e.state in CONNECTED}
        assert reaching(result) == connected
        assert all(result.reachable(r) for r in connected)
        assert result.subtree_statuses() == roll_up(
            result.topology, [e.state for e in result.entries]
        )
    replaced: set[int] = set()
    for rank in [0, *result.topology.descendants(0)]:  # parents first, as a refill goes
        entry = result.entry(rank)
        if entry.state not in CONNECTED:
            now += 1
            if entry.phase in CONFIG_PHASES:  # its host starts its broker again
                assert result.apply(Reboot(rank, entry.incarnation), now).applied
            else:  # FLUB gives it to a new broker
                grant = result.apply(Reserve(public_key(500 + rank), "joiner", rank, 30.0), now)
                assert grant.applied, grant
            replaced.add(rank)
            assert result.apply(hello(result, rank), now).applied
        for child, incarnation, key in away_from_home(result, rank):
            held = result.entry(child)
            assert (held.incarnation, held.key or "") == (incarnation, key)
            if held.attached_to is not None:
                assert result.apply(Moved(child, incarnation, held.attached_to, rank), now).applied
            assert result.apply(hello(result, child, parent=rank), now).applied
    assert all(
        e.attached_to == result.topology.parent(e.rank) and e.adrift_until is None
        for e in result.entries
    )
    assert all(e.state is RankState.ONLINE for e in result.entries)
    for rank, (before, entry) in enumerate(zip(incarnations, result.entries, strict=True)):
        if rank not in replaced:  # fostered and sent home, never restarted
            assert entry.incarnation == before, rank


# --- the state machine ---------------------------------------------------------------------


class HealingMachine(RuleBasedStateMachine):
    """Ranks end while others hang below them, attached or fostered; foster parents and home
    parents welcome the same brokers again; brokers move; graces run out; lost brokers return
    and ranks are refilled. Every event is checked against what the rules say it does, and the
    table against invariants of the tree as it is now."""

    def __init__(self) -> None:
        super().__init__()
        self.table: RankTable
        self.now = 1000.0
        self.pids = 10_000
        self.keys = 1000
        self.incarnations: list[int] = []

    @initialize(tree=trees(12), fixed=st.booleans(), data=st.data())
    def start(self, tree: tuple[str, int], fixed: bool, data: st.DataObject) -> None:
        spec, size = tree
        self.table = healing_table(spec, size, fixed=fixed, now=self.now)
        for rank in self.table.topology.descendants(0):
            keyed = data.draw(st.integers(0, 4), label="keyed") > 0  # mostly known
            assert self.table.apply(hello(self.table, rank, keyed=keyed), self.now).applied
        self.incarnations = [entry.incarnation for entry in self.table.entries]

    # --- helpers ---

    def _apply(self, event: Event | Reserve, must: bool | None = None) -> Outcome:
        """Apply at the next instant: a refusal touches nothing; an applied event's `changed`
        names exactly the entries that changed. `must`: whether it has to be applied."""
        self.now += 0.5
        before = frozen(self.table)
        entries = [entry.fields() for entry in self.table.entries]
        outcome = self.table.apply(event, self.now)
        if must is not None:
            assert outcome.applied == must, (event, outcome)
        if not outcome.applied:
            assert outcome.changed == () and frozen(self.table) == before, event
            return outcome
        after = [entry.fields() for entry in self.table.entries]
        changed = {r for r, (a, b) in enumerate(zip(entries, after, strict=True)) if a != b}
        assert set(outcome.changed) == changed, (event, outcome)
        assert self.table.generation == before[0] + bool(changed)
        return outcome

    def _pick(self, data: st.DataObject, ranks: list[int], label: str) -> int | None:
        return data.draw(st.sampled_from(ranks), label=label) if ranks else None

    def _connected(self) -> list[int]:
        return [e.rank for e in self.table.entries if e.state in CONNECTED and e.rank != 0]

    def _holds(self, reporter: int | None, rank: int) -> bool:
        """Whether `reporter` may welcome `rank`: a connected ancestor (None: its parent)."""
        topology = self.table.topology
        parent = topology.parent(rank) if reporter is None else reporter
        if parent is None:
            return True
        if not 0 <= parent < self.table.size or not topology.is_ancestor(parent, rank):
            return False
        return self.table.entry(parent).state in CONNECTED

    # --- rules ---

    @rule(data=st.data(), kind=st.sampled_from(["lost", "departed", "void"]), own=st.booleans())
    def end(self, data: st.DataObject, kind: str, own: bool) -> None:
        """A connected rank ends, told by the broker its link goes to, or by rank 0 itself."""
        rank = self._pick(data, self._connected(), "ending")
        if rank is None:
            return
        entry = self.table.entry(rank)
        reporter = None if own else entry.attached_to
        event: Event = {
            "lost": Lost(rank, entry.incarnation, "connection dropped", reporter),
            "departed": Departed(rank, entry.incarnation, reporter),
            "void": Void(rank, entry.incarnation, "voided"),
        }[kind]
        before = [e.fields() for e in self.table.entries]
        was = [(e.state, e.attached_to, e.phase) for e in self.table.entries]
        seeking_until = entry.adrift_until  # an adrift rank's attachees keep its deadline
        self._apply(event, must=True)
        grace_ends = self.now + GRACE
        if seeking_until is not None:
            grace_ends = min(grace_ends, seeking_until)
        topology = self.table.topology
        below = set(topology.descendants(rank))
        assert self.table.entry(rank).state not in CONNECTED
        for other in self.table.entries:
            state, attached, phase = was[other.rank]
            if other.rank == rank:
                continue
            if other.rank not in below:
                assert other.fields() == before[other.rank]
            elif state in CONNECTED and attached == rank:  # its link went here: adrift
                assert other.state is state and other.pid is not None
                assert other.attached_to is None
                assert other.adrift_until == grace_ends
            elif state in CONNECTED:  # its link goes elsewhere: untouched
                assert other.fields() == before[other.rank]
            elif other.fields() != before[other.rank]:  # never online, under a parent gone
                parent = topology.parent(other.rank)
                assert parent is not None
                assert parent == rank or was[parent][0] not in CONNECTED
                assert phase in (Phase.LAUNCHED, Phase.CONFIG_BOOTING, Phase.CONFIG_DOWN)
                assert other.state in (RankState.LOST, RankState.OFFLINE)
        foster = foster_parents(self.table, rank)[0]
        assert self.table.reachable(foster) and topology.is_ancestor(foster, rank)

    @rule(
        data=st.data(),
        kind=st.sampled_from(["lost", "departed", "torpid", "moved"]),
        to=st.integers(-1, 12),
    )
    def stale_link_event(self, data: st.DataObject, kind: str, to: int) -> None:
        """A broker reports on a link the rank is not on (it left it, or never had it)."""
        rank = self._pick(data, self._connected(), "stale")
        if rank is None:
            return
        entry = self.table.entry(rank)
        others = [r for r in range(self.table.size) if r != entry.attached_to]
        reporter = data.draw(st.sampled_from(others), label="reporter")
        event: Event = {
            "lost": Lost(rank, entry.incarnation, "late", reporter),
            "departed": Departed(rank, entry.incarnation, reporter),
            "torpid": Torpid(rank, entry.incarnation, not entry.torpid, reporter),
            "moved": Moved(rank, entry.incarnation, reporter, to),
        }[kind]
        self._apply(event, must=False)

    @rule(data=st.data())
    def foster(self, data: st.DataObject) -> None:
        """A broker says hello to an ancestor: most often the one rank 0 would name."""
        adrift = [r for r in self._connected() if self.table.entry(r).attached_to is None]
        rank = self._pick(data, adrift or self._connected(), "fostered")
        if rank is None:
            return
        topology = self.table.topology
        choices = [foster_parents(self.table, rank)[0], *topology.ancestors(rank)]
        reporter = data.draw(
            st.sampled_from(choices) | st.integers(0, self.table.size - 1), label="by"
        )
        allowed = self._holds(reporter, rank)
        old = self.table.entry(rank).attached_to
        outcome = self._apply(hello(self.table, rank, parent=reporter), must=allowed)
        if allowed:
            entry = self.table.entry(rank)
            assert (entry.attached_to, entry.adrift_until) == (reporter, None)
            assert set(outcome.changed) <= {rank}
            if old is not None and old != reporter:  # the link it left is over: its parent says
                assert entry.other_links == (old,)
                self._apply(Moved(rank, entry.incarnation, old, reporter), must=True)
                assert self.table.entry(rank).other_links == ()

    @rule(data=st.data(), moved_first=st.booleans())
    def go_home(self, data: st.DataObject, moved_first: bool) -> None:
        """A child living away from its parent, online again, goes back to it."""
        away = [
            (rank, child)
            for rank in range(self.table.size)
            if self.table.entry(rank).state in CONNECTED
            for child, _, _ in away_from_home(self.table, rank)
        ]
        if not away:
            return
        rank, child = data.draw(st.sampled_from(away), label="home")
        entry = self.table.entry(child)
        old = entry.attached_to
        moved = Moved(child, entry.incarnation, old, rank)
        online = hello(self.table, child, parent=rank)
        if old is None:  # adrift: there is no link to leave
            self._apply(online, must=True)
        elif moved_first:
            self._apply(moved, must=True)
            assert self._apply(online, must=True).changed == ()
        else:
            self._apply(online, must=True)
            self._apply(moved, must=True)  # ends the old link, which the table kept till then
            assert self.table.entry(child).other_links == ()
        entry = self.table.entry(child)
        assert (entry.attached_to, entry.adrift_until) == (rank, None)
        assert child not in [c for c, _, _ in away_from_home(self.table, rank)]

    @rule(data=st.data())
    def dropped(self, data: st.DataObject) -> None:
        """A broker whose parent's connection dropped is welcomed by another ancestor, and then
        says so: that link ends; its old parent, if adrift, is lost with all it held; if not,
        it is left as it was. Said again, it is stale."""
        linked = [r for r in self._connected() if self.table.entry(r).attached_to not in (None, 0)]
        rank = self._pick(data, linked, "dropped")
        if rank is None:
            return
        topology, entry = self.table.topology, self.table.entry(rank)
        gone = entry.attached_to
        assert gone is not None
        others = [a for a in topology.ancestors(rank) if a != gone and self._holds(a, rank)]
        if not others:
            return
        welcomer = data.draw(st.sampled_from(others), label="welcomed by")
        self._apply(hello(self.table, rank, parent=welcomer), must=True)
        assert gone in self.table.entry(rank).other_links
        parent = self.table.entry(gone)
        adrift, before = parent.adrift_until is not None, parent.fields()
        seeking_until = parent.adrift_until
        was = {e.rank: (e.state, e.attached_to, e.other_links) for e in self.table.entries}
        said = Dropped(rank, entry.incarnation, gone, "connection dropped")
        self._apply(said, must=True)
        assert gone not in self.table.entry(rank).other_links
        assert self.table.entry(rank).attached_to == welcomer
        if not adrift:
            assert self.table.entry(gone).fields() == before
        else:
            assert self.table.entry(gone).state not in CONNECTED
            assert (
                self.table.entry(gone).reason == f"connection dropped, seen by rank {rank} below it"
            )
            # what it held alone goes adrift, until its own grace would have ended
            assert seeking_until is not None
            for other in topology.descendants(gone):
                state, attached, links = was[other]
                if state in CONNECTED and attached == gone and not links:
                    until = min(self.now + GRACE, seeking_until)
                    assert self.table.entry(other).adrift_until == until
        self._apply(said, must=False)

    @rule(data=st.data(), to=st.integers(-1, 12), own=st.booleans())
    def moved(self, data: st.DataObject, to: int, own: bool) -> None:
        """The broker's link moved to `to`: believed if `to` can hold it (a connected ancestor)."""
        rank = self._pick(data, self._connected(), "moving")
        if rank is None:
            return
        entry = self.table.entry(rank)
        before = entry.fields()
        attached = entry.attached_to
        self._apply(Moved(rank, entry.incarnation, None if own else attached, to), must=True)
        entry = self.table.entry(rank)
        can_hold = 0 <= to < self.table.size and self._holds(to, rank)
        if can_hold:
            assert (entry.attached_to, entry.adrift_until) == (to, None)
        else:
            assert entry.fields() == before

    @rule(data=st.data(), torpid=st.booleans())
    def torpid(self, data: st.DataObject, torpid: bool) -> None:
        rank = self._pick(data, self._connected(), "torpid")
        if rank is not None:
            entry = self.table.entry(rank)
            self._apply(Torpid(rank, entry.incarnation, torpid, entry.attached_to), must=True)
            assert self.table.entry(rank).torpid == torpid

    @rule(advance=st.sampled_from([0.0, 1.0, GRACE / 2, GRACE]))
    def time_passes(self, advance: float) -> None:
        """The broker's timer: reservations lapse, and ranks adrift past their grace are lost;
        the ranks that were attached to them keep their deadline, so the timer runs again at
        once until none is due (a dead subtree ends in one go)."""
        self.now += advance
        for expiry in self.table.expired(self.now):
            self.now -= 0.5  # _apply moves the clock on: stay at the instant asked about
            self._apply(expiry, must=True)
        for _ in range(self.table.size):
            due = self.table.adrift(self.now)
            for lost in due:
                entry = self.table.entry(lost.rank)
                assert entry.adrift_until is not None and entry.adrift_until <= self.now
                assert lost.parent is None and lost.incarnation == entry.incarnation
                self.now -= 0.5
                self._apply(lost, must=True)
                assert self.table.entry(lost.rank).state not in CONNECTED
        assert self.table.adrift(self.now) == []  # the cascade is over within the tree's depth

    @rule(data=st.data(), same=st.booleans())
    def returning(self, data: st.DataObject, same: bool) -> None:
        """A lost broker says hello again (a partition healed), or another broker claims to be
        it; only the same broker, at the same incarnation, is welcomed."""
        lost = [
            e.rank for e in self.table.entries if e.phase is Phase.LOST and e.last_pid is not None
        ]
        rank = self._pick(data, lost, "returning")
        if rank is None:
            return
        entry = self.table.entry(rank)
        reporter = data.draw(
            st.sampled_from([None, *self.table.topology.ancestors(rank)]), label="by"
        )
        self.pids += 1
        assert entry.last_pid is not None
        pid = entry.last_pid if same else self.pids
        key = entry.key or ""
        barred = key in self.table.retired_keys
        allowed = same and self._holds(reporter, rank) and not barred
        event = Online(rank, entry.incarnation, entry.host, pid, reporter, key)
        self._apply(event, must=allowed)
        if allowed:
            entry = self.table.entry(rank)
            assert (entry.state, entry.pid, entry.adrift_until) == (RankState.ONLINE, pid, None)
            assert entry.attached_to == (
                self.table.topology.parent(rank) if reporter is None else reporter
            )

    @rule(data=st.data())
    def refill(self, data: st.DataObject) -> None:
        """FLUB gives a lost or vacant rank to a new broker, which comes online at home."""
        free = [e.rank for e in self.table.entries if e.state in (RankState.LOST, RankState.VACANT)]
        rank = self._pick(data, free, "refilled")
        if rank is None:
            return
        self.keys += 1
        grant = self._apply(Reserve(public_key(self.keys), "joiner", rank, 30.0))
        if grant.applied and self._holds(None, rank):
            self._apply(hello(self.table, rank), must=True)

    @rule()
    def bring_up(self) -> None:
        """The lowest offline rank whose parent is connected comes online (the tree grows)."""
        for entry in self.table.entries:
            waiting = entry.state in (RankState.OFFLINE, RankState.RESERVED)
            if waiting and self._holds(None, entry.rank):
                self._apply(hello(self.table, entry.rank), must=True)
                return

    @rule(data=st.data(), then_lost=st.booleans())
    def retire(self, data: st.DataObject, then_lost: bool) -> None:
        """`tbon retire`: retiring ranks go adrift, are fostered and lost like any other; one
        lost while retiring has its key barred, and may not return."""
        rank = self._pick(data, self._connected(), "retiring")
        if rank is None:
            return
        entry = self.table.entry(rank)
        retiring = self._apply(Retire(rank, entry.incarnation)).applied
        if retiring and then_lost:
            self._apply(Lost(rank, entry.incarnation, "killed", entry.attached_to), must=True)

    # --- invariants ---

    @precondition(lambda self: self.incarnations)
    @invariant()
    def rank_zero_is_the_root_of_every_chain(self) -> None:
        root = self.table.entry(0)
        assert root.state is RankState.ONLINE and self.table.reachable(0)
        assert (root.attached_to, root.adrift_until) == (None, None)

    @precondition(lambda self: self.incarnations)
    @invariant()
    def attached_or_adrift_never_both(self) -> None:
        """A connected rank's link goes to a connected ancestor, or it seeks one for at most the
        grace; one not connected has no link and no deadline."""
        topology = self.table.topology
        for entry in self.table.entries[1:]:
            if entry.state not in CONNECTED:
                assert (entry.attached_to, entry.adrift_until) == (None, None), entry
            elif entry.attached_to is None:
                assert entry.adrift_until is not None, entry
                assert entry.adrift_until <= self.now + GRACE
            else:
                assert entry.adrift_until is None, entry
                assert topology.is_ancestor(entry.attached_to, entry.rank), entry
                assert self.table.entry(entry.attached_to).state in CONNECTED, entry

    @precondition(lambda self: self.incarnations)
    @invariant()
    def reachable_is_a_chain_of_links_to_rank_0(self) -> None:
        found = reaching(self.table)
        assert {r for r in range(self.table.size) if self.table.reachable(r)} == found

    @precondition(lambda self: self.incarnations)
    @invariant()
    def the_plan_names_what_the_tree_holds(self) -> None:
        """cut_off_below: the connected descendants that do not reach rank 0 and whose key rank
        0 knows (a config rank's is the shared one); foster_parents: the nearest ancestor that
        reaches rank 0; away_from_home: the children connected elsewhere that can be admitted."""
        table, topology = self.table, self.table.topology
        found = reaching(table)

        def admission(rank: int) -> tuple[int, int, str] | None:
            entry = table.entry(rank)
            if entry.key or entry.phase in CONFIG_PHASES:
                return (rank, entry.incarnation, entry.key or "")
            return None

        for rank in range(table.size):
            cut = [
                admission(r)
                for r in topology.descendants(rank)
                if table.entry(r).state in CONNECTED and r not in found
            ]
            assert cut_off_below(table, rank) == [a for a in cut if a is not None]
            ancestors = list(topology.ancestors(rank))
            foster = foster_parents(table, rank)[0]
            if ancestors:
                assert foster in found and foster in ancestors
                assert not found & set(ancestors[: ancestors.index(foster)])
            else:
                assert foster == 0
            away = [
                admission(child)
                for child in topology.children(rank)
                if table.entry(child).state in CONNECTED and table.entry(child).attached_to != rank
            ]
            assert away_from_home(table, rank) == [a for a in away if a is not None]

    @precondition(lambda self: self.incarnations)
    @invariant()
    def the_roll_up_is_the_tree_as_it_is_now(self) -> None:
        states = [entry.state for entry in self.table.entries]
        assert self.table.subtree_statuses() == roll_up(self.table.topology, states)

    @precondition(lambda self: self.incarnations)
    @invariant()
    def incarnations_never_decrease(self) -> None:
        now = [entry.incarnation for entry in self.table.entries]
        assert all(a >= b for a, b in zip(now, self.incarnations, strict=True))
        self.incarnations = now

    @precondition(lambda self: self.incarnations)
    @invariant()
    def deadlines_and_the_snapshot_agree(self) -> None:
        ends = [e.lease_until for e in self.table.entries if e.lease_until is not None]
        ends += [e.adrift_until for e in self.table.entries if e.adrift_until is not None]
        assert self.table.next_expiry() == (min(ends) if ends else None)
        for entry, shown in zip(
            self.table.entries, status_json(self.table, self.now)["ranks"], strict=True
        ):
            if entry.state in CONNECTED:
                assert shown["attached_to"] == entry.attached_to
                assert shown.get("reattaching", False) == (entry.adrift_until is not None)
                assert entry.reason == ""
            else:
                assert "attached_to" not in shown and "reattaching" not in shown

    @precondition(lambda self: self.incarnations)
    @invariant()
    def a_barred_key_holds_no_connected_rank(self) -> None:
        """A broker retired (or lost while retiring) never comes back, a partition or not."""
        for entry in self.table.entries:
            if entry.state in CONNECTED and entry.key is not None:
                assert entry.key not in self.table.retired_keys, entry


TestHealingMachine = HealingMachine.TestCase
TestHealingMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
