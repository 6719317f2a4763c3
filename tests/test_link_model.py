"""The link side of an instance as a hypothesis state machine (issue 20): several brokers, each
with its real uplink machine and child sessions, rank 0 with its real rank table and one path,
on a simulated network (tests/linkmodel.py, which says what it abstracts away). Brokers are
killed, stopped and woken, links cut and healed, lost ranks refilled by FLUB, while the clock
moves; after every step a simple oracle checks who may hold each rank:

1. One holder: once everything in flight is delivered, no rank is held by two live brokers,
   each attached by a link whose parent holds it connected on that link.
2. Status tells the truth: once the liveness timeouts have passed since the last disturbance, a
   rank rank 0 shows online is held (as in 1) by the very broker and incarnation it shows.
3. No revoked incarnation comes back: no parent welcomes an incarnation rank 0 revoked there,
   and once quiet, no holder is of an incarnation rank 0 revoked or has replaced.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from linkmodel import REATTACH, TIMEOUT, Clock, Net, Node, model_time

from tbon.overlay.state.ranktable import RankState

SETTLED_AFTER = 2 * TIMEOUT + REATTACH + 2.0
"""Model seconds after the last disturbance by which status must tell the truth: a stopped
broker's silence (tbon.timeout), then its children's search and rank 0's grace for them."""


def booted(size: int) -> tuple[Net, ExitStack]:
    clock = Clock()
    stack = ExitStack()
    stack.enter_context(model_time(clock))
    net = Net(size, clock)
    net.settle()
    return net, stack


def test_an_instance_boots_in_the_model() -> None:
    net, stack = booted(11)
    with stack:
        table = net.table
        assert [e.state for e in table.entries] == [RankState.ONLINE] * 11
        for rank in range(1, 11):
            assert [n.bid for n in net.holders(rank)] == [net.nodes[rank].bid]
        net.advance(20.0)  # heartbeats keep every link
        assert all(node.alive for node in net.nodes)
        assert [e.state for e in table.entries] == [RankState.ONLINE] * 11


def test_a_killed_interior_rank_is_healed_and_refilled() -> None:
    net, stack = booted(7)
    with stack:
        net.kill(net.nodes[1])
        net.advance(1.0)
        table = net.table
        assert table.entry(1).state is RankState.LOST
        for rank in (3, 4):  # fostered by rank 0
            assert table.entry(rank).state is RankState.ONLINE
            assert table.entry(rank).attached_to == 0
            assert [n.bid for n in net.holders(rank)] == [net.nodes[rank].bid]
        net.refill(1)
        net.advance(3.0)
        assert table.entry(1).state is RankState.ONLINE
        assert table.entry(1).incarnation == 2
        for rank in (3, 4):  # home again
            assert table.entry(rank).attached_to == 1
        assert [n.rank for n in net.holders(1)] == [1]


class LinkModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.net: Net | None = None
        self.disturbed = 0.0

    def teardown(self) -> None:
        self.stack.close()

    @property
    def n(self) -> Net:
        assert self.net is not None
        return self.net

    def _disturbed(self) -> None:
        self.disturbed = self.n.clock.now

    @initialize(size=st.integers(min_value=7, max_value=13))
    def boot(self, size: int) -> None:
        self.net, stack = booted(size)
        self.stack.enter_context(stack)
        self._disturbed()

    # --- the network and the clock ------------------------------------------------------------

    @precondition(lambda self: self.net is not None and bool(self.net.deliverable()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def deliver_one(self, pick: int) -> None:
        ready = self.n.deliverable()
        wire, upward = ready[pick % len(ready)]
        self.n.deliver(wire, upward)

    @rule()
    def settle(self) -> None:
        self.n.settle()

    @rule(seconds=st.sampled_from([0.25, 1.0, 3.0, 6.0, 12.0]))
    def advance(self, seconds: float) -> None:
        self.n.advance(seconds)

    # --- brokers --------------------------------------------------------------------------------

    def _alive(self) -> list[Node]:
        return [node for node in self.n.nodes if node.alive and node.rank != 0]

    @precondition(lambda self: self.net is not None and bool(self._alive()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def kill(self, pick: int) -> None:
        alive = self._alive()
        self.n.kill(alive[pick % len(alive)])
        self._disturbed()

    def _refillable(self) -> list[int]:
        table = self.n.table
        free = (RankState.LOST, RankState.VACANT)
        return [e.rank for e in table.entries if e.state in free and not self.n.joiners]

    @precondition(lambda self: self.net is not None and bool(self._refillable()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def refill(self, pick: int) -> None:
        free = self._refillable()
        self.n.refill(free[pick % len(free)])
        self._disturbed()

    # --- the oracle -----------------------------------------------------------------------------

    @invariant()
    def one_holder(self) -> None:
        if self.net is None or not self.net.quiet():
            return
        for rank in range(1, self.net.topology.size):
            holders = self.net.holders(rank)
            assert len(holders) <= 1, f"rank {rank} has two holders: {holders}"

    @invariant()
    def no_revoked_incarnation_comes_back(self) -> None:
        if self.net is None:
            return
        assert not self.net.bad_welcomes
        if not self.net.quiet():
            return
        table = self.net.table
        for rank in range(1, self.net.topology.size):
            for node in self.net.holders(rank):
                held = (rank, node.incarnation)
                assert held not in self.net.revoked, f"{node} holds revoked {held}"
                current = table.entry(rank).incarnation
                assert node.incarnation == current, f"{node} holds {held}: rank 0 has {current}"

    @invariant()
    def status_tells_the_truth(self) -> None:
        net = self.net
        if net is None or not net.quiet() or net.clock.now - self.disturbed < SETTLED_AFTER:
            return
        for entry in net.table.entries[1:]:
            if entry.state is not RankState.ONLINE:
                continue
            holders = [(n.bid, n.incarnation) for n in net.holders(entry.rank)]
            shown = (entry.pid, entry.incarnation)
            assert holders == [shown], f"rank {entry.rank} shown online as {shown}: {holders}"


LinkModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLinkModel = LinkModel.TestCase


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR")
