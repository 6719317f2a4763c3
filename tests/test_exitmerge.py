"""Exits merged up the tree (overlay/state/exitmerge.py, overlay/wire/exits.py, and the exec
service's side of them), without sockets: the codec, the machine, and a model of a whole tree
in which answers are delivered in any order, brokers die holding exits, targets resend and old
brokers do not merge, checked against the client's own exactly-once rule (resend.Inbox)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.services.actions import Forward, PassOn, Send
from tbon.overlay.services.exec import ExecService, last_word
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.exitmerge import FORGET_S, HOLD_S, ExitMerge, Flush
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.exits import BadExits, Exit, answers_of, decode, encode, exit_of
from tbon.overlay.wire.message import Kind, Message
from tbon.overlay.wire.resend import Inbox, Verdict

KEY = (7, ("l1",))
exits_st = st.dictionaries(
    st.integers(0, 300),
    st.tuples(
        st.integers(0, 255),
        st.integers(0, 5),
        st.none() | st.integers(1, 64),
        st.none() | st.sampled_from(["x: command not found", "killed: rank 3 retired"]),
    ),
    max_size=60,
).map(lambda d: [Exit(r, seq, status, sig, note) for r, (status, seq, sig, note) in d.items()])


# --- the codec --------------------------------------------------------------------------------


@given(exits_st)
def test_merging_then_splitting_gives_back_each_ranks_exit(exits: list[Exit]) -> None:
    split = [one for groups in encode(exits) for one in decode(groups, 301)]
    assert sorted(split, key=lambda e: e.rank) == sorted(exits, key=lambda e: e.rank)
    for one in exits:  # each as its rank sent it, and read back as one
        assert exit_of(one.payload()) == one


def test_ranks_that_ended_alike_are_one_group() -> None:
    exits = [Exit(r, 0, 0) for r in range(1024)] + [Exit(5000, 3, 1, None, "why")]
    [groups] = encode(exits)
    assert groups == [
        {"ranks": "0-1023", "exit": 0, "seq": 0},
        {"ranks": "5000", "exit": 1, "seq": 3, "note": "why"},
    ]
    assert answers_of({"exits": groups}, 6000)[-1] == {
        "rank": 5000,
        "exit": 1,
        "seq": 3,
        "note": "why",
    }


def test_a_flush_too_big_for_one_message_is_cut() -> None:
    exits = [Exit(r, 0, 1, None, f"{r}: " + "n" * 4000) for r in range(600)]
    answers = encode(exits)
    assert len(answers) > 1
    assert sum(len(groups) for groups in answers) == 600


@pytest.mark.parametrize(
    "groups",
    [
        None,
        [1],
        [{"ranks": "0-3", "exit": "0", "seq": 0}],
        [{"ranks": "0-3", "exit": 0, "seq": -1}],
        [{"ranks": "3-0", "exit": 0, "seq": 0}],
        [{"ranks": "0-99999999", "exit": 0, "seq": 0}],
        [{"ranks": "0-10", "exit": 0, "seq": 0}, {"ranks": "0-10", "exit": 0, "seq": 0}],
        [{"ranks": "\u0661", "exit": 0, "seq": 0}],  # a digit, but not an ASCII one
        [{"ranks": "", "exit": 0, "seq": 0}],
        [{"ranks": "1", "exit": 0, "seq": 0, "note": 3}],
    ],
)
def test_what_is_not_a_merged_answer_is_refused(groups: object) -> None:
    with pytest.raises(BadExits):
        decode(groups, 16)
    assert answers_of({"exits": groups}, 16) == []  # the client drops it


@given(st.recursive(st.none() | st.integers() | st.text(max_size=8), st.lists, max_leaves=20))
def test_decoding_raises_only_its_own_error(junk: Any) -> None:
    with contextlib.suppress(BadExits):
        decode(junk, 64)


def test_only_a_plain_numbered_exit_is_merged() -> None:
    assert exit_of({"rank": 1, "exit": 0}) is None  # no seq: an older broker's
    assert exit_of({"rank": 1, "error": "rank 1 is retiring"}) is None
    assert exit_of({"rank": 1, "stream": "stdout", "seq": 0}) is None
    assert exit_of({"rank": 1, "exit": 0, "seq": 0, "extra": 1}) is None  # a field unknown
    assert exit_of({"rank": 1, "exit": 137, "seq": 2, "signal": 9}) == Exit(1, 2, 137, 9)


# --- the machine ------------------------------------------------------------------------------


def test_a_subtree_that_completes_goes_up_at_once_in_one_flush() -> None:
    merge = ExitMerge()
    merge.open(KEY, "j", [1, 3, 4], 1, 0.0)
    assert merge.take(KEY, [Exit(3, 0, 0)], 0.0) == []
    assert merge.next_deadline() == HOLD_S
    assert merge.passed(KEY, 4, 0.01) == []  # an error: it went on as it came
    [flush] = merge.take(KEY, [Exit(1, 0, 0)], 0.02) or []
    assert flush == Flush(KEY, 1, (Exit(3, 0, 0), Exit(1, 0, 0)))
    assert not merge.merges(KEY) and merge.next_deadline() is None
    assert merge.take(KEY, [Exit(3, 0, 0)], 0.03) is None  # a resend later: passes as it came


def test_exits_are_held_no_longer_than_the_hold() -> None:
    merge = ExitMerge()
    merge.open(KEY, "j", [1, 3, 4], 1, 0.0)
    merge.take(KEY, [Exit(3, 0, 0)], 1.0)
    assert merge.due(1.0 + HOLD_S / 2) == []
    assert merge.due(1.0 + HOLD_S) == [Flush(KEY, 1, (Exit(3, 0, 0),))]
    assert merge.due(2.0) == []  # nothing held
    assert merge.merges(KEY)  # rank 1 and 4 are still to end
    assert merge.next_deadline() == 1.0 + FORGET_S
    merge.due(1.0 + FORGET_S)
    assert not merge.merges(KEY)  # a job heard of no more is forgotten


def test_a_gone_client_s_jobs_are_forgotten() -> None:
    merge = ExitMerge()
    merge.open(KEY, "j", [1, 3], 1, 0.0)
    merge.open((8, ("l1",)), "k", [1, 3], 1, 0.0)
    merge.gone("j")
    assert not merge.merges(KEY) and merge.merges((8, ("l1",)))


# --- the exec service: fan-out, gather, hand-over to the client --------------------------------


def start(targets: list[int], route: list[str], nodeid: int, merge: bool = True) -> Message:
    payload = {"id": "j1", "argv": ["true"], "targets": targets, "acks": True, "merge": merge}
    return Message(Kind.REQUEST, "exec.start", payload, nodeid=nodeid, tag=7, route=route)


def test_an_interior_broker_sends_its_subtree_s_exits_up_as_one_answer() -> None:
    """Rank 1 of kary:2 (7 ranks) fans out to 3 and 4, and runs the job itself: the three
    exits go up as one merged answer along the route it came by, once the last is in."""
    service = ExecService(1, Topology("kary:2", 7), Lifecycle())
    request = start([1, 3, 4], ["l1", "p0"], 1)
    actions = service.handle(request, 0.0)
    assert sorted(f.child for f in actions if isinstance(f, Forward)) == [3, 4]
    child = request.respond({"rank": 3, "exit": 0, "seq": 0}, streaming=True)
    assert service.gather(child, 0.0) is not None  # held
    out = request.respond({"rank": 3, "stream": "stdout", "seq": 0}, streaming=True)
    assert service.gather(out, 0.0) is None  # output goes on at once
    own = request.respond({"rank": 1, "exit": 1, "seq": 0}, streaming=True)
    assert service.gather(own, 0.0) == []
    last = request.respond({"rank": 4, "exit": 0, "seq": 0}, streaming=True)
    [merged] = service.gather(last, 0.0) or []
    assert isinstance(merged, PassOn) and merged.message.route == ["l1", "p0"]
    assert merged.message.payload == {
        "exits": [{"ranks": "3-4", "exit": 0, "seq": 0}, {"ranks": "1", "exit": 1, "seq": 0}]
    }
    assert service.gather(last, 0.0) is None  # complete here and forgotten: a resend passes


def test_the_error_that_completes_a_subtree_goes_on_before_the_exits_held() -> None:
    service = ExecService(1, Topology("kary:2", 7), Lifecycle())
    request = start([3, 4], ["l1", "p0"], 1)
    service.handle(request, 0.0)
    service.gather(request.respond({"rank": 3, "exit": 0, "seq": 0}, streaming=True), 0.0)
    error = request.respond({"rank": 4, "error": "rank 4 is not connected"}, streaming=True)
    first, merged = service.gather(error, 0.0) or []
    assert first == PassOn(error)
    assert isinstance(merged, PassOn) and merged.message.route == ["l1", "p0"]
    assert merged.message.tag == 7 and merged.message.streaming and last_word(merged.message)
    assert answers_of(merged.message.payload) == [{"rank": 3, "exit": 0, "seq": 0}]


def test_a_target_with_nothing_below_it_sends_its_own_exit_as_it_is() -> None:
    """Rank 5 of kary:2 (7 ranks) is a leaf: nothing to wait for, so nothing held or merged
    there; rank 2 above it merges its plain exit as it would a merged one."""
    leaf = ExecService(5, Topology("kary:2", 7), Lifecycle())
    request = start([5], ["l1", "p0", "c2"], 5)
    assert [a for a in leaf.handle(request, 0.0) if isinstance(a, Forward)] == []
    assert not leaf.merge.jobs
    own = request.respond({"rank": 5, "exit": 0, "seq": 0}, streaming=True)
    assert leaf.gather(own, 0.0) is None  # goes up as it came
    interior = ExecService(2, Topology("kary:2", 7), Lifecycle())
    above = start([2, 5, 6], ["l1", "p0"], 2)
    interior.handle(above, 0.0)
    for rank in (2, 6):
        interior.gather(above.respond({"rank": rank, "exit": 0, "seq": 0}, streaming=True), 0.0)
    plain = above.respond({"rank": 5, "exit": 0, "seq": 0}, streaming=True)
    [merged] = interior.gather(plain, 0.0) or []
    assert isinstance(merged, PassOn)
    assert merged.message.payload == {"exits": [{"ranks": "2,5-6", "exit": 0, "seq": 0}]}


def test_a_job_that_did_not_ask_for_merging_is_not_held() -> None:
    service = ExecService(1, Topology("kary:2", 7), Lifecycle())
    request = start([1, 3, 4], ["l1", "p0"], 1, merge=False)
    service.handle(request, 0.0)
    assert (
        service.gather(request.respond({"rank": 3, "exit": 0, "seq": 0}, streaming=True), 0) is None
    )


def test_the_client_s_broker_acknowledges_each_rank_of_a_merged_answer() -> None:
    service = ExecService(0, Topology("kary:2", 7), Lifecycle())
    request = start([0, 3, 4], ["l1"], 0)
    service.started_by("l1", request)
    merged = request.respond({"exits": encode([Exit(3, 0, 0), Exit(4, 2, 1)])[0]}, streaming=True)
    assert service.answered("l1", merged) == []
    assert [a for a in service.flush(0.0) if isinstance(a, Send)] == []  # rank 0 runs on
    # rank 4's exit came after a hole (its seq 2, none before): not acknowledged; but its job
    # ended, so a client that leaves now has only rank 0's killed, and rank 3 told it was taken
    [kill] = [s for s in service.client_gone("l1") if isinstance(s, Send)]
    assert kill.message.payload["targets"] == [0]
    assert kill.message.route == ["l1"]  # it names the client it speaks for (route.speaks_for)
    [taken] = [a for a in service.flush(0.0) if isinstance(a, Send)]
    assert taken.message.topic == "exec.taken" and sorted(taken.message.payload["targets"]) == [3]


# --- a model of a whole tree ------------------------------------------------------------------


@dataclass
class Target:
    """A rank's job: `lines` answers of output, then its exit, each kept until acknowledged."""

    lines: int
    status: int
    finished: bool = False
    acked: int = 0  # the client took every answer numbered below this

    def answers(self, rank: int) -> list[dict[str, Any]]:
        out = [{"rank": rank, "stream": "stdout", "seq": s} for s in range(self.lines)]
        return [*out, {"rank": rank, "exit": self.status, "seq": self.lines}]


@dataclass
class Tree:
    """Brokers of one topology, one job fanned out to every rank, the client at rank 0. What is
    in flight is a bag: any message may be delivered next."""

    topology: Topology
    old: set[int]  # brokers that do not merge
    targets: dict[int, Target]
    dead: set[int] = field(default_factory=set)
    merges: dict[int, ExitMerge] = field(default_factory=dict)
    flight: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (to broker, payload)
    inbox: dict[int, Inbox] = field(default_factory=dict)
    took: dict[int, list[int]] = field(default_factory=dict)  # rank -> seqs the client took
    now: float = 0.0

    def __post_init__(self) -> None:
        for rank in range(self.topology.size):
            if rank not in self.old:
                self.merges[rank] = ExitMerge()
                below = [r for r in self.targets if self._below(r, rank)]
                self.merges[rank].open((rank, ()), "j", below, rank, 0.0)

    def _below(self, rank: int, broker: int) -> bool:
        current: int | None = rank
        while current is not None:
            if current == broker:
                return True
            current = self.topology.parent(current)
        return False

    def up(self, broker: int) -> int | None:
        """Where broker's answers go: its nearest living ancestor (a heal), or the client."""
        current = self.topology.parent(broker)
        while current is not None and current in self.dead:
            current = self.topology.parent(current)
        return -1 if current is None else current

    def emit(self, rank: int) -> None:
        """Rank's broker sends what its job keeps (first, or again: a heal, a prompt)."""
        target = self.targets[rank]
        for said in target.answers(rank)[target.acked :]:
            self.arrive(rank, said)

    def arrive(self, broker: int, payload: dict[str, Any]) -> None:
        """An answer reaches `broker` on its way up (made there, or from below)."""
        merge = self.merges.get(broker)
        if merge is not None:
            exits = None
            if "exits" in payload:
                exits = decode(payload["exits"], self.topology.size)
            elif (one := exit_of(payload)) is not None:
                exits = [one]
            if exits is not None:
                flushes = merge.take((broker, ()), exits, self.now)
                if flushes is not None:
                    self.send_up(broker, flushes)
                    return
        up = self.up(broker)
        assert up is not None
        self.flight.append((up, payload))

    def send_up(self, broker: int, flushes: list[Flush]) -> None:
        for flush in flushes:
            for groups in encode(flush.exits):
                self.flight.append((self.up(broker) or 0, {"exits": groups}))

    def deliver(self, index: int) -> None:
        to, payload = self.flight.pop(index % len(self.flight))
        if to in self.dead:
            return  # lost with the broker
        if to != -1:
            self.arrive(to, payload)
            return
        for one in answers_of(payload, self.topology.size):  # the client, as cli/exec.py
            rank, seq = one["rank"], one["seq"]
            if self.inbox.setdefault(rank, Inbox()).take(seq) is Verdict.TAKE:
                self.took.setdefault(rank, []).append(seq)
                self.targets[rank].acked = seq + 1  # acknowledged (at once, in the model)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for broker, merge in self.merges.items():
            if broker not in self.dead:
                self.send_up(broker, merge.due(self.now))

    def kill(self, broker: int) -> None:
        """A broker dies with what it holds and what is on its way to it; every broker below it
        heals and sends again what it keeps (the lineage that reaches it, docs §12)."""
        self.dead.add(broker)
        self.flight = [(to, p) for to, p in self.flight if to != broker]
        for rank, target in self.targets.items():
            if rank not in self.dead and target.finished and self._below(rank, broker):
                self.emit(rank)


operations = st.lists(
    st.tuples(
        st.sampled_from(["finish", "deliver", "deliver", "deliver", "tick", "kill", "resend"]),
        st.integers(0, 1000),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(2, 14),
    k=st.integers(2, 3),
    old=st.sets(st.integers(0, 13), max_size=4),
    lines=st.lists(st.integers(0, 2), min_size=14, max_size=14),
    ops=operations,
)
def test_every_rank_s_answers_reach_the_client_exactly_once_whatever_happens(
    size: int, k: int, old: set[int], lines: list[int], ops: list[tuple[str, int]]
) -> None:
    topology = Topology(f"kary:{k}", size)
    targets = {r: Target(lines[r], r % 3) for r in range(size)}
    tree = Tree(topology, {r for r in old if r < size}, targets)
    for op, n in ops:
        rank = n % size
        if op == "finish" and rank not in tree.dead and not targets[rank].finished:
            targets[rank].finished = True
            tree.emit(rank)
        elif op == "deliver" and tree.flight:
            tree.deliver(n)
        elif op == "tick":
            tree.tick(HOLD_S * (n % 3) / 2)
        elif op == "kill" and rank != 0 and rank not in tree.dead:
            tree.kill(rank)
        elif op == "resend" and targets[rank].finished and rank not in tree.dead:
            tree.emit(rank)  # a prompt, or a heal only the client saw
    for rank, target in targets.items():  # the rest finish; then quiet, resends till done
        if rank not in tree.dead and not target.finished:
            target.finished = True
            tree.emit(rank)
    for _ in range(3):  # no resend yet: what no heal touched arrives as it is
        while tree.flight:
            tree.deliver(0)
        tree.tick(HOLD_S)
    if not tree.dead:  # nothing lost: every exit arrived (one alone: no order to keep)
        assert all(tree.took.get(r) == [0] for r, t in targets.items() if t.lines == 0)
    for _ in range(50):
        while tree.flight:
            tree.deliver(0)
        tree.tick(HOLD_S)
        if not tree.flight:
            for rank, target in targets.items():
                if rank not in tree.dead and target.acked <= target.lines:
                    tree.emit(rank)
        if not tree.flight:
            break
    for rank, target in targets.items():
        took = tree.took.get(rank, [])
        assert took == list(range(len(took)))  # in order, none twice
        if rank not in tree.dead:
            assert took == list(range(target.lines + 1))  # and all of it
