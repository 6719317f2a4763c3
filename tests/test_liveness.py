"""Tests of `tbon.overlay.links.liveness`: how long a peer has been silent, and what that
makes it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.links.liveness import Liveness, Verdict


def test_starts_alive() -> None:
    liveness = Liveness(10, 60, now=100)
    assert liveness.verdict is Verdict.ALIVE
    assert liveness.last_heard == 100
    assert liveness.check(100) is None
    assert liveness.check(109.999) is None


def test_alive_torpid_lost() -> None:
    liveness = Liveness(10, 60, now=100)
    assert liveness.check(110) is Verdict.TORPID  # the limit itself counts
    assert liveness.verdict is Verdict.TORPID
    assert liveness.check(120) is None  # reported once
    assert liveness.check(159.9) is None
    assert liveness.check(160) is Verdict.LOST
    assert liveness.verdict is Verdict.LOST
    assert liveness.check(1000) is None  # reported once, and final


def test_straight_to_lost_when_both_limits_pass() -> None:
    liveness = Liveness(10, 60, now=0)
    assert liveness.check(61) is Verdict.LOST


def test_heard_clears_torpid() -> None:
    liveness = Liveness(10, 60, now=0)
    assert liveness.heard(5) is None  # alive stays alive: nothing to report
    assert liveness.check(14) is None  # silence counts from the last sign of life
    assert liveness.check(15) is Verdict.TORPID
    assert liveness.heard(20) is Verdict.ALIVE
    assert liveness.verdict is Verdict.ALIVE
    assert liveness.last_heard == 20
    assert liveness.heard(21) is None
    assert liveness.check(30.5) is None
    assert liveness.check(31) is Verdict.TORPID


def test_heard_does_not_revive_the_lost() -> None:
    liveness = Liveness(10, 60, now=0)
    assert liveness.check(60) is Verdict.LOST
    assert liveness.heard(61) is None
    assert liveness.verdict is Verdict.LOST
    assert liveness.check(62) is None
    assert liveness.deadline() is None


def test_zero_torpid_disables_torpid() -> None:
    liveness = Liveness(0, 60, now=0)
    assert liveness.deadline() == 60
    assert liveness.check(59) is None
    assert liveness.verdict is Verdict.ALIVE
    assert liveness.check(60) is Verdict.LOST


def test_zero_timeout_disables_lost() -> None:
    liveness = Liveness(10, 0, now=0)
    assert liveness.check(10) is Verdict.TORPID
    assert liveness.deadline() is None
    assert liveness.check(10**9) is None
    assert liveness.verdict is Verdict.TORPID


def test_both_zero_never_judges() -> None:
    liveness = Liveness(0, 0, now=0)
    assert liveness.deadline() is None
    assert liveness.check(10**9) is None
    assert liveness.verdict is Verdict.ALIVE


def test_deadline_values() -> None:
    liveness = Liveness(10, 60, now=100)
    assert liveness.deadline() == 110  # alive: the nearer of torpid and lost
    liveness.heard(105)
    assert liveness.deadline() == 115
    liveness.check(115)
    assert liveness.deadline() == 165  # torpid: only lost is left
    liveness.heard(120)
    assert liveness.deadline() == 130
    liveness.check(180)
    assert liveness.deadline() is None


def test_deadline_when_torpid_is_longer_than_timeout() -> None:
    liveness = Liveness(90, 60, now=0)
    assert liveness.deadline() == 60
    assert liveness.check(60) is Verdict.LOST


@given(
    torpid=st.sampled_from([0, 0.25, 1, 10]),
    lost=st.sampled_from([0, 0.5, 2, 60]),
    steps=st.lists(
        st.tuples(st.booleans(), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=30
    ),
)
@settings(max_examples=100, deadline=None)
def test_check_changes_nothing_before_the_deadline(
    torpid: float, lost: float, steps: list[tuple[bool, float]]
) -> None:
    """The broker sleeps until deadline(): no verdict may change earlier than that."""
    now = 0.0
    liveness = Liveness(torpid, lost, now)
    for hear, delay in steps:
        now += delay
        deadline = liveness.deadline()
        before = liveness.verdict
        if hear:
            result = liveness.heard(now)
            expected = Verdict.ALIVE if before is Verdict.TORPID else None
            assert result is expected
            continue
        result = liveness.check(now)
        if deadline is None or now < deadline:
            assert result is None
            assert liveness.verdict is before
        else:
            assert result is not None and result is liveness.verdict
        if result is Verdict.LOST:
            assert lost and now - liveness.last_heard >= lost
        if result is Verdict.TORPID:
            assert torpid and now - liveness.last_heard >= torpid
        if liveness.verdict is Verdict.LOST:
            assert before is not Verdict.LOST or result is None


def test_a_judge_that_was_paused_does_not_count_its_own_sleep() -> None:
    # Checked every 0.1 s (a broker's loop runs at least once a heartbeat), then the judge itself
    # is stopped for 5 s (SIGSTOP): on waking, the peer has been silent 5.3 s by the clock, but
    # only 0.3 s of it while we were awake to hear.
    live = Liveness(torpid_after=1.0, lost_after=2.0, now=0.0, pause_after=0.3)
    for tick in range(1, 4):
        assert live.check(tick / 10) is None
    verdicts = {}
    for tick in range(53, 80):  # awake again, checking every 0.1 s, still hearing nothing
        verdict = live.check(tick / 10)
        if verdict is not None:
            verdicts[verdict] = tick / 10
    assert verdicts == {Verdict.TORPID: 6.0, Verdict.LOST: 7.0}


def test_without_pause_after_every_second_counts() -> None:
    live = Liveness(torpid_after=1.0, lost_after=2.0, now=0.0)
    assert live.check(5.0) is Verdict.LOST


def test_a_judge_that_hears_often_and_checks_seldom_was_not_paused() -> None:
    """A child hears its parent's beats and answers them, its own clock put off each time: its
    checks are far apart, but each beat heard shows it was awake. When the beats stop, the
    silence counts from the last one, not from the last check (no pause is discounted)."""
    liveness = Liveness(0, 60, now=0, pause_after=6)
    for beat in range(2, 1000, 2):  # heartbeat 2 s: heard every 2 s, never checked
        liveness.heard(beat)
    now = 998.0
    while (verdict := liveness.check(now + 3)) is None:  # its own beat, every 1.5 heartbeats
        now += 3
    assert verdict is Verdict.LOST and now + 3 == 998 + 60
