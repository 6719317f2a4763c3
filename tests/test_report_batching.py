"""Reports in batches (issue 26): a broker's Batcher holds its subtree's events for at most an
interval after its last report, in order and within bounds, and rank 0 applies a report in one
pass that ends exactly where applying its events one by one would. Pure: no sockets."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tables import started

from tbon.overlay.services.actions import Action, Call, Log, Send, Wake
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state.ranktable import (
    Departed,
    Dropped,
    Event,
    Lost,
    Moved,
    Online,
    Torpid,
)
from tbon.overlay.state.reports import (
    MAX_BYTES,
    MAX_EVENTS,
    REPORT_INTERVAL,
    Batcher,
    decode_events,
    encode_event,
    encode_events,
    weight,
)
from tbon.overlay.wire.message import Kind, Message, MessageError, encode

KEY = "0" * 40
FRAME_LIMIT = 4 * 1024 * 1024


def lost(rank: int, reason: str = "connection dropped") -> Lost:
    return Lost(rank, 1, reason, 0)


# --- the batcher ---------------------------------------------------------------------------------


def test_after_a_quiet_spell_what_one_turn_read_goes_at_once() -> None:
    batcher = Batcher(interval=0.005)
    assert batcher.deadline() is None and batcher.take(10.0) == []
    batcher.add([lost(1), lost(2)], 10.0)
    assert batcher.deadline() is not None and batcher.deadline() <= 10.0
    assert batcher.take(10.0) == [[lost(1), lost(2)]]
    assert len(batcher) == 0 and batcher.deadline() is None


def test_within_an_interval_of_the_last_report_events_wait_for_it() -> None:
    batcher = Batcher(interval=0.005)
    batcher.add([lost(1)], 10.0)
    assert batcher.take(10.0) == [[lost(1)]]
    batcher.add([lost(2)], 10.001)
    batcher.add([lost(3)], 10.002)
    assert batcher.deadline() == 10.005
    assert batcher.take(10.004) == []  # not yet: one report per interval
    assert batcher.take(10.005) == [[lost(2), lost(3)]]
    batcher.add([lost(4)], 10.006)
    assert batcher.deadline() == 10.005 + 0.005  # the interval runs from the last report sent


def test_joins_alone_wait_an_interval_from_the_first_for_company() -> None:
    """A subtree wiring up says its hellos within milliseconds of each other: the first join
    after a quiet spell waits an interval for those that follow, and they go up together."""
    batcher = Batcher(interval=0.005)
    first, second = Online(3, 1, "h", 9, 1, KEY), Online(4, 1, "h", 10, 1, KEY)
    batcher.add([first], 10.0)
    assert batcher.deadline() == 10.005
    assert batcher.take(10.004) == []
    batcher.add([second], 10.004)
    assert batcher.deadline() == 10.005  # from the first, not the last
    assert batcher.take(10.005) == [[first, second]]
    batcher.add([Online(5, 1, "h", 11, 1, KEY)], 10.020)
    assert batcher.deadline() == 10.025  # the last report is long past: from this join


def test_anything_but_a_join_takes_the_joins_held_with_it_at_once() -> None:
    """A loss (or any other news) is not held for company: it goes after a quiet spell at
    once, with the joins before it, in their order."""
    batcher = Batcher(interval=0.005)
    join = Online(3, 1, "h", 9, 1, KEY)
    batcher.add([join], 10.0)
    batcher.add([lost(4)], 10.001)
    assert batcher.deadline() is not None and batcher.deadline() <= 10.001
    assert batcher.take(10.001) == [[join, lost(4)]]


def test_a_full_batch_goes_at_once_and_the_rest_waits() -> None:
    batcher = Batcher(interval=0.005, max_events=3)
    batcher.add([lost(0)], 10.0)
    batcher.take(10.0)
    batcher.add([lost(rank) for rank in range(1, 8)], 10.001)
    assert batcher.deadline() == float("-inf")  # due now: the loop takes it this turn
    assert batcher.take(10.001) == [[lost(1), lost(2), lost(3)], [lost(4), lost(5), lost(6)]]
    assert len(batcher) == 1 and batcher.deadline() == 10.001 + 0.005
    assert batcher.take(10.006) == [[lost(7)]]


def test_a_goodbye_takes_everything_held() -> None:
    batcher = Batcher(interval=0.005)
    batcher.add([lost(1)], 10.0)
    batcher.take(10.0)
    batcher.add([lost(2)], 10.001)
    assert batcher.take(10.001, force=True) == [[lost(2)]]


def test_long_strings_split_a_batch_by_its_weight() -> None:
    batcher = Batcher(interval=0.005, max_bytes=10_000)
    events = [lost(rank, "x" * 1000) for rank in range(5)]  # 6160 bytes each at most
    batcher.add(events, 10.0)
    assert batcher.take(10.0) == [[event] for event in events]


def test_a_full_report_of_the_heaviest_events_fits_a_frame() -> None:
    """MAX_EVENTS events with long hosts, or events of MAX_BYTES' worth of reasons, each make a
    message under the 4 MiB frame limit."""
    heavy: list[Event] = [
        Online(rank, 1, "h" * 255, 1 << 30, 1, KEY) for rank in range(MAX_EVENTS + 10)
    ]
    heavy += [lost(rank, "\x01" * 50_000) for rank in range(100)]
    batcher = Batcher()
    batcher.add(heavy, 10.0)
    batches = batcher.take(10.0)
    assert [event for batch in batches for event in batch] == heavy
    for batch in batches:
        assert len(batch) <= MAX_EVENTS
        frames = encode(Message(Kind.CONTROL, "report", encode_events(batch)))
        assert sum(len(frame) for frame in frames) < FRAME_LIMIT


events = st.one_of(
    st.builds(
        Online,
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.text(max_size=80),
        st.integers(0, 2**31),
        st.none() | st.integers(0, 10**6),
        st.sampled_from(["", KEY]),
    ),
    st.builds(Lost, st.integers(0, 10**6), st.integers(0, 10**6), st.text(max_size=300)),
    st.builds(Departed, st.integers(0, 10**6), st.integers(0, 10**6)),
    st.builds(Torpid, st.integers(0, 10**6), st.integers(0, 10**6), st.booleans()),
    st.builds(Moved, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.builds(Dropped, st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 99), st.text()),
)


@given(events)
def test_weight_bounds_an_event_s_bytes_in_a_report(event: Event) -> None:
    assert len(json.dumps(encode_event(event))) + 2 <= weight(event)


@given(
    st.lists(
        st.tuples(st.lists(events, max_size=12), st.floats(0, 0.02), st.booleans()), max_size=30
    )
)
@settings(max_examples=200)
def test_batches_keep_the_order_and_the_bounds(
    steps: list[tuple[list[Event], float, bool]],
) -> None:
    """Whatever comes when: what goes up is what came, in the same order, in batches of at most
    4 events and 2000 bytes; what is held at a take is not yet due, and nothing is sent less
    than an interval after the last report unless a batch was full (or a goodbye forces it)."""
    batcher = Batcher(interval=0.005, max_events=4, max_bytes=2000)
    added: list[Event] = []
    sent: list[Event] = []
    now, last = 0.0, float("-inf")
    for adding, later, force in steps:
        batcher.add(adding, now)
        added += adding
        deadline = batcher.deadline()
        now += later
        full = deadline == float("-inf")
        taken = batcher.take(now, force)
        for batch in taken:
            assert 1 <= len(batch) <= 4
            assert sum(weight(event) for event in batch) <= max(2000, weight(batch[0]))
        if taken:
            assert force or full or now >= last + 0.005
            last = now
        elif deadline is not None:
            assert now < deadline
        sent += [event for batch in taken for event in batch]
    sent += [event for batch in batcher.take(now, force=True) for event in batch]
    assert sent == added


def test_reports_decode_as_lists_of_events_within_bounds() -> None:
    batch: list[Event] = [Online(3, 1, "h", 9, 1, KEY), lost(4), Departed(5, 2, 1)]
    assert decode_events(encode_events(batch)) == batch
    for payload in (
        {},
        {"events": []},
        {"events": "online"},
        {"events": [1]},
        {"events": [encode_event(lost(1))] * (MAX_EVENTS + 1)},
    ):
        try:
            decode_events(payload)
        except MessageError:
            continue
        raise AssertionError(f"accepted {payload!r}")


def test_the_interval_is_a_few_milliseconds_and_a_report_fits_a_frame() -> None:
    assert 0 < REPORT_INTERVAL <= 0.01
    assert MAX_BYTES * 2 <= FRAME_LIMIT


# --- rank 0: a batch in one pass equals its events one by one ----------------------------------

SIZE = 15  # kary:2 of 15: ranks 1-2 under rank 0, 3-6 under them, 7-14 leaves


@st.composite
def reported(draw: st.DrawFn) -> Event:
    """An event as a parent might report it in a kary:2 tree of 15, stale ones included."""
    rank = draw(st.integers(1, SIZE - 1))
    incarnation = draw(st.sampled_from([1, 1, 1, 2]))
    home = (rank - 1) // 2
    parent = draw(st.sampled_from([home, home, 0, (home - 1) // 2 if home else 0]))
    kind = draw(st.sampled_from(["online", "online", "lost", "departed", "torpid", "moved"]))
    if kind == "online":
        pid = draw(st.sampled_from([1000 + rank, 5000 + rank]))
        key = draw(st.sampled_from(["", KEY]))
        return Online(rank, incarnation, f"node{rank}", pid, parent, key)
    if kind == "lost":
        return Lost(rank, incarnation, "connection dropped", parent)
    if kind == "departed":
        return Departed(rank, incarnation, parent)
    if kind == "torpid":
        return Torpid(rank, incarnation, draw(st.booleans()), parent)
    return Moved(rank, incarnation, parent, draw(st.integers(0, SIZE - 1)))


def shown(action: Action) -> Any:
    """An action as a comparable value (continuations are functions: their requests stand in)."""
    match action:
        case Send(message) | Call(message, _):
            return (type(action).__name__, message.topic, message.payload, message.nodeid)
        case Log(level, text):
            return ("log", level, text)
    return repr(action)


def state(path: RankPath) -> Any:
    table = path.table
    return (
        [table.entry(rank) for rank in range(SIZE)],
        table.generation,
        table.subtree_statuses(),
        path.admissions.open(),
        [path.admissions.parents(rank, table.entry(rank).incarnation) for rank in range(SIZE)],
    )


@given(st.lists(st.lists(reported(), min_size=1, max_size=8), max_size=8))
@settings(max_examples=200, deadline=None)
def test_a_report_applied_in_one_pass_equals_its_events_one_by_one(
    reports: list[list[Event]],
) -> None:
    """The same table, the same outcomes, the same follow-ups in the same order; the loop is
    woken once per report that gave a deadline, not once per event."""
    one_by_one, batched = RankPath(started("kary:2", SIZE)), RankPath(started("kary:2", SIZE))
    for index, report in enumerate(reports):
        now = 101.0 + index
        outcomes, actions = [], []
        deadlines = one_by_one.table.deadlines
        for event in report:
            applied = one_by_one.handle(event, now)
            outcomes.append(applied.outcome)
            actions += [a for a in applied.actions if not isinstance(a, Wake)]
        changed = one_by_one.table.deadlines != deadlines
        together = batched.handle_all(report, now)
        assert together.outcomes == outcomes
        wakes = [a for a in together.actions if isinstance(a, Wake)]
        assert len(wakes) == (1 if changed else 0)
        rest = [shown(a) for a in together.actions if not isinstance(a, Wake)]
        assert rest == [shown(a) for a in actions]
        assert state(batched) == state(one_by_one)
