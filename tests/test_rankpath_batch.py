"""Rank 0's one pass over a report (RankPath.handle_all, RankTable.apply_all) against the same
events handled one by one (RankPath.handle): the same table, outcomes, follow-ups and admissions.

The oracle reads the table's roll-up after every event, so each Online is rolled up alone; the
batch leaves runs of them to one pass (Rollup.set_online) and runs of quiet Onlines to
`apply_all`. Events are drawn to reach every path: Onlines at home and under a foster parent,
repeats and other brokers' hellos (refused, then voided), stale incarnations, losses that cut
subtrees off and open foster admissions, goodbyes and torpid flags.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tables import specs, started
from zmq.utils import z85

from tbon.overlay.services.actions import Action, Call, Log, Send, Wake
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state.ranktable import (
    Departed,
    Event,
    Lost,
    Online,
    Outcome,
    RankTable,
    Reserve,
    Torpid,
)


def shown(action: Action) -> Any:
    """An action as data: a Call's continuation is a closure, compared by its request."""
    if isinstance(action, Call):
        message = action.request
        return ("call", message.topic, message.nodeid, repr(message.payload))
    if isinstance(action, Send):
        message = action.message
        return ("send", message.topic, message.nodeid, repr(message.payload))
    if isinstance(action, Log):
        return ("log", action.level, action.text)
    return repr(action)


def state(path: RankPath) -> Any:
    table: RankTable = path.table
    rollup = table.rollup
    return (
        list(table.entries),
        table.generation,
        rollup.statuses,
        rollup.since,
        +rollup.counts,
        rollup.offline,
        path.admissions._told,
        path.admissions._open,
        sorted(table.timed),
    )


@st.composite
def reports(draw: st.DrawFn, size: int) -> list[list[Event]]:
    """Reports of events about ranks of a `size` tree, each naming its parent (or a foster)."""
    batches = []
    for _ in range(draw(st.integers(1, 6))):
        batch: list[Event] = []
        for _ in range(draw(st.integers(1, 12))):
            rank = draw(st.integers(1, size - 1))
            incarnation = draw(st.sampled_from([1, 1, 1, 2]))
            parent = draw(st.sampled_from([None, "home", "home", "home", 0]))
            kind = draw(st.sampled_from(["online"] * 6 + ["lost", "departed", "torpid"]))
            batch.append((kind, rank, incarnation, parent, draw(st.sampled_from([0, 0, 1]))))
        batches.append(batch)
    return batches


def event_of(path: RankPath, raw: tuple[str, int, int, Any, int]) -> Event:
    kind, rank, incarnation, parent, other = raw
    home = path.topology.parent(rank)
    by = home if parent == "home" else parent
    if kind == "online":
        return Online(rank, incarnation, f"node{rank}", 1000 + rank + other, by, "k" * 40)
    if kind == "lost":
        return Lost(rank, incarnation, "connection dropped", by)
    if kind == "departed":
        return Departed(rank, incarnation, by)
    return Torpid(rank, incarnation, bool(other), by)


@given(st.data(), st.integers(2, 12))
@settings(max_examples=300, deadline=None)
def test_a_report_in_one_pass_is_its_events_one_by_one(data: st.DataObject, size: int) -> None:
    spec = data.draw(specs(size))
    one, batched = RankPath(started(spec, size)), RankPath(started(spec, size))
    now = 100.0
    for raws in data.draw(reports(size)):
        now += data.draw(st.sampled_from([0.0, 1.0]))
        events = [event_of(one, raw) for raw in raws]
        outcomes: list[Outcome] = []
        actions: list[Action] = []
        for event in events:
            applied = one.handle(event, now)
            one.table.rollup  # noqa: B018 (read: rolled up event by event)
            outcomes.append(applied.outcome)
            actions += [a for a in applied.actions if not isinstance(a, Wake)]
        deadlines = batched.table.deadlines
        done = batched.handle_all(events, now)
        assert done.outcomes == outcomes
        assert [shown(a) for a in done.actions if not isinstance(a, Wake)] == [
            shown(a) for a in actions
        ]
        woken = [a for a in done.actions if isinstance(a, Wake)]
        assert len(woken) == (batched.table.deadlines != deadlines)
        assert state(batched) == state(one)


@given(st.data(), st.integers(2, 12))
@settings(max_examples=300, deadline=None)
def test_the_loop_is_woken_whenever_the_table_s_next_deadline_comes_sooner(
    data: st.DataObject, size: int
) -> None:
    """Only a deadline given wakes the loop (a wire-up's Onlines do not), and every one does: a
    next expiry sooner than before (or the first) always comes with a Wake, whichever way the
    table moved (reports in one pass, a joiner's reservation one by one)."""
    spec = data.draw(specs(size))
    launched = data.draw(st.integers(1, size))
    path = RankPath(started(spec, size, launched))
    now = 100.0
    for raws in data.draw(reports(size)):
        now += data.draw(st.sampled_from([0.0, 1.0, 40.0]))
        before = path.table.next_expiry()
        if data.draw(st.integers(0, 3)) == 0:
            rank = data.draw(st.none() | st.integers(1, size - 1))
            key = z85.encode(data.draw(st.integers(1, 4)).to_bytes(32, "big")).decode()
            actions = path.handle(Reserve(key, "joiner", rank, 30.0), now).actions
        else:
            actions = path.handle_all([event_of(path, raw) for raw in raws], now).actions
        after = path.table.next_expiry()
        woken = any(isinstance(a, Wake) for a in actions)
        if after is not None and (before is None or after < before):
            assert woken
        if not woken:  # nothing given: every deadline as it was, or gone
            assert after is None or (before is not None and after >= before)
