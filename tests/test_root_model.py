"""The root group of issue 23 as a hypothesis state machine (docs/protocol.md §13): a root and
K standbys (K from 0 to 4), each an `overlay.state.leadership.Member`, over a network written
here that loses, repeats, delays and reorders messages, cuts links and heals them; members are
killed, stopped and woken later with their old state and term, and refilled as new
incarnations that remember nothing; the clock jumps. Clients ask whoever believes it is root to
grant, release and retire ranks, and a grant counts as given only when that member's machine
acknowledges it. Two tree brokers obey the orders that follow each acknowledgement, behind a
`TermFence`.

The oracle is a table far simpler than the rank table: a rank is held by one joiner, released
by it, or retired for good. It is applied to the one committed log, and every acknowledgement
must agree with it. Invariants, after every step: committed logs are prefixes of one another;
every acknowledged entry is that committed log's, and every root of a later term holds it; no
rank is acknowledged to a second joiner unless the committed log released it from the first in
between, and none after its retirement; at most one member may acknowledge at any moment; a
broker obeys no order of a term older than one it has seen, and every order it obeys is the
committed log's. And a liveness check: once the network heals, with a majority of voters
running, some member serves as root within a bounded time.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tbon.overlay.state.leadership import (
    Acknowledge,
    AppendReply,
    Apply,
    Member,
    Message,
    Propose,
    Restore,
    Send,
    Tick,
    Timing,
    VoteReply,
)
from tbon.overlay.state.replicalog import Entry
from tbon.overlay.state.terms import StaleTerm, TermFence

Payload = tuple[Any, ...]  # ("grant", rank, joiner), ("release", rank, joiner), ("retire", rank)
OBSERVERS = (100, 101)  # two tree brokers that obey the root's orders
LIVENESS_BOUND = 4.0  # seconds of simulated time for a new root to serve
HELD_BOUND = 2  # entries a member holds once all are up, connected and quiet (§13.2)


@dataclass
class Table:
    """The oracle: who holds each rank, and which are retired."""

    holders: dict[int, int]
    retired: set[int]

    def apply(self, payload: Payload) -> str:
        kind, rank = payload[0], payload[1]
        if kind == "grant":
            joiner = payload[2]
            if rank in self.retired or self.holders.get(rank, joiner) != joiner:
                return "refused"
            self.holders[rank] = joiner
            return "granted"
        if kind == "release":
            if self.holders.get(rank) != payload[2]:
                return "refused"
            del self.holders[rank]
            return "released"
        self.retired.add(rank)
        self.holders.pop(rank, None)
        return "retired"

    def copy(self) -> Table:
        return Table(dict(self.holders), set(self.retired))


def outcomes(payloads: list[tuple[int, Payload]]) -> dict[int, str]:
    table = Table({}, set())
    return {index: table.apply(payload) for index, payload in payloads}


@dataclass
class Replica:
    """A member's copy of the table, fed by its Apply instructions."""

    table: Table
    applied: int
    outcome: dict[int, str]


@dataclass
class Order:
    """What a root sends the tree after an acknowledgement (flub.authorize and the like)."""

    sender: int
    term: int
    index: int
    payload: Payload


payloads = st.one_of(
    st.tuples(st.just("grant"), st.integers(1, 4), st.integers(0, 4)),
    st.tuples(st.just("release"), st.integers(1, 4), st.integers(0, 4)),
    st.tuples(st.just("retire"), st.integers(1, 4)),
)


class RootGroup(RuleBasedStateMachine):
    @initialize(
        k=st.integers(0, 4), batch=st.sampled_from([1, 2, 256]), keep=st.sampled_from([0, 3, 1024])
    )
    def start(self, k: int, batch: int = 256, keep: int = 1024) -> None:
        """`batch` small: a root catches a member up one entry at a time, so it can learn that a
        majority holds an entry of an earlier term before any entry of its own (figure 8).
        `keep` small: a member that lags or is refilled is sent a snapshot of the table."""
        self.now = 0.0
        self.ranks = tuple(range(k + 1))
        self.timing = Timing(batch=batch, keep=keep)
        self.replicas = {r: Replica(Table({}, set()), 0, {}) for r in self.ranks}
        self.members: dict[int, Member[Payload]] = {r: self.member(r) for r in self.ranks}
        self.status = dict.fromkeys(self.ranks, "up")  # up, stopped or dead
        self.incarnation = dict.fromkeys(self.ranks, 1)
        self.net: list[tuple[int, int, Message | Order | StaleTerm]] = []  # (from, to, what)
        self.held: list[tuple[int, int, Message | Order | StaleTerm]] = []  # kept back for long
        self.cut: set[frozenset[int]] = set()
        self.acks: list[tuple[int, Entry[Payload], str]] = []  # (index, entry, outcome)
        self.fences = {o: TermFence() for o in OBSERVERS}
        self.obeyed: dict[int, list[Order]] = {o: [] for o in OBSERVERS}
        self.heard = dict.fromkeys(OBSERVERS, 0)  # the highest term each broker was sent
        self.late: list[tuple[int, Order]] = []  # (observer, order) obeyed below a term heard
        self.committed: list[Entry[Payload]] = []  # the longest committed prefix seen

    def member(self, rank: int, incarnation: int = 1) -> Member[Payload]:
        """A member whose snapshots are its replica's table (copied: a snapshot is a value)."""
        return Member(
            rank,
            self.ranks,
            self.now,
            self.timing,
            incarnation=incarnation,
            fresh=incarnation > 1,
            snapshot=lambda: (self.replicas[rank].applied, self.replicas[rank].table.copy()),
        )

    # --- carrying instructions out ------------------------------------------------------------

    def feed(self, rank: int, stimulus: Any) -> None:
        member = self.members[rank]
        for instruction in member.handle(stimulus, self.now):
            if isinstance(instruction, Send):
                self.net.append((rank, instruction.to, instruction.message))
            elif isinstance(instruction, Apply):
                replica = self.replicas[rank]
                assert instruction.index > replica.applied, "applied twice or out of order"
                replica.applied = instruction.index
                replica.outcome[instruction.index] = replica.table.apply(instruction.payload)
            elif isinstance(instruction, Restore):
                applied, table = instruction.state  # its last payload, before any mark
                assert applied <= instruction.index, "a snapshot of a later index"
                self.replicas[rank] = Replica(table.copy(), instruction.index, {})
            elif isinstance(instruction, Acknowledge):
                index = instruction.index
                assert index in self.replicas[rank].outcome, f"acknowledged {index} unapplied"
                outcome = self.replicas[rank].outcome[index]
                entry = Entry(member.term, instruction.payload)  # proposed in its term
                self.acks.append((index, entry, outcome))
                for o in OBSERVERS:
                    self.net.append((rank, o, Order(rank, member.term, index, instruction.payload)))
        self.note_committed(member)

    def note_committed(self, member: Member[Payload]) -> None:
        """The committed entries a member holds (it may have discarded the first ones) agree
        with the longest committed log seen, and may extend it."""
        log = member.log
        held = list(log.between(log.base + 1, log.commit))
        assert log.base <= len(self.committed), "entries discarded that were never committed"
        seen = self.committed[log.base : log.commit]
        n = min(len(seen), len(held))
        assert seen[:n] == held[:n], "two committed logs disagree"
        if log.commit > len(self.committed):
            self.committed += held[n:]

    def deliver_one(self, position: int) -> None:
        sender, to, what = self.net[position]
        if to in self.fences:
            del self.net[position]
            if frozenset((sender, to)) in self.cut:
                return
            assert isinstance(what, Order)
            if self.fences[to].admit(what.term):
                self.obeyed[to].append(what)
                if what.term < self.heard[to]:
                    self.late.append((to, what))
            else:
                self.net.append((to, sender, StaleTerm(self.fences[to].term)))
            self.heard[to] = max(self.heard[to], what.term)
            return
        if self.status[to] == "stopped":
            return  # it waits in the socket until the broker wakes
        del self.net[position]
        if self.status[to] == "dead" or frozenset((sender, to)) in self.cut:
            return
        self.feed(to, what)

    # --- rules --------------------------------------------------------------------------------

    @rule(dt=st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.45, 0.7, 1.5]))
    def tick(self, dt: float) -> None:
        self.now += dt
        for rank in self.ranks:
            if self.status[rank] == "up":
                self.feed(rank, Tick())

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        self.deliver_one(data.draw(st.integers(0, len(self.net) - 1)))

    @precondition(lambda self: self.net)
    @rule()
    def deliver_all(self) -> None:
        for _ in range(len(self.net)):
            waiting = [i for i, m in enumerate(self.net) if self.status.get(m[1]) != "stopped"]
            if not waiting:
                return
            self.deliver_one(waiting[0])

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        del self.net[data.draw(st.integers(0, len(self.net) - 1))]

    @precondition(lambda self: self.net)
    @rule(data=st.data())
    def repeat(self, data: st.DataObject) -> None:
        self.net.append(self.net[data.draw(st.integers(0, len(self.net) - 1))])

    @precondition(lambda self: self.net)
    @rule(data=st.data(), kind=st.sampled_from(["reply", "order", "any"]))
    def hold(self, data: st.DataObject, kind: str) -> None:
        """Keep one message back for many steps: an ack from an incarnation that dies meanwhile,
        an order of a root that is superseded meanwhile."""
        wanted = {"reply": AppendReply | VoteReply, "order": Order, "any": object}[kind]
        found = [i for i, (_, _, what) in enumerate(self.net) if isinstance(what, wanted)]
        if found:
            self.held.append(self.net.pop(data.draw(st.sampled_from(found))))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.net.append(self.held.pop(data.draw(st.integers(0, len(self.held) - 1))))
        self.deliver_one(len(self.net) - 1)

    @rule(data=st.data(), payload=payloads)
    def ask_root(self, data: st.DataObject, payload: Payload) -> None:
        roots = [r for r in self.ranks if self.status[r] == "up" and self.members[r].is_root]
        if roots:
            self.feed(data.draw(st.sampled_from(roots)), Propose(payload))

    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        up = [r for r in self.ranks if self.status[r] == "up"]
        if up:
            self.status[data.draw(st.sampled_from(up))] = "stopped"

    @rule(data=st.data())
    def wake(self, data: st.DataObject) -> None:
        stopped = [r for r in self.ranks if self.status[r] == "stopped"]
        if stopped:
            self.status[data.draw(st.sampled_from(stopped))] = "up"

    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        alive = [r for r in self.ranks if self.status[r] != "dead"]
        if alive:
            self.status[data.draw(st.sampled_from(alive))] = "dead"

    @rule(data=st.data())
    def refill(self, data: st.DataObject) -> None:
        """A new broker takes a dead member's rank: a new incarnation that knows nothing."""
        dead = [r for r in self.ranks if self.status[r] == "dead"]
        if not dead:
            return
        rank = data.draw(st.sampled_from(dead))
        self.incarnation[rank] += 1
        self.replicas[rank] = Replica(Table({}, set()), 0, {})
        self.members[rank] = self.member(rank, self.incarnation[rank])
        self.status[rank] = "up"

    @rule(a=st.integers(0, 4), b=st.integers(0, 101))
    def partition(self, a: int, b: int) -> None:
        if a in self.ranks and (b in self.ranks or b in OBSERVERS) and a != b:
            self.cut.add(frozenset((a, b)))

    @rule()
    def heal(self) -> None:
        self.cut.clear()

    @rule(rounds=st.integers(1, 20), dt=st.sampled_from([0.02, 0.05, 0.1]))
    def run(self, rounds: int, dt: float) -> None:
        """Time passes with the network working (but for its cuts): what a partition does."""
        for _ in range(rounds):
            self.deliver_all()
            self.tick(dt)
            self.one_acknowledger()
            self.committed_logs_agree()

    @rule()
    def liveness(self) -> None:
        """Heal the network; with a majority of voters running, a root serves in bounded time."""
        self.cut.clear()
        voters = [r for r in self.ranks if self.status[r] == "up" and self.members[r].voter]
        if len(voters) < len(self.ranks) // 2 + 1:
            return
        deadline = self.now + LIVENESS_BOUND
        up = [r for r in self.ranks if self.status[r] == "up"]  # a member made voter meanwhile too
        while not any(self.members[r].serves(self.now) for r in up):
            assert self.now < deadline, f"no root within {LIVENESS_BOUND}s: {self.describe()}"
            self.deliver_all()
            self.tick(0.05)
        if all(self.status[r] == "up" for r in self.ranks) and not self.held:
            self.memory_is_bounded()

    def memory_is_bounded(self) -> None:
        """All up and connected: after a few heartbeats every member holds what the others have
        not all acknowledged, and no more (a refilled one by a snapshot: the root has discarded
        what it lacks)."""
        for _ in range(8):
            self.deliver_all()
            self.tick(0.1)
        self.deliver_all()
        for rank, m in self.members.items():
            held = m.log.last - m.log.base
            assert held <= HELD_BOUND, f"member {rank} holds {held} entries: {self.describe()}"

    def describe(self) -> str:
        return ", ".join(
            f"{r}:{self.status[r]} term {m.term} {type(m.role).__name__} voter={m.voter}"
            f" log={m.log.base}..{m.log.last} commit={m.log.commit}"
            for r, m in self.members.items()
        )

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def committed_logs_agree(self) -> None:
        for rank in self.ranks:
            if self.status[rank] != "dead":
                self.note_committed(self.members[rank])

    @invariant()
    def acknowledged_entries_stay(self) -> None:
        truth = outcomes(
            [(i, e.payload) for i, e in enumerate(self.committed, 1) if e.payload is not None]
        )
        for index, entry, outcome in self.acks:
            assert index <= len(self.committed), f"acknowledged {index} is not committed"
            assert self.committed[index - 1] == entry, f"acknowledged {index} was lost"
            assert truth[index] == outcome, f"acknowledged {index}: {outcome}, not {truth[index]}"
            for rank in self.ranks:
                m = self.members[rank]
                if self.status[rank] != "dead" and m.is_root and m.term > entry.term:
                    if index <= m.log.base:
                        assert index <= m.log.commit  # its table holds it (tables_agree)
                        continue
                    held = m.log.at(index) if index <= m.log.last else None
                    assert held == entry, f"root {rank} of term {m.term} lacks {index}"

    @invariant()
    def tables_agree(self) -> None:
        """Every copy of the table, by applies or by a snapshot, is the committed log's as of
        the index its member has applied."""
        truth, at = Table({}, set()), 0
        alive = [r for r in self.ranks if self.status[r] != "dead"]
        for rank in sorted(alive, key=lambda r: self.members[r].applied):
            replica = self.replicas[rank]
            while at < self.members[rank].applied:
                at += 1
                payload = self.committed[at - 1].payload
                if payload is not None:
                    truth.apply(payload)
            assert replica.table == truth, f"member {rank}'s table is not the log's at {at}"

    @invariant()
    def one_holder_per_rank(self) -> None:
        committed = {i: e.payload for i, e in enumerate(self.committed, 1)}
        given = sorted((i, e.payload) for i, e, o in self.acks if o == "granted")
        for n, (index, payload) in enumerate(given):
            assert payload is not None
            _, rank, joiner = payload
            retired = [i for i, p in committed.items() if p == ("retire", rank) and i < index]
            assert not retired, f"rank {rank} granted at {index} after its retirement"
            for earlier, before in given[:n]:
                assert before is not None
                if before[1] == rank and before[2] != joiner:
                    released = ("release", rank, before[2])
                    between = [p for i, p in committed.items() if earlier < i < index]
                    assert released in between, f"rank {rank} granted to {before[2]} and {joiner}"

    @invariant()
    def one_acknowledger(self) -> None:
        able = [
            r
            for r in self.ranks
            if self.status[r] != "dead" and self.members[r].may_acknowledge(self.now)
        ]
        assert len(able) <= 1, f"members {able} may all acknowledge at {self.now}"

    @invariant()
    def orders_obeyed_are_current(self) -> None:
        for orders in self.obeyed.values():
            for before, after in itertools.pairwise(orders):
                assert after.term >= before.term, "a stale root's order was obeyed"
            for order in orders:
                entry = self.committed[order.index - 1]
                assert entry == Entry(order.term, order.payload), f"{order}: not the log's"
        assert not self.late, f"obeyed an order of a term older than one heard: {self.late}"


def model_settings(examples: int) -> settings:
    """CI runs `examples` (a few seconds of CPU on a shared machine); a soak asks for more
    without editing the file: TBON_MODEL_EXAMPLES=5000 TBON_MODEL_STEPS=120 pytest ..."""
    return settings(
        max_examples=int(os.environ.get("TBON_MODEL_EXAMPLES", examples)),
        stateful_step_count=int(os.environ.get("TBON_MODEL_STEPS", 60)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


TestRootGroup = RootGroup.TestCase
TestRootGroup.settings = model_settings(200)
