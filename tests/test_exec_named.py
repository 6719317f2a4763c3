"""exec.start with its targets named (`all`, an idset), chosen at the root from its table
(docs/protocol.md §7, **Targets by name**): the root's first answer, the request it carries
out, and the client's broker that learns the ranks from that answer."""

from __future__ import annotations

import errno
from typing import Any

from tbon.overlay.parse.idset import format_idset
from tbon.overlay.services.actions import Forward, Respond, Send, StartJob
from tbon.overlay.services.exec import ExecService
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.exectargets import chosen_targets, pick_targets
from tbon.overlay.state.statesview import RankStates
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.exits import Exit, encode
from tbon.overlay.wire.flow import output_window
from tbon.overlay.wire.message import Kind, Message

STATES = ["online", "online", "lost", "online", "offline", "online", "retiring", "vacant"]


def view(states: list[str]) -> dict[str, Any]:
    """Rank 0's `states` view of ranks in these states, as statusviews.states writes it."""
    named: dict[str, list[int]] = {}
    for rank, state in enumerate(states):
        named.setdefault(state, []).append(rank)
    return {"size": len(states), "states": {s: format_idset(r) for s, r in named.items()}}


def root(states: list[str] = STATES) -> ExecService:
    service = ExecService(0, Topology("kary:2", len(states)), Lifecycle())
    service.rank_states = lambda: view(states)
    return service


def start(targets: Any, route: list[str], **extra: Any) -> Message:
    payload = {"id": "j1", "argv": ["true"], "targets": targets, "acks": True, "merge": True}
    return Message(Kind.REQUEST, "exec.start", payload | extra, nodeid=0, tag=7, route=route)


def test_the_root_answers_first_with_the_ranks_it_chose_then_starts_them() -> None:
    actions = root().handle(start("all", ["l1"]), 0.0)
    first = actions[0]
    assert isinstance(first, Respond) and first.message.streaming
    said = first.message.payload
    assert said["targets"] == "0-1,3,5" and said["window"] == output_window(4)
    assert RankStates(said).state(2) == "lost" and said["size"] == len(STATES)
    forwards = [a for a in actions if isinstance(a, Forward)]
    sent = sorted(r for f in forwards for r in f.message.payload["targets"])
    assert sent == [1, 3, 5]  # rank 0 runs it itself
    assert all(f.message.payload["window"] == output_window(4) for f in forwards)
    assert all("exclude" not in f.message.payload for f in forwards)
    [here] = [a for a in actions if isinstance(a, StartJob)]
    assert here.request.payload["window"] == output_window(4)


def test_an_idset_and_exclude_choose_the_online_ranks_among_them() -> None:
    actions = root().handle(start("1-4,99", ["l1"], exclude="3", window=8192), 0.0)
    said = actions[0].message.payload  # type: ignore[attr-defined]
    assert said["targets"] == "1" and said["window"] == 8192
    assert [r for a in actions if isinstance(a, Forward) for r in a.message.payload["targets"]] == [
        1
    ]


def test_with_no_rank_chosen_the_first_answer_is_the_last() -> None:
    [answer] = root().handle(start("2,4", ["l1"]), 0.0)
    assert isinstance(answer, Respond) and not answer.message.streaming
    assert answer.message.payload["targets"] == ""


def test_named_targets_are_refused_where_no_table_chooses_them() -> None:
    service = ExecService(1, Topology("kary:2", 7), Lifecycle())  # not the root: no view
    [refused] = service.handle(start("all", ["l1", "c2"]), 0.0)
    assert isinstance(refused, Respond) and refused.message.errnum == errno.EINVAL
    for bad in (start("0-", ["l1"]), start("all", ["l1"], exclude=3)):
        [refused] = root().handle(bad, 0.0)
        assert isinstance(refused, Respond) and refused.message.errnum == errno.EINVAL


def test_the_root_and_the_client_choose_alike() -> None:
    """chosen_targets (the root) and pick_targets (an older broker's client) by one rule."""
    states = RankStates(view(STATES))
    for ranks, exclude in (("all", None), ("all", "0,5"), ("0-7", None), ("2-3,9", "3")):
        assert chosen_targets(states, ranks, exclude) == pick_targets(states, ranks, exclude)[0]


def test_the_root_never_lists_the_ranks_of_a_client_s_idset(monkeypatch: Any) -> None:
    """A client writes the idset: a range of a million ranks, repeated to fill a message, would
    cost the root 10^11 set insertions if listed rank by rank (parse_idset). It reads runs."""
    import tbon.overlay.state.exectargets as exectargets

    def listed(text: str) -> list[int]:
        raise AssertionError(f"the root listed the ranks of {text[:20]!r}")

    monkeypatch.setattr(exectargets, "parse_idset", listed)
    huge = ",".join(["0-1048575"] * 100_000)
    actions = root().handle(start(huge, ["l1"], exclude=huge[:19]), 0.0)
    assert actions[0].message.payload["targets"] == ""  # type: ignore[attr-defined]
    actions = root().handle(start(huge, ["l1"], exclude="1"), 0.0)
    assert actions[0].message.payload["targets"] == "0,3,5"  # type: ignore[attr-defined]


def test_the_client_s_broker_learns_the_ranks_from_the_root_s_answer() -> None:
    broker = ExecService(0, Topology("kary:2", 8), Lifecycle())
    request = start("all", ["l1"])
    broker.started_by("l1", request)
    choice = request.respond({"targets": "3,5", "window": 8192, "states": {}}, streaming=True)
    assert broker.answered("l1", choice) == []
    merged = request.respond({"exits": encode([Exit(3, 0, 0)])[0]}, streaming=True)
    broker.answered("l1", merged)
    [kill] = [s for s in broker.client_gone("l1") if isinstance(s, Send)]
    assert kill.message.payload["targets"] == [5]  # 3 has ended; 5 still runs
    [taken] = [a for a in broker.flush(0.0) if isinstance(a, Send)]
    assert taken.message.topic == "exec.taken" and taken.message.payload["targets"] == [3]


def test_a_client_gone_before_the_choice_came_kills_its_job_on_every_rank() -> None:
    broker = ExecService(0, Topology("kary:2", 8), Lifecycle())
    broker.started_by("l1", start("all", ["l1"]))
    [kill] = [s for s in broker.client_gone("l1") if isinstance(s, Send)]
    assert kill.message.payload["targets"] == list(range(8)) and kill.message.payload["gone"]
