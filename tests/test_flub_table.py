"""FLUB in the rank table: reserve, verify, expire, and a reserved rank coming online.

The table is a pure object, so every transition of issue 3 is tested here directly: which ranks
FLUB may hand out and in which order, what a reservation records, how it ends (hello or lease),
and that no stale event ever touches a rank given to a newer incarnation. A hypothesis state
machine then mixes joins, failures, departures, expiries and stale reports on random trees.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from tables import bring_up, specs, started, table
from zmq.utils import z85

from tbon.keys.cert import fingerprint
from tbon.overlay.state.rankstates import CONFIG_PHASES
from tbon.overlay.state.ranktable import (
    ALLOCATABLE,
    CONNECTED,
    Departed,
    Event,
    Expire,
    Lost,
    Online,
    Phase,
    RankEntry,
    RankState,
    RankTable,
    Reboot,
    Release,
    Reservation,
    Reserve,
    Retire,
    Torpid,
    Void,
)
from tbon.overlay.state.snapshot import describe
from tbon.overlay.state.snapshot import snapshot as status_json

LEASE = 30.0


def key(seed: int) -> str:
    """A well-formed CURVE public key (Z85, 40 characters) that differs per seed."""
    return z85.encode(bytes([seed]) * 32).decode()


ALICE, BOB, CAROL = key(1), key(2), key(3)


def reserve(
    result: RankTable,
    public_key: str = ALICE,
    rank: int | None = None,
    host: str = "joiner",
    lease: float = LEASE,
    now: float = 200.0,
) -> Reservation:
    reservation = result.apply(Reserve(public_key, host, rank, lease), now).reservation
    assert reservation is not None
    return reservation


def frozen(result: RankTable) -> tuple[int, list[RankEntry]]:
    """Everything the table holds, deep-copied, to compare before and after."""
    return result.generation, copy.deepcopy(result.entries)


def states(result: RankTable) -> list[str]:
    return [entry.state.value for entry in result.entries]


def reserved_by(result: RankTable, public_key: str) -> list[int]:
    return [
        e.rank for e in result.entries if e.state is RankState.RESERVED and e.joiner == public_key
    ]


def mixed() -> RankTable:
    """kary:2, size 9, 6 launched:  0 online; 1, 2 online; 3 lost; 4 offline; 5 departed (vacant);
    6, 7, 8 spare (vacant)."""
    #          0
    #       1     2
    #      3 4   5 6
    #     7 8
    result = started("kary:2", 9, launched=6)
    bring_up(result, [1, 2, 3, 5])
    assert result.apply(Lost(3, 1, "connection lost"), 150.0).changed == (3,)
    assert result.apply(Departed(5, 1), 151.0).changed == (5,)
    assert states(result) == [
        "online",
        "online",
        "online",
        "lost",
        "offline",
        "vacant",
        "vacant",
        "vacant",
        "vacant",
    ]
    return result


# --- reserve(): which rank -------------------------------------------------------------------


def test_reserve_gives_the_lowest_allocatable_rank_first() -> None:
    result = mixed()
    grants = [reserve(result, key(seed)).rank for seed in range(10, 15)]
    # 3 is lost, 5 vacant (departed), 6..8 spare; never 0, 1, 2 (online) or 4 (offline)
    assert grants == [3, 5, 6, 7, 8]
    full = reserve(result, key(20))
    assert not full.granted and full.reason == "no available ranks"


def test_lowest_first_puts_interior_ranks_before_their_leaves() -> None:
    result = started("kary:2", 7, launched=1)
    assert [reserve(result, key(seed)).rank for seed in range(10, 16)] == [1, 2, 3, 4, 5, 6]


def rank_one_in(phase: Phase) -> RankTable:
    """kary:0 of two ranks, rank 1 brought to `phase` by the events that lead there."""
    result = started("kary:0", 2, 1 if phase is Phase.VACANT else 2, fixed=phase in CONFIG_PHASES)
    online, retire = Online(1, 1, "node1", 77), Retire(1, 1)
    lost, departed = Lost(1, 1, "connection lost"), Departed(1, 1)
    steps: list[Event] = {
        Phase.ONLINE: [online],
        Phase.CONFIG_ONLINE: [online],
        Phase.RETIRING: [online, retire],
        Phase.CONFIG_RETIRING: [online, retire],
        Phase.LOST: [lost],
        Phase.RESERVED: [lost],
        Phase.CONFIG_DOWN: [online, lost],
        Phase.CONFIG_LOST: [online, retire, lost],
        Phase.RETIRED: [online, retire, departed],
    }.get(phase, [])
    for step in steps:
        assert result.apply(step, 150.0).applied
    if phase is Phase.RESERVED:
        assert reserve(result, BOB).granted
    assert result.entry(1).phase is phase
    return result


@pytest.mark.parametrize("phase", list(Phase))
def test_only_vacant_and_lost_are_allocatable(phase: Phase) -> None:
    result = rank_one_in(phase)
    state = result.entry(1).state
    before = frozen(result)
    grant = reserve(result, ALICE)
    assert grant.granted == (state in ALLOCATABLE)
    assert set(ALLOCATABLE) == {RankState.VACANT, RankState.LOST}
    if grant.granted:
        assert grant.rank == 1
        assert result.entry(1).phase is Phase.RESERVED  # FLUB's now, whoever held it before
    else:
        assert grant.reason == "no available ranks"
        assert frozen(result) == before
        specific = reserve(result, ALICE, rank=1)
        assert not specific.granted and specific.reason.startswith("rank 1 is taken: ")
        assert frozen(result) == before


def test_rank_zero_is_never_given_out() -> None:
    result = started("kary:2", 1)
    assert reserve(result).reason == "no available ranks"
    grant = reserve(result, rank=0)
    assert not grant.granted
    assert grant.reason == "rank 0 is taken: online (host node0, pid 1000)"
    # nor before rank 0 itself is online
    fresh = table("kary:2", 3, launched=1)
    assert reserve(fresh).rank == 1
    assert not reserve(fresh, BOB, rank=0).granted
    assert "offline" in reserve(fresh, BOB, rank=0).reason


# --- reserve(): what a reservation records ------------------------------------------------------


def test_a_reservation_records_joiner_host_lease_and_a_new_incarnation() -> None:
    result = started("kary:2", 4, launched=2)
    generation = result.generation
    grant = reserve(result, ALICE, host="newhost", lease=12.5, now=300.0)
    assert grant == Reservation(True, 2, 1)
    assert not grant.repeated
    entry = result.entry(2)
    assert entry.state is RankState.RESERVED
    assert entry.incarnation == 1  # a spare starts at 0
    assert entry.host == "newhost"
    assert entry.lease.host_before == "extra0"
    assert entry.joiner == ALICE
    assert entry.lease_until == 312.5
    assert entry.since == 300.0
    assert entry.pid is None and not entry.torpid
    assert result.generation == generation + 1
    assert states(result) == ["online", "offline", "reserved", "vacant"]


@pytest.mark.parametrize(("rank", "incarnation"), [(3, 2), (5, 2), (6, 1)])
def test_incarnation_goes_up_by_one(rank: int, incarnation: int) -> None:
    result = mixed()
    before = result.entry(rank).incarnation
    grant = reserve(result, rank=rank)
    assert grant.granted and grant.rank == rank
    assert grant.incarnation == incarnation == before + 1 == result.entry(rank).incarnation


def test_only_the_reserved_rank_changes() -> None:
    result = mixed()
    generation, before = frozen(result)
    grant = reserve(result, rank=6)
    after = result.entries
    assert [r for r in range(result.size) if before[r] != after[r]] == [grant.rank]
    assert result.generation == generation + 1


def test_a_lost_rank_shows_the_joiners_host_and_gets_it_back_on_expiry() -> None:
    result = mixed()
    grant = reserve(result, rank=3, host="replacement", now=200.0)
    assert result.entry(3).host == "replacement"
    assert result.entry(3).lease.host_before == "node3"
    assert result.apply(Expire(3, grant.incarnation), 200.0 + LEASE).applied
    entry = result.entry(3)
    # the lease ends in vacant (issue 3), with the host shown before the reservation
    assert (entry.state, entry.host, entry.incarnation) == (RankState.VACANT, "node3", 2)


def test_a_repeated_request_gets_the_same_reservation_and_changes_nothing() -> None:
    result = mixed()
    first = reserve(result, ALICE, host="a", now=200.0)
    assert first.granted and not first.repeated
    before = frozen(result)
    for rank in (None, first.rank):
        again = reserve(result, ALICE, rank=rank, host="elsewhere", lease=999.0, now=210.0)
        assert again == Reservation(True, first.rank, first.incarnation, repeated=True)
        assert frozen(result) == before
    # another key gets another rank
    other = reserve(result, BOB)
    assert other.granted and other.rank != first.rank


def test_a_key_never_holds_two_reservations() -> None:
    result = started("kary:2", 5, launched=1)
    first = reserve(result, ALICE)
    assert first.rank == 1
    second = reserve(result, ALICE, rank=3)
    # Either refused or answered with the reservation it already has: never a second rank.
    assert not second.granted or second.rank == first.rank
    assert reserved_by(result, ALICE) == [1]


def test_a_specific_rank_is_granted_if_allocatable() -> None:
    result = mixed()
    assert reserve(result, ALICE, rank=7).rank == 7  # not the lowest: the one asked for
    assert reserve(result, BOB, rank=3).rank == 3  # lost
    assert reserve(result, CAROL, rank=5).rank == 5  # departed
    assert reserve(result, key(9)).rank == 6  # the lowest left


def test_a_specific_rank_that_is_taken_names_its_holder() -> None:
    result = mixed()
    reserved = reserve(result, BOB, rank=6, host="joinhost")
    assert reserved.granted
    cases = {
        1: "rank 1 is taken: online (host node1, pid 1001)",
        4: "rank 4 is taken: offline, expected from bootstrap on node4",
        6: f"rank 6 is taken: reserved for a joiner on joinhost (key {fingerprint(BOB)})",
    }
    before = frozen(result)
    for rank, reason in cases.items():
        grant = reserve(result, ALICE, rank=rank)
        assert grant == Reservation(False, reason=reason)
        assert frozen(result) == before
    assert result.apply(Retire(1, 1), 160.0).applied  # its children: 3 lost, 4 offline
    assert (
        reserve(result, ALICE, rank=1).reason
        == "rank 1 is taken: retiring (host node1, pid 1001)"
        == f"rank 1 is taken: {describe(result.entry(1))}"
    )


@pytest.mark.parametrize("rank", [-1, 9, 100])
def test_a_rank_outside_the_instance_is_refused(rank: int) -> None:
    result = mixed()
    before = frozen(result)
    grant = reserve(result, rank=rank)
    assert grant == Reservation(False, reason=f"no rank {rank} in this instance of size 9")
    assert frozen(result) == before


def test_a_full_instance_has_no_available_ranks() -> None:
    result = started("binomial", 4)
    bring_up(result, [1, 2, 3])
    before = frozen(result)
    assert reserve(result) == Reservation(False, reason="no available ranks")
    assert frozen(result) == before


def test_snapshot_of_a_reserved_rank() -> None:
    result = started("kary:2", 3, launched=1, now=100.0)
    grant = reserve(result, ALICE, host="j1", lease=10.0, now=200.0)
    shown = status_json(result, 203.5)["ranks"][grant.rank]
    assert shown["state"] == "reserved"
    assert shown["host"] == "j1"
    assert shown["pid"] is None
    assert shown["incarnation"] == 1
    assert shown["joiner"] == fingerprint(ALICE)
    assert shown["joiner"].startswith("SHA256:")
    assert ALICE not in json.dumps(shown)  # a fingerprint, not the key
    assert shown["expires"] == 6.5
    assert shown["since"] == 3.5
    assert status_json(result, 500.0)["ranks"][grant.rank]["expires"] == 0.0
    # only reserved ranks carry them
    assert all(
        "joiner" not in r and "expires" not in r for r in status_json(result, 203.5)["ranks"][::2]
    )
    assert result.apply(Online(1, 1, "j1", 55), 204.0).applied
    assert "joiner" not in status_json(result, 205.0)["ranks"][1]
    assert "expires" not in status_json(result, 205.0)["ranks"][1]


# --- verify() -----------------------------------------------------------------------------------


def test_verify_accepts_exactly_the_reserved_key_rank_and_incarnation() -> None:
    result = mixed()
    grant = reserve(result, ALICE, rank=3)  # lost rank 3, now incarnation 2
    other = reserve(result, BOB, rank=6)
    assert result.verify(3, 2, ALICE) is None
    assert result.verify(6, 1, BOB) is None
    refusals = {
        (3, 2, BOB): "rank 3 is reserved for another key",
        (3, 1, ALICE): "rank 3 incarnation 1 is not reserved (rank 3 is reserved, incarnation 2)",
        (3, 3, ALICE): "rank 3 incarnation 3 is not reserved (rank 3 is reserved, incarnation 2)",
        (6, 1, ALICE): "rank 6 is reserved for another key",
        (5, 2, ALICE): "rank 5 incarnation 2 is not reserved (rank 5 is vacant, incarnation 1)",
        (1, 1, ALICE): "rank 1 incarnation 1 is not reserved (rank 1 is online, incarnation 1)",
        (4, 1, ALICE): "rank 4 incarnation 1 is not reserved (rank 4 is offline, incarnation 1)",
        (0, 1, ALICE): "rank 0 incarnation 1 is not reserved (rank 0 is online, incarnation 1)",
        (-1, 1, ALICE): "no rank -1 in this instance of size 9",
        (9, 1, ALICE): "no rank 9 in this instance of size 9",
        (3, 2, ""): "rank 3 is reserved for another key",
    }
    for (rank, incarnation, public_key), reason in refusals.items():
        assert result.verify(rank, incarnation, public_key) == reason
    assert grant.incarnation == 2 and other.incarnation == 1
    before = frozen(result)
    result.verify(3, 2, ALICE)
    assert frozen(result) == before  # a pure question


def test_verify_refuses_once_the_reservation_has_ended() -> None:
    result = started("kary:2", 3, launched=1)
    one = reserve(result, ALICE, now=200.0)
    two = reserve(result, BOB, now=200.0)
    assert result.apply(Online(1, one.incarnation, "a", 1), 201.0).applied
    assert result.verify(1, one.incarnation, ALICE) is not None  # online now: no second kex
    assert result.apply(Expire(2, two.incarnation), 200.0 + LEASE).applied
    assert result.verify(2, two.incarnation, BOB) is not None
    three = reserve(result, CAROL, now=300.0)
    assert three.rank == 2 and three.incarnation == two.incarnation + 1
    assert result.verify(2, two.incarnation, BOB) is not None
    assert result.verify(2, three.incarnation, BOB) is not None
    assert result.verify(2, three.incarnation, CAROL) is None


# --- Expire, expired(), next_expiry() -----------------------------------------------------------


def test_expire_is_refused_before_the_lease_ends_and_applied_at_it() -> None:
    result = started("kary:2", 3, launched=1)
    grant = reserve(result, ALICE, host="j", lease=10.0, now=200.0)
    before = frozen(result)
    early = result.apply(Expire(1, grant.incarnation), 209.9)
    assert not early.applied and early.changed == ()
    assert "reservation has 0.1s left" in early.reason
    assert frozen(result) == before
    outcome = result.apply(Expire(1, grant.incarnation), 210.0)
    assert outcome.applied and outcome.changed == (1,)
    entry = result.entry(1)
    assert entry.state is RankState.VACANT
    assert (entry.joiner, entry.lease_until, entry.pid) == (None, None, None)
    assert entry.host == "extra0"
    assert entry.incarnation == grant.incarnation  # only reserve raises it
    assert entry.since == 210.0
    assert result.generation == before[0] + 1
    # a second Expire, or one for the old incarnation after a new reservation, does nothing
    assert not result.apply(Expire(1, grant.incarnation), 211.0).applied
    again = reserve(result, BOB, now=212.0)
    assert again.rank == 1
    before = frozen(result)
    stale = result.apply(Expire(1, grant.incarnation), 1000.0)
    assert not stale.applied and "not current" in stale.reason
    assert frozen(result) == before


def test_expire_after_the_lease() -> None:
    result = started("kary:2", 3, launched=1)
    grant = reserve(result, lease=1.0, now=200.0)
    assert result.apply(Expire(1, grant.incarnation), 5000.0).applied


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_expire_of_a_rank_that_is_not_reserved_is_refused(rank: int) -> None:
    result = started("kary:2", 3, launched=2)
    bring_up(result, [1])
    before = frozen(result)
    outcome = result.apply(Expire(rank, result.entry(rank).incarnation), 10_000.0)
    assert not outcome.applied and "not reserved" in outcome.reason
    assert frozen(result) == before


# --- Release ------------------------------------------------------------------------------------


def test_release_by_the_joiners_key_frees_the_rank_at_once() -> None:
    result = started("kary:2", 3, launched=1)
    grant = reserve(result, ALICE, host="j", lease=10.0, now=200.0)
    before = frozen(result)
    for wrong in (Release(1, grant.incarnation, BOB), Release(1, grant.incarnation + 1, ALICE)):
        refused = result.apply(wrong, 201.0)
        assert not refused.applied and frozen(result) == before
    assert "reserved for another key" in result.apply(Release(1, 1, BOB), 201.0).reason
    outcome = result.apply(Release(1, grant.incarnation, ALICE), 201.0)  # long before the lease
    assert outcome.applied and outcome.changed == (1,)
    entry = result.entry(1)
    assert entry.state is RankState.VACANT and entry.host == "extra0"
    assert (entry.joiner, entry.lease_until, entry.pid) == (None, None, None)
    assert entry.incarnation == grant.incarnation and entry.since == 201.0
    assert result.expired(1e9) == [] and result.next_expiry() is None
    again = result.apply(Release(1, grant.incarnation, ALICE), 202.0)
    assert not again.applied and "not reserved" in again.reason
    assert reserve(result, BOB, now=203.0).incarnation == grant.incarnation + 1


def test_release_of_a_rank_that_came_online_is_refused() -> None:
    result = started("kary:2", 3, launched=1)
    grant = reserve(result, ALICE, rank=1)
    assert result.apply(Online(1, grant.incarnation, "j", 9), 201.0).applied
    before = frozen(result)
    outcome = result.apply(Release(1, grant.incarnation, ALICE), 202.0)
    assert not outcome.applied and "online, not reserved" in outcome.reason
    assert frozen(result) == before


# --- Void: two brokers with one key --------------------------------------------------------------


def test_two_joiners_with_one_key_share_one_reservation_and_one_may_come_online() -> None:
    """Two processes started with one certificate ask for rank 3 while its parent is vacant: one
    reservation. If their parent reported both online, the second is refused, and voiding the
    incarnation ends it in the table: never online with a broker its parent cut off."""
    result = started("kary:2", 4, launched=1)
    first = reserve(result, ALICE, rank=3, now=200.0)
    second = reserve(result, ALICE, rank=3, now=201.0)
    assert second.repeated and (second.rank, second.incarnation) == (3, first.incarnation)
    assert reserve(result, BOB, rank=1, now=202.0).granted  # the parent joins, and comes up
    assert result.apply(Online(1, 1, "parent", 10), 203.0).applied
    assert result.apply(Online(3, first.incarnation, "twin", 11), 204.0).applied
    refused = result.apply(Online(3, first.incarnation, "twin", 12), 205.0)
    assert not refused.applied and "cannot come online" in refused.reason
    assert result.entry(3).pid == 11
    assert result.apply(Void(3, first.incarnation, refused.reason), 205.0).applied
    entry = result.entry(3)
    assert (entry.state, entry.pid, entry.incarnation) == (RankState.LOST, None, 1)
    assert reserve(result, ALICE, rank=3, now=206.0).incarnation == 2  # free again, key and all


@pytest.mark.parametrize("phase", list(Phase))
def test_only_a_connected_incarnation_is_voided_in_the_table(phase: Phase) -> None:
    """Void ends what the table still shows connected, as Lost would; any other rank's
    incarnation has ended already (an expired or released reservation), and nothing changes."""
    voided, lost = rank_one_in(phase), rank_one_in(phase)
    incarnation, connected = voided.entry(1).incarnation, voided.entry(1).state in CONNECTED
    before = frozen(voided)
    outcome = voided.apply(Void(1, incarnation, "voided"), 300.0)
    assert outcome.applied == connected
    if outcome.applied:
        assert lost.apply(Lost(1, incarnation, "voided"), 300.0).applied
        assert (voided.entry(1).phase, voided.retired_keys) == (
            lost.entry(1).phase,
            lost.retired_keys,
        )
    else:
        assert frozen(voided) == before and "no broker of it is connected" in outcome.reason


def test_expired_and_next_expiry() -> None:
    result = started("kary:0", 5, launched=1)
    assert result.next_expiry() is None
    assert result.expired(1e9) == []
    a = reserve(result, ALICE, lease=30.0, now=100.0)  # until 130
    b = reserve(result, BOB, lease=10.0, now=105.0)  # until 115
    c = reserve(result, CAROL, lease=0.0, now=106.0)  # until 106
    assert [a.rank, b.rank, c.rank] == [1, 2, 3]
    assert result.next_expiry() == 106.0
    assert result.expired(105.9) == []
    assert result.expired(106.0) == [Expire(3, 1)]
    assert result.expired(115.0) == [Expire(2, 1), Expire(3, 1)]
    assert result.expired(1e9) == [Expire(1, 1), Expire(2, 1), Expire(3, 1)]
    for expiry in result.expired(115.0):
        assert result.apply(expiry, 115.0).applied
    assert result.next_expiry() == 130.0
    assert result.apply(Online(1, 1, "a", 9), 120.0).applied  # a hello ends the lease too
    assert result.next_expiry() is None
    assert result.expired(1e9) == []


# --- a reserved rank comes online, or its parent goes -------------------------------------------


def test_online_with_the_reserved_incarnation() -> None:
    result = mixed()
    grant = reserve(result, ALICE, rank=3, host="replacement", now=200.0)
    generation = result.generation
    outcome = result.apply(Online(3, grant.incarnation, "replacement", 4242), 201.0)
    assert outcome.applied and outcome.changed == (3,)
    entry = result.entry(3)
    assert entry.state is RankState.ONLINE
    assert (entry.host, entry.pid, entry.incarnation) == ("replacement", 4242, 2)
    assert entry.joiner is None and entry.lease_until is None
    assert result.generation == generation + 1
    assert result.next_expiry() is None


@pytest.mark.parametrize("incarnation", [0, 1, 3])
def test_online_with_another_incarnation_is_refused(incarnation: int) -> None:
    result = mixed()
    reserve(result, ALICE, rank=3)  # incarnation 2
    before = frozen(result)
    outcome = result.apply(Online(3, incarnation, "old", 1), 201.0)
    assert not outcome.applied and "not current" in outcome.reason
    assert frozen(result) == before


def test_the_old_incarnation_never_touches_its_replacement() -> None:
    result = mixed()
    grant = reserve(result, ALICE, rank=3)
    assert result.apply(Online(3, grant.incarnation, "new", 5), 201.0).applied
    before = frozen(result)
    for event in (
        Online(3, 1, "node3", 1003),
        Lost(3, 1, "silent"),
        Departed(3, 1),
        Torpid(3, 1, True),
        Expire(3, 1),
    ):
        outcome = result.apply(event, 202.0)
        assert not outcome.applied and "not current" in outcome.reason, event
        assert frozen(result) == before


def test_a_reserved_rank_waits_for_its_parent() -> None:
    # kary:1 is a chain: 0 - 1 - 2; the leaf may be reserved and try first
    result = started("kary:1", 3, launched=1)
    interior = reserve(result, ALICE)
    leaf = reserve(result, BOB)
    assert (interior.rank, leaf.rank) == (1, 2)
    before = frozen(result)
    early = result.apply(Online(2, leaf.incarnation, "b", 2), 201.0)
    assert not early.applied and "parent" in early.reason
    assert frozen(result) == before
    assert result.apply(Online(1, interior.incarnation, "a", 1), 202.0).applied
    assert result.apply(Online(2, leaf.incarnation, "b", 2), 203.0).applied
    assert states(result) == ["online"] * 3


@pytest.mark.parametrize("end", ["lost", "departed"])
def test_a_parent_going_leaves_its_reserved_child_reserved(end: str) -> None:
    #          0
    #       1     2
    #      3 4   5 6
    result = started("kary:2", 7, launched=4)
    bring_up(result, [1, 3])
    grant = reserve(result, ALICE, rank=4, host="j", now=200.0)
    reserved_before = copy.deepcopy(result.entry(4))
    event: Event = Lost(1, 1, "connection lost") if end == "lost" else Departed(1, 1)
    outcome = result.apply(event, 300.0)
    assert outcome.applied and set(outcome.changed) == {1, 3}
    assert result.entry(4) == reserved_before
    assert result.verify(4, grant.incarnation, ALICE) is None
    # and it cannot come online under a parent that is gone
    refused = result.apply(Online(4, grant.incarnation, "j", 9), 301.0)
    assert not refused.applied and "parent" in refused.reason


@pytest.mark.parametrize(
    "event", [Lost(1, 1, "x"), Departed(1, 1), Torpid(1, 1, True), Online(1, 1, "h", 1)]
)
def test_a_reserved_rank_is_only_ended_by_hello_or_expiry(event: Event) -> None:
    result = started("kary:1", 3, launched=1)
    assert reserve(result).rank == 1
    before = frozen(result)
    outcome = result.apply(event, 201.0)
    if isinstance(event, Online):  # its hello: its parent (rank 0) is up
        assert outcome.applied
        return
    assert not outcome.applied
    assert frozen(result) == before


# --- random sequences ---------------------------------------------------------------------------

KEYS = [key(seed) for seed in range(1, 9)]
LEASES = st.sampled_from([0.0, 0.5, 5.0, 30.0])
LIVE = (RankState.ONLINE, RankState.RETIRING, RankState.RESERVED)


@st.composite
def trees(draw: st.DrawFn) -> tuple[str, int]:
    size = draw(st.integers(2, 24), label="size")
    return draw(specs(size) | st.just("kary:4"), label="spec"), size


class FlubMachine(RuleBasedStateMachine):
    """Joins, hellos, failures, departures, retirements, restarts, expiries and stale reports
    on random trees, PMI- or config-booted.

    Reserve is judged against a model of what FLUB promises, not of how the table keeps it: a
    key holds at most one live rank; a barred key never gets one; a rank is granted iff it is
    allocatable (or, asked for none, the lowest such rank is); incarnations only grow. The model
    keeps only what those promises need: which key each rank was granted to, which keys were
    retired, which ranks belong to a config host, and each rank's incarnation.
    """

    def __init__(self) -> None:
        super().__init__()
        self.table: RankTable
        self.now = 1000.0
        self.pids = 10_000
        self.incarnations: list[int] = []  # raised by a grant, or a config broker's restart
        self.granted_to: dict[int, str] = {}  # rank -> the key it was last granted to
        self.barred: dict[str, int] = {}  # key -> the rank its retired broker left
        self.config: set[int] = set()  # ranks that belong to their config host
        self.welcomed: dict[int, int] = {}  # rank -> the incarnation last welcomed online

    @initialize(tree=trees(), fixed=st.booleans(), data=st.data())
    def start(self, tree: tuple[str, int], fixed: bool, data: st.DataObject) -> None:
        spec, size = tree
        launched = data.draw(st.integers(1, size), label="launched")
        self.table = table(spec, size, launched, self.now, fixed=fixed)
        assert self.table.apply(Online(0, 1, "node0", 1), self.now).applied
        self.incarnations = [e.incarnation for e in self.table.entries]
        self.config = set(range(launched)) if fixed else set()
        self.welcomed = {0: 1}

    # --- the checks around every call ---

    def _apply(self, event: Event, must_refuse: bool = False) -> None:
        self.now += 0.5
        generation, before = frozen(self.table)
        outcome = self.table.apply(event, self.now)
        after = self.table.entries
        changed = {r for r in range(self.table.size) if before[r] != after[r]}
        if must_refuse:
            assert not outcome.applied, (event, outcome)
        if not outcome.applied:
            assert outcome.changed == ()
            assert frozen(self.table) == (generation, before)
            return
        assert outcome.reservation is None
        assert set(outcome.changed) == changed
        assert self.table.generation == generation + (1 if changed else 0)
        for rank in range(self.table.size):
            if rank != event.rank or not isinstance(event, Reboot):
                assert after[rank].incarnation == before[rank].incarnation
        entry = self.table.entry(event.rank)
        was = before[event.rank]
        topology = self.table.topology
        match event:
            case Online():
                assert was.state in (RankState.OFFLINE, RankState.RESERVED, RankState.ONLINE)
                assert entry.state is RankState.ONLINE and entry.pid == event.pid
                assert entry.joiner is None and entry.lease_until is None
                assert changed <= {event.rank}
                self.welcomed[event.rank] = entry.incarnation
            case Lost() | Departed():
                retiring = was.state is RankState.RETIRING
                if event.rank in self.config and not retiring:
                    assert entry.state is RankState.OFFLINE  # its host runs a broker again
                else:
                    ended = RankState.LOST if isinstance(event, Lost) else RankState.VACANT
                    assert entry.state is ended
                # a retiring broker's goodbye is its acknowledgement: retired, not just gone
                assert entry.retired == (isinstance(event, Departed) and retiring)
                if retiring and event.rank in self.granted_to:
                    self.barred[self.granted_to[event.rank]] = event.rank
                if entry.retired:  # its host's broker may not come back either
                    self.config.discard(event.rank)
                assert changed <= {event.rank, *topology.descendants(event.rank)}
                for rank in topology.descendants(event.rank):
                    if before[rank].state is RankState.RESERVED:
                        assert after[rank] == before[rank]
                    if before[rank].state in CONNECTED:  # its broker seeks a live ancestor
                        assert after[rank].state is before[rank].state
                        if rank in changed:
                            assert before[rank].attached_to == event.rank
                            assert after[rank].attached_to is None
                            assert after[rank].adrift_until is not None
                    elif rank in changed:
                        gone = RankState.OFFLINE if rank in self.config else RankState.LOST
                        assert after[rank].state is gone
            case Expire():
                assert was.state is RankState.RESERVED
                assert was.lease is not None and self.now >= was.lease.until
                assert entry.state is RankState.VACANT and entry.host == was.lease.host_before
                assert changed == {event.rank}
            case Torpid():
                assert entry.state in CONNECTED and entry.torpid == event.torpid
                assert changed <= {event.rank}
            case Retire():
                if was.state is RankState.RETIRING or (
                    was.state is RankState.VACANT and was.retired
                ):
                    assert changed == set()  # asking again is not an error
                else:
                    assert was.state is RankState.ONLINE and event.rank != 0
                    assert entry.state is RankState.RETIRING and changed == {event.rank}
                    for child in topology.children(event.rank):
                        assert before[child].state not in LIVE
            case Reboot():
                assert event.rank in self.config and was.state is RankState.OFFLINE
                renewed = self.welcomed.get(event.rank) == was.incarnation
                assert changed == ({event.rank} if renewed else set())
                assert entry.state is RankState.OFFLINE
                self.incarnations[event.rank] += renewed

    def _reserve(self, request: Reserve) -> None:
        self.now += 0.5
        generation, before = frozen(self.table)
        topology = self.table.topology
        key = request.public_key

        def free(rank: int) -> bool:
            parent = topology.parent(rank)
            retiring = parent is not None and before[parent].state is RankState.RETIRING
            return before[rank].state in ALLOCATABLE and not retiring

        live = [r for r, k in self.granted_to.items() if k == key and before[r].state in LIVE]
        outcome = self.table.apply(request, self.now)
        grant = outcome.reservation
        assert grant is not None
        assert (outcome.applied, outcome.reason) == (grant.granted, grant.reason)
        unchanged = frozen(self.table) == (generation, before)
        if key in self.barred:  # a retired broker's key never gets a rank again
            assert not grant.granted and grant.never and unchanged
            assert f"key was retired from rank {self.barred[key]}" in grant.reason
            return
        assert not grant.never
        if live:  # one broker, one rank
            (held,) = live
            if before[held].state is RankState.RESERVED and request.rank in (None, held):
                assert grant == Reservation(True, held, before[held].incarnation, repeated=True)
            else:
                assert not grant.granted and grant.rank == -1
                assert grant.reason.startswith("this key already holds ")
                assert f"rank {held}" in grant.reason
            assert unchanged and outcome.changed == ()
            return
        if request.rank is None:
            wanted = [r for r in range(self.table.size) if free(r)]
        else:
            wanted = (
                [request.rank] if 0 <= request.rank < self.table.size and free(request.rank) else []
            )
        if not wanted:
            assert not grant.granted and not grant.repeated and unchanged
            if request.rank is None:
                assert grant.reason == "no available ranks"
            elif not 0 <= request.rank < self.table.size:
                assert grant.reason == (
                    f"no rank {request.rank} in this instance of size {self.table.size}"
                )
            elif before[request.rank].state in ALLOCATABLE:
                assert grant.reason == f"rank {request.rank}'s parent is retiring"
            else:
                held_by = describe(before[request.rank])
                assert grant.reason == f"rank {request.rank} is taken: {held_by}"
            return
        rank = wanted[0]  # the one asked for, or the lowest: interior ranks before leaves
        assert grant == Reservation(True, rank, before[rank].incarnation + 1)
        assert outcome.changed == (rank,) and self.table.generation == generation + 1
        entry, was = self.table.entry(rank), before[rank]
        assert [r for r in range(self.table.size) if before[r] != self.table.entries[r]] == [rank]
        assert entry.state is RankState.RESERVED and entry.since == self.now
        assert (entry.joiner, entry.host, entry.lease_until) == (
            key,
            request.host,
            self.now + request.lease,
        )
        assert entry.pid is None and not entry.torpid
        assert entry.lease is not None and entry.lease.host_before == was.host
        self.incarnations[rank] += 1
        self.granted_to[rank] = key
        self.config.discard(rank)  # a rank FLUB gave out is open, whoever held it before

    def _pick(self, data: st.DataObject, ranks: list[int], label: str) -> int | None:
        return data.draw(st.sampled_from(ranks), label=label) if ranks else None

    def _in(self, *wanted: RankState) -> list[int]:
        return [e.rank for e in self.table.entries if e.state in wanted]

    # --- rules ---

    @rule(
        data=st.data(),
        which=st.integers(0, len(KEYS) - 1),
        specific=st.booleans(),
        lease=LEASES,
    )
    def reserve(self, data: st.DataObject, which: int, specific: bool, lease: float) -> None:
        public_key = KEYS[which]
        rank = data.draw(st.integers(-1, self.table.size), label="rank") if specific else None
        self._reserve(Reserve(public_key, f"joiner{which}", rank, lease))

    @rule(data=st.data(), correct=st.booleans())
    def online_reserved(self, data: st.DataObject, correct: bool) -> None:
        rank = self._pick(data, self._in(RankState.RESERVED), "reserved")
        if rank is None:
            return
        current = self.table.entry(rank).incarnation
        incarnation = current if correct else data.draw(st.sampled_from([current - 1, current + 1]))
        self.pids += 1
        parent = self.table.topology.parent(rank)
        assert parent is not None
        parent_up = self.table.entry(parent).state in CONNECTED
        self._apply(
            Online(rank, incarnation, f"joined{rank}", self.pids),
            must_refuse=not (correct and parent_up),
        )
        if correct and parent_up:
            assert self.table.entry(rank).state is RankState.ONLINE

    @rule()
    def online_in_order(self) -> None:
        """Bring up the lowest offline rank whose parent is connected (the tree grows)."""
        for entry in self.table.entries:
            parent = self.table.topology.parent(entry.rank)
            if entry.state is RankState.OFFLINE and (
                parent is None or self.table.entry(parent).state in CONNECTED
            ):
                self.pids += 1
                self._apply(Online(entry.rank, entry.incarnation, "h", self.pids))
                return

    @rule(data=st.data(), lost=st.booleans())
    def end(self, data: st.DataObject, lost: bool) -> None:
        ranks = [r for r in self._in(*CONNECTED, RankState.OFFLINE) if r != 0]
        rank = self._pick(data, ranks, "ending")
        if rank is None:
            return
        incarnation = self.table.entry(rank).incarnation
        event: Event = (
            Lost(rank, incarnation, "connection lost") if lost else Departed(rank, incarnation)
        )
        self._apply(event)

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        """`tbon retire` of any rank at its current incarnation: refused unless it is online
        with no busy children, or already retiring or retired."""
        rank = data.draw(st.integers(0, self.table.size - 1), label="retiring")
        self._apply(Retire(rank, self.table.entry(rank).incarnation))

    @rule(data=st.data())
    def retire_idle(self, data: st.DataObject) -> None:
        """Retire a rank that may retire, interior ones first, so that retiring parents and
        retired ranks are common."""
        idle = [
            e.rank
            for e in self.table.entries
            if e.state is RankState.ONLINE
            and e.rank != 0
            and not any(
                self.table.entry(c).state in LIVE for c in self.table.topology.children(e.rank)
            )
        ]
        interior = [r for r in idle if self.table.topology.children(r)]
        rank = self._pick(data, interior or idle, "idle")
        if rank is not None:
            self._apply(Retire(rank, self.table.entry(rank).incarnation))

    @rule(data=st.data(), which=st.integers(0, len(KEYS) - 1), specific=st.booleans())
    def reserve_below_retiring(self, data: st.DataObject, which: int, specific: bool) -> None:
        """A joiner asks for a rank whose parent is retiring: it may not have it."""
        below = [
            child
            for rank in self._in(RankState.RETIRING)
            for child in self.table.topology.children(rank)
        ]
        rank = self._pick(data, below, "below retiring")
        if rank is not None:
            self._reserve(Reserve(KEYS[which], f"joiner{which}", rank if specific else None, 5.0))

    @rule(data=st.data(), ended=st.booleans())
    def reboot(self, data: st.DataObject, ended: bool) -> None:
        """A broker started again on its config host: refused unless the rank is a config
        rank whose broker is down; it names the incarnation that ended, or 0."""
        offline = [r for r in self._in(RankState.OFFLINE) if r in self.config]
        rank = self._pick(data, offline, "down") if offline and data.draw(st.booleans()) else None
        if rank is None:
            rank = data.draw(st.integers(1, self.table.size - 1), label="rebooting")
        incarnation = self.table.entry(rank).incarnation if ended else 0
        allowed = rank in self.config and self.table.entry(rank).state is RankState.OFFLINE
        self._apply(Reboot(rank, incarnation), must_refuse=not allowed)

    @rule(data=st.data(), lost=st.booleans(), specific=st.booleans())
    def retired_joiner_comes_back(self, data: st.DataObject, lost: bool, specific: bool) -> None:
        """A joined broker is retired, leaves (or is lost while retiring), and its careless
        supervisor starts it again with the same key: refused, whatever rank it asks for."""
        joined = [r for r in self._in(RankState.ONLINE) if r in self.granted_to]
        rank = self._pick(data, joined, "joined")
        if rank is None:
            return
        key, incarnation = self.granted_to[rank], self.table.entry(rank).incarnation
        self._apply(Retire(rank, incarnation))
        if self.table.entry(rank).state is not RankState.RETIRING:
            return  # refused: it has busy children
        ending: Event = (
            Lost(rank, incarnation, "connection lost") if lost else Departed(rank, incarnation)
        )
        self._apply(ending)
        assert self.barred[key] == rank
        self._reserve(Reserve(key, "again", rank if specific else None, 30.0))

    @rule(data=st.data(), advance=st.sampled_from([0.0, 0.25, 1.0, 5.0, 40.0]))
    def expire(self, data: st.DataObject, advance: float) -> None:
        self.now += advance
        # maybe too early: a random reserved rank, whatever its lease says
        rank = self._pick(data, self._in(RankState.RESERVED), "expiring")
        if rank is not None:
            entry = self.table.entry(rank)
            assert entry.lease_until is not None
            early = self.now + 0.5 < entry.lease_until
            self._apply(Expire(rank, entry.incarnation), must_refuse=early)
        # then what the broker does on its timer
        for expiry in self.table.expired(self.now):
            self.now -= 0.5  # _apply advances the clock; stay at the instant of expired()
            self._apply(expiry)
            assert self.table.entry(expiry.rank).state is RankState.VACANT

    @rule(data=st.data(), torpid=st.booleans())
    def torpid(self, data: st.DataObject, torpid: bool) -> None:
        rank = self._pick(data, self._in(*CONNECTED), "torpid")
        if rank is not None:
            self._apply(Torpid(rank, self.table.entry(rank).incarnation, torpid))

    @rule(data=st.data(), kind=st.sampled_from(["online", "lost", "departed", "torpid", "expire"]))
    def stale(self, data: st.DataObject, kind: str) -> None:
        rank = data.draw(st.integers(0, self.table.size - 1), label="stale rank")
        current = self.table.entry(rank).incarnation
        incarnation = data.draw(
            st.sampled_from([current - 1, current + 1, current + 2]), label="stale incarnation"
        )
        event: Event = {
            "online": Online(rank, incarnation, "stale", 1),
            "lost": Lost(rank, incarnation, "late"),
            "departed": Departed(rank, incarnation),
            "torpid": Torpid(rank, incarnation, True),
            "expire": Expire(rank, incarnation),
        }[kind]
        self._apply(event, must_refuse=True)

    # --- invariants: FLUB's promises, and the table's bookkeeping against the model ---

    @precondition(lambda self: self.incarnations)
    @invariant()
    def at_most_one_live_rank_per_key(self) -> None:
        for public_key in KEYS:
            live = [
                r
                for r, k in self.granted_to.items()
                if k == public_key and self.table.entry(r).state in LIVE
            ]
            assert len(live) <= 1, (public_key, live)
            assert len(reserved_by(self.table, public_key)) <= 1

    @precondition(lambda self: self.incarnations)
    @invariant()
    def a_retired_key_holds_no_rank(self) -> None:
        assert self.table.retired_keys == self.barred
        for entry in self.table.entries:
            if entry.state in LIVE:
                assert self.granted_to.get(entry.rank) not in self.barred

    @precondition(lambda self: self.incarnations)
    @invariant()
    def keys_and_owners_are_what_was_granted(self) -> None:
        for entry in self.table.entries:
            assert entry.key == self.granted_to.get(entry.rank)
            assert (entry.phase in CONFIG_PHASES) == (entry.rank in self.config), entry

    @precondition(lambda self: self.incarnations)
    @invariant()
    def retired_ranks_are_vacant(self) -> None:
        for entry in self.table.entries:
            assert not entry.retired or entry.state is RankState.VACANT

    @precondition(lambda self: self.incarnations)
    @invariant()
    def the_timers_see_every_deadline(self) -> None:
        """`deadlined`, what the loop's timers walk, is every entry with a lease or adrift."""
        every = [e for e in self.table.entries if e.lease is not None or e.adrift_until is not None]
        assert self.table.deadlined() == every

    @precondition(lambda self: self.incarnations)
    @invariant()
    def rank_zero_is_online(self) -> None:
        assert self.table.entry(0).state is RankState.ONLINE

    @precondition(lambda self: self.incarnations)
    @invariant()
    def a_reservation_has_a_joiner_and_a_lease(self) -> None:
        for entry in self.table.entries:
            if entry.state is RankState.RESERVED:
                assert entry.joiner is not None and entry.lease_until is not None, entry
                assert entry.pid is None
            else:
                assert entry.joiner is None and entry.lease_until is None, entry

    @precondition(lambda self: self.incarnations)
    @invariant()
    def incarnations_only_grow_and_only_by_grant_or_restart(self) -> None:
        assert [e.incarnation for e in self.table.entries] == self.incarnations

    @precondition(lambda self: self.incarnations)
    @invariant()
    def online_only_under_a_connected_parent_or_adrift(self) -> None:
        """A rank whose parent ended stays online only while it seeks a live ancestor."""
        for entry in self.table.entries:
            parent = self.table.topology.parent(entry.rank)
            orphan = parent is not None and self.table.entry(parent).state not in CONNECTED
            if orphan and entry.state is RankState.ONLINE:
                assert entry.attached_to is None and entry.adrift_until is not None, entry
            if entry.state not in CONNECTED:
                assert entry.pid is None and not entry.torpid

    @precondition(lambda self: self.incarnations)
    @invariant()
    def verify_agrees_with_the_reservations(self) -> None:
        for entry in self.table.entries:
            for incarnation in (entry.incarnation - 1, entry.incarnation, entry.incarnation + 1):
                for public_key in KEYS:
                    ok = (
                        entry.state is RankState.RESERVED
                        and incarnation == entry.incarnation
                        and public_key == entry.joiner
                    )
                    why = self.table.verify(entry.rank, incarnation, public_key)
                    assert (why is None) == ok, (entry, incarnation, why)
                    assert ok or why

    @precondition(lambda self: self.incarnations)
    @invariant()
    def expiries_agree_with_the_leases(self) -> None:
        leases = {
            e.rank: e.lease_until for e in self.table.entries if e.state is RankState.RESERVED
        }
        ends = [until for until in leases.values() if until is not None]
        ends += [e.adrift_until for e in self.table.entries if e.adrift_until is not None]
        assert self.table.next_expiry() == (min(ends) if ends else None)  # reattach graces too
        due = [r for r, until in leases.items() if until is not None and self.now >= until]
        assert [x.rank for x in self.table.expired(self.now)] == due
        assert all(
            x.incarnation == self.table.entry(x.rank).incarnation
            for x in self.table.expired(self.now)
        )

    @precondition(lambda self: self.incarnations)
    @invariant()
    def snapshot_shows_reservations(self) -> None:
        snapshot: dict[str, Any] = status_json(self.table, self.now)
        for entry, shown in zip(self.table.entries, snapshot["ranks"], strict=True):
            assert shown["state"] == entry.state.value
            assert shown["incarnation"] == entry.incarnation
            if entry.state is RankState.RESERVED:
                assert entry.joiner is not None
                assert shown["joiner"] == fingerprint(entry.joiner)
                assert shown["expires"] >= 0
            else:
                assert "joiner" not in shown and "expires" not in shown


TestFlubMachine = FlubMachine.TestCase
TestFlubMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
