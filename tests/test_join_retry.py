"""A FLUB joiner whose boot servers answer that they cannot reach the root for now (a takeover
under way, grants paused) tries the list again, within its own broker.join-timeout
(overlay/boot/joinretry.py; docs/flub.md §2; docs/protocol.md §13.4). The decision, pure; the
process test that a join started during a takeover succeeds is in test_takeover_join.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tbon.overlay.boot.joinretry import FIRST_PAUSE, LONGEST_PAUSE, pause_before_round


def test_a_round_in_which_every_boot_server_was_gone_is_not_tried_again() -> None:
    assert pause_before_round(1, unsettled=False, left=30.0) is None
    assert pause_before_round(5, unsettled=False, left=30.0) is None


def test_an_unsettled_round_is_tried_again_after_a_pause_that_doubles_up_to_a_bound() -> None:
    pauses = [pause_before_round(done, True, 30.0) for done in range(1, 10)]
    assert pauses[:3] == [FIRST_PAUSE, 2 * FIRST_PAUSE, 4 * FIRST_PAUSE]
    assert pauses[-1] == LONGEST_PAUSE
    assert pauses == sorted(pauses)  # never shorter than the one before


def test_no_pause_runs_past_the_joins_deadline() -> None:
    assert pause_before_round(1, True, left=FIRST_PAUSE) is None  # the next try would be late
    assert pause_before_round(1, True, left=0.0) is None
    assert pause_before_round(1, True, left=-1.0) is None
    assert pause_before_round(10, True, left=0.5) is None  # a 1 s pause does not fit


@given(st.integers(1, 10**6), st.booleans(), st.floats(-1e6, 1e6))
def test_a_pause_is_bounded_and_ends_before_the_deadline(
    done: int, unsettled: bool, left: float
) -> None:
    pause = pause_before_round(done, unsettled, left)
    if pause is not None:
        assert unsettled and FIRST_PAUSE <= pause <= LONGEST_PAUSE and pause < left
