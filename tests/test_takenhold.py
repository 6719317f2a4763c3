"""When the client's broker tells ranks their last answers were taken (overlay/state/takenhold.py):
held until the job is over or its client gone, and HOLD_S at most."""

from __future__ import annotations

from tbon.overlay.state.takenhold import HOLD_S, TakenHold


def test_a_job_s_ranks_are_told_together_once_it_is_over() -> None:
    hold = TakenHold()
    hold.taken("j", 3)
    assert hold.due(10.0) == []  # held from now on
    assert hold.next_deadline() == 10.0 + HOLD_S
    hold.taken("j", 0)
    assert hold.due(11.0) == []
    assert hold.over("j") and hold.next_deadline() == 0.0  # due at once
    assert hold.due(11.5) == [("j", [3, 0])]
    assert hold.due(12.0) == [] and hold.next_deadline() is None


def test_a_job_that_runs_on_has_its_finished_ranks_told_after_hold_s() -> None:
    hold = TakenHold()
    hold.taken("long", 1)
    hold.taken("short", 2)
    assert hold.due(0.0) == []
    assert hold.over("short")
    assert hold.due(1.0) == [("short", [2])]
    assert hold.due(HOLD_S - 0.1) == []
    assert hold.due(HOLD_S) == [("long", [1])]
    hold.taken("long", 4)  # more of it, later: held anew
    assert hold.due(HOLD_S + 1) == [] and hold.next_deadline() == 2 * HOLD_S + 1


def test_a_job_with_nothing_held_is_not_over_here() -> None:
    hold = TakenHold()
    assert not hold.over("j")
    assert hold.next_deadline() is None and hold.due(0.0) == []
