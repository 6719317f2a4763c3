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
from linkmodel import REATTACH, TIMEOUT, Clock, Net, Node, Wire, model_time

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


def test_a_superseded_broker_woken_under_its_foster_parent_is_refused() -> None:
    """Issue 20, item 1, in the model: rank 1 killed, rank 3 fostered by rank 0 and stopped past
    tbon.timeout (lost), rank 1 then rank 3 refilled; the old rank 3, woken, is refused (77) at
    its foster parent, and the new one is the one holder. (With Downward's revocation made a
    no-op, the one-holder oracle sees both.)"""
    net, stack = booted(7)
    with stack:
        net.kill(net.nodes[1])
        net.advance(1.0)
        old = net.nodes[3]
        old.running = False
        net.refill(1)
        net.advance(7.0)
        assert net.table.entry(3).state is RankState.LOST
        net.refill(3)
        net.advance(1.0)
        old.running = True
        net.advance(10.0)
        assert old.ended is not None and old.ended[0] == 77
        assert [(n.rank, n.incarnation) for n in net.holders(3)] == [(3, 2)]


def test_a_superseded_child_of_a_parent_that_returns_is_cut_off() -> None:
    """Found by the model. kary:2, 8 ranks. SIGSTOP rank 1, then its child rank 4. Rank 0
    declares rank 1 lost (silent), then rank 4 (adrift, "did not reattach in time"). A joiner
    is granted rank 4 (incarnation 2): rank 0 supersedes incarnation 1 with `flub.revoke` to
    rank 1, but rank 1 is lost, so rank 0's router fails the one-way order at once and it is
    never sent again. The joiner cannot get its parent's card (rank 1 is not online) and gives
    up; its lease runs out (vacant). SIGCONT both: rank 1 comes back as itself (same broker,
    online again), still holding the old rank 4 connected, heartbeats and all. So a broker of an
    incarnation rank 0 replaced serves rank 4 under a live parent for as long as both run, while
    `tbon status` shows rank 4 vacant (or reserved). The same happens without the joiner: rank 4
    shows lost while its old broker serves. Now a parent welcomed again says its census: rank 0
    refuses the old incarnation's Online and voids it there."""
    net, stack = booted(8)
    with stack:
        parent, child = net.nodes[1], net.nodes[4]
        parent.running = False
        net.advance(0.25)
        child.running = False
        net.advance(18.0)
        table = net.table
        assert (table.entry(1).state, table.entry(4).state) == (RankState.LOST, RankState.LOST)
        net.refill(4)
        net.settle()
        assert table.entry(4).incarnation == 2
        parent.running = child.running = True
        net.advance(SETTLED_AFTER + 30.0)  # the lease runs out too
        assert table.entry(1).state is RankState.ONLINE
        assert net.holders(4) == [], f"rank 4 is vacant in status, yet held: {net.holders(4)}"


def _wire(net: Net, child: int, parent: int) -> Wire:
    """The open link from the broker of `child` to that of `parent` (first brokers)."""
    return next(
        w
        for w in net.wires
        if w.open and w.child is net.nodes[child] and w.parent is net.nodes[parent]
    )


def test_a_leaf_killed_just_before_its_grandparent_reads_lost() -> None:
    """Found by the model. kary:2, 12 ranks. kill -9 rank 7 (a leaf, child of rank 3); rank 3
    sees the connection drop and reports rank 7 lost up its link to rank 1; kill -9 rank 1
    before it forwards that report. Rank 3 is fostered by rank 0, but a report is sent once,
    hop by hop, and nothing sent it again: rank 7 showed online with a dead pid for as long as
    the instance ran (rank 3 is attached and answers, so nothing ever times rank 7 out). Now rank
    3, welcomed by its foster parent, says its census: rank 7's Lost among it."""
    net, stack = booted(12)
    with stack:
        leaf = _wire(net, 7, 3)
        net.kill(net.nodes[7])
        net.deliver(leaf, True)  # rank 3 reads the close, and reports up to rank 1
        net.kill(net.nodes[1])
        net.advance(SETTLED_AFTER)
        assert net.table.entry(3).attached_to == 0
        assert net.table.entry(7).state is not RankState.ONLINE, "a dead rank shown online"


def test_the_children_of_a_rank_back_as_itself_stay_online() -> None:
    """Found by the model. kary:2, 12 ranks. The connection from rank 1 to rank 0 drops under
    both ends (a reset; both brokers live). Rank 0 reports rank 1 lost, and the table sets
    ranks 3 and 4, attached to it, adrift; rank 1 seeks, is welcomed back by rank 0 as the same
    broker, and is online again. But ranks 3 and 4 never left rank 1 and so never say hello
    anywhere: nothing attaches them again in the table. Rank 0 cannot route to them ("rank 4 is
    reattaching to the tree", so heal.home to them fails), and at the end of the reattach grace
    declares them lost ("did not reattach in time"), with their own children, while every one
    of those brokers runs on under rank 1. A refill of one of them then gives its rank to a
    second broker, and a revocation for it is sent to no one (its parent shows lost). Now rank 1,
    welcomed back, says its census: each child's Online attaches it again."""
    net, stack = booted(12)
    with stack:
        _wire(net, 1, 0).reset()
        net.advance(SETTLED_AFTER)
        table = net.table
        assert table.entry(1).state is RankState.ONLINE
        for rank in (3, 4, 7, 8, 9, 10):
            assert net.holders(rank), f"rank {rank}'s broker runs attached"
            assert table.entry(rank).state is RankState.ONLINE, f"rank {rank} shown lost"


def test_a_dead_subtree_reads_lost_one_grace_after_its_top() -> None:
    """Found by the model. kary:2, 11 ranks. Ranks 1 and 2's links to rank 0 are partitioned
    (silent), then every broker but rank 0 is killed, leaves first, so each loss is seen only
    by a broker that dies next. Rank 0 hears nothing: ranks 1 and 2 read lost after
    tbon.timeout, ranks 3-6 adrift until their grace ends, and ranks 7-10, adrift in turn, got
    a whole grace of their own: a dead subtree read online with no live holder for a grace per
    level. Now they keep the deadline of the rank they were attached to."""
    net, stack = booted(11)
    with stack:
        for top in (1, 2):
            _wire(net, top, 0).partitioned = True
        for rank in (7, 8, 9, 10, 3, 4, 5, 6, 1, 2):
            net.kill(net.nodes[rank])
            net.settle()
        net.advance(SETTLED_AFTER)
        shown = [e.rank for e in net.table.entries[1:] if e.state is RankState.ONLINE]
        assert shown == [], f"ranks shown online with no live broker: {shown}"


class LinkModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()
        self.net: Net | None = None
        self.disturbed = 0.0
        self.faults = True
        self.only_deaths = True  # no stop, partition or reset yet: nothing is ever cut off

    def teardown(self) -> None:
        self.stack.close()

    @property
    def n(self) -> Net:
        assert self.net is not None
        return self.net

    def _disturbed(self) -> None:
        self.disturbed = self.n.clock.now

    @initialize(size=st.integers(min_value=7, max_value=13), faults=st.booleans())
    def boot(self, size: int, faults: bool = True) -> None:
        """`faults`: whether brokers may be stopped and links cut in this run; without, only
        deaths and refills, after which no live broker may ever give up (no_broker_is_abandoned)."""
        self.net, stack = booted(size)
        self.stack.enter_context(stack)
        self.faults = faults
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

    def _families(self) -> list[tuple[Node, Node]]:
        """(broker, the broker it is linked up to), both alive, neither rank 0."""
        return [
            (w.child, w.parent)
            for w in self.n.wires
            if w.open and w.child.alive and w.parent.alive and w.parent.rank != 0
        ]

    @precondition(lambda self: self.net is not None and bool(self._families()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def kill_with_parent(self, pick: int) -> None:
        """A node and the one above it fail together (a rack, a switch): nobody above the
        parent sees the child go; only the brokers below the child do."""
        families = self._families()
        child, parent = families[pick % len(families)]
        self.n.kill(parent)
        self.n.kill(child)
        self._disturbed()

    def _moving(self) -> list[Node]:
        """Brokers with more than one open link up: going home, or welcomed twice."""
        ups: dict[int, int] = {}
        for wire in self.n.wires:
            if wire.open and wire.child.alive:
                ups[id(wire.child)] = ups.get(id(wire.child), 0) + 1
        return [node for node in self._alive() if ups.get(id(node), 0) > 1]

    @precondition(lambda self: self.net is not None and bool(self._moving()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def kill_while_moving(self, pick: int) -> None:
        """A broker dies between two parents, its old link still open (issue 20's race)."""
        moving = self._moving()
        self.n.kill(moving[pick % len(moving)])
        self._disturbed()

    def _homecomings(self) -> list[int]:
        """Ranks that can be refilled while a child of theirs lives under a foster parent."""
        return [
            rank
            for rank in self._refillable()
            if any(
                node.alive and node.rank in self.n.topology.children(rank)
                for node in self.n.nodes
            )
        ]

    @precondition(lambda self: self.net is not None and bool(self._homecomings()))
    @rule(
        pick=st.integers(min_value=0, max_value=1 << 16),
        order=st.integers(min_value=0, max_value=1 << 16),
        steps=st.integers(min_value=0, max_value=40),
    )
    def refill_then_kill_a_child_on_its_way_home(self, pick: int, order: int, steps: int) -> None:
        """A scenario too long for the random rules to find often (issue 20's race): a rank is
        refilled, its fostered children are sent home, and one of them dies between its two
        parents, after `steps` deliveries in an order drawn from `order`."""
        rank = self._homecomings()[pick % len(self._homecomings())]
        self.n.refill(rank)
        self._disturbed()
        children = set(self.n.topology.children(rank))
        for step in range(steps):
            moving = [node for node in self._moving() if node.rank in children]
            if moving:
                self.n.kill(moving[(order + step) % len(moving)])
                return
            ready = self.n.deliverable()
            if not ready:
                return
            wire, upward = ready[(order * 7919 + step) % len(ready)]
            self.n.deliver(wire, upward)

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

    def _running(self) -> list[Node]:
        return [node for node in self._alive() if node.running]

    @precondition(lambda self: self.net is not None and self.faults and bool(self._running()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def stop(self, pick: int) -> None:
        """SIGSTOP: the broker reads nothing and keeps no timer; time passes for the others."""
        running = self._running()
        running[pick % len(running)].running = False
        self.only_deaths = False
        self._disturbed()

    def _stopped(self) -> list[Node]:
        return [node for node in self._alive() if not node.running]

    @precondition(lambda self: self.net is not None and bool(self._stopped()))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def wake(self, pick: int) -> None:
        stopped = self._stopped()
        stopped[pick % len(stopped)].running = True
        self._disturbed()

    # --- single links -------------------------------------------------------------------------

    def _links(self, partitioned: bool) -> list[Wire]:
        return [w for w in self.n.wires if w.open and w.partitioned == partitioned]

    @precondition(lambda self: self.net is not None and self.faults and bool(self._links(False)))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16), reset=st.booleans())
    def cut_link(self, pick: int, reset: bool) -> None:
        """One link fails: it drops under both ends (`reset`), or it is partitioned: nothing
        gets through either way, and no end hears of it, until it heals."""
        links = self._links(False)
        wire = links[pick % len(links)]
        if reset:
            wire.reset()
        else:
            wire.partitioned = True
        self.only_deaths = False
        self._disturbed()

    @precondition(lambda self: self.net is not None and bool(self._links(True)))
    @rule(pick=st.integers(min_value=0, max_value=1 << 16))
    def heal_link(self, pick: int) -> None:
        links = self._links(True)
        links[pick % len(links)].partitioned = False
        self._disturbed()

    @rule()
    def calm(self) -> None:
        """Every broker woken, every link healed, and time enough for status to be true."""
        for node in self.n.nodes:
            node.running = True
        for wire in self.n.wires:
            wire.partitioned = False
        self._disturbed()
        self.n.advance(SETTLED_AFTER)

    # --- the oracle -----------------------------------------------------------------------------

    @invariant()
    def one_holder(self) -> None:
        if self.net is None or not self.net.quiet():
            return
        for rank in range(1, self.net.topology.size):
            holders = self.net.holders(rank)
            assert len(holders) <= 1, f"rank {rank} has two holders: {holders}"

    @invariant()
    def no_revoked_incarnation_is_welcomed(self) -> None:
        assert self.net is None or not self.net.bad_welcomes


class LinkModelTruth(LinkModel):
    """The oracle's other half: status tells the truth, and no revoked or superseded incarnation
    is held. The regression tests above are what it found: three before a reattached broker
    said its census (downward.py), and a dead subtree read online for a grace per level before
    the ranks below an adrift rank kept its deadline (ranktable.py, cut_below)."""

    @invariant()
    def no_revoked_incarnation_is_held(self) -> None:
        if self.net is None or not self.net.quiet():
            return
        table = self.net.table
        for rank in range(1, self.net.topology.size):
            for node in self.net.holders(rank):
                held = (rank, node.incarnation)
                assert held not in self.net.revoked, f"{node} holds revoked {held}"
                current = table.entry(rank).incarnation
                assert node.incarnation == current, f"{node} holds {held}: rank 0 has {current}"

    @invariant()
    def no_broker_is_abandoned(self) -> None:
        """With brokers only killed and refilled (rank 0 never dies here), a live broker always
        has a live ancestor that reaches rank 0 and was told to admit it: none gives up (75)."""
        if self.net is None or not self.only_deaths:
            return
        for node in self.net.nodes:
            if node.ended is not None and node.alive is False and node.ended[0] == 75:
                raise AssertionError(f"{node} gave up: {node.ended[1]}")

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


BOUNDED = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LinkModel.TestCase.settings = BOUNDED
LinkModelTruth.TestCase.settings = BOUNDED
TestLinkModel = LinkModel.TestCase
TestLinkModelTruth = LinkModelTruth.TestCase


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("ERROR")
