"""When a parent says it refused a key at the handshake (overlay/links/refusals.py)."""

from __future__ import annotations

import logging

from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.links.refusals import REFUSAL_GRACE, Refusals, refusal_grace

DEBUG, WARNING = logging.DEBUG, logging.WARNING


def test_an_orphans_knocks_during_a_heal_are_said_at_debug_level_once() -> None:
    refusals = Refusals(grace=3.0, quiet=60.0)
    levels = [refusals.level("orphan", i * 0.05) for i in range(50)]  # 2.5 s of knocking
    assert levels == [DEBUG] + [None] * 49


def test_a_key_refused_past_the_grace_is_warned_about_once_per_quiet() -> None:
    refusals = Refusals(grace=3.0, quiet=60.0)
    said = {t / 10: refusals.level("foreign", t / 10) for t in range(0, 1300)}  # every 100 ms
    assert said[0.0] == DEBUG
    assert [t for t, level in said.items() if level == WARNING] == [3.0, 63.0, 123.0]


def test_a_key_that_stopped_knocking_starts_afresh() -> None:
    """The same broker fostered again in a later heal knocks with the key it had."""
    refusals = Refusals(grace=3.0)
    assert refusals.level("k", 0.0) == DEBUG
    assert refusals.level("k", 2.0) is None
    assert refusals.level("k", 100.0) == DEBUG
    assert refusals.level("k", 102.0) is None


def test_the_grace_outlasts_a_heartbeat_or_two() -> None:
    assert refusal_grace(0.1) == REFUSAL_GRACE and refusal_grace(10.0) == 20.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=300))
def test_the_memory_is_bounded(keys: list[int]) -> None:
    refusals = Refusals(grace=3.0, capacity=16)
    for now, key in enumerate(keys):
        refusals.level(str(key), float(now))
        assert len(refusals._said) <= 16
