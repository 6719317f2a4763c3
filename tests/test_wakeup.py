"""The loop's next wake-up (overlay/broker/wakeup.py): the soonest deadline of every source after
a turn that did anything; after a turn of heartbeats only, the link up's asked again and the rest
kept. No sockets: deadlines in, the wake-up out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tbon.overlay.broker.wakeup import NEVER, WakeUp

deadline = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e6))
deadlines = st.lists(deadline, max_size=14)
now_ = st.floats(min_value=0.0, max_value=1e6)


def test_a_new_loop_asks_every_source_on_its_first_turn() -> None:
    assert WakeUp().due == 0.0


def test_a_deadline_added_by_a_turn_is_the_next_wake_up() -> None:
    """What heal.wait did not get: a turn that adds a deadline (its ETIMEDOUT), then sleeps."""
    wakeup = WakeUp()
    wakeup.asked(100.0, [None, 700.0], 3700.0)  # an idle rank 0: a far lease, a far beat
    assert wakeup.due == 700.0
    wakeup.asked(100.5, [None, 700.0, 101.5], 3700.0)  # the wait came in: due in 1 s
    assert wakeup.due == 101.5
    assert wakeup.timeout_ms(100.5) == 1001


def test_a_deadline_past_is_due_now_and_none_at_all_sleeps_until_input() -> None:
    wakeup = WakeUp()
    wakeup.asked(50.0, [10.0], None)
    assert (wakeup.due, wakeup.timeout_ms(50.0)) == (50.0, 1)
    wakeup.asked(50.0, [None, None], None)
    assert (wakeup.due, wakeup.timeout_ms(50.0)) == (NEVER, None)


def test_a_heartbeat_moves_the_link_ups_deadline_and_keeps_the_rest() -> None:
    wakeup = WakeUp()
    wakeup.asked(0.0, [30.0], 15.0)  # the child's own beat 15 s on, a silence at 30 s
    assert wakeup.due == 15.0
    wakeup.beat(10.0, 25.0)  # the parent's beat came at 10 s, answered: own beat now at 25 s
    assert wakeup.due == 25.0
    wakeup.beat(20.0, 35.0)  # the next one: the silence at 30 s is sooner now
    assert wakeup.due == 30.0


def test_a_known_sooner_deadline_and_a_reset() -> None:
    wakeup = WakeUp()
    wakeup.asked(0.0, [30.0], None)
    wakeup.sooner(40.0)
    assert wakeup.due == 30.0
    wakeup.sooner(5.0)
    assert wakeup.due == 5.0
    wakeup.recompute()  # every source asked on the next turn, the timers not run for it
    assert wakeup.stale and wakeup.due == 5.0
    wakeup.asked(1.0, [30.0], None)
    assert not wakeup.stale and wakeup.due == 30.0


@given(now_, deadlines, deadline)
def test_asking_every_source_wakes_at_the_soonest_deadline_and_not_before_now(
    now: float, rest: list[float | None], up: float | None
) -> None:
    wakeup = WakeUp()
    wakeup.asked(now, rest, up)
    every = [d for d in [*rest, up] if d is not None]
    assert wakeup.due == (max(now, min(every)) if every else NEVER)
    timeout = wakeup.timeout_ms(now)
    assert (timeout is None) == (not every)
    if timeout is not None:  # the poll never sleeps past the deadline, in whole milliseconds
        assert now + (timeout - 1) / 1000 <= wakeup.due + 1e-6


@given(now_, deadlines, deadline, st.lists(st.tuples(now_, deadline), max_size=5))
def test_heartbeat_turns_never_wake_later_than_asking_every_source_would(
    now: float,
    rest: list[float | None],
    up: float | None,
    beats: list[tuple[float, float | None]],
) -> None:
    """The other sources' deadlines only go later over heartbeat turns (a beat heard puts a
    silence off), so the kept `rest` can make a wake-up early, never late."""
    wakeup = WakeUp()
    wakeup.asked(now, rest, up)
    for when, moved in beats:
        wakeup.beat(when, moved)
        full = WakeUp()
        full.asked(when, rest, moved)
        assert wakeup.due == full.due
