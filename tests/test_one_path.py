"""Rank 0's one path into its rank table (overlay/services/rankpath.py): nothing else applies an
event, and each event comes out with every follow-up it calls for, in the documented order.
Pure: events in, actions out, no sockets."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

from rank0 import performed
from tables import started
from zmq.utils import z85

from tbon.overlay.services.actions import Action, Apply, Call, Log, Send, Wake
from tbon.overlay.services.rankpath import EXPIRED, RELEASED, Applied, RankPath
from tbon.overlay.state.ranktable import (
    Expire,
    Lost,
    Moved,
    Online,
    RankState,
    RankTable,
    Reboot,
    Release,
    Reserve,
    Retire,
)
from tbon.overlay.state.topology import Topology

OVERLAY = Path(__file__).resolve().parent.parent / "overlay"
THE_PATH = OVERLAY / "services" / "rankpath.py"


def public_key(seed: int) -> str:
    return z85.encode(seed.to_bytes(32, "big")).decode()


def applies(source: Path) -> list[int]:
    """The lines of `source` that call something's `.apply(...)` or `.apply_all(...)`."""
    tree = ast.parse(source.read_text(), filename=str(source))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("apply", "apply_all")
    ]


def test_no_module_but_the_path_applies_an_event_to_the_rank_table() -> None:
    """A lint: `.apply(` is the rank table's way in, and only the one path may call it, so that
    no new way of changing the table can forget a follow-up (a revocation, fostering). A
    service returns an Apply action instead (services/actions.py)."""
    modules = sorted(OVERLAY.rglob("*.py"))
    assert THE_PATH in modules and len(modules) > 50
    found = {
        str(module.relative_to(OVERLAY)): lines
        for module in modules
        if module != THE_PATH and (lines := applies(module))
    }
    assert found == {}
    assert applies(THE_PATH)  # the lint looks for what the path itself does


# --- events in, actions out -----------------------------------------------------------------


def online(table: RankTable, ranks: list[int]) -> None:
    """Welcome each rank's current incarnation under its own parent, with its key (set-up)."""
    for rank in ranks:
        incarnation = table.entry(rank).incarnation
        event = Online(rank, incarnation, f"node{rank}", 1000 + rank, None, public_key(rank))
        assert table.apply(event, 101.0).applied


def seven() -> tuple[RankTable, RankPath]:
    """kary:2, 7 ranks, every one online under its own parent, keys known."""
    table = started("kary:2", 7)
    online(table, list(range(1, 7)))
    return table, RankPath(table)


def shape(actions: list[Action]) -> list[str]:
    """Each action as the test reads it: a log line's level, a request's topic and rank."""
    said: list[str] = []
    for action in actions:
        if isinstance(action, Log):
            said.append(logging.getLevelName(action.level).lower())
        elif isinstance(action, Send | Call):
            message = action.message if isinstance(action, Send) else action.request
            said.append(f"{message.topic}@{message.nodeid}")
        else:
            said.append(type(action).__name__)
    return said


def test_a_rank_lost_has_what_it_held_fostered_then_the_loop_woken() -> None:
    table, path = seven()
    applied = path.handle(Lost(1, 1, "connection dropped", 0), 200.0)
    assert applied.outcome.applied and table.entry(1).state is RankState.LOST
    assert shape(applied.actions) == ["info", "heal.foster@0", "Wake"]
    [order] = [a for a in applied.actions if isinstance(a, Call)]
    assert sorted(r for r, _, _ in order.request.payload["ranks"]) == [3, 4]
    assert sorted(r for r, _, _ in path.admissions.open()) == [3, 4]


def test_a_refused_event_is_said_and_changes_nothing() -> None:
    table, path = seven()
    generation = table.generation
    applied = path.handle(Retire(1, 1), 200.0)  # its children are online
    assert not applied.outcome.applied
    assert shape(applied.actions) == ["info"] and table.generation == generation
    assert "ignored" in applied.actions[0].text  # type: ignore[union-attr]
    refused = path.handle(Reserve(public_key(50), "joiner", 1, 30.0), 200.0)
    assert not refused.outcome.applied and refused.actions == []  # FLUB answers its joiner


def test_a_second_brokers_online_is_voided_in_order() -> None:
    """Refused, said; the incarnation voided in the table (and what it held fostered, then
    moot admissions withdrawn); revoked at every parent that may admit it; the loop woken."""
    table, path = seven()
    applied = path.handle(Online(1, 1, "node1", 4242, 0, public_key(1)), 200.0)
    assert not applied.outcome.applied
    assert shape(applied.actions) == [
        "info",  # ignored: another broker
        "warning",  # voided
        "info",  # rank 1 ended: rank 0 fosters 3, 4
        "heal.foster@0",
        "flub.revoke@0",  # the broker that reported it, its topology parent, attached to it
        "Wake",
    ]
    assert table.entry(1).state is RankState.LOST and "voided" in table.entry(1).reason


def test_an_online_of_an_ended_incarnation_is_revoked_without_a_second_void() -> None:
    _table, path = seven()
    path.handle(Lost(3, 1, "silent", 1), 200.0)
    path.handle(Reserve(public_key(33), "spare", 3, 30.0), 201.0)
    applied = path.handle(Online(3, 1, "node3", 1003, 1, public_key(3)), 202.0)
    assert shape(applied.actions) == ["info", "flub.revoke@1"]  # nothing to wake


def test_a_new_incarnation_supersedes_the_last_wherever_it_was_admitted() -> None:
    _table, path = seven()
    path.handle(Lost(1, 1, "connection dropped", 0), 200.0)  # rank 0 fosters 3 and 4
    path.handle(Online(3, 1, "node3", 1003, 0, public_key(3)), 201.0)
    path.handle(Lost(3, 1, "silent", 0), 202.0)
    applied = path.handle(Reserve(public_key(33), "spare", 3, 30.0), 203.0)
    assert applied.outcome.reservation is not None and applied.outcome.reservation.granted
    assert shape(applied.actions) == ["flub.revoke@0", "flub.revoke@1", "Wake"]
    assert {a.message.payload["reason"] for a in applied.actions if isinstance(a, Send)} == {
        "superseded: rank 3 is now incarnation 2"
    }
    repeat = path.handle(Reserve(public_key(33), "spare", 3, 30.0), 204.0)
    assert repeat.outcome.applied and repeat.actions == []  # told again: nothing new


def test_a_released_or_expired_reservation_is_revoked_at_its_parent() -> None:
    table = started("kary:2", 7, launched=3)
    online(table, [1, 2])
    path = RankPath(table)
    for incarnation, ended, why in ((1, Release, RELEASED), (2, Expire, EXPIRED)):
        key = public_key(100 + incarnation)
        grant = path.handle(Reserve(key, "joiner", 3, 30.0), 200.0).outcome
        assert grant.reservation is not None and grant.reservation.incarnation == incarnation
        event = Release(3, incarnation, key) if ended is Release else Expire(3, incarnation)
        applied = path.handle(event, 240.0)
        assert table.entry(3).state is RankState.VACANT
        revokes = [a.message for a in applied.actions if isinstance(a, Send)]
        assert [(m.nodeid, m.payload["reason"]) for m in revokes] == [(1, why)]
        assert not any(isinstance(a, Wake) for a in applied.actions)  # a lease gone: no timer


def test_a_config_broker_rebooted_supersedes_its_last_incarnation() -> None:
    table = RankTable(Topology("kary:2", 4), ["h0", "h1", "h2", "h3"], 100.0, fixed=True)
    path = RankPath(table)
    path.handle(Online(0, 1, "h0", 1), 100.0)
    for rank in (1, 3):
        path.handle(Online(rank, 1, f"h{rank}", 10 + rank), 101.0)
    path.handle(Lost(3, 1, "connection dropped", 1), 102.0)
    applied = path.handle(Reboot(3, 1), 103.0)
    assert table.entry(3).incarnation == 2
    assert shape(applied.actions) == ["flub.revoke@1"]  # no deadline given: nothing to wake
    again = path.handle(Reboot(3, 1), 104.0)  # booting already: the current one serves
    assert again.outcome.applied and again.actions == []


def test_a_rank_online_under_a_foster_parent_is_sent_home_when_its_parent_is_there() -> None:
    _table, path = seven()
    path.handle(Lost(1, 1, "connection dropped", 0), 200.0)
    path.handle(Online(3, 1, "node3", 1003, 0, public_key(3)), 201.0)  # fostered at rank 0
    path.handle(Reserve(public_key(11), "spare", 1, 30.0), 202.0)
    applied = path.handle(Online(1, 2, "spare", 77, None, public_key(11)), 203.0)
    adopt = [a.request for a in applied.actions if isinstance(a, Call)]
    assert [(m.topic, m.nodeid, m.payload["rank"]) for m in adopt] == [
        ("heal.adopt", 1, 3),  # the child fostered at rank 0
        ("heal.adopt", 1, 4),  # the child still adrift
    ]
    assert not any(isinstance(a, Wake) for a in applied.actions)  # its lease ended: no timer


def test_an_apply_and_its_continuation_come_out_in_order() -> None:
    """As the performer carries it out (tests/rank0.py): follow-ups, then the continuation."""
    table, path = seven()
    seen: list[bool] = []

    def then(outcome: object, now: float) -> list[Action]:
        seen.append(table.entry(1).state is RankState.LOST)
        return [Log(logging.ERROR, "continuation")]

    done = performed(path, [Apply(Lost(1, 1, "gone", 0), then)], 200.0)
    assert shape(done) == ["info", "heal.foster@0", "Wake", "error"] and seen == [True]


def _fostered_by(applied: Applied) -> list[int]:
    return [
        a.request.nodeid
        for a in applied.actions
        if isinstance(a, Call) and a.request.topic == "heal.foster"
    ]


def test_what_a_rank_dying_on_its_way_home_held_is_fostered_where_its_lineage_reaches() -> None:
    """Issue 20, found by a process test and the link model. kary:2: rank 1 killed, rank 3
    fostered by rank 0 (its children 7 and 8 now hold the lineage [0, 3]); rank 1 refilled, and
    rank 3 sent home. Rank 1's new broker welcomes rank 3, which dies before it passes the new
    lineage down (its old link drops first, then its new one). Ranks 7 and 8 can find rank 0
    but not rank 1's new broker, whose card they never had: rank 0 fosters them too, not rank 1
    alone, as the nearest live ancestor would have it."""
    table = started("kary:2", 9)
    online(table, list(range(1, 9)))
    path = RankPath(table)
    assert _fostered_by(path.handle(Lost(1, 1, "connection dropped", 0), 200.0)) == [0]
    path.handle(Online(3, 1, "node3", 1003, 0, public_key(3)), 201.0)  # fostered at rank 0
    path.handle(Reserve(public_key(11), "spare", 1, 30.0), 202.0)
    path.handle(Online(1, 2, "spare", 77, None, public_key(11)), 203.0)
    path.handle(Online(3, 1, "node3", 1003, 1, public_key(3)), 204.0)  # welcomed home
    assert (table.entry(3).attached_to, table.entry(3).other_links) == (1, (0,))
    path.handle(Lost(3, 1, "connection dropped", 0), 205.0)  # its foster link drops
    assert (table.entry(3).attached_to, table.entry(3).past_links) == (1, (0,))
    applied = path.handle(Lost(3, 1, "connection dropped", 1), 205.1)
    assert table.entry(3).state is RankState.LOST
    assert _fostered_by(applied) == [1, 0]
    opened = sorted((r, p) for r, _, p in path.admissions.open() if r > 4)  # 4: still adrift
    assert opened == [(7, 0), (7, 1), (8, 0), (8, 1)]
    # rank 7 is welcomed by rank 0: its admission at rank 1 is moot, and withdrawn
    applied = path.handle(Online(7, 1, "node7", 1007, 0, public_key(7)), 206.0)
    assert shape(applied.actions).count("heal.withdraw@1") == 1
    assert sorted((r, p) for r, _, p in path.admissions.open() if r > 4) == [(8, 0), (8, 1)]


def test_a_rank_whose_move_home_was_confirmed_is_fostered_on_both_chains_still() -> None:
    """The same, but rank 0 heard rank 3's `moved`: rank 3 sent the new lineage down before it,
    yet its children may not have read it (it died with rank 3, or waited unread behind the
    news of the dropped connection: CI saw it, session 15), so both chains still foster."""
    table = started("kary:2", 9)
    online(table, list(range(1, 9)))
    path = RankPath(table)
    path.handle(Lost(1, 1, "connection dropped", 0), 200.0)
    path.handle(Online(3, 1, "node3", 1003, 0, public_key(3)), 201.0)
    path.handle(Reserve(public_key(11), "spare", 1, 30.0), 202.0)
    path.handle(Online(1, 2, "spare", 77, None, public_key(11)), 203.0)
    path.handle(Online(3, 1, "node3", 1003, 1, public_key(3)), 204.0)
    path.handle(Moved(3, 1, 0, 1), 205.0)
    assert (table.entry(3).other_links, table.entry(3).past_links) == ((), (0,))
    assert _fostered_by(path.handle(Lost(3, 1, "connection dropped", 1), 206.0)) == [1, 0]
