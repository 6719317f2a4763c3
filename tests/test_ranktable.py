"""Tests of `tbon.overlay.state.ranktable`: the rank table at rank 0 as a pure state machine."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tables import bring_up, reserve, specs, started, table

from tbon.overlay.state.rankstates import CONFIG_PHASES, PUBLIC, Rollup, roll_up
from tbon.overlay.state.ranktable import (
    ALLOCATABLE,
    CONNECTED,
    GOODBYE,
    REASON_LENGTH,
    REFUSALS,
    RESERVABLE_PHASES,
    TRANSITIONS,
    UNKNOWN_HOST,
    Departed,
    Dropped,
    Event,
    Expire,
    LinkEnded,
    Located,
    Lost,
    Moved,
    Online,
    Orphaned,
    Phase,
    RankState,
    RankTable,
    Reboot,
    Release,
    Reserve,
    Retire,
    SubtreeStatus,
    Torpid,
    Void,
    root_once_applied,
)
from tbon.overlay.state.snapshot import snapshot as status_json
from tbon.overlay.state.topology import Topology

SNAPSHOT_FIELDS = {
    "rank",
    "state",
    "host",
    "pid",
    "incarnation",
    "parent",
    "children",
    "subtree",
    "torpid",
    "since",
}
"""Every entry has these; the others appear only where they say something (docs/design.md §12)."""

SOMETIMES = {
    "subtree_since": {"online", "retiring"},
    "attached_to": {"online", "retiring"},
    "reattaching": {"online", "retiring"},
    "reason": {"lost", "offline", "vacant"},
    "last_pid": {"lost", "offline", "vacant"},
    "joiner": {"reserved"},
    "expires": {"reserved"},
    "retired": {"vacant"},
}
"""The fields an entry may add, and the states it may add them in."""


def states(result: RankTable) -> list[str]:
    return [entry.state.value for entry in result.entries]


def subtrees(result: RankTable) -> list[str]:
    return [status.value for status in result.subtree_statuses()]


def fingerprint(result: RankTable) -> tuple[Any, ...]:
    return (result.generation, tuple(entry.fields() for entry in result.entries))


def brute_subtree(result: RankTable, rank: int) -> SubtreeStatus:
    """The subtree status of `rank`, straight from the definition in docs/design.md."""
    entry = result.entry(rank)
    if entry.state is RankState.LOST:
        return SubtreeStatus.LOST
    if entry.state not in CONNECTED:
        return SubtreeStatus.OFFLINE
    below = [result.entry(r).state for r in result.topology.descendants(rank)]
    if RankState.LOST in below:
        return SubtreeStatus.DEGRADED  # lost dominates partial
    short = {RankState.OFFLINE, RankState.VACANT, RankState.RESERVED, RankState.RETIRING}
    if short & set(below) or entry.state is RankState.RETIRING:
        return SubtreeStatus.PARTIAL
    return SubtreeStatus.FULL


# --- the initial table --------------------------------------------------------------------------


def test_initial_states() -> None:
    result = table("kary:2", 6, launched=4, now=50.0)
    assert result.size == 6
    assert result.generation == 0
    assert states(result) == ["offline"] * 4 + ["vacant"] * 2
    assert [e.incarnation for e in result.entries] == [1, 1, 1, 1, 0, 0]
    assert [e.host for e in result.entries] == [
        "node0",
        "node1",
        "node2",
        "node3",
        "extra0",
        "extra1",
    ]
    assert all(e.pid is None and not e.torpid and e.since == 50.0 for e in result.entries)
    assert [e.rank for e in result.entries] == list(range(6))


def test_rank_zero_comes_online() -> None:
    result = table("kary:2", 3, launched=3)
    outcome = result.apply(Online(0, 1, "root", 42), 101.0)
    assert outcome.applied and outcome.changed == (0,)
    entry = result.entry(0)
    assert (entry.state, entry.host, entry.pid, entry.since) == (
        RankState.ONLINE,
        "root",
        42,
        101.0,
    )
    assert result.generation == 1
    assert states(result) == ["online", "offline", "offline"]


@pytest.mark.parametrize("launched", [0, 5])
def test_launched_count_must_fit(launched: int) -> None:
    with pytest.raises(ValueError):
        table("kary:2", 4, launched)


def test_all_spares_but_rank_zero() -> None:
    result = started("binomial", 4, launched=1)
    assert states(result) == ["online", "vacant", "vacant", "vacant"]
    assert [e.host for e in result.entries[1:]] == ["extra0", "extra1", "extra2"]
    assert result.up()
    assert subtrees(result) == ["partial", "offline", "offline", "offline"]


# --- transitions --------------------------------------------------------------------------------


def test_online_needs_a_connected_parent() -> None:
    result = started("kary:1", 3)
    outcome = result.apply(Online(2, 1, "n2", 2), 101.0)
    assert not outcome.applied and outcome.changed == ()
    assert "parent" in outcome.reason
    assert result.entry(2).state is RankState.OFFLINE
    bring_up(result, [1, 2])
    assert states(result) == ["online"] * 3


def test_online_is_idempotent_for_the_same_pid_and_refused_for_another() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    generation = result.generation
    again = result.apply(Online(1, 1, "node1", 1001), 102.0)
    assert again.applied and again.changed == ()
    assert result.generation == generation
    other = result.apply(Online(1, 1, "node1", 9999), 102.0)
    assert not other.applied
    assert result.entry(1).pid == 1001
    assert result.generation == generation


def test_a_voided_incarnation_that_was_online_ends_as_if_lost() -> None:
    """Rank 0 refused a second broker's Online and has the parent cut the incarnation off,
    which the parent does not report: the table must not go on showing it online."""
    result = started("kary:2", 7)
    bring_up(result, [1, 3, 4])
    assert not result.apply(Online(1, 1, "node1", 9999), 102.0).applied
    outcome = result.apply(Void(1, 1, "rank 1 is online, it cannot come online"), 103.0)
    assert outcome.applied and set(outcome.changed) == {1, 3, 4}
    # its children were attached to it: they stay online, adrift, to seek a live ancestor
    assert states(result)[:5] == ["online", "lost", "offline", "online", "online"]
    assert result.entry(1).pid is None and result.entry(1).incarnation == 1
    for rank in (3, 4):
        entry = result.entry(rank)
        assert (entry.attached_to, entry.adrift_until) == (None, 103.0 + result.reattach_grace)


def test_online_records_host_and_pid_and_clears_torpid() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    entry = result.entry(1)
    assert (entry.host, entry.pid, entry.torpid, entry.since) == ("node1", 1001, False, 101.0)


def test_vacant_spare_cannot_come_online_by_itself() -> None:
    result = started("kary:2", 4, launched=2)
    outcome = result.apply(Online(3, 0, "x", 5), 101.0)
    assert not outcome.applied
    assert result.entry(3).state is RankState.VACANT


def test_lost_sets_connected_descendants_adrift_and_offline_ones_lost() -> None:
    """A broker below a lost one seeks a live ancestor and stays online; one that never came
    online under it can never be welcomed now, and is lost with it."""
    #        0
    #      1   2
    #     3 4 5 6
    result = started("kary:2", 7, launched=6)
    bring_up(result, [1, 3, 2])
    assert states(result) == [
        "online",
        "online",
        "online",
        "online",
        "offline",
        "offline",
        "vacant",
    ]
    outcome = result.apply(Lost(1, 1, "connection dropped"), 200.0)
    assert outcome.applied
    assert set(outcome.changed) == {1, 3, 4}
    assert outcome.changed[0] == 1
    assert states(result)[:5] == ["online", "lost", "online", "online", "lost"]
    for rank in (1, 4):
        assert result.entry(rank).pid is None
        assert result.entry(rank).since == 200.0
    adrift = result.entry(3)  # its broker keeps its pid, its state and its since
    assert (adrift.pid, adrift.since, adrift.attached_to) == (1003, 101.0, None)
    assert adrift.adrift_until == 200.0 + result.reattach_grace
    assert result.entry(1).incarnation == 1  # only rank 0 hands out new incarnations
    assert result.generation == 5  # one per applied change: 0, 1, 3, 2, then the loss
    outcome = result.apply(Lost(2, 1, "silent"), 201.0)
    # rank 5 was offline: lost too; rank 6 is a vacant spare and stays so
    assert set(outcome.changed) == {2, 5}
    assert states(result) == ["online", "lost", "lost", "online", "lost", "lost", "vacant"]


def test_departed_becomes_vacant_and_its_child_goes_adrift() -> None:
    result = started("kary:1", 4)
    bring_up(result, [1, 2, 3])
    outcome = result.apply(Departed(2, 1), 300.0)
    assert outcome.applied and set(outcome.changed) == {2, 3}
    assert states(result) == ["online", "online", "vacant", "online"]
    assert result.entry(2).pid is None
    assert (result.entry(3).attached_to, result.entry(3).adrift_until) == (
        None,
        300.0 + result.reattach_grace,
    )


def test_departed_leaf() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1, 2])
    assert result.apply(Departed(2, 1), 300.0).changed == (2,)
    assert states(result) == ["online", "online", "vacant"]
    assert subtrees(result) == ["partial", "full", "offline"]


@pytest.mark.parametrize("event", [Lost(0, 1, "x"), Departed(0, 1)])
def test_rank_zero_never_leaves(event: Event) -> None:
    result = started("kary:2", 3)
    before = fingerprint(result)
    assert not result.apply(event, 500.0).applied
    assert fingerprint(result) == before


def taken_over_by_1(spec: str = "kary:4", size: int = 9) -> RankTable:
    """Ranks 0 to size-1 online, group {0,1,2}, rank 0 dead and rank 1 the root; the dead
    root's other children fostered at rank 1 (as the new root's census and fosters leave them)."""
    result = started(spec, size)
    bring_up(result, list(range(1, size)))
    result.members = (0, 1, 2)
    why = "the root died; rank 1 took over in term 2"
    assert result.apply(Lost(0, 1, why, parent=1), 200.0).applied
    assert result.root == 1 and states(result)[0] == "lost"
    for rank in result.topology.children(0):
        if rank != 1:
            entry = result.entry(rank)
            online = Online(rank, entry.incarnation, f"node{rank}", 1000 + rank, parent=1)
            assert result.apply(online, 201.0).applied
    return result


def refill_rank0(result: RankTable, now: float = 210.0) -> int:
    """A joiner granted rank 0 and welcomed by the root: its incarnation."""
    granted = result.apply(Reserve("k" * 40, "newhost", 0, 30.0), now)
    assert granted.reservation is not None and granted.reservation.granted, granted
    incarnation = granted.reservation.incarnation
    online = Online(0, incarnation, "newhost", 4242, parent=result.root, key="k" * 40)
    assert result.apply(online, now + 1).applied
    return incarnation


def test_rank_zero_is_not_reserved_while_it_is_the_root() -> None:
    result = started("kary:4", 5)
    bring_up(result, [1, 2, 3, 4])
    result.members = (0, 1, 2)
    refused = result.apply(Reserve("k" * 40, "h", 0, 30.0), 200.0)
    assert refused.reservation is not None and not refused.reservation.granted
    assert result.parent_of(0) is None and result.parent_of(3) == 0


def test_the_dead_roots_rank_is_refilled_under_the_root_that_took_over() -> None:
    result = taken_over_by_1()
    assert result.parent_of(0) == 1 and result.parent_of(1) is None
    refused = result.apply(Reserve("r" * 40, "h", 1, 30.0), 202.0)  # the root's own rank
    assert refused.reservation is not None and "rank 1 is taken" in refused.reservation.reason
    incarnation = refill_rank0(result)
    entry = result.entry(0)
    assert incarnation == 2 and states(result)[0] == "online"
    assert entry.attached_to == 1 and entry.host == "newhost" and result.reachable(0)
    assert result.root == 1  # the role stays where it is


def test_the_lowest_free_rank_after_a_takeover_is_the_dead_roots() -> None:
    result = taken_over_by_1()
    granted = result.apply(Reserve("k" * 40, "h", None, 30.0), 202.0)
    assert granted.reservation is not None and granted.reservation.rank == 0


def test_a_refilled_rank_zero_is_lost_by_its_parents_word_and_the_root_stays() -> None:
    result = taken_over_by_1()
    incarnation = refill_rank0(result)
    assert result.apply(Lost(0, incarnation, "connection dropped", parent=1), 220.0).applied
    assert states(result)[0] == "lost" and result.root == 1
    # the root leaves the table only by a takeover: a Lost of it from a rank not in the group
    assert not result.apply(Lost(1, 1, "connection dropped", parent=3), 221.0).applied
    assert not result.apply(Lost(1, 1, "connection dropped"), 221.0).applied


@pytest.mark.parametrize("successor", [2, 0])
def test_the_root_that_took_over_dies_in_turn_and_what_it_held_goes_adrift(
    successor: int,
) -> None:
    """The second takeover: whoever it held (the refilled rank 0, the dead root's children
    fostered there) sits outside its own subtree; every one goes adrift, but the new root."""
    result = taken_over_by_1()
    incarnation = refill_rank0(result)
    why = f"the root died; rank {successor} took over in term 3"
    assert result.apply(Lost(1, 1, why, parent=successor), 230.0).applied
    assert result.root == successor and states(result)[1] == "lost"
    assert result.entry(successor).attached_to is None
    assert result.entry(successor).adrift_until is None and result.reachable(successor)
    held = [r for r in (0, 2, 3, 4, 5, 6, 7, 8) if r != successor]
    for rank in held:
        entry = result.entry(rank)
        assert entry.state.value == "online" and entry.adrift_until is not None, (rank, entry)
    assert result.entry(0).incarnation == incarnation
    # the former root is not the root's: a Lost of it from another member changes nothing more
    assert not result.apply(Lost(successor, 1, "x", parent=1), 231.0).applied


def test_the_root_once_applied_follows_each_takeover_in_the_log() -> None:
    """A member elected root reckons whom it replaces from its log's unapplied entries too."""
    result = started("kary:4", 9)
    bring_up(result, list(range(1, 9)))
    result.members = (0, 1, 2, 3)
    first = Lost(0, 1, "the root died; rank 1 took over in term 2", parent=1)
    second = Lost(1, 1, "the root died; rank 2 took over in term 3", parent=2)
    assert root_once_applied(result, []) == 0
    assert root_once_applied(result, [first]) == 1
    assert root_once_applied(result, [first, second]) == 2
    assert root_once_applied(result, [Lost(2, 1, "x", parent=1)]) == 0  # not the root
    assert root_once_applied(result, [Lost(0, 1, "x", parent=5)]) == 0  # not a member
    assert root_once_applied(result, [second]) == 0  # rank 1 is no root yet


def test_a_root_elected_over_an_uncommitted_takeover_replaces_its_root_not_rank_0() -> None:
    """Rank 1 took over (term 2) and stalled before its Lost of rank 0 was committed; rank 3,
    elected in term 3 with that entry in its log, commits it first. Its own takeover must name
    rank 1 (root_once_applied): a Lost of rank 0 again changes nothing, the table's root stays
    the stalled rank 1, and the members rank 3 admits are voided as outside its subtree."""
    stale = started("kary:4", 13)
    bring_up(stale, list(range(1, 13)))
    stale.members = (0, 1, 2, 3, 4)
    uncommitted = [Lost(0, 1, "the root died; rank 1 took over in term 2", parent=1)]
    assert stale.apply(uncommitted[0], 200.0).applied  # committed with term 3's first entry
    wrong = Lost(0, 1, "the root died; rank 3 took over in term 3", parent=3)
    assert not stale.apply(wrong, 201.0).applied and stale.root == 1
    assert not stale.apply(Online(2, 1, "node2", 1002, parent=3), 202.0).applied

    result = started("kary:4", 13)
    bring_up(result, list(range(1, 13)))
    result.members = (0, 1, 2, 3, 4)
    dead = root_once_applied(result, uncommitted)
    assert dead == 1
    assert result.apply(uncommitted[0], 200.0).applied
    why = "the root died; rank 3 took over in term 3"
    assert result.apply(Lost(dead, 1, why, parent=3), 201.0).applied
    assert result.root == 3 and states(result)[1] == "lost"
    assert result.apply(Online(2, 1, "node2", 1002, parent=3), 202.0).applied


def test_an_ended_rank_cannot_end_again_or_come_back() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    assert result.apply(Lost(1, 1, "x"), 200.0).applied
    before = fingerprint(result)
    for event in (Lost(1, 1, "y"), Departed(1, 1), Online(1, 1, "h", 5), Torpid(1, 1, True)):
        assert not result.apply(event, 201.0).applied, event
        assert fingerprint(result) == before


def test_torpid_flag() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    generation = result.generation
    outcome = result.apply(Torpid(1, 1, True), 150.0)
    assert outcome.applied and outcome.changed == (1,)
    assert result.entry(1).torpid
    assert result.entry(1).state is RankState.ONLINE
    assert result.entry(1).since == 101.0  # a flag, not a state: since is untouched
    assert result.generation == generation + 1
    assert result.apply(Torpid(1, 1, True), 151.0).changed == ()
    assert result.generation == generation + 1
    assert result.apply(Torpid(1, 1, False), 152.0).changed == (1,)
    assert not result.entry(1).torpid
    # not connected: refused
    assert not result.apply(Torpid(2, 1, True), 153.0).applied


def test_loss_clears_torpid() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    result.apply(Torpid(1, 1, True), 150.0)
    result.apply(Lost(1, 1, "silent"), 160.0)
    assert not result.entry(1).torpid


@pytest.mark.parametrize(
    "event",
    [
        Online(1, 2, "h", 5),
        Online(1, 0, "h", 5),
        Lost(1, 2, "x"),
        Lost(1, 0, "x"),
        Departed(1, 7),
        Torpid(1, 2, True),
        Online(3, 1, "h", 5),  # a spare is incarnation 0
        Online(0, 2, "h", 5),
    ],
)
def test_stale_incarnations_change_nothing(event: Event) -> None:
    result = started("kary:2", 4, launched=3)
    bring_up(result, [1])
    before = fingerprint(result)
    snapshot = json.dumps(status_json(result, 400.0), sort_keys=True)
    outcome = result.apply(event, 400.0)
    assert not outcome.applied
    assert outcome.changed == ()
    assert "not current" in outcome.reason
    assert fingerprint(result) == before
    assert json.dumps(status_json(result, 400.0), sort_keys=True) == snapshot


@pytest.mark.parametrize("rank", [-1, 4, 100])
def test_ranks_outside_the_instance_are_refused(rank: int) -> None:
    result = started("kary:2", 4)
    before = fingerprint(result)
    outcome = result.apply(Online(rank, 1, "h", 1), 101.0)
    assert not outcome.applied and "not in this instance" in outcome.reason
    assert fingerprint(result) == before


# --- views --------------------------------------------------------------------------------------


def test_up_waits_for_every_launched_rank() -> None:
    result = table("kary:2", 5, launched=3)
    assert not result.up()
    result.apply(Online(0, 1, "n", 1), 100.0)
    assert not result.up()
    bring_up(result, [1])
    assert not result.up()
    bring_up(result, [2])
    assert result.up()  # ranks 3 and 4 are spares


def test_up_does_not_wait_for_a_lost_rank() -> None:
    # A launched rank lost before it came up: nobody will bring it back, so up() does not wait.
    result = started("kary:2", 3)
    result.apply(Lost(2, 1, "x"), 101.0)
    bring_up(result, [1])
    assert result.up()


def test_subtree_roll_up() -> None:
    #        0
    #      1   2
    #     3 4 5 6
    result = started("kary:2", 7)
    assert subtrees(result) == ["partial"] + ["offline"] * 6
    bring_up(result, [1, 2, 3, 4, 5, 6])
    assert subtrees(result) == ["full"] * 7
    result.apply(Departed(6, 1), 110.0)  # vacant below 2 and 0
    assert subtrees(result) == ["partial", "full", "partial", "full", "full", "full", "offline"]
    result.apply(Lost(3, 1, "x"), 111.0)  # lost below 1 and 0: lost dominates partial
    assert subtrees(result) == [
        "degraded",
        "degraded",
        "partial",
        "lost",
        "full",
        "full",
        "offline",
    ]
    result.apply(Lost(1, 1, "x"), 112.0)  # rank 4 stays online, adrift: its subtree is whole
    assert subtrees(result) == ["degraded", "lost", "partial", "lost", "full", "full", "offline"]


def test_vacant_spares_make_ancestors_partial() -> None:
    result = started("kary:1", 4, launched=2)
    bring_up(result, [1])
    assert subtrees(result) == ["partial", "partial", "offline", "offline"]


def test_subtree_of_a_lone_root() -> None:
    assert subtrees(started("kary:2", 1)) == ["full"]
    assert subtrees(table("kary:2", 1, 1)) == ["offline"]


def test_snapshot_fields() -> None:
    result = started("kary:2", 4, launched=3, now=100.0)
    bring_up(result, [1], now=101.0)
    result.apply(Torpid(1, 1, True), 102.0)
    snapshot = status_json(result, 103.25)
    assert set(snapshot) == {"size", "topo", "ranks"}
    assert snapshot["size"] == 4
    assert snapshot["topo"] == "kary:2"
    assert [set(rank) for rank in snapshot["ranks"]] == [
        SNAPSHOT_FIELDS | {"subtree_since", "attached_to"},
        SNAPSHOT_FIELDS | {"subtree_since", "attached_to"},
        SNAPSHOT_FIELDS,  # offline, never held: nothing to say why
        SNAPSHOT_FIELDS,  # a spare
    ]
    assert snapshot["ranks"][0] == {
        "rank": 0,
        "state": "online",
        "host": "node0",
        "pid": 1000,
        "incarnation": 1,
        "parent": None,
        "children": [1, 2],
        "subtree": "partial",
        "torpid": False,
        "since": 3.25,
        "subtree_since": 3.25,
        "attached_to": None,
    }
    assert snapshot["ranks"][1] == {
        "rank": 1,
        "state": "online",
        "host": "node1",
        "pid": 1001,
        "incarnation": 1,
        "parent": 0,
        "children": [3],
        "subtree": "partial",
        "torpid": True,
        "since": 2.25,
        "subtree_since": 2.25,
        "attached_to": 0,
    }
    assert snapshot["ranks"][3] == {
        "rank": 3,
        "state": "vacant",
        "host": "extra0",
        "pid": None,
        "incarnation": 0,
        "parent": 1,
        "children": [],
        "subtree": "offline",
        "torpid": False,
        "since": 3.25,
    }
    # it is JSON as it stands, and a clock that went backwards never shows a negative age
    assert json.loads(json.dumps(snapshot)) == snapshot
    assert all(rank["since"] == 0.0 for rank in status_json(result, 0.0)["ranks"])


# --- why a rank went: reasons, last pid, and the subtree's clock ---------------------------------


def shown(result: RankTable, rank: int, now: float) -> dict[str, Any]:
    return status_json(result, now)["ranks"][rank]


def test_a_lost_rank_says_why_when_and_which_broker() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1, 2])
    result.apply(Lost(2, 1, "connection dropped"), 200.0)
    entry = shown(result, 2, 203.5)
    assert (entry["state"], entry["reason"], entry["since"]) == ("lost", "connection dropped", 3.5)
    assert (entry["pid"], entry["last_pid"], entry["host"]) == (None, 1002, "node2")
    assert "subtree_since" not in entry


def test_ranks_below_one_that_went_name_it() -> None:
    """Those never online below it are cut off and name it; those online go adrift, with
    nothing to explain until rank 0 gives up on them, and then say that."""
    #        0
    #      1   2
    #     3 4 5 6
    result = started("kary:2", 7)
    bring_up(result, [1, 2, 3, 5])
    result.apply(Lost(1, 1, "silent for 5.0s"), 200.0)
    result.apply(Departed(2, 1), 201.0)
    reasons = {rank: result.entry(rank).reason for rank in range(1, 7)}
    assert reasons == {
        1: "silent for 5.0s",
        2: GOODBYE,
        3: "",  # online, adrift
        4: "rank 1 above it was lost",  # launched, never online: cut off
        5: "",
        6: "rank 2 above it left",
    }
    assert [result.entry(rank).last_pid for rank in range(1, 7)] == [
        1001,
        1002,
        1003,
        None,
        1005,
        None,
    ]
    assert "last_pid" not in shown(result, 6, 202.0)
    late = 201.0 + result.reattach_grace
    for event in result.adrift(late):
        assert result.apply(event, late).applied
    assert [result.entry(rank).reason for rank in (3, 5)] == ["did not reattach in time"] * 2
    assert [shown(result, rank, late)["last_pid"] for rank in (3, 5)] == [1003, 1005]


def test_a_voided_rank_and_those_cut_off_below_it_say_so() -> None:
    result = started("kary:1", 3)
    bring_up(result, [1])  # rank 2 never came online: cut off (one online would go adrift)
    result.apply(Void(1, 1, "rank 1 is online, it cannot come online"), 200.0)
    assert result.entry(1).reason == "voided: rank 1 is online, it cannot come online"
    assert result.entry(2).reason == "rank 1 above it was voided"


def test_retired_ranks_and_those_cut_off_below_a_retiring_one() -> None:
    result = started("kary:1", 3, launched=2)  # rank 2 is a spare: nothing below rank 1 held
    bring_up(result, [1])
    result.apply(Retire(1, 1), 200.0)
    assert result.entry(1).reason == ""  # connected: nothing to explain
    result.apply(Departed(1, 1), 201.0)
    assert (result.entry(1).state, result.entry(1).reason) == (RankState.VACANT, "retired")
    assert "reason" not in shown(result, 2, 202.0)  # a spare never held says nothing
    config = started("kary:1", 3, launched=3, fixed=True)
    config.apply(Online(1, 1, "node1", 11), 101.0)
    config.apply(Retire(1, 1), 200.0)
    config.apply(Departed(1, 1), 201.0)
    reasons = (config.entry(1).reason, config.entry(2).reason)
    assert reasons == ("retired", "rank 1 above it retired")


def test_a_config_rank_says_why_it_is_offline_and_that_it_was_restarted() -> None:
    result = started("kary:2", 3, fixed=True)
    bring_up(result, [1])
    result.apply(Lost(1, 1, "connection dropped"), 200.0)
    assert shown(result, 1, 201.0)["reason"] == "connection dropped"
    result.apply(Reboot(1, 1), 202.0)
    entry = shown(result, 1, 203.0)
    assert (entry["state"], entry["reason"], entry["last_pid"]) == (
        "offline",
        "its host restarted its broker",
        1001,
    )
    result.apply(Online(1, 2, "node1", 77), 204.0)
    entry = shown(result, 1, 205.0)
    assert "reason" not in entry and "last_pid" not in entry and entry["pid"] == 77


def test_a_lapsed_or_released_reservation_says_so_and_shows_the_last_broker_again() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1, 2])
    result.apply(Lost(2, 1, "connection dropped"), 200.0)
    grant = reserve(result, Reserve("a" * 40, "joiner", 2, 30.0), 201.0)
    reserved = shown(result, 2, 202.0)
    assert reserved["host"] == "joiner" and "reason" not in reserved and "last_pid" not in reserved
    assert result.apply(Expire(2, grant.incarnation), 231.0).applied
    entry = shown(result, 2, 232.0)
    assert entry["state"] == "vacant"
    assert entry["reason"] == "lease expired before its joiner's hello"
    assert (entry["host"], entry["last_pid"], entry["since"]) == ("node2", 1002, 1.0)
    again = reserve(result, Reserve("b" * 40, "joiner", 2, 30.0), 240.0)
    assert result.apply(Release(2, again.incarnation, "b" * 40), 241.0).applied
    assert result.entry(2).reason == "released: its joiner failed before hello"


def test_coming_online_clears_the_reason() -> None:
    result = started("kary:2", 3, launched=2)
    bring_up(result, [1])
    result.apply(Lost(1, 1, "connection dropped"), 200.0)
    grant = reserve(result, Reserve("a" * 40, "joiner", 1, 30.0), 201.0)
    result.apply(Online(1, grant.incarnation, "joiner", 55), 202.0)
    assert (result.entry(1).reason, result.entry(1).last_pid) == ("", 55)


def test_a_long_reason_from_a_child_is_cut_short() -> None:
    result = started("kary:2", 3)
    bring_up(result, [1])
    result.apply(Lost(1, 1, "x" * 5000), 200.0)
    reason = result.entry(1).reason
    assert len(reason) == REASON_LENGTH and reason == "x" * (REASON_LENGTH - 3) + "..."


def test_the_subtree_clock_restarts_when_the_subtree_status_changes() -> None:
    """The root said `full for 49.5s` just after recovering from a failure (issue 13): its own
    state had not changed, but its subtree's had."""
    result = started("kary:2", 3, launched=3)
    bring_up(result, [1, 2], now=101.0)
    assert shown(result, 0, 150.0)["subtree_since"] == 49.0  # full since rank 2 came online
    result.apply(Lost(2, 1, "connection dropped"), 160.0)
    assert shown(result, 0, 161.0)["subtree"] == "degraded"
    assert shown(result, 0, 161.0)["subtree_since"] == 1.0
    grant = reserve(result, Reserve("a" * 40, "joiner", 2, 30.0), 170.0)
    assert shown(result, 0, 171.0)["subtree"] == "partial"
    result.apply(Online(2, grant.incarnation, "joiner", 9), 175.0)
    root = shown(result, 0, 176.5)
    assert (root["subtree"], root["subtree_since"], root["since"]) == ("full", 1.5, 76.5)
    # a change below that leaves the status as it was does not restart the clock
    result.apply(Torpid(1, 1, True), 180.0)
    assert shown(result, 0, 181.0)["subtree_since"] == 6.0


# --- random event sequences ---------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn, max_size: int) -> tuple[str, int]:
    """(spec, size): a named shape or a shuffled `parents:` tree (parents may follow children)."""
    size = draw(st.integers(1, max_size), label="size")
    return draw(specs(size), label="spec"), size


class RankTableMachine(RuleBasedStateMachine):
    """Random events, stale and current, on PMI- and config-booted tables of any tree shape,
    against the invariants of docs/design.md. The model knows only which ranks belong to their
    config host, and in which incarnation each rank was last welcomed."""

    def __init__(self) -> None:
        super().__init__()
        self.table: RankTable
        self.now = 1000.0
        self.pids = 10_000
        self.config: set[int] = set()  # ranks a config file gives to their host
        self.welcomed: dict[int, int] = {}  # rank -> the incarnation last welcomed online
        self.incarnations: list[int] = []  # only a Reboot of a welcomed incarnation raises one
        self.adrift_until: list[float | None] = []  # each rank's grace before the event

    @initialize(tree=trees(12), fixed=st.booleans(), data=st.data())
    def start(self, tree: tuple[str, int], fixed: bool, data: st.DataObject) -> None:
        spec, size = tree
        launched = data.draw(st.integers(1, size), label="launched")
        unknown = not fixed and data.draw(st.booleans(), label="unknown hosts")
        self.table = table(spec, size, launched, self.now, fixed=fixed, unknown=unknown)
        assert self.table.apply(Online(0, 1, "node0", 1), self.now).applied
        self.config = set(range(launched)) if fixed else set()
        self.welcomed = {0: 1}
        self.incarnations = [entry.incarnation for entry in self.table.entries]

    def _apply(self, event: Event) -> None:
        self.now += 0.5
        statuses = self.table.subtree_statuses()
        clocks = [self.table.subtree_since(rank) for rank in range(self.table.size)]
        self._apply_checked(event)
        for rank, status in enumerate(self.table.subtree_statuses()):
            # a subtree status that changed restarts its clock; one that did not, does not
            since = self.now if status is not statuses[rank] else clocks[rank]
            assert self.table.subtree_since(rank) == since, (rank, event)

    def _apply_checked(self, event: Event) -> None:
        before = fingerprint(self.table)
        old_entries = [entry.fields() for entry in self.table.entries]
        was = [entry.state for entry in self.table.entries]
        attached = [entry.attached_to for entry in self.table.entries]
        self.adrift_until = [entry.adrift_until for entry in self.table.entries]
        snapshot = json.dumps(status_json(self.table, self.now), sort_keys=True)
        in_range = 0 <= event.rank < self.table.size
        # a Reboot names the incarnation that ended (or 0): it is not checked
        current = in_range and (
            isinstance(event, Reboot)
            or event.incarnation == self.table.entry(event.rank).incarnation
        )
        outcome = self.table.apply(event, self.now)
        new_entries = [entry.fields() for entry in self.table.entries]
        changed = {
            r for r, (a, b) in enumerate(zip(old_entries, new_entries, strict=True)) if a != b
        }
        if isinstance(event, Reboot) and in_range:
            # only a config rank whose broker is down may be restarted on its host
            allowed = event.rank in self.config and was[event.rank] is RankState.OFFLINE
            assert outcome.applied == allowed, (event, outcome)
        if not current or not outcome.applied:
            # refused: the table is untouched, byte for byte
            assert not outcome.applied or not current
            assert outcome.changed == ()
            assert fingerprint(self.table) == before
            assert json.dumps(status_json(self.table, self.now), sort_keys=True) == snapshot
            return
        # generation moves by one iff something changed, and `changed` names what did
        assert set(outcome.changed) == changed
        assert len(outcome.changed) == len(changed)
        assert self.table.generation == before[0] + (1 if changed else 0)
        self._check_effect(event, changed, was, attached)

    def _check_effect(
        self, event: Event, changed: set[int], was: list[RankState], attached: list[int | None]
    ) -> None:
        entry = self.table.entry(event.rank)
        topology = self.table.topology
        match event:
            case Online():
                assert entry.state is RankState.ONLINE
                assert entry.pid == event.pid
                assert changed <= {event.rank}
                self.welcomed[event.rank] = entry.incarnation
            case Lost() | Departed() | Void():
                if isinstance(event, Void):  # only a connected incarnation is voided here
                    assert was[event.rank] in CONNECTED
                if event.rank in self.config:  # its host will run a broker again
                    assert entry.state is RankState.OFFLINE
                else:
                    assert entry.state is (
                        RankState.VACANT if isinstance(event, Departed) else RankState.LOST
                    )
                assert changed <= {event.rank, *topology.descendants(event.rank)}
                for rank in topology.descendants(event.rank):
                    below = self.table.entry(rank)
                    if was[rank] in CONNECTED:  # stays connected; adrift if its link went here
                        assert below.state is was[rank]
                        adrift = attached[rank] == event.rank
                        assert (rank in changed) == adrift
                        if adrift:
                            # a new grace, or what was left of the ended rank's own (cut_below)
                            grace_ends = self.now + self.table.reattach_grace
                            if self.adrift_until[event.rank] is not None:
                                grace_ends = min(grace_ends, self.adrift_until[event.rank])
                            assert below.attached_to is None
                            assert below.adrift_until == grace_ends
                    elif rank in changed:  # never online, under a parent that is gone
                        assert below.state is (
                            RankState.OFFLINE if rank in self.config else RankState.LOST
                        )
                        parent = topology.parent(rank)
                        assert parent is not None
                        assert parent == event.rank or was[parent] not in CONNECTED
                    else:
                        assert below.state is was[rank]
            case Torpid():
                assert entry.state in CONNECTED
                assert entry.torpid == event.torpid
                assert changed <= {event.rank}
            case Located():  # a host for a rank never online, and nothing else
                assert entry.state in (RankState.OFFLINE, RankState.LOST)
                assert entry.host == event.host and entry.pid is None
                assert changed == ({event.rank} if event.host != UNKNOWN_HOST else set())
            case Reboot():
                # a new incarnation only if the current one was ever welcomed online
                renewed = self.welcomed.get(event.rank) == self.incarnations[event.rank]
                assert entry.state is RankState.OFFLINE
                assert changed == ({event.rank} if renewed else set())
                self.incarnations[event.rank] += renewed

    def _incarnation(self, data: st.DataObject, rank: int) -> int:
        current = self.table.entry(rank).incarnation if 0 <= rank < self.table.size else 1
        return data.draw(
            st.sampled_from([current, current, current, current + 1, max(0, current - 1)]),
            label="incarnation",
        )

    def _rank(self, data: st.DataObject) -> int:
        return data.draw(
            st.integers(0, self.table.size - 1) | st.sampled_from([-1, self.table.size]),
            label="rank",
        )

    @rule(data=st.data(), host=st.sampled_from(["n1", UNKNOWN_HOST]))
    def located(self, data: st.DataObject, host: str) -> None:
        rank = self._rank(data)
        self._apply(Located(rank, self._incarnation(data, rank), host))

    @rule(data=st.data())
    def online(self, data: st.DataObject) -> None:
        rank = self._rank(data)
        entry = self.table.entry(rank) if 0 <= rank < self.table.size else None
        if entry is not None and entry.pid is not None and data.draw(st.booleans(), label="same"):
            pid = entry.pid
        else:
            self.pids += 1
            pid = self.pids
        self._apply(Online(rank, self._incarnation(data, rank), f"host{rank}", pid))

    @rule(data=st.data())
    def online_in_order(self, data: st.DataObject) -> None:
        """Bring up the lowest offline rank whose parent is connected (keeps the tree growing)."""
        for entry in self.table.entries:
            parent = self.table.topology.parent(entry.rank)
            if entry.state is RankState.OFFLINE and (
                parent is None or self.table.entry(parent).state in CONNECTED
            ):
                self.pids += 1
                self._apply(Online(entry.rank, entry.incarnation, "h", self.pids))
                return

    @rule(data=st.data(), reason=st.sampled_from(["connection dropped", "silent for 61.0s"]))
    def lost(self, data: st.DataObject, reason: str) -> None:
        rank = self._rank(data)
        self._apply(Lost(rank, self._incarnation(data, rank), reason))

    @rule(data=st.data())
    def void(self, data: st.DataObject) -> None:
        """Rank 0 had the parent cut an incarnation off (an Online it refused, an expiry)."""
        rank = self._rank(data)
        self._apply(Void(rank, self._incarnation(data, rank), "voided"))

    @rule(data=st.data())
    def departed(self, data: st.DataObject) -> None:
        rank = self._rank(data)
        self._apply(Departed(rank, self._incarnation(data, rank)))

    @rule(data=st.data(), torpid=st.booleans())
    def torpid(self, data: st.DataObject, torpid: bool) -> None:
        rank = self._rank(data)
        self._apply(Torpid(rank, self._incarnation(data, rank), torpid))

    @rule(data=st.data(), ended=st.booleans())
    def reboot(self, data: st.DataObject, ended: bool) -> None:
        """A broker restarted on its host, naming the incarnation that ended or 0 (first boot)."""
        rank = self._rank(data)
        self._apply(Reboot(rank, self._incarnation(data, rank) if ended else 0))

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def rank_zero_is_online(self) -> None:
        assert self.table.entry(0).state is RankState.ONLINE

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def connected_ranks_are_attached_to_their_parent_or_adrift(self) -> None:
        """Every Online here comes from the topology parent; a rank whose parent ended seeks
        another, with a deadline, and is never both attached and adrift."""
        for entry in self.table.entries[1:]:
            if entry.state not in CONNECTED:
                assert entry.attached_to is None and entry.adrift_until is None, entry
            elif entry.attached_to is None:
                assert entry.adrift_until is not None, entry
            else:
                assert entry.adrift_until is None, entry
                assert entry.attached_to == self.table.topology.parent(entry.rank), entry
                assert self.table.entry(entry.attached_to).state in CONNECTED, entry

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def entries_are_coherent(self) -> None:
        for entry in self.table.entries:
            if entry.state not in CONNECTED:
                assert entry.pid is None and not entry.torpid, entry
            if entry.state is RankState.VACANT and entry.incarnation == 0:
                assert entry.host.startswith("extra")
            assert entry.state is PUBLIC[entry.phase]

    def deadlines_now(self) -> list[Any]:
        return [e for e in self.table.entries if e.lease is not None or e.adrift_until is not None]

    @precondition(lambda self: hasattr(self, "table"))
    @rule()
    def the_timers_see_every_deadline(self) -> None:
        """`deadlined`, what the loop's timers walk (when a deadline is due), is every entry
        with a lease or adrift."""
        assert self.table.deadlined() == self.deadlines_now()

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def the_loop_is_told_the_soonest_deadline(self) -> None:
        """`next_expiry`, asked after every turn and kept between the timers' walks, is the
        soonest lease or reattach grace, exactly."""
        timed = self.deadlines_now()
        ends = [e.lease.until if e.lease is not None else e.adrift_until for e in timed]
        soonest = min((end for end in ends if end is not None), default=None)
        assert self.table.next_expiry() == soonest

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def a_join_looks_for_a_rank_where_one_may_be(self) -> None:
        """Every rank below where a Reserve of any rank starts looking is in a phase no Reserve
        row takes from."""
        for rank in range(self.table._free_from):
            assert self.table.entry(rank).phase not in RESERVABLE_PHASES, rank

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def ownership_is_explicit(self) -> None:
        """A config rank is in a config phase, never lost or vacant here; an open one never."""
        for entry in self.table.entries:
            assert (entry.phase in CONFIG_PHASES) == (entry.rank in self.config), entry
        assert [entry.incarnation for entry in self.table.entries] == self.incarnations

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def subtree_status_agrees_with_the_definition(self) -> None:
        statuses = self.table.subtree_statuses()
        for rank in range(self.table.size):
            assert statuses[rank] is brute_subtree(self.table, rank), rank
        states = [entry.state for entry in self.table.entries]
        assert statuses == roll_up(self.table.topology, states)  # kept live = rolled up anew

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def every_rank_that_went_says_why(self) -> None:
        """A rank that a broker held and that is lost, offline or vacant has a reason; a
        connected or reserved one has none; and the last broker's pid is kept."""
        for entry in self.table.entries:
            assert len(entry.reason) <= REASON_LENGTH
            if entry.state in CONNECTED or entry.state is RankState.RESERVED:
                assert entry.reason == "", entry
            elif entry.last_pid is not None:
                assert entry.reason, entry
            if entry.state in CONNECTED:
                assert entry.last_pid == entry.pid

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def snapshot_is_well_formed(self) -> None:
        snapshot = status_json(self.table, self.now)
        assert snapshot["size"] == self.table.size == len(snapshot["ranks"])
        for rank, shown in enumerate(snapshot["ranks"]):
            assert set(shown) >= SNAPSHOT_FIELDS
            for field in set(shown) - SNAPSHOT_FIELDS:
                assert shown["state"] in SOMETIMES[field], (field, shown)
            assert shown["rank"] == rank
            assert shown["since"] >= 0
            if shown["state"] in CONNECTED:
                assert 0 <= shown["subtree_since"] <= shown["since"]
        assert self.table.up() == all(
            entry.state is not RankState.OFFLINE for entry in self.table.entries
        )


TestRankTableMachine = RankTableMachine.TestCase
TestRankTableMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


@given(
    trees(20),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 19), st.sampled_from(["up", "lost", "departed"]))),
)
@settings(max_examples=100, deadline=None)
def test_subtree_roll_up_matches_brute_force(
    tree: tuple[str, int], fixed: bool, steps: list[tuple[int, str]]
) -> None:
    spec, size = tree
    result = started(spec, size, fixed=fixed)
    now = 100.0
    for rank, what in steps:
        rank %= size
        now += 1
        incarnation = result.entry(rank).incarnation
        if what == "up":
            result.apply(Online(rank, incarnation, "h", rank + 1), now)
        elif what == "lost":
            result.apply(Lost(rank, incarnation, "x"), now)
        else:
            result.apply(Departed(rank, incarnation), now)
        statuses = result.subtree_statuses()
        assert statuses == [brute_subtree(result, r) for r in range(size)]


@given(trees(40), st.data())
@settings(max_examples=100, deadline=None)
def test_a_roll_up_kept_live_starts_as_the_roll_up(
    tree: tuple[str, int], data: st.DataObject
) -> None:
    """Built from any states on any tree (a `parents:` one numbers a parent after its child),
    the live roll-up holds the statuses, counts and offline count a roll-up from scratch gives."""
    spec, size = tree
    topology = Topology(spec, size)
    states = data.draw(st.lists(st.sampled_from(list(RankState)), min_size=size, max_size=size))
    rollup = Rollup(topology, states, 5.0)
    assert rollup.statuses == roll_up(topology, states)
    assert rollup.offline == states.count(RankState.OFFLINE)
    assert rollup.since == [5.0] * size


@given(trees(40), st.data())
@settings(max_examples=200, deadline=None)
def test_a_batch_of_ranks_coming_online_rolls_up_as_one_by_one(
    tree: tuple[str, int], data: st.DataObject
) -> None:
    """`set_online` (a report's Onlines rolled up in one pass) leaves what `set` one rank at a
    time does: states, counts, statuses and when each changed, from any states on any tree,
    for any ranks in any order (repeats and ranks online already included)."""
    spec, size = tree
    topology = Topology(spec, size)
    states = data.draw(st.lists(st.sampled_from(list(RankState)), min_size=size, max_size=size))
    ranks = data.draw(st.lists(st.integers(0, size - 1), max_size=2 * size))
    one_by_one, batched = Rollup(topology, states, 5.0), Rollup(topology, states, 5.0)
    for rank in ranks:
        one_by_one.set(rank, RankState.ONLINE, 7.0)
    batched.set_online(ranks, 7.0)
    assert batched.states == one_by_one.states
    assert batched.statuses == one_by_one.statuses == roll_up(topology, batched.states)
    assert batched.since == one_by_one.since
    assert +batched.counts == +one_by_one.counts and batched.offline == one_by_one.offline
    assert (batched.lost_kids, batched.short_kids) == (one_by_one.lost_kids, one_by_one.short_kids)


# --- retire ---------------------------------------------------------------------------------


def retire_table() -> RankTable:
    """kary:2 of 7, all online: rank 1 has leaves 3 and 4."""
    result = started("kary:2", 7)
    bring_up(result, [1, 2, 3, 4, 5, 6])
    return result


def test_a_leaf_retires_through_retiring_to_vacant() -> None:
    result = retire_table()
    outcome = result.apply(Retire(3, 1), 200.0)
    assert outcome.applied and outcome.changed == (3,)
    assert result.entry(3).state is RankState.RETIRING
    assert result.subtree_statuses()[1] is SubtreeStatus.PARTIAL
    assert result.up()  # retiring is not "expected from bootstrap"
    # until it has left, nobody may have it
    assert not reserve(result, Reserve("k" * 40, "joiner", 3, 30.0), 201.0).granted
    outcome = result.apply(Departed(3, 1), 202.0)
    assert outcome.applied and result.entry(3).state is RankState.VACANT
    assert result.entry(3).retired
    assert status_json(result, 203.0)["ranks"][3]["retired"] is True
    # the old incarnation can never come back
    assert not result.apply(Online(3, 1, "node3", 4242), 204.0).applied


def test_retiring_again_or_after_is_not_an_error() -> None:
    result = retire_table()
    result.apply(Retire(4, 1), 200.0)
    again = result.apply(Retire(4, 1), 201.0)
    assert again.applied and again.changed == () and "already retiring" in again.reason
    result.apply(Departed(4, 1), 202.0)
    after = result.apply(Retire(4, 1), 203.0)
    assert after.applied and after.changed == () and "already retired" in after.reason


def test_unsafe_retires_are_refused_and_change_nothing() -> None:
    result = retire_table()
    result.apply(Lost(6, 1, "connection dropped"), 200.0)
    generation = result.generation
    cases = {
        0: "rank 0 cannot retire",
        1: "rank 1 has children that are online, reserved or retiring (3, 4)",
        6: "rank 6 is lost: nothing to retire",
    }
    for rank, reason in cases.items():
        outcome = result.apply(Retire(rank, 1), 201.0)
        assert not outcome.applied and reason in outcome.reason, outcome
    assert result.generation == generation
    assert [result.entry(r).state for r in (0, 1, 6)] == [
        RankState.ONLINE,
        RankState.ONLINE,
        RankState.LOST,
    ]


def test_a_retiring_parent_takes_no_new_children() -> None:
    result = started("kary:2", 7, launched=3)  # ranks 3-6 are spares
    bring_up(result, [1, 2])
    assert result.apply(Retire(1, 1), 200.0).applied
    specific = reserve(result, Reserve("a" * 40, "joiner", 3, 30.0), 201.0)
    assert not specific.granted and specific.reason == "rank 3's parent is retiring"
    anyone = reserve(result, Reserve("b" * 40, "joiner", None, 30.0), 201.0)
    assert anyone.granted and anyone.rank == 5  # the first spare not under rank 1


def test_a_retiring_broker_that_dies_is_lost_not_retired() -> None:
    result = retire_table()
    result.apply(Retire(5, 1), 200.0)
    result.apply(Lost(5, 1, "connection dropped"), 201.0)
    assert result.entry(5).state is RankState.LOST and not result.entry(5).retired


@pytest.mark.parametrize("ending", ["departed", "lost"])
def test_a_retired_joiners_key_never_gets_a_rank_again(ending: str) -> None:
    result = started("kary:2", 3, launched=1)
    key = "r" * 40
    grant = reserve(result, Reserve(key, "node1", 1, 30.0), 200.0)
    assert result.apply(Online(1, grant.incarnation, "node1", 11), 201.0).applied
    assert result.apply(Retire(1, grant.incarnation), 202.0).applied
    end = (
        Departed(1, grant.incarnation)
        if ending == "departed"
        else Lost(1, grant.incarnation, "connection dropped")
    )
    assert result.apply(end, 203.0).applied
    for wanted in (1, 2, None):
        again = reserve(result, Reserve(key, "node1", wanted, 30.0), 204.0)
        assert not again.granted and again.never
        assert "this broker's key was retired from rank 1" in again.reason
    assert reserve(result, Reserve("n" * 40, "node9", 1, 30.0), 205.0).granted  # a new key may


# --- config-booted ranks: they belong to their hosts -------------------------------------------


def config_table(spec: str = "kary:2", size: int = 3) -> RankTable:
    """Booted from a config file with every rank online."""
    result = started(spec, size, fixed=True)
    bring_up(result, list(result.topology.descendants(0)))
    return result


@pytest.mark.parametrize("end", ["lost", "departed"])
def test_a_config_rank_whose_broker_goes_is_offline_and_reboots_with_a_new_incarnation(
    end: str,
) -> None:
    result = config_table()
    event: Event = Lost(1, 1, "connection dropped") if end == "lost" else Departed(1, 1)
    assert result.apply(event, 200.0).changed == (1,)
    entry = result.entry(1)
    assert (entry.state, entry.phase, entry.pid) == (RankState.OFFLINE, Phase.CONFIG_DOWN, None)
    assert not result.up()  # expected back from its host
    assert not reserve(result, Reserve("k" * 40, "joiner", 1, 30.0), 201.0).granted
    reboot = result.apply(Reboot(1, 1), 202.0)
    assert reboot.applied and reboot.changed == (1,)
    assert (result.entry(1).incarnation, result.entry(1).phase) == (2, Phase.CONFIG_BOOTING)
    # asked again before that incarnation was online: it serves, nothing changes
    again = result.apply(Reboot(1, 1), 203.0)
    assert again.applied and again.changed == ()
    assert not result.apply(Online(1, 1, "node1", 7), 204.0).applied  # the old one is stale
    assert result.apply(Online(1, 2, "node1", 7), 204.0).applied
    assert result.entry(1).phase is Phase.CONFIG_ONLINE


def test_a_config_rank_never_online_keeps_its_incarnation() -> None:
    result = started("kary:2", 3, fixed=True)
    assert result.entry(1).phase is Phase.CONFIG_BOOTING
    assert result.apply(Lost(1, 1, "x"), 200.0).changed == (1,)  # `since` starts again
    assert result.entry(1).phase is Phase.CONFIG_BOOTING
    reboot = result.apply(Reboot(1, 0), 201.0)
    assert reboot.applied and reboot.changed == () and result.entry(1).incarnation == 1


def test_reboot_refusals_say_why() -> None:
    result = config_table("kary:2", 4)
    result.apply(Retire(3, 1), 200.0)
    result.apply(Departed(3, 1), 201.0)
    cases = {
        1: "rank 1 is online",
        3: "rank 3 was retired: a retired broker does not come back",
    }
    for rank, reason in cases.items():
        outcome = result.apply(Reboot(rank, 1), 202.0)
        assert (outcome.applied, outcome.reason) == (False, reason)
    pmi = started("kary:2", 3)
    pmi.apply(Lost(1, 1, "x"), 200.0)
    refused = pmi.apply(Reboot(1, 1), 201.0)
    assert (refused.applied, refused.reason) == (False, "rank 1 is not held by config bootstrap")


def test_a_config_rank_retiring_below_a_lost_one_goes_adrift_and_still_retires() -> None:
    """Its broker seeks a live ancestor, still retiring: it is not cut off, so its host does
    not restart it, and it leaves through the parent it reattached to."""
    #   0 - 1 - 2   (a chain): rank 2 retires, then its parent goes
    result = config_table("kary:1", 3)
    assert result.apply(Retire(2, 1), 200.0).applied
    outcome = result.apply(Lost(1, 1, "connection dropped"), 201.0)
    assert outcome.changed == (1, 2)
    assert [result.entry(r).phase for r in (1, 2)] == [Phase.CONFIG_DOWN, Phase.CONFIG_RETIRING]
    assert result.entry(2).attached_to is None and result.entry(2).adrift_until is not None
    assert not result.retired_keys
    assert result.apply(Reboot(2, 1), 202.0).reason == "rank 2 is retiring"
    assert result.apply(Online(2, 1, "node2", 1002, parent=0), 203.0).changed == (2,)
    assert not result.apply(Departed(2, 1, parent=1), 204.0).applied  # a link it left
    assert result.apply(Departed(2, 1, parent=0), 204.0).applied
    assert result.entry(2).phase is Phase.RETIRED
    # one that does not reattach in time is a retiring broker that failed: lost, for FLUB
    late = config_table("kary:1", 3)
    late.apply(Retire(2, 1), 200.0)
    late.apply(Lost(1, 1, "connection dropped"), 201.0)
    assert late.adrift(201.0 + late.reattach_grace - 0.001) == []
    (expired,) = late.adrift(201.0 + late.reattach_grace)
    assert late.apply(expired, 201.0 + late.reattach_grace).applied
    assert late.entry(2).phase is Phase.CONFIG_LOST


def test_a_config_broker_that_dies_while_retiring_is_lost_and_free_for_flub() -> None:
    result = config_table()
    result.apply(Retire(2, 1), 200.0)
    result.apply(Lost(2, 1, "connection dropped"), 201.0)
    assert (result.entry(2).state, result.entry(2).phase) == (RankState.LOST, Phase.CONFIG_LOST)
    assert result.apply(Reboot(2, 1), 202.0).reason == "rank 2 is lost"
    grant = reserve(result, Reserve("k" * 40, "joiner", 2, 30.0), 203.0)
    assert grant.granted and grant.incarnation == 2
    assert result.entry(2).phase is Phase.RESERVED  # FLUB's now: an open rank
    assert result.apply(Expire(2, 2), 300.0).applied
    assert result.entry(2).phase is Phase.VACANT


# --- the roll-up walks the tree, not the rank numbers ------------------------------------------


@pytest.mark.parametrize(
    ("end", "expected"), [("lost", "degraded"), ("departed", "partial"), ("config", "partial")]
)
def test_a_child_numbered_before_its_parent_rolls_up(end: str, expected: str) -> None:
    # parents:2,0 -- rank 1 hangs under rank 2, which hangs under rank 0:  0 - 2 - 1
    result = started("parents:2,0", 3, fixed=end == "config")
    bring_up(result, [2, 1])
    assert subtrees(result) == ["full"] * 3
    event: Event = Departed(1, 1) if end == "departed" else Lost(1, 1, "killed")
    assert result.apply(event, 200.0).changed == (1,)
    below = {"lost": "lost", "departed": "offline", "config": "offline"}[end]
    assert subtrees(result) == [expected, below, expected]


def test_the_example_of_the_issue() -> None:
    # parents:0,3,0 -- rank 2's parent is rank 3
    result = started("parents:0,3,0", 4)
    bring_up(result, [1, 3, 2])
    result.apply(Lost(2, 1, "killed"), 200.0)
    assert subtrees(result) == ["degraded", "full", "lost", "degraded"]


# --- the table itself -----------------------------------------------------------------------------


def test_every_phase_shows_one_public_state_and_every_public_state_is_shown() -> None:
    assert set(PUBLIC) == set(Phase)
    assert set(PUBLIC.values()) == set(RankState)
    assert all(PUBLIC[phase] is RankState.ONLINE for phase in (Phase.ONLINE, Phase.CONFIG_ONLINE))


def test_allocatable_is_what_the_reserve_rows_allow() -> None:
    reservable = {PUBLIC[phase] for phase, kind in TRANSITIONS if kind is Reserve}
    assert reservable == set(ALLOCATABLE)
    assert {PUBLIC[phase] for phase, kind in TRANSITIONS if kind is Torpid} == CONNECTED


def test_every_event_type_has_a_refusal_and_a_row() -> None:
    # what a rank's parent sees, and what a broker saw of its own old parent
    reported = {Online, Lost, Departed, Torpid, Moved, Dropped}
    decided = {Retire, Expire, Release, Reboot, Void, Reserve, Located}  # rank 0 decides, grants
    events = reported | decided
    assert set(REFUSALS) == events
    internal = {Orphaned, LinkEnded}
    assert {kind for _, kind in TRANSITIONS} == events | internal


def test_reserve_goes_through_apply_and_carries_its_grant() -> None:
    result = started("kary:2", 3, launched=1)
    generation = result.generation
    outcome = result.apply(Reserve("a" * 40, "joiner", None, 30.0), 200.0)
    assert outcome.applied and outcome.changed == (1,) and result.generation == generation + 1
    assert outcome.reservation is not None
    assert (outcome.reservation.rank, outcome.reservation.incarnation) == (1, 1)
    again = result.apply(Reserve("a" * 40, "joiner", None, 30.0), 201.0)
    assert again.applied and again.changed == () and again.reservation is not None
    assert again.reservation.repeated and again.reservation.rank == 1
    assert result.generation == generation + 1
    taken = result.apply(Reserve("b" * 40, "joiner", 0, 30.0), 202.0)
    assert not taken.applied and taken.reservation is not None
    assert (
        taken.reason == taken.reservation.reason == "rank 0 is taken: online (host node0, pid 1000)"
    )
    # no event but Reserve carries a grant
    assert result.apply(Torpid(0, 1, True), 203.0).reservation is None


@given(trees(40), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_the_live_roll_up_is_the_roll_up(tree: tuple[str, int], seed: int) -> None:
    """Every rank brought up, then ranks lost and departed in a random order: the counts kept
    along the way give the statuses a roll-up from scratch gives."""
    import random

    spec, size = tree
    result = started(spec, size)
    order = [0, *result.topology.descendants(0)]
    bring_up(result, order[1:])
    shuffled = random.Random(seed).sample(order[1:], len(order) - 1)
    for step, rank in enumerate(shuffled):
        entry = result.entry(rank)
        event: Event = Departed(rank, 1) if step % 3 == 0 else Lost(rank, 1, "x")
        if entry.state in CONNECTED:
            result.apply(event, 200.0 + step)
        assert result.subtree_statuses() == roll_up(
            result.topology, [e.state for e in result.entries]
        )


# --- Located: bootstrap's word on where a broker never online was started ------------------------


def test_a_launched_rank_is_located_while_its_host_is_unknown() -> None:
    result = RankTable(Topology("kary:2", 3), ["root", UNKNOWN_HOST, UNKNOWN_HOST], 100.0)
    assert result.apply(Online(0, 1, "root", 42), 100.0).applied
    outcome = result.apply(Located(1, 1, "node1"), 101.0)
    assert outcome.applied and outcome.changed == (1,)
    assert result.entry(1).host == "node1" and result.entry(1).state is RankState.OFFLINE
    assert result.entry(1).since == 100.0  # a host is not a move
    again = result.apply(Located(1, 1, "elsewhere"), 102.0)
    assert not again.applied and "host is known: node1" in again.reason
    assert not result.apply(Located(2, 2, "node2"), 102.0).applied  # not its incarnation


def test_an_online_brings_its_host_and_bootstrap_cannot_change_it() -> None:
    result = RankTable(Topology("kary:2", 2), ["root", UNKNOWN_HOST], 100.0)
    assert result.apply(Online(0, 1, "root", 42), 100.0).applied
    assert result.apply(Online(1, 1, "node1", 7), 101.0).applied
    assert result.entry(1).host == "node1"
    refused = result.apply(Located(1, 1, "other"), 102.0)
    assert not refused.applied and "its host is its broker's" in refused.reason


def test_a_rank_lost_before_it_came_online_is_located() -> None:
    result = RankTable(Topology("kary:1", 3), ["root", UNKNOWN_HOST, UNKNOWN_HOST], 100.0)
    assert result.apply(Online(0, 1, "root", 42), 100.0).applied
    assert result.apply(Lost(1, 1, "connection dropped"), 101.0).applied  # rank 2 orphaned
    assert result.entry(2).state is RankState.LOST
    assert result.apply(Located(2, 1, "node2"), 102.0).applied
    assert result.entry(2).host == "node2" and result.entry(2).state is RankState.LOST
