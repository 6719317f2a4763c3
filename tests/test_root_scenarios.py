"""Interleavings of the root group that a random walk rarely reaches, played out on the model of
tests/test_root_model.py with its invariants checked after every step (docs/protocol.md §13.7).
Each scenario asserts that it reached the shape it was written for (a root elected, a message
held and then released), so a change that dodges the shape fails too, rather than passing
without testing anything. Hypothesis draws the group's size and which ranks play which part.

- Late ack: a standby acknowledges an entry, dies, and is refilled; its successor holds less;
  the dead incarnation's acknowledgement arrives after the successor spoke. Counting it would
  commit an entry only the root holds, which a takeover then forgets.
- Figure 8 (Raft paper, fig. 8): a root of a later term learns that a majority holds an entry of
  an earlier term before it holds one of its own there; committing it by counting replicas lets
  a later root, whose log ends in a later term, overwrite it.
- Refilled voter: a standby that held a committed entry dies and is refilled empty; were the new
  incarnation a voter at once, it and a standby that never had the entry would elect a root
  without it once the old root stops. It may vote only once a root has seen it hold everything
  committed; until then there is no majority, and no takeover.
- Forgotten term: a standby votes for a new root (taking its term) and dies; its new incarnation
  knows no term and answers the former root, cut off from the new one. Its answers must renew
  no lease (two roots would acknowledge at once) and it must not be made a voter by a root
  that holds no lease (the former root lacks what the new one commits).
- Stale order: a root's orders to the tree are held in flight through a takeover and arrive
  after its successor's; a broker must refuse them (`TermFence`).
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st
from test_root_model import OBSERVERS, Order, Replica, RootGroup, Table, model_settings

from tbon.overlay.state.leadership import (
    AppendEntries,
    AppendReply,
    Leading,
    Member,
    Propose,
    Tick,
    VoteRequest,
)
from tbon.overlay.state.terms import StaleTerm

Traffic = tuple[int, int, object]
Keep = Callable[[int, int, object], bool]


def everything(sender: int, to: int, what: object) -> bool:
    return True


class Script(RootGroup):
    """The model with a hand on the network: what is delivered, dropped or kept back."""

    def check(self) -> None:
        self.committed_logs_agree()
        self.acknowledged_entries_stay()
        self.one_holder_per_rank()
        self.one_acknowledger()
        self.orders_obeyed_are_current()

    def exchange(self, among: set[int], keep: Keep = everything) -> None:
        """Deliver, until none is left, the messages between members of `among` that `keep`
        lets through; every other message between members is lost. Orders to tree brokers
        stay in the network."""
        for _ in range(200):
            members = [m for m in self.net if m[1] not in OBSERVERS]
            if not members:
                return
            self.net = [m for m in self.net if m[1] in OBSERVERS]
            for sender, to, what in members:
                if {sender, to} <= among and self.status[to] == "up" and keep(sender, to, what):
                    self.feed(to, what)
            self.check()
        raise AssertionError("the group never went quiet")

    def take(self, pick: Keep) -> list[Traffic]:
        taken = [m for m in self.net if pick(*m)]
        self.net = [m for m in self.net if not pick(*m)]
        return taken

    def pump(self, among: set[int], until: Callable[[], bool], keep: Keep = everything) -> None:
        """Let time pass in steps of 50 ms among `among` until `until()` holds."""
        deadline = self.now + 8.0
        while True:
            self.exchange(among, keep)
            if until():
                return
            assert self.now < deadline, f"the scenario lost its shape: {self.describe()}"
            self.now += 0.05
            for rank in sorted(among):
                if self.status[rank] == "up":
                    self.feed(rank, Tick())
            self.check()

    def pump_for(self, among: set[int], seconds: float) -> None:
        end = self.now + seconds
        self.pump(among, lambda: self.now >= end)

    def halt(self, rank: int, how: str = "stopped") -> None:
        self.status[rank] = how
        self.take(lambda s, t, m: rank in (s, t))

    def wake_up(self, rank: int) -> None:
        self.status[rank] = "up"

    def reincarnate(self, rank: int) -> None:
        """A new broker in a dead member's rank: a new incarnation that remembers nothing."""
        self.incarnation[rank] += 1
        self.members[rank] = Member(
            rank, self.ranks, self.now, self.timing, incarnation=self.incarnation[rank], fresh=True
        )
        self.replicas[rank] = Replica(Table({}, set()), 0, {})
        self.status[rank] = "up"

    def root_of(self, rank: int) -> Callable[[], bool]:
        return lambda: self.members[rank].is_root and self.members[rank].serves(self.now)


def campaigns_only(candidate: int) -> Keep:
    """Only `candidate` may canvass or ask for votes: the others' requests are lost."""
    return lambda s, t, m: not (isinstance(m, VoteRequest) and s != candidate)


def started(k: int, batch: int = 256) -> Script:
    group = Script()
    group.start(k, batch)
    group.now = 0.1
    group.feed(0, Tick())  # the first heartbeats: every standby answers, the lease starts
    group.exchange(set(group.ranks))
    assert group.members[0].serves(group.now)
    return group


@model_settings(12)
@given(k=st.sampled_from([2, 4]), data=st.data())
def test_late_ack_of_a_dead_incarnation(k: int, data: st.DataObject) -> None:
    g = started(k)
    root, peers = 0, list(g.ranks[1:])
    r = data.draw(st.sampled_from(peers), label="reincarnated")
    others = [p for p in peers if p != r]
    helpers = others[: k // 2 - 1]  # hold the second entry, one short of a majority with root
    every = set(g.ranks)

    g.feed(root, Propose(("grant", 1, 1)))
    first = g.take(lambda s, t, m: t == r)  # the append of entry 1 to r, kept for later
    g.exchange(every - {r})  # entry 1 committed without r
    g.feed(root, Propose(("grant", 2, 2)))
    second = g.take(lambda s, t, m: t == r)
    g.exchange({root, *helpers})  # entry 2: the root and its helpers hold it, not a majority
    g.take(lambda s, t, m: s == root)
    assert g.members[root].log.commit == 1

    for _, t, m in first + second:  # r holds both entries and says so
        g.feed(t, m)
    acks = g.take(lambda s, t, m: s == r and isinstance(m, AppendReply) and m.ok)
    assert acks and max(m.match for _, _, m in acks) == 2  # type: ignore[attr-defined]
    late = [a for a in acks if a[2].match == 2]  # type: ignore[attr-defined]

    g.halt(r, "dead")
    g.reincarnate(r)
    for _, t, m in first:  # it is sent entry 1 only, and says so to the root
        g.feed(t, m)
    g.exchange({root, r}, lambda s, t, m: s == r)
    g.take(lambda s, t, m: s == root)  # entry 2 never reaches it
    assert g.members[r].log.last == 1 and g.members[r].voter

    for _, t, m in late:  # the dead incarnation's ack arrives at last
        g.feed(t, m)
        g.check()
    for rank in (root, *helpers):  # the holders of entry 2 stop; a majority is left
        g.halt(rank)
    left = every - {root, *helpers}
    g.pump(left, lambda: any(g.root_of(p)() for p in left))


@model_settings(12)
@given(data=st.data())
def test_figure_8(data: st.DataObject) -> None:
    g = started(4, batch=1)
    s1 = 0
    s2, s3, s4, s5 = data.draw(st.permutations([1, 2, 3, 4]), label="S2..S5")
    p = ("grant", 1, 1)

    # (a) S1, root of term 1, gets its entry to S2 only.
    g.feed(s1, Propose(p))
    g.exchange({s1, s2})
    assert g.members[s2].log.last == 1 and g.members[s1].log.commit == 0

    # (b) S1 and S2 stop; S5 is elected by S3, S4 and itself, and its mark reaches no one.
    g.halt(s1)
    g.halt(s2)
    mark_kept = campaigns_only(s5)
    g.pump(
        {s3, s4, s5},
        lambda: g.members[s5].is_root,
        lambda s, t, m: mark_kept(s, t, m) and not isinstance(m, AppendEntries),
    )
    assert g.members[s5].log.last == 1 and g.members[s3].log.last == 0

    # (c) S5 stops; S1 and S2 wake; S1 is elected by S1, S2, S3 and catches S3 up with its
    # term-1 entry, one entry per append, but not with its own mark.
    g.halt(s5)
    g.wake_up(s1)
    g.wake_up(s2)
    first_only = campaigns_only(s1)

    def old_entries_to_s3(s: int, t: int, m: object) -> bool:
        if isinstance(m, AppendEntries) and t == s3:
            return all(e.term == 1 for e in m.entries)
        return first_only(s, t, m)

    def s3_holds_it() -> bool:
        role = g.members[s1].role
        return isinstance(role, Leading) and role.match.get(s3, 0) >= 1

    g.pump({s1, s2, s3}, s3_holds_it, old_entries_to_s3)
    assert g.members[s3].log.at(1).term == 1

    # (d) S1 stops; S5 wakes and is elected by S3, S4 and itself: its log ends in term 2, theirs
    # earlier. It overwrites entry 1 wherever it replicates.
    g.halt(s1)
    g.wake_up(s5)
    g.pump({s2, s3, s4, s5}, g.root_of(s5), campaigns_only(s5))
    assert g.members[s3].log.at(1).term != 1


@model_settings(12)
@given(data=st.data())
def test_a_refilled_member_votes_only_once_it_holds_what_was_committed(
    data: st.DataObject,
) -> None:
    g = started(2)
    holder, other = data.draw(st.permutations([1, 2]), label="holder, other")
    g.feed(0, Propose(("grant", 1, 1)))
    g.exchange({0, holder})  # committed by the root and `holder`; `other` never has it
    assert g.members[0].log.commit == 1 and g.members[other].log.last == 0
    g.halt(holder, "dead")
    g.reincarnate(holder)
    g.halt(0)
    g.pump_for({holder, other}, 3.0)  # one voter of three: no takeover
    assert not any(g.members[r].is_root for r in (holder, other))
    g.wake_up(0)
    g.pump(set(g.ranks), lambda: g.root_of(0)() and g.members[holder].voter)
    assert g.replicas[holder].table.holders == {1: 1}  # by the log, or by a snapshot


@model_settings(12)
@given(data=st.data())
def test_a_refilled_member_renews_no_lease_of_a_former_root(data: st.DataObject) -> None:
    g = started(2)
    old = 0
    new, voter = data.draw(st.permutations([1, 2]), label="new root, its voter")
    g.pump(
        {new, voter},
        lambda: g.members[new].is_root,
        lambda s, t, m: campaigns_only(new)(s, t, m) and not isinstance(m, AppendEntries),
    )
    assert g.members[old].is_root and g.members[new].may_acknowledge(g.now)
    g.halt(voter, "dead")
    g.reincarnate(voter)
    g.pump_for({old, voter}, 0.6)  # the former root, by its own account, meets the new one
    assert not g.members[voter].voter
    g.pump(set(g.ranks), lambda: g.root_of(new)() and g.members[voter].voter)
    assert g.members[voter].voted_for == new and not g.members[old].is_root


@model_settings(12)
@given(k=st.sampled_from([2, 4]), data=st.data())
def test_orders_of_a_former_root(k: int, data: st.DataObject) -> None:
    g = started(k)
    every = set(g.ranks)
    g.feed(0, Propose(("grant", 1, 1)))
    g.exchange(every)
    old = g.take(lambda s, t, m: isinstance(m, Order))
    assert old and all(m.term == 1 for _, _, m in old)  # type: ignore[attr-defined]

    g.halt(0)  # a partition of the root; its orders are still on their way
    g.pump(every - {0}, lambda: any(g.root_of(r)() for r in every - {0}))
    successor = next(r for r in every - {0} if g.members[r].is_root)
    g.feed(successor, Propose(("grant", 2, 2)))
    g.exchange(every - {0})
    new = [i for i, m in enumerate(g.net) if isinstance(m[2], Order)]
    assert new
    for _ in new:
        position = next(i for i, m in enumerate(g.net) if isinstance(m[2], Order))
        g.deliver_one(position)
    g.check()
    if data.draw(st.booleans(), label="old root wakes"):
        g.wake_up(0)
        g.pump(every, lambda: not g.members[0].is_root)
    for sender, to, what in old:
        g.net.append((sender, to, what))
        g.deliver_one(len(g.net) - 1)
        g.check()
    assert any(isinstance(m[2], StaleTerm) and m[0] in OBSERVERS for m in g.net)  # refused
