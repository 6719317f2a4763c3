"""The parent's side of its links (overlay/links/downward.py), without sockets: each transition,
refused stimuli, the deadlines, whom a shutdown waits for, and a hypothesis state machine over
random stimuli."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tbon import exitcodes
from tbon.overlay.links.downward import (
    TRANSITIONS,
    Absent,
    Accepted,
    Admit,
    AskRejoin,
    AuthorizeKey,
    Closed,
    Declined,
    Downward,
    Goodbye,
    Heard,
    Hello,
    Instruction,
    MovedAway,
    Note,
    Rejoined,
    Report,
    Retire,
    Revoke,
    RevokeKey,
    RevokeRank,
    SendControl,
    SendRefuse,
    SendWelcome,
    Settle,
    ShutdownBegan,
    Stale,
    Tick,
    Timing,
    Unexpected,
    Withdraw,
)
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.liveness import Verdict
from tbon.overlay.links.sessions import Connected, Ended, Expected
from tbon.overlay.state.ranktable import Departed, Lost, Moved, Online, Torpid
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message

#            0
#        1       2
#      3   4   5   6
#     7 8 9 10 ...
TOPOLOGY = Topology("kary:2", 15)
TIMING = Timing(heartbeat=1.0, torpid=5.0, timeout=10.0)
KEY = "k" * 40
R3 = Identity(3, 1)


def machine() -> Downward:
    """Rank 1: children 3 and 4, grandchildren 7 to 10 (fostered at rank 0's word)."""
    return Downward(1, TOPOLOGY, TIMING)


def hello(identity: Identity, pid: int = 4242, **extra: Any) -> Message:
    payload = {
        "rank": identity.rank,
        "incarnation": identity.incarnation,
        "version": PROTOCOL_VERSION,
        "hostname": "node",
        "pid": pid,
        **extra,
    }
    return Message(Kind.CONTROL, "hello", payload)


def knock(
    m: Downward, identity: Identity, rid: bytes, fd: int, now: float = 0.0, **extra: Any
) -> list[Instruction]:
    """A broker connects on `fd` and says hello as `identity`, holding its key."""
    m.handle(Accepted(fd), now)
    return m.handle(Hello(rid, fd, identity, hello(identity, **extra)), now)


def connected(rank: int = 3, incarnation: int = 1, now: float = 0.0) -> Downward:
    m = machine()
    m.handle(Admit(rank, incarnation, KEY), now)
    knock(m, Identity(rank, incarnation), b"r", 11, now)
    return m


def reports(out: list[Instruction]) -> list[Any]:
    return [i.event for i in out if isinstance(i, Report)]


def sent(out: list[Instruction]) -> list[Instruction]:
    return [i for i in out if not isinstance(i, Note)]


# --- admissions ----------------------------------------------------------------------------------


def test_an_admission_authorizes_the_key_and_expects_its_broker() -> None:
    m = machine()
    assert m.handle(Admit(3, 1, KEY), 0.0) == [AuthorizeKey(KEY, R3)]
    session = m.sessions[3]
    assert session.phase == Expected() and not session.foster and not session.expected
    assert m.awaited(0.0) == [] and m.connected() == []


def test_a_shared_key_admission_revokes_the_ranks_keys_and_expects_exactly_it() -> None:
    m = machine()
    assert m.handle(Admit(3, 2, ""), 0.0) == [RevokeRank(3)]
    assert m.sessions[3].shared and m.sessions[3].expected


def test_admitting_the_incarnation_already_connected_changes_nothing() -> None:
    m = connected()
    session = m.sessions[3]
    assert m.handle(Admit(3, 1, KEY), 1.0) == []
    assert m.sessions[3] is session and session.connected


def test_a_new_incarnation_displaces_the_connected_one_whose_close_still_ends_it() -> None:
    m = connected()
    m.handle(Admit(3, 2, KEY), 1.0)
    assert not m.live(b"r", R3) and m.connected() == []
    m.handle(Closed(11), 2.0)
    assert reports(m.handle(Settle(), 2.0)) == [Lost(3, 1, "connection dropped", 1)]
    assert m.sessions[3].identity == Identity(3, 2) and m.sessions[3].phase == Expected()


def test_a_foster_admission_is_expected_until_its_grace_ends() -> None:
    m = machine()
    m.handle(Admit(7, 1, KEY, foster_until=5.0), 0.0)
    session = m.sessions[7]
    assert session.foster and session.expected and session.phase == Expected(5.0)
    assert m.fosters == {7} and m.awaited(4.0) == [7] and m.next_deadline() == 0.0
    m.handle(Tick(), 0.0)  # heartbeats sent: the grace is the next deadline
    assert m.next_deadline() == 1.0
    assert m.handle(Tick(), 4.9) == []
    assert m.handle(Tick(), 5.0) == [RevokeKey(Identity(7, 1))]
    assert 7 not in m.sessions and m.fosters == set()


def test_the_sessions_change_only_by_ways_that_keep_the_foster_set() -> None:
    m = machine()
    m.handle(Admit(7, 1, KEY, foster_until=5.0), 0.0)
    m.handle(Admit(3, 1, KEY), 0.0)
    assert m.fosters == {7}
    m.sessions[7] = m.sessions.pop(3)  # not what downward.py does: the set follows it anyway
    assert m.fosters == set()
    for change in (m.sessions.clear, m.sessions.popitem, lambda: m.sessions.update({})):
        with pytest.raises(TypeError):
            change()
    assert list(m.sessions) == [7]


def test_a_child_of_the_topology_admitted_with_a_grace_keeps_none() -> None:
    m = machine()
    m.handle(Admit(3, 1, KEY, foster_until=5.0), 0.0)
    assert m.sessions[3].phase == Expected(None) and m.awaited(0.0) == []


# --- hellos ---------------------------------------------------------------------------------------


def test_a_hello_of_the_admitted_incarnation_is_welcomed() -> None:
    m = machine()
    m.handle(Admit(3, 1, KEY), 0.0)
    out = knock(m, R3, b"r", 11)
    assert out == [SendWelcome(b"r", R3), Report(Online(3, 1, "node", 4242, 1, KEY))]
    assert isinstance(m.sessions[3].phase, Connected) and m.live(b"r", R3)
    assert m.attached(3) and m.connected() == [3] and m.routing_id(3) == b"r"


def test_a_hello_the_judge_refuses_is_answered_and_changes_nothing() -> None:
    m = machine()
    out = knock(m, Identity(5, 1), b"x", 11)
    assert sent(out) == [SendRefuse(b"x", "rank 5 is not a child of rank 1", exitcodes.REFUSED)]
    assert m.sessions == {}


def test_a_first_hello_on_a_connection_already_closed_is_lost_at_once() -> None:
    m = machine()
    m.handle(Admit(3, 1, KEY), 0.0)
    m.handle(Accepted(11), 0.0)
    m.handle(Closed(11), 0.0)
    out = m.handle(Hello(b"r", 11, R3, hello(R3)), 0.0)
    assert reports(out) == [
        Online(3, 1, "node", 4242, 1, KEY),
        Lost(3, 1, "connection dropped", 1),
    ]
    assert m.sessions[3].returnable


def test_a_foster_childs_first_hello_on_a_connection_already_closed_is_not_news() -> None:
    """A seeking broker asks several ancestors at once and leaves those it gives up on (no
    answer in time, or another welcomed it first): a hello from such a link, read only once it
    has closed, says nothing of where that broker is. Welcomed and lost at once, its rank was
    declared lost at rank 0 while its broker ran on under the ancestor it kept, whose Online
    comes later (held up to REPORT_INTERVAL per level on its way: state/reports.py). The
    admission stays within its grace: the broker may knock again."""
    m = machine()
    r7 = Identity(7, 1)
    m.handle(Admit(7, 1, KEY, foster_until=5.0), 0.0)
    m.handle(Accepted(11), 0.0)
    m.handle(Closed(11), 0.0)
    out = m.handle(Hello(b"r", 11, r7, hello(r7)), 0.0)
    assert sent(out) == [] and reports(out) == []
    assert isinstance(m.sessions[7].phase, Expected)
    again = knock(m, r7, b"again", 12, 1.0)
    assert sent(again)[0] == SendWelcome(b"again", r7)
    assert reports(again) == [Online(7, 1, "node", 4242, 1, KEY)]


def test_a_hello_again_on_a_new_connection_moves_the_session_there() -> None:
    m = connected()
    out = knock(m, R3, b"new", 12, 1.0)
    assert sent(out)[0] == SendWelcome(b"new", R3)
    assert not m.live(b"r", R3) and m.live(b"new", R3)
    m.handle(Closed(11), 2.0)
    assert m.handle(Settle(), 2.0) == []  # the old connection's close is stale
    m.handle(Closed(12), 3.0)
    assert reports(m.handle(Settle(), 3.0)) == [Lost(3, 1, "connection dropped", 1)]


def test_a_hello_again_from_a_closed_connection_is_not_news() -> None:
    m = connected()
    m.handle(Accepted(12), 1.0)
    m.handle(Closed(12), 1.0)
    out = m.handle(Hello(b"new", 12, R3, hello(R3)), 1.0)
    assert sent(out) == [] and m.live(b"r", R3)


def test_a_lost_broker_is_welcomed_back_only_as_itself() -> None:
    m = connected()
    m.handle(Closed(11), 1.0)
    m.handle(Settle(), 1.0)
    impostor = knock(m, R3, b"x", 12, 2.0, pid=999)
    assert sent(impostor)[0] == SendRefuse(
        b"x", "rank 3 incarnation 1 was lost: connection dropped", exitcodes.LOST
    )
    assert sent(knock(m, R3, b"back", 13, 3.0))[0] == SendWelcome(b"back", R3)
    # the connection it was lost on leads nowhere now: one way to the session, the new one
    assert m.session_on(b"r") is None and m.session_on(b"back") is m.sessions[3]
    assert not m.live(b"r", R3)


def test_a_shared_key_hello_goes_to_rank_zero_and_its_answer_is_carried_out() -> None:
    m = machine()
    m.handle(Accepted(11), 0.0)
    claim = Identity(3, 0)
    [ask] = m.handle(Hello(b"s", 11, None, hello(claim)), 0.0)
    assert isinstance(ask, AskRejoin)
    assert (ask.rejoin.rank, ask.rejoin.incarnation, ask.rejoin.generation) == (3, 0, 1)
    assert sent(m.handle(Rejoined(ask.rejoin, None, "retired"), 1.0)) == [
        SendRefuse(b"s", "retired", exitcodes.REFUSED)
    ]
    out = m.handle(Rejoined(ask.rejoin, 2, ""), 1.0)
    assert out == [SendWelcome(b"s", Identity(3, 2)), Report(Online(3, 2, "node", 4242, 1))]


def test_a_config_booted_broker_restarted_on_its_host_replaces_the_old_one() -> None:
    m = machine()
    m.handle(Accepted(11), 0.0)
    [ask] = m.handle(Hello(b"a", 11, None, hello(Identity(3, 0))), 0.0)
    assert isinstance(ask, AskRejoin)
    m.handle(Rejoined(ask.rejoin, 1, ""), 0.0)
    m.handle(Accepted(12), 1.0)
    out = m.handle(Hello(b"b", 12, None, hello(Identity(3, 0), pid=5)), 1.0)
    assert reports(out) == [Lost(3, 1, "its host started a new broker", 1)]
    assert isinstance(out[-1], AskRejoin)


# --- a live child speaks --------------------------------------------------------------------------


def test_silence_makes_a_child_torpid_then_lost_and_a_word_revives_it() -> None:
    m = connected()
    for now in range(1, 5):
        assert reports(m.handle(Tick(), float(now))) == []
    assert m.verdict_due(5.0) and not m.verdict_due(4.9)
    assert reports(m.handle(Tick(), 5.0)) == [Torpid(3, 1, True, 1)]
    assert m.handle(Heard(b"r"), 5.5) == [Report(Torpid(3, 1, False, 1))]
    assert m.handle(Heard(b"r"), 5.6) == []
    for now in range(6, 15):
        m.handle(Tick(), float(now))
    out = m.handle(Tick(), 15.6)
    assert reports(out) == [Lost(3, 1, "silent for 10.0s", 1)]
    assert RevokeKey(R3) not in out  # a lost broker may come back: its key is kept
    assert m.sessions[3].returnable and not m.verdict_due(100.0)


def test_only_a_word_that_changed_no_verdict_leaves_the_loop_s_timers_as_they_are() -> None:
    """Downward.hastens: hearing a live child puts its deadline off (the loop need not look);
    a torpid child heard again is reported, and its deadline may come sooner (its torpid limit
    again, here before the timeout it was judged by): the loop must look."""
    m = Downward(1, TOPOLOGY, Timing(heartbeat=1.0, torpid=2.0, timeout=10.0))
    m.handle(Admit(3, 1, KEY), 0.0)
    knock(m, R3, b"r", 11, 0.0)
    rid = m.routing_id(3)
    assert rid is not None
    before = m.next_deadline()
    out = m.handle(Heard(rid), 1.0)
    assert out == [] and not Downward.hastens(Heard(rid), out)
    assert m.next_deadline() >= before
    for now in (2.0, 3.0):  # silent 2 s: torpid, judged next at its timeout (11 s)
        m.handle(Tick(), now)
    assert m.sessions[3].phase.liveness.verdict is Verdict.TORPID  # type: ignore[union-attr]
    torpid = m.sessions[3].deadline()
    out = m.handle(Heard(rid), 3.5)
    assert reports(out) == [Torpid(3, 1, False, 1)] and Downward.hastens(Heard(rid), out)
    again = m.sessions[3].deadline()
    assert torpid is not None and again is not None and again < torpid
    assert Downward.hastens(Goodbye(rid), []) and Downward.hastens(Tick(), [])
    # a settle that ended no session changed no deadline; one that did may have
    assert not Downward.hastens(Settle(), []) and Downward.hastens(Settle(), out)


def test_a_goodbye_ends_the_incarnation_and_the_close_that_follows_is_no_news() -> None:
    m = connected()
    out = m.handle(Goodbye(b"r"), 1.0)
    assert sent(out) == [RevokeKey(R3), Report(Departed(3, 1, 1))]
    assert m.sessions[3].phase == Ended("has departed", told=Departed(3, 1, 1))
    assert not m.sessions[3].returnable
    m.handle(Closed(11), 2.0)
    assert m.handle(Settle(), 2.0) == []


def test_a_retiring_child_is_retired_however_it_ends_even_once_refilled() -> None:
    m = connected()
    assert sent(m.handle(Retire(3, 1, {"why": "x"}), 1.0)) == [
        SendControl(b"r", "retire", {"why": "x"})
    ]
    m.handle(Closed(11), 2.0)
    assert reports(m.handle(Settle(), 2.0)) == [Lost(3, 1, "connection dropped", 1)]
    lost = Lost(3, 1, "connection dropped", 1)
    assert m.sessions[3].phase == Ended("has retired", exitcodes.SHUTDOWN, told=lost)
    m.handle(Admit(3, 2, KEY), 3.0)
    out = knock(m, R3, b"again", 12, 4.0)
    assert sent(out) == [
        SendRefuse(b"again", "retired: rank 3 incarnation 1 has retired", exitcodes.SHUTDOWN)
    ]


def test_the_census_says_again_what_this_parent_reported_of_each_child() -> None:
    """Connected: its Online; ended: the Lost or Departed reported then; moved away or revoked:
    nothing (rank 0 was told by another parent, or decided it), nor one still expected."""
    m = machine()
    for rank in (3, 4):
        m.handle(Admit(rank, 1, KEY), 0.0)
    m.handle(Admit(7, 1, KEY, foster_until=9.0), 0.0)
    m.handle(Admit(8, 1, KEY, foster_until=9.0), 0.0)
    m.handle(Admit(9, 1, KEY, foster_until=9.0), 0.0)
    knock(m, Identity(3, 1), b"r3", 11)
    knock(m, Identity(4, 1), b"r4", 12)
    knock(m, Identity(7, 1), b"r7", 13)
    knock(m, Identity(8, 1), b"r8", 14)
    m.handle(Closed(11), 1.0)
    lost = reports(m.handle(Settle(), 1.0))
    departed = reports(m.handle(Goodbye(b"r4"), 1.0))
    m.handle(MovedAway(b"r7", 3), 1.0)
    m.handle(Revoke(8, 1, "voided"), 1.0)
    assert lost == [Lost(3, 1, "connection dropped", 1)]
    assert departed == [Departed(4, 1, 1)]
    assert m.census() == [*lost, *departed]
    knock(m, Identity(3, 1), b"back", 15, 2.0)  # its own broker back: connected again
    assert m.census() == [Online(3, 1, "node", 4242, 1, KEY), *departed]


@pytest.mark.parametrize("foster", [False, True])
def test_a_child_that_moved_ends_its_link_here_not_its_incarnation(foster: bool) -> None:
    m = machine()
    rank = 7 if foster else 3
    identity = Identity(rank, 1)
    m.handle(Admit(rank, 1, KEY, foster_until=9.0), 0.0)
    knock(m, identity, b"r", 11)
    out = m.handle(MovedAway(b"r", 3), 1.0)
    assert sent(out) == [RevokeKey(identity), Report(Moved(rank, 1, 1, 3))]
    assert (rank in m.sessions) is not foster and m.connected() == []
    m.handle(Closed(11), 2.0)
    assert m.handle(Settle(), 2.0) == []


def test_a_message_from_a_stale_peer_is_answered_by_the_rules_of_the_judge() -> None:
    m = connected()
    m.handle(Admit(3, 2, KEY), 1.0)
    assert m.handle(Stale(b"r", R3, "heartbeat"), 1.0) == [
        SendRefuse(b"r", "superseded: rank 3 is now incarnation 2", exitcodes.REFUSED)
    ]
    [note] = m.handle(Stale(b"y", Identity(4, 1), "heartbeat"), 1.0)
    assert isinstance(note, Note) and "not connected" in note.text


def test_a_routing_id_of_no_live_session_is_refused_by_the_table() -> None:
    m = connected()
    with pytest.raises(Unexpected, match="can't handle Heard when phase=Absent"):
        m.handle(Heard(b"nobody"), 1.0)
    m.handle(Goodbye(b"r"), 1.0)  # ended: its connection leads to no session any more
    with pytest.raises(Unexpected, match="can't handle Goodbye when phase=Absent"):
        m.handle(Goodbye(b"r"), 1.0)


# --- rank 0's word --------------------------------------------------------------------------------


def test_a_revocation_cuts_the_broker_off_and_it_is_never_welcomed_again() -> None:
    m = connected()
    out = m.handle(Revoke(3, 1, "superseded: rank 3 is now incarnation 2"), 1.0)
    assert sent(out) == [
        SendRefuse(b"r", "superseded: rank 3 is now incarnation 2", exitcodes.REFUSED)
    ]
    assert m.sessions[3].end_code == exitcodes.REFUSED and m.connected() == []
    assert m.handle(Revoke(3, 1, "again"), 1.5) == []
    assert m.handle(Admit(3, 1, KEY), 2.0) == []  # rank 0 ended it for good
    again = sent(knock(m, R3, b"back", 12, 3.0))
    assert again == [
        SendRefuse(
            b"back",
            "rank 3 incarnation 1 was revoked: superseded: rank 3 is now incarnation 2",
            exitcodes.REFUSED,
        )
    ]


def test_a_lost_incarnation_revoked_is_refused_not_welcomed_back() -> None:
    m = connected()
    m.handle(Closed(11), 1.0)
    m.handle(Settle(), 1.0)
    assert sent(m.handle(Revoke(3, 1, "voided"), 2.0)) == []
    assert sent(knock(m, R3, b"back", 12, 3.0))[0].exit_code == exitcodes.REFUSED  # type: ignore[union-attr]


def test_revoking_another_incarnation_only_revokes_its_key() -> None:
    m = connected()
    assert m.handle(Revoke(3, 0, "old"), 1.0) == [RevokeKey(Identity(3, 0))]
    assert m.handle(Revoke(4, 1, "none"), 1.0) == [RevokeKey(Identity(4, 1))]
    assert m.live(b"r", R3)


def test_a_withdrawn_foster_admission_is_forgotten_unless_its_broker_came() -> None:
    m = machine()
    m.handle(Admit(7, 1, KEY, foster_until=9.0), 0.0)
    m.handle(Admit(8, 1, KEY, foster_until=9.0), 0.0)
    knock(m, Identity(8, 1), b"r8", 11)
    assert m.handle(Withdraw(7, 2), 1.0) == []  # not that incarnation
    assert sent(m.handle(Withdraw(7, 1), 1.0)) == [RevokeKey(Identity(7, 1))]
    assert m.handle(Withdraw(8, 1), 1.0) == [] and m.connected() == [8]
    assert m.handle(Withdraw(9, 1), 1.0) == []


def test_a_retirement_of_no_current_child_is_declined() -> None:
    m = machine()
    m.handle(Admit(3, 1, KEY), 0.0)
    assert m.handle(Retire(3, 1, {}), 1.0) == [Declined("rank 3 is not connected")]
    assert m.sessions[3].retiring
    assert m.handle(Retire(3, 2, {}), 1.0) == [
        Declined("rank 3 incarnation 2 is not a current child of this broker")
    ]
    assert m.handle(Retire(4, 1, {}), 1.0)[0] == Declined(
        "rank 4 incarnation 1 is not a current child of this broker"
    )


# --- the clock and the shutdown -------------------------------------------------------------------


def test_heartbeats_go_to_every_connected_child_every_heartbeat() -> None:
    m = connected()
    m.handle(Admit(4, 1, KEY), 0.0)
    assert sent(m.handle(Tick(), 0.0)) == [SendControl(b"r", "heartbeat")]
    assert m.next_deadline() == TIMING.heartbeat
    assert m.handle(Tick(), 0.5) == []
    assert sent(m.handle(Tick(), 1.0)) == [SendControl(b"r", "heartbeat")]


def test_the_shutdown_tells_the_connected_and_refuses_a_foster_child_that_knocks() -> None:
    m = connected()
    m.handle(Admit(7, 1, KEY, foster_until=9.0), 0.0)
    assert sorted(m.awaited(1.0)) == [3, 7]
    assert sent(m.handle(ShutdownBegan(), 1.0)) == [SendControl(b"r", "shutdown")]
    out = knock(m, Identity(7, 1), b"r7", 12, 2.0)
    assert sent(out) == [
        SendRefuse(b"r7", "the instance is shutting down", exitcodes.SHUTDOWN),
        RevokeKey(Identity(7, 1)),
    ]
    assert m.awaited(2.0) == [3]
    m.handle(Goodbye(b"r"), 3.0)
    assert m.awaited(3.0) == []


def test_a_connected_foster_child_knocking_again_in_the_shutdown_stays_awaited() -> None:
    """Found by the state machine below: it used to be forgotten while still connected."""
    m = machine()
    m.handle(Admit(7, 1, KEY, foster_until=9.0), 0.0)
    knock(m, Identity(7, 1), b"r7", 11)
    m.handle(ShutdownBegan(), 1.0)
    out = knock(m, Identity(7, 1), b"again", 12, 2.0)
    assert sent(out) == [SendRefuse(b"again", "the instance is shutting down", exitcodes.SHUTDOWN)]
    assert m.awaited(2.0) == [7] and m.live(b"r7", Identity(7, 1))
    m.handle(Closed(11), 3.0)
    assert reports(m.handle(Settle(), 3.0)) == [Lost(7, 1, "connection dropped", 1)]
    assert m.awaited(3.0) == []


def test_a_shutdown_after_heals_waits_only_for_the_connected_and_the_truly_expected() -> None:
    """Rank 1 fostered 7 and 8 in one heal and 9 in another: 7 came and went home (moved), 8's
    admission was withdrawn, 9's grace has passed but no tick has run yet, 10's has not passed.
    A shutdown now waits for its own child 3 and for 10 only."""
    m = connected()
    for rank in (7, 8, 9):
        m.handle(Admit(rank, 1, KEY, foster_until=5.0), 0.0)
    m.handle(Admit(10, 1, KEY, foster_until=50.0), 0.0)
    knock(m, Identity(7, 1), b"r7", 12, 1.0)
    m.handle(MovedAway(b"r7", 3), 2.0)
    m.handle(Withdraw(8, 1), 2.0)
    m.handle(ShutdownBegan(), 6.0)
    assert sorted(m.awaited(6.0)) == [3, 10]
    assert sorted(m.awaited()) == [3, 9, 10]  # without a clock, every grace still counts


# --- the table ------------------------------------------------------------------------------------


def test_rank_zeros_word_is_listed_for_every_phase() -> None:
    for stimulus in (Admit, Withdraw, Revoke, Retire):
        for phase in (Absent, Expected, Connected, Ended):
            assert (phase, stimulus) in TRANSITIONS


# --- random stimuli -------------------------------------------------------------------------------

RANKS = (3, 4, 7)  # two children of the topology, one foster child
FDS = (11, 12, 13)
PIDS = (1, 2)


def fresh_deadline(m: Downward) -> float:
    """next_deadline as a walk of every session now, nothing kept."""
    deadlines = [s.deadline() for s in m.sessions.values()]
    deadlines += [s.awaited_until for s in m.sessions.values()]
    return min([m._next_heartbeat, *(d for d in deadlines if d is not None)])


class DownwardMachine(RuleBasedStateMachine):
    """Rank 0's word, hellos, goodbyes, moves, closes and the clock in random order. The oracle:
    rank 0's latest incarnation of each rank, and the incarnations it revoked."""

    def __init__(self) -> None:
        super().__init__()
        self.m = machine()
        self.now = 0.0
        self.latest: dict[int, int] = {}
        self.revoked: set[Identity] = set()
        self.open: set[int] = set()

    def feed(self, stimulus: Any) -> list[Instruction]:
        before = self.m.next_deadline()
        try:
            out = self.m.handle(stimulus, self.now)
        except Unexpected:
            return []
        if not Downward.hastens(stimulus, out):  # the loop's timers are left as they are
            assert self.m.next_deadline() >= before, stimulus
        # the deadline it keeps between walks is never later than a walk of its sessions now,
        # and exactly that after a stimulus that may hasten it; nor does it hide a verdict due
        walked = fresh_deadline(self.m)
        kept = self.m.next_deadline()
        assert kept <= walked and (kept == walked or not Downward.hastens(stimulus, out))
        for at in (self.now, self.now + 15.0, self.now + 100.0):
            due = any((d := s.deadline()) is not None and d <= at for s in self.m.sessions.values())
            assert self.m.verdict_due(at) == due, (stimulus, at)
        for instruction in out:
            if isinstance(instruction, SendWelcome):
                identity = instruction.identity
                assert identity not in self.revoked, identity
                assert identity.incarnation == self.latest.get(identity.rank), identity
        return out

    @rule(rank=st.sampled_from(RANKS), bump=st.booleans(), grace=st.floats(0.0, 20.0))
    def admit(self, rank: int, bump: bool, grace: float) -> None:
        incarnation = self.latest.get(rank, 0) + (bump or rank not in self.latest)
        if Identity(rank, incarnation) in self.revoked:
            incarnation += 1  # rank 0 never admits an incarnation it revoked
        self.latest[rank] = incarnation
        self.feed(Admit(rank, incarnation, KEY, foster_until=self.now + grace))

    @rule(rank=st.sampled_from(RANKS), back=st.integers(0, 1))
    def revoke(self, rank: int, back: int) -> None:
        if rank in self.latest:
            identity = Identity(rank, max(1, self.latest[rank] - back))
            self.revoked.add(identity)
            self.feed(Revoke(rank, identity.incarnation, "voided"))

    @rule(rank=st.sampled_from(RANKS))
    def withdraw(self, rank: int) -> None:
        if rank in self.latest:
            self.feed(Withdraw(rank, self.latest[rank]))

    @rule(rank=st.sampled_from(RANKS), back=st.integers(0, 1), fd=st.sampled_from(FDS))
    def knock(self, rank: int, back: int, fd: int, pid: int = 1) -> None:
        identity = Identity(rank, max(1, self.latest.get(rank, 1) - back))
        if fd not in self.open:
            self.open.add(fd)
            self.feed(Accepted(fd))
        rid = f"{identity.user_id}:{fd}".encode()
        self.feed(Hello(rid, fd, identity, hello(identity, pid=pid)))

    @rule(rank=st.sampled_from(RANKS), fd=st.sampled_from(FDS), pid=st.sampled_from(PIDS))
    def knock_as(self, rank: int, fd: int, pid: int) -> None:
        self.knock(rank, 0, fd, pid)

    @rule(fd=st.sampled_from(FDS))
    def close(self, fd: int) -> None:
        self.open.discard(fd)
        self.feed(Closed(fd))

    @rule()
    def settle(self) -> None:
        self.feed(Settle())

    @rule(rank=st.sampled_from(RANKS), what=st.sampled_from(["heard", "goodbye", "moved"]))
    def speak(self, rank: int, what: str) -> None:
        rid = self.m.routing_id(rank)
        if rid is None:
            return
        stimulus = {"heard": Heard(rid), "goodbye": Goodbye(rid), "moved": MovedAway(rid, 0)}
        self.feed(stimulus[what])

    @rule(rank=st.sampled_from(RANKS))
    def retire(self, rank: int) -> None:
        if rank in self.latest:
            self.feed(Retire(rank, self.latest[rank], {}))

    @rule(seconds=st.floats(0.0, 4.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.feed(Tick())

    @precondition(lambda self: not self.m.shutting_down)
    @rule()
    def shutdown(self) -> None:
        self.feed(ShutdownBegan())

    @invariant()
    def one_reachable_session_per_rank(self) -> None:
        live = [s for s in self.m._by_routing.values() if s.connected]
        ranks = [s.identity.rank for s in live]
        assert len(ranks) == len(set(ranks))
        assert all(self.m.sessions.get(s.identity.rank) is s for s in live)

    @invariant()
    def an_ended_session_is_never_connected(self) -> None:
        for session in self.m.sessions.values():
            assert not (session.ended and session.connected)
            assert session.connected == isinstance(session.phase, Connected)
            assert (session.routing_id is not None) == session.connected

    @invariant()
    def the_kept_foster_set_is_the_one_a_walk_finds(self) -> None:
        """Sessions keeps its foster ranks as sessions come and go (the router reads it per
        target): never stale against a walk of the sessions."""
        walked = {rank for rank, session in self.m.sessions.items() if session.foster}
        assert self.m.fosters == walked

    @invariant()
    def a_shutdown_waits_for_the_connected_and_the_expected_only(self) -> None:
        for rank in self.m.awaited(self.now):
            session = self.m.sessions[rank]
            expected = isinstance(session.phase, Expected) and session.foster
            assert session.connected or (
                expected and session.phase.until is not None and self.now < session.phase.until
            )


TestDownwardMachine = DownwardMachine.TestCase
TestDownwardMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_child_sent_anything_within_half_a_heartbeat_gets_no_beat() -> None:
    """Any message is a sign of life: a child that heard from this parent lately needs none."""
    m = connected()
    assert sent(m.handle(Tick(), 0.0)) == [SendControl(b"r", "heartbeat")]
    m.sent(b"r", 0.6)  # a request routed down, say
    assert m.handle(Tick(), 1.0) == []
    assert sent(m.handle(Tick(), 2.0)) == [SendControl(b"r", "heartbeat")]


def test_a_parents_first_beat_comes_early_by_its_phase() -> None:
    """Parents started together beat out of step: each shortens its first interval by a phase
    of its own, then keeps the period."""
    m = Downward(1, TOPOLOGY, TIMING, phase=0.25)
    m.handle(Tick(), 0.0)
    assert m.next_deadline() == 0.75
    m.handle(Tick(), 0.75)
    assert m.next_deadline() == 1.75
