"""The root group's member machine (overlay/state/leadership.py) and its log (replicalog.py), one
transition at a time: each test builds members, feeds stimuli and reads the instructions. The
whole group under crashes and partitions is tests/test_root_model.py."""

from __future__ import annotations

from typing import Any

import pytest

from tbon.overlay.state.leadership import (
    Abandon,
    Acknowledge,
    AppendEntries,
    AppendReply,
    Apply,
    BecameRoot,
    Campaigning,
    Following,
    InstallSnapshot,
    Member,
    NotRoot,
    Propose,
    Proposed,
    Restore,
    RootUnreachable,
    Send,
    SteppedDown,
    Tick,
    Timing,
    Unexpected,
    VoteReply,
    VoteRequest,
)
from tbon.overlay.state.replicalog import CommittedLost, Entry, ReplicaLog
from tbon.overlay.state.terms import StaleTerm, TermFence

GROUP = (0, 1, 2)
DEFAULT = Timing()


def sends(out: list[Any]) -> dict[int, Any]:
    return {i.to: i.message for i in out if isinstance(i, Send)}


def of(out: list[Any], kind: type) -> list[Any]:
    return [i for i in out if isinstance(i, kind)]


def test_a_group_of_one_commits_and_acknowledges_at_once() -> None:
    """K=0 is today's protocol: no wait, no lease."""
    root: Member[str] = Member(0, (0,), now=0.0)
    out = root.handle(Propose("e1"), 5.0)
    assert out == [Proposed(1), Apply(1, "e1"), Acknowledge(1, "e1")]
    assert root.serves(1e9)


def test_the_root_acknowledges_once_a_majority_holds_the_entry() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    out = root.handle(Propose("e1"), 0.0)
    assert of(out, Proposed) == [Proposed(1)]
    assert not of(out, Apply) and not of(out, Acknowledge)
    append = sends(out)[1]
    assert isinstance(append, AppendEntries) and append.entries == (Entry(1, "e1"),)
    standby: Member[str] = Member(1, GROUP, now=0.0)
    reply = sends(standby.handle(append, 0.01))[0]
    assert reply == AppendReply(1, 1, 1, True, 1, 0.0)
    out = root.handle(reply, 0.02)
    assert of(out, Apply) == [Apply(1, "e1")] and of(out, Acknowledge) == [Acknowledge(1, "e1")]
    # the standby applies it once the root's next append says it is committed
    beat = sends(root.handle(Tick(), 0.2))[1]
    assert beat.commit == 1
    assert of(standby.handle(beat, 0.21), Apply) == [Apply(1, "e1")]


def test_an_answer_no_member_could_send_changes_nothing() -> None:
    """An `ok` past the root's log would commit what no majority holds (and fail the next
    append); an answer from a rank outside the group has no place in the count. Both are a
    peer at fault: ignored, never obeyed, never a crash (found by tests/test_group_service.py's
    helpers, session 15)."""
    root: Member[str] = Member(0, GROUP, now=0.0)
    root.handle(Propose("e1"), 0.0)
    assert root.handle(AppendReply(1, 1, 1, True, 5, 0.0), 0.01) == []
    assert root.handle(AppendReply(7, 1, 1, True, 1, 0.0), 0.01) == []
    assert root.log.commit == 0
    assert sends(root.handle(Tick(), 0.2))  # the next heartbeat goes out as before
    out = root.handle(AppendReply(1, 1, 1, True, 1, 0.0), 0.21)  # an honest answer commits
    assert of(out, Acknowledge) == [Acknowledge(1, "e1")]


def test_a_follower_missing_the_previous_entry_says_where_it_ends() -> None:
    standby: Member[str] = Member(1, GROUP, now=0.0)
    late = AppendEntries(0, 1, 3, 1, (Entry(1, "e4"),), 0, 0.0)
    assert sends(standby.handle(late, 0.0))[0] == AppendReply(1, 1, 1, False, 0, 0.0)


def test_an_order_of_a_stale_term_is_refused_and_its_root_steps_down() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    append = sends(root.handle(Propose("e1"), 0.0))[1]
    standby: Member[str] = Member(1, GROUP, now=0.0)
    standby.term = 3
    refusal = sends(standby.handle(append, 0.0))[0]
    assert refusal == AppendReply(1, 1, 3, False, 0, 0.0)
    out = root.handle(refusal, 0.01)
    assert out == [SteppedDown(3, None, "term 3 is under way"), Abandon(1)]
    assert not root.is_root and root.term == 3
    assert root.handle(Propose("e2"), 0.02) == [NotRoot(None)]


def test_a_broker_that_knows_a_later_term_makes_the_root_step_down() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    assert of(root.handle(StaleTerm(2), 0.0), SteppedDown)
    assert root.term == 2 and isinstance(root.role, Following)


def test_a_silent_root_is_replaced_after_a_canvass_and_an_election() -> None:
    one: Member[str] = Member(1, GROUP, now=0.0)
    two: Member[str] = Member(2, GROUP, now=0.0)
    assert one.handle(Tick(), 0.59) == []  # 0.5 s, plus 0.1 s for its place
    canvass = sends(one.handle(Tick(), 0.6))[2]
    assert isinstance(canvass, VoteRequest) and canvass.pre and canvass.term == 2
    assert one.term == 1  # a canvass raises no term
    yes = sends(two.handle(canvass, 0.6))[1]
    assert yes == VoteReply(2, 1, 2, True, 0.6, True) and two.term == 1
    request = sends(one.handle(yes, 0.61))[2]
    assert isinstance(request, VoteRequest) and not request.pre and one.term == 2
    vote = sends(two.handle(request, 0.61))[1]
    assert vote == VoteReply(2, 1, 2, True, 0.61) and two.voted_for == 1
    out = one.handle(vote, 0.62)
    assert of(out, BecameRoot) == [BecameRoot(2)]
    opening = sends(out)[2]
    assert opening.entries == (Entry(2, None),) and opening.term == 2
    assert one.may_acknowledge(0.62)  # the vote is an answer: the lease starts
    assert not one.serves(0.62)  # not before its own term's mark is committed
    one.handle(sends(two.handle(opening, 0.63))[1], 0.64)
    assert one.serves(0.64)


PATIENT = Timing(patience=2.0)


def test_silence_alone_is_waited_out_for_patience_a_lost_link_for_election() -> None:
    """Patience: a stall of the root shorter than `patience` deposes nobody; a member whose
    broker lost its parent's link canvasses after `election` (plus its place) as before."""
    slow: Member[str] = Member(1, GROUP, now=0.0, timing=PATIENT)
    assert slow.next_deadline() == pytest.approx(2.1)
    assert slow.handle(Tick(), 2.09) == []
    assert isinstance(sends(slow.handle(Tick(), 2.1))[2], VoteRequest)
    told: Member[str] = Member(1, GROUP, now=0.0, timing=PATIENT)
    assert told.handle(RootUnreachable(), 0.2) == []
    assert told.next_deadline() == pytest.approx(0.6)
    assert isinstance(sends(told.handle(Tick(), 0.6))[2], VoteRequest)


def test_an_append_of_its_root_ends_the_suspicion() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0, timing=PATIENT)
    member: Member[str] = Member(1, GROUP, now=0.0, timing=PATIENT)
    member.handle(RootUnreachable(), 0.1)
    append = sends(root.handle(Tick(), 0.2))[1]
    member.handle(append, 0.3)
    assert not member.suspect and member.next_deadline() == pytest.approx(2.4)


def test_a_root_without_answers_steps_down_only_after_patience() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0, timing=PATIENT)
    assert of(root.handle(Tick(), 1.9), SteppedDown) == []  # no lease, but patient
    assert root.handle(RootUnreachable(), 1.95) == []  # a root has no parent to lose
    assert of(root.handle(Tick(), 2.0), SteppedDown) != []


def test_a_member_that_heard_its_root_lately_ignores_vote_requests() -> None:
    """Quiet: no answer and no new term, so the root's lease holds."""
    two: Member[str] = Member(2, GROUP, now=0.0)
    two.handle(AppendEntries(0, 1, 0, 0, (), 0, 0.3), 0.3)
    for pre in (True, False):
        assert two.handle(VoteRequest(1, 2, 0, 0, 0.5, pre), 0.5) == []
    assert two.term == 1
    assert sends(two.handle(VoteRequest(1, 2, 0, 0, 0.8), 0.8))[1].granted


def test_one_vote_per_term_and_only_for_a_complete_log() -> None:
    two: Member[str] = Member(2, GROUP, now=0.0)
    two.handle(AppendEntries(0, 1, 0, 0, (Entry(1, "e1"),), 0, 0.0), 0.0)
    assert not sends(two.handle(VoteRequest(1, 2, 0, 0, 1.0), 1.0))[1].granted  # log behind
    assert two.term == 2  # the term is taken all the same
    assert sends(two.handle(VoteRequest(1, 3, 1, 1, 2.0), 2.0))[1].granted
    assert two.handle(VoteRequest(0, 3, 1, 1, 2.0), 2.0) == []  # quiet since it voted
    assert not sends(two.handle(VoteRequest(0, 3, 1, 1, 2.6), 2.6))[0].granted  # voted in 3


def test_a_root_without_answers_stops_acknowledging_then_steps_down() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    root.handle(Propose("e1"), 0.0)
    reply = AppendReply(1, 1, 1, True, 1, 0.0)
    # committed, but the answer came when the lease (0.4 s from 0.0) was over: not acknowledged
    out = root.handle(reply, 0.45)
    assert of(out, Apply) == [Apply(1, "e1")] and not of(out, Acknowledge)
    assert root.handle(Tick(), 0.89) != [] and root.is_root
    out = root.handle(Tick(), 0.9)  # lease over for `election`
    assert out == [SteppedDown(1, None, "no majority of the group answers"), Abandon(1)]


def test_a_committed_proposal_is_acknowledged_once_the_lease_is_renewed() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    root.handle(Propose("e1"), 0.0)
    assert not of(root.handle(AppendReply(1, 1, 1, True, 1, 0.0), 0.45), Acknowledge)
    out = root.handle(AppendReply(2, 1, 1, True, 1, 0.44), 0.46)
    assert of(out, Acknowledge) == [Acknowledge(1, "e1")]


def test_a_refilled_member_votes_only_once_a_root_saw_it_hold_the_committed_log() -> None:
    fresh: Member[str] = Member(1, GROUP, now=0.0, incarnation=2, fresh=True)
    assert fresh.term == 0 and not fresh.voter
    assert fresh.handle(Tick(), 60.0) == []  # never campaigns
    assert fresh.handle(VoteRequest(2, 5, 9, 4, 60.0), 60.0) == []  # nor votes
    fresh.handle(AppendEntries(0, 4, 0, 0, (Entry(4, "e1"),), 1, 61.0), 61.0)
    assert not fresh.voter
    fresh.handle(AppendEntries(0, 4, 1, 4, (), 1, 61.1, voter=True), 61.1)
    assert fresh.voter


def test_the_root_promotes_a_member_that_holds_what_it_committed() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    root.handle(Propose("e1"), 0.0)
    root.handle(AppendReply(2, 1, 1, True, 1, 0.0), 0.01)  # committed with rank 2
    out = root.handle(AppendReply(1, 2, 1, True, 1, 0.02), 0.02)  # a new rank 1 holds it
    out = root.handle(Tick(), 0.2)
    assert sends(out)[1].voter


def test_replies_of_a_dead_incarnation_are_ignored() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    root.handle(Propose("e1"), 0.0)
    root.handle(AppendReply(1, 2, 1, False, 0, 0.0), 0.01)  # incarnation 2 speaks first
    out = root.handle(AppendReply(1, 1, 1, True, 1, 0.0), 0.02)  # its dead predecessor's ack
    assert out == [] and root.log.commit == 0


def test_only_the_root_takes_proposals() -> None:
    standby: Member[str] = Member(1, GROUP, now=0.0)
    assert standby.handle(Propose("e1"), 0.0) == [NotRoot(0)]
    standby.handle(Tick(), 1.0)
    assert isinstance(standby.role, Campaigning)
    assert standby.handle(Propose("e1"), 1.0) == [NotRoot(None)]


def test_an_append_of_its_own_term_at_a_root_is_unexpected() -> None:
    root: Member[str] = Member(0, GROUP, now=0.0)
    with pytest.raises(Unexpected, match="AppendEntries when role=Leading"):
        root.handle(AppendEntries(1, 1, 0, 0, (), 0, 0.0), 0.0)


def test_a_lease_must_end_before_quiet_does() -> None:
    with pytest.raises(ValueError, match="shorter than quiet"):
        Timing(lease=0.5, election=0.5)


def test_the_term_fence_refuses_older_terms_only() -> None:
    fence = TermFence()
    assert fence.admit(1) and fence.admit(3) and fence.admit(3)
    assert not fence.admit(2)


def test_the_log_keeps_what_it_holds_and_drops_only_a_conflict() -> None:
    log: ReplicaLog[str] = ReplicaLog()
    assert log.accept(0, 0, (Entry(1, "a"), Entry(1, "b"))) == 2
    assert log.accept(0, 0, (Entry(1, "a"),)) == 1  # an overtaken append
    assert log.last == 2  # shortened nothing
    assert log.accept(5, 1, ()) is None
    assert log.accept(1, 1, (Entry(2, "c"),)) == 2
    assert [e.payload for e in log.entries] == ["a", "c"]
    log.commit = 2
    with pytest.raises(CommittedLost):
        log.accept(1, 1, (Entry(3, "d"),))
    assert log.up_to_date(2, 2) and log.up_to_date(1, 3) and not log.up_to_date(5, 1)


def test_the_log_discards_applied_entries_and_matches_below_them() -> None:
    log: ReplicaLog[str] = ReplicaLog()
    log.accept(0, 0, (Entry(1, "a"), Entry(1, "b"), Entry(2, "c")))
    with pytest.raises(CommittedLost):
        log.compact(2)  # not committed: a snapshot may stand only for committed entries
    log.commit = 2
    log.compact(2)
    assert (log.base, log.base_term, log.last, log.last_term) == (2, 1, 3, 2)
    assert log.term_at(1) is None and log.term_at(2) == 1 and log.at(3) == Entry(2, "c")
    with pytest.raises(IndexError):
        log.at(2)
    assert log.between(1, 3) == (Entry(2, "c"),)
    # an append from below the discarded part matches there: those entries are committed
    assert log.accept(0, 0, (Entry(1, "a"),)) == 2
    assert log.accept(1, 1, (Entry(1, "b"), Entry(2, "c"), Entry(2, "d"))) == 4
    with pytest.raises(CommittedLost):
        log.accept(1, 1, (Entry(3, "x"),))
    assert log.up_to_date(4, 2) and not log.up_to_date(3, 2)


def test_a_snapshot_replaces_the_log_up_to_its_index() -> None:
    log: ReplicaLog[str] = ReplicaLog()
    log.accept(0, 0, (Entry(1, "a"), Entry(1, "b"), Entry(1, "c")))
    log.install(2, 1)  # it holds entry 2 of term 1: what follows stays
    assert (log.base, log.last, log.commit) == (2, 3, 2)
    log.install(1, 1)  # late: nothing changes
    assert (log.base, log.last) == (2, 3)
    other: ReplicaLog[str] = ReplicaLog()
    other.accept(0, 0, (Entry(1, "a"), Entry(2, "x")))
    other.install(3, 3)  # a conflicting tail goes
    assert (other.base, other.base_term, other.last, other.entries) == (3, 3, 3, [])


def snapshotting(
    rank: int, table: list[str], timing: Timing = DEFAULT, fresh: bool = False
) -> Member[str]:
    """A member whose table is `table` (the payloads applied), for snapshots."""
    return Member(rank, GROUP, 0.0, timing, 2 if fresh else 1, fresh, lambda: list(table))


def carry(member: Member[str], table: list[str], out: list[Any]) -> dict[int, Any]:
    """Carry out a member's instructions on its table; returns its sends."""
    for i in out:
        if isinstance(i, Apply):
            table.append(i.payload)
        elif isinstance(i, Restore):
            table[:] = i.state
    return sends(out)


def test_the_root_discards_what_all_hold_and_followers_follow_its_floor() -> None:
    tables: dict[int, list[str]] = {r: [] for r in GROUP}
    group = {r: snapshotting(r, tables[r]) for r in GROUP}
    root, now = group[0], 0.0
    for payload in ("a", "b", "c"):
        out = carry(root, tables[0], root.handle(Propose(payload), now))
        for peer, append in out.items():
            reply = carry(group[peer], tables[peer], group[peer].handle(append, now))[0]
            carry(root, tables[0], root.handle(reply, now))
    for _ in range(3):  # heartbeats carry the commit and the floor
        now += 0.1
        for peer, append in carry(root, tables[0], root.handle(Tick(), now)).items():
            reply = carry(group[peer], tables[peer], group[peer].handle(append, now))[0]
            carry(root, tables[0], root.handle(reply, now))
    assert all(tables[r] == ["a", "b", "c"] for r in GROUP)
    assert all(group[r].log.base == 3 and group[r].log.last == 3 for r in GROUP)


def test_a_member_past_keep_gets_a_snapshot_then_the_log() -> None:
    timing = Timing(keep=1)
    table: list[str] = []
    root = snapshotting(0, table, timing)
    standby = snapshotting(1, [], timing)
    now = 0.0
    for payload in ("a", "b", "c", "d"):  # rank 2 is dead: a majority is the root and rank 1
        out = carry(root, table, root.handle(Propose(payload), now))
        reply = sends(standby.handle(out[1], now))[0]
        carry(root, table, root.handle(reply, now))
    now += 0.1
    carry(root, table, root.handle(Tick(), now))
    assert root.log.base == 3  # rank 2 acknowledged nothing; the root keeps 1 entry behind 4
    refilled_table: list[str] = []
    refilled = snapshotting(2, refilled_table, timing, fresh=True)
    beat = carry(root, table, root.handle(Tick(), now + 0.1))[2]
    refusal = sends(refilled.handle(beat, now + 0.1))[0]
    snapshot = carry(root, table, root.handle(refusal, now + 0.1))[2]
    assert isinstance(snapshot, InstallSnapshot) and snapshot.index == 4
    assert snapshot.state == ["a", "b", "c", "d"]
    out = refilled.handle(snapshot, now + 0.1)
    assert of(out, Restore) == [Restore(4, ["a", "b", "c", "d"])]
    carry(refilled, refilled_table, out)
    assert refilled_table == table and refilled.log.base == 4 and refilled.applied == 4
    carry(root, table, root.handle(sends(out)[0], now + 0.1))
    assert root.role.match[2] == 4  # type: ignore[union-attr]
    # a snapshot lost on the way is sent again only once an answer shows it missing
    lost: Member[str] = snapshotting(2, [], timing, fresh=True)
    lost.incarnation = 3
    beat = carry(root, table, root.handle(Tick(), now + 0.2))[2]
    again = carry(root, table, root.handle(sends(lost.handle(beat, now + 0.2))[0], now + 0.2))
    assert isinstance(again[2], InstallSnapshot)
    probe = carry(root, table, root.handle(Tick(), now + 0.3))[2]
    assert isinstance(probe, AppendEntries) and probe.prev == root.log.base  # not the table
    answer = sends(lost.handle(probe, now + 0.3))[0]
    assert isinstance(carry(root, table, root.handle(answer, now + 0.3))[2], InstallSnapshot)


def test_a_root_that_stepped_down_elects_no_other_and_is_elected_again() -> None:
    """With one member gone, the root and the other standby are the only majority: the root,
    stalled past its lease, steps down and helps elect no other (its broker would leave as
    superseded, and the majority with it); it campaigns itself and the other votes for it."""
    root: Member[str] = Member(0, GROUP, now=0.0)
    assert of(root.handle(Tick(), 0.9), SteppedDown)  # no answer since 0.0: the lease lapsed
    for at in (1.5, 3.0, 10.0):  # past its quiet of `election`, and long after
        for pre in (True, False):
            assert root.handle(VoteRequest(1, 2, 0, 0, at, pre), at) == []
    assert root.term == 1
    out = root.handle(Tick(), 10.0)  # its own timeout: it canvasses, then campaigns
    assert sends(out)[1] == VoteRequest(0, 2, 0, 0, 10.0, True)
    one: Member[str] = Member(1, GROUP, now=0.0)
    answer = sends(one.handle(sends(out)[1], 10.0))[0]
    assert answer.granted
    out = root.handle(answer, 10.0)
    assert root.term == 2 and sends(out)[1] == VoteRequest(0, 2, 0, 0, 10.0)
    out = root.handle(sends(one.handle(sends(out)[1], 10.0))[0], 10.0)
    assert root.is_root and root.term == 2 and of(out, BecameRoot)
    assert sends(one.handle(VoteRequest(2, 3, 2, 2, 12.0), 12.0))[2].granted  # it follows again
