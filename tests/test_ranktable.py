"""Tests of `tbon.overlay.state.ranktable`: the rank table at rank 0 as a pure state machine."""

from __future__ import annotations

import json
from dataclasses import astuple
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
from tables import bring_up, started, table

from tbon.overlay.state.ranktable import (
    CONNECTED,
    Departed,
    Event,
    Lost,
    Online,
    RankState,
    RankTable,
    SubtreeStatus,
    Torpid,
)

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


def states(result: RankTable) -> list[str]:
    return [entry.state.value for entry in result.entries]


def subtrees(result: RankTable) -> list[str]:
    return [status.value for status in result.subtree_statuses()]


def fingerprint(result: RankTable) -> tuple[Any, ...]:
    return (result.generation, tuple(astuple(entry) for entry in result.entries))


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


def test_lost_cascades_to_connected_and_offline_descendants() -> None:
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
    outcome = result.apply(Lost(1, 1, "connection lost"), 200.0)
    assert outcome.applied
    assert set(outcome.changed) == {1, 3, 4}
    assert outcome.changed[0] == 1
    assert states(result)[:5] == ["online", "lost", "online", "lost", "lost"]
    for rank in (1, 3, 4):
        assert result.entry(rank).pid is None
        assert result.entry(rank).since == 200.0
    assert result.entry(1).incarnation == 1  # only rank 0 hands out new incarnations
    assert result.generation == 5  # one per applied change: 0, 1, 3, 2, then the loss
    outcome = result.apply(Lost(2, 1, "silent"), 201.0)
    # rank 5 was offline: lost too; rank 6 is a vacant spare and stays so
    assert set(outcome.changed) == {2, 5}
    assert states(result) == ["online", "lost", "lost", "lost", "lost", "lost", "vacant"]


def test_departed_becomes_vacant_and_its_subtree_lost() -> None:
    result = started("kary:1", 4)
    bring_up(result, [1, 2, 3])
    outcome = result.apply(Departed(2, 1), 300.0)
    assert outcome.applied and set(outcome.changed) == {2, 3}
    assert states(result) == ["online", "online", "vacant", "lost"]
    assert result.entry(2).pid is None


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
    snapshot = json.dumps(result.snapshot(400.0), sort_keys=True)
    outcome = result.apply(event, 400.0)
    assert not outcome.applied
    assert outcome.changed == ()
    assert "not current" in outcome.reason
    assert fingerprint(result) == before
    assert json.dumps(result.snapshot(400.0), sort_keys=True) == snapshot


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
    result.apply(Lost(1, 1, "x"), 112.0)
    assert subtrees(result) == ["degraded", "lost", "partial", "lost", "lost", "full", "offline"]


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
    snapshot = result.snapshot(103.25)
    assert set(snapshot) == {"size", "topo", "ranks"}
    assert snapshot["size"] == 4
    assert snapshot["topo"] == "kary:2"
    assert [set(rank) for rank in snapshot["ranks"]] == [SNAPSHOT_FIELDS] * 4
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
    assert all(rank["since"] == 0.0 for rank in result.snapshot(0.0)["ranks"])


# --- random event sequences ---------------------------------------------------------------------

SPECS = st.sampled_from(["kary:0", "kary:1", "kary:2", "kary:3", "binomial"])


class RankTableMachine(RuleBasedStateMachine):
    """Random events, stale and current, against the invariants of docs/design.md."""

    def __init__(self) -> None:
        super().__init__()
        self.table: RankTable
        self.now = 1000.0
        self.pids = 10_000

    @initialize(spec=SPECS, size=st.integers(1, 12), data=st.data())
    def start(self, spec: str, size: int, data: st.DataObject) -> None:
        launched = data.draw(st.integers(1, size), label="launched")
        self.table = table(spec, size, launched, self.now)
        assert self.table.apply(Online(0, 1, "node0", 1), self.now).applied

    def _apply(self, event: Event) -> None:
        self.now += 0.5
        before = fingerprint(self.table)
        old_entries = [astuple(entry) for entry in self.table.entries]
        snapshot = json.dumps(self.table.snapshot(self.now), sort_keys=True)
        in_range = 0 <= event.rank < self.table.size
        current = in_range and event.incarnation == self.table.entry(event.rank).incarnation
        outcome = self.table.apply(event, self.now)
        new_entries = [astuple(entry) for entry in self.table.entries]
        changed = {
            r for r, (a, b) in enumerate(zip(old_entries, new_entries, strict=True)) if a != b
        }
        if not current or not outcome.applied:
            # refused: the table is untouched, byte for byte
            assert not outcome.applied or not current
            assert outcome.changed == ()
            assert fingerprint(self.table) == before
            assert json.dumps(self.table.snapshot(self.now), sort_keys=True) == snapshot
            return
        # generation moves by one iff something changed, and `changed` names what did
        assert set(outcome.changed) == changed
        assert len(outcome.changed) == len(changed)
        assert self.table.generation == before[0] + (1 if changed else 0)
        self._check_effect(event, changed)

    def _check_effect(self, event: Event, changed: set[int]) -> None:
        entry = self.table.entry(event.rank)
        topology = self.table.topology
        match event:
            case Online():
                assert entry.state is RankState.ONLINE
                assert entry.pid == event.pid
                assert changed <= {event.rank}
            case Lost() | Departed():
                assert entry.state is (
                    RankState.LOST if isinstance(event, Lost) else RankState.VACANT
                )
                assert changed <= {event.rank, *topology.descendants(event.rank)}
                for rank in topology.descendants(event.rank):
                    assert self.table.entry(rank).state in (RankState.LOST, RankState.VACANT)
                    if rank in changed:
                        assert self.table.entry(rank).state is RankState.LOST
            case Torpid():
                assert entry.state in CONNECTED
                assert entry.torpid == event.torpid
                assert changed <= {event.rank}

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

    @rule(data=st.data(), reason=st.sampled_from(["connection lost", "silent for 61.0s"]))
    def lost(self, data: st.DataObject, reason: str) -> None:
        rank = self._rank(data)
        self._apply(Lost(rank, self._incarnation(data, rank), reason))

    @rule(data=st.data())
    def departed(self, data: st.DataObject) -> None:
        rank = self._rank(data)
        self._apply(Departed(rank, self._incarnation(data, rank)))

    @rule(data=st.data(), torpid=st.booleans())
    def torpid(self, data: st.DataObject, torpid: bool) -> None:
        rank = self._rank(data)
        self._apply(Torpid(rank, self._incarnation(data, rank), torpid))

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def rank_zero_is_online(self) -> None:
        assert self.table.entry(0).state is RankState.ONLINE

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def online_only_under_a_connected_parent(self) -> None:
        for entry in self.table.entries:
            parent = self.table.topology.parent(entry.rank)
            if entry.state is RankState.ONLINE and parent is not None:
                assert self.table.entry(parent).state in CONNECTED, entry

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def entries_are_coherent(self) -> None:
        for entry in self.table.entries:
            if entry.state not in CONNECTED:
                assert entry.pid is None and not entry.torpid, entry
            if entry.state is RankState.VACANT and entry.incarnation == 0:
                assert entry.host.startswith("extra")

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def subtree_status_agrees_with_the_definition(self) -> None:
        statuses = self.table.subtree_statuses()
        for rank in range(self.table.size):
            assert statuses[rank] is brute_subtree(self.table, rank), rank

    @precondition(lambda self: hasattr(self, "table"))
    @invariant()
    def snapshot_is_well_formed(self) -> None:
        snapshot = self.table.snapshot(self.now)
        assert snapshot["size"] == self.table.size == len(snapshot["ranks"])
        for rank, shown in enumerate(snapshot["ranks"]):
            assert set(shown) == SNAPSHOT_FIELDS
            assert shown["rank"] == rank
            assert shown["since"] >= 0
        assert self.table.up() == all(
            entry.state is not RankState.OFFLINE for entry in self.table.entries
        )


TestRankTableMachine = RankTableMachine.TestCase
TestRankTableMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@given(
    SPECS,
    st.integers(1, 20),
    st.lists(st.tuples(st.integers(0, 19), st.sampled_from(["up", "lost", "departed"]))),
)
@settings(max_examples=60, deadline=None)
def test_subtree_roll_up_matches_brute_force(
    spec: str, size: int, steps: list[tuple[int, str]]
) -> None:
    result = started(spec, size)
    now = 100.0
    for rank, what in steps:
        rank %= size
        now += 1
        if what == "up":
            result.apply(Online(rank, 1, "h", rank + 1), now)
        elif what == "lost":
            result.apply(Lost(rank, 1, "x"), now)
        else:
            result.apply(Departed(rank, 1), now)
        statuses = result.subtree_statuses()
        assert statuses == [brute_subtree(result, r) for r in range(size)]


# --- retire ---------------------------------------------------------------------------------


def retire_table() -> RankTable:
    """kary:2 of 7, all online: rank 1 has leaves 3 and 4."""
    result = started("kary:2", 7)
    bring_up(result, [1, 2, 3, 4, 5, 6])
    return result


def test_a_leaf_retires_through_retiring_to_vacant() -> None:
    from tbon.overlay.state.ranktable import Retire

    result = retire_table()
    outcome = result.apply(Retire(3, 1), 200.0)
    assert outcome.applied and outcome.changed == (3,)
    assert result.entry(3).state is RankState.RETIRING
    assert result.subtree_statuses()[1] is SubtreeStatus.PARTIAL
    assert result.up()  # retiring is not "expected from bootstrap"
    # until it has left, nobody may have it
    from tbon.overlay.state.ranktable import Reserve

    assert not result.reserve(Reserve("k" * 40, "joiner", 3, 30.0), 201.0).granted
    outcome = result.apply(Departed(3, 1), 202.0)
    assert outcome.applied and result.entry(3).state is RankState.VACANT
    assert result.entry(3).retired
    assert result.snapshot(203.0)["ranks"][3]["retired"] is True
    # the old incarnation can never come back
    assert not result.apply(Online(3, 1, "node3", 4242), 204.0).applied


def test_retiring_again_or_after_is_not_an_error() -> None:
    from tbon.overlay.state.ranktable import Retire

    result = retire_table()
    result.apply(Retire(4, 1), 200.0)
    again = result.apply(Retire(4, 1), 201.0)
    assert again.applied and again.changed == () and "already retiring" in again.reason
    result.apply(Departed(4, 1), 202.0)
    after = result.apply(Retire(4, 1), 203.0)
    assert after.applied and after.changed == () and "already retired" in after.reason


def test_unsafe_retires_are_refused_and_change_nothing() -> None:
    from tbon.overlay.state.ranktable import Retire

    result = retire_table()
    result.apply(Lost(6, 1, "connection lost"), 200.0)
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
    from tbon.overlay.state.ranktable import Reserve, Retire

    result = started("kary:2", 7, launched=3)  # ranks 3-6 are spares
    bring_up(result, [1, 2])
    assert result.apply(Retire(1, 1), 200.0).applied
    specific = result.reserve(Reserve("a" * 40, "joiner", 3, 30.0), 201.0)
    assert not specific.granted and specific.reason == "rank 3's parent is retiring"
    anyone = result.reserve(Reserve("b" * 40, "joiner", None, 30.0), 201.0)
    assert anyone.granted and anyone.rank == 5  # the first spare not under rank 1


def test_a_retiring_broker_that_dies_is_lost_not_retired() -> None:
    from tbon.overlay.state.ranktable import Retire

    result = retire_table()
    result.apply(Retire(5, 1), 200.0)
    result.apply(Lost(5, 1, "connection lost"), 201.0)
    assert result.entry(5).state is RankState.LOST and not result.entry(5).retired


@pytest.mark.parametrize("ending", ["departed", "lost"])
def test_a_retired_joiners_key_never_gets_a_rank_again(ending: str) -> None:
    from tbon.overlay.state.ranktable import Reserve, Retire

    result = started("kary:2", 3, launched=1)
    key = "r" * 40
    grant = result.reserve(Reserve(key, "node1", 1, 30.0), 200.0)
    assert result.apply(Online(1, grant.incarnation, "node1", 11), 201.0).applied
    assert result.apply(Retire(1, grant.incarnation), 202.0).applied
    end = (
        Departed(1, grant.incarnation)
        if ending == "departed"
        else Lost(1, grant.incarnation, "connection lost")
    )
    assert result.apply(end, 203.0).applied
    for wanted in (1, 2, None):
        again = result.reserve(Reserve(key, "node1", wanted, 30.0), 204.0)
        assert not again.granted and again.never
        assert "this broker's key was retired from rank 1" in again.reason
    assert result.reserve(Reserve("n" * 40, "node9", 1, 30.0), 205.0).granted  # a new key may
