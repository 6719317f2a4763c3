"""The one path by which an event reaches rank 0's rank table, and everything it calls for.

The rule: nothing but `RankPath.handle` calls `RankTable.apply` (tests/test_one_path.py holds
every module under overlay/ to it). A service that wants an event applied (FLUB's Reserve,
Release, Expire and Reboot, retire's Retire) returns an `Apply` action, with a continuation if it
needs the table's answer; what a link saw (an Online, a Lost) reaches it as a report
(`Broker.report`). The performer hands each to `handle` and carries out what comes back, then
the continuation. So a new way of changing the table cannot forget a follow-up: they are all
here, in this order:

1. The table decides the event. A refused one is said in the log (but a Reserve: FLUB answers
   its joiner why).
2. An Online refused is voided: another broker's hello reported all the same, or an incarnation
   rank 0 has ended. Every parent that may still admit that incarnation drops its key and cuts
   its broker off (`flub.revoke`): its topology parent, each parent rank 0 told to admit it
   (admissions.py), the broker that reported it, and the one it is attached to. If the table
   still shows it connected, it ends there too (Void, through this same list from step 3 on).
3. An incarnation ended for good is revoked the same way: a reservation released or expired
   before its hello (voided), or one replaced by a newer incarnation (Reserve, Reboot: the one
   before is "superseded"), so that its broker, back from a partition, is refused (77).
4. Healing (docs/protocol.md §12, rules in state/healing.py): a rank that ended (Lost, Departed,
   Void, or a Dropped that a child's word made lost) has the brokers cut off below it fostered
   by the nearest live rank on each chain of links it had before (`heal.foster`);
   a rank online again has its children away from home, and itself if it came online under a
   foster parent, sent home (`heal.adopt`, then `heal.home`).
5. Every open foster admission that is moot now is withdrawn (`heal.withdraw`).
6. If the table gave a deadline (a new lease, a rank adrift: `RankTable.deadlines` counts them),
   the loop's deadlines are recomputed at once (`Wake`); any other change leaves them as they
   were, or puts one off, which the loop sees when its timers next run: a wire-up's Onlines wake
   nothing. Status streams, retire waiters and the initial program follow the table's
   `generation`, which the table counts, after every turn of the loop.

A report's events come in one `ApplyAll` and go through `handle_all`: one pass over them, each
event through the steps above before the next, one Wake for the lot. Then the performer runs
the asking service's continuation with the table's Outcome. Rank 0 alone
has a path; any other broker sends its events up (`Report`), and an Apply there is a bug
(CannotPerform). Pure: events in, actions out; the orders travel through the router.
"""

from __future__ import annotations

from collections.abc import Sequence

from tbon.overlay.services.actions import Action, Call, Send, Wake, info, warning
from tbon.overlay.services.heal import in_orders
from tbon.overlay.state.admissions import Admissions
from tbon.overlay.state.healing import (
    Fate,
    admission_fate,
    away_from_home,
    cut_off_below,
    foster_parents,
    goes_home,
    may_admit,
)
from tbon.overlay.state.rankstates import CONNECTED
from tbon.overlay.state.ranktable import (
    Departed,
    Dropped,
    Event,
    Expire,
    Lost,
    Online,
    Outcome,
    RankTable,
    Reboot,
    Release,
    Reserve,
    Void,
)
from tbon.overlay.wire.message import Kind, Message
from tbon.record import Record

Chains = list[list[int]]
"""A rank's chains of links to rank 0, nearest first (RankTable.links_above)."""

RELEASED = "the joiner released its reservation"
EXPIRED = "the reservation expired"


class Applied(Record):
    """What an event did to the table, and every follow-up it calls for, in order."""

    __slots__ = __match_args__ = ("outcome", "actions")

    def __init__(self, outcome: Outcome, actions: list[Action]) -> None:
        self.outcome, self.actions = outcome, actions


class AppliedAll(Record):
    """What a report's events did, one outcome each, and every follow-up, in order."""

    __slots__ = __match_args__ = ("outcomes", "actions")

    def __init__(self, outcomes: list[Outcome], actions: list[Action]) -> None:
        self.outcomes, self.actions = outcomes, actions


class RankPath:
    """Rank 0's one way into its table (rules at the top of this module)."""

    def __init__(self, table: RankTable) -> None:
        self.table = table
        self.topology = table.topology
        self.admissions = Admissions(table.topology)  # who was told to admit whom

    def handle(self, event: Event | Reserve, now: float) -> Applied:
        deadlines = self.table.deadlines
        chains = self._chains_before(event)
        outcome = self.table.apply(event, now)
        actions = self._follow_ups(event, outcome, now, chains)
        if self.table.deadlines != deadlines:
            actions.append(Wake())
        return Applied(outcome, actions)

    def handle_all(self, events: Sequence[Event], now: float) -> AppliedAll:
        """A report's events in one pass, in their order: each is decided, and its follow-ups
        taken, before the next (so the outcomes and actions are those of `handle` one by one);
        the loop is woken once for the lot if the table gave a deadline, and status streams
        push once for it (they follow the table's generation after each turn of the loop).

        A run of Onlines whose one follow-up is `Admissions.told` (`_quiet`: most of a wire-up)
        goes to the table in one `apply_all`, which stops at a refusal; their follow-ups are
        then taken in their order, and the refusal's (a void) before anything after it
        (tests/test_rankpath_batch.py holds it to `handle` one by one)."""
        deadlines = self.table.deadlines
        outcomes: list[Outcome] = []
        actions: list[Action] = []
        at, count = 0, len(events)
        while at < count:
            end = at
            while end < count and self._quiet(events[end]):
                end += 1
            if end > at:
                run = events[at:end]
                done = self.table.apply_all(run, now)
                told = self.admissions.told_at_home
                for event, outcome in zip(run, done, strict=False):
                    if outcome.applied:  # quiet: an Online welcomed at home (`_told`)
                        told(event.rank, event.incarnation)
                    else:
                        actions += self._follow_ups(event, outcome, now, [])
                outcomes += done
                at += len(done)
                continue
            event = events[at]
            chains = self._chains_before(event)
            outcome = self.table.apply(event, now)
            actions += self._follow_ups(event, outcome, now, chains)
            outcomes.append(outcome)
            at += 1
        if self.table.deadlines != deadlines:
            actions.append(Wake())
        return AppliedAll(outcomes, actions)

    def _quiet(self, event: Event) -> bool:
        """Whether, applied, `event` calls for nothing but `Admissions.told`, whatever the events
        around it do: an Online at home (no foster parent to send it home from) of a rank with no
        children in the tree (none to call home), while no foster admission is open (none to
        withdraw). An Online refused is voided all the same."""
        return (
            type(event) is Online
            and 0 < event.rank < self.topology.size
            and (event.parent is None or event.parent == self.topology.parent(event.rank))
            and not self.topology.children(event.rank)
            and not self.admissions.any_open()
        )

    def _follow_ups(
        self, event: Event | Reserve, outcome: Outcome, now: float, chains: Chains
    ) -> list[Action]:
        if not outcome.applied:
            if isinstance(event, Reserve):
                return []  # FLUB tells its joiner why
            said: list[Action] = [info(f"ignored {event}: {outcome.reason}")]
            if isinstance(event, Online):
                return said + self._void(
                    event.rank, event.incarnation, outcome.reason, now, event.parent
                )
            return said
        return self._ended_for_good(event, outcome, now) + self._heal(event, now, chains)

    # --- steps 2 and 3: incarnations ended for good ----------------------------------------

    def _ended_for_good(self, event: Event | Reserve, outcome: Outcome, now: float) -> list[Action]:
        if isinstance(event, Release | Expire):
            why = RELEASED if isinstance(event, Release) else EXPIRED
            return self._void(event.rank, event.incarnation, why, now)
        if isinstance(event, Reserve):
            grant = outcome.reservation
            if grant is None or not grant.granted or grant.repeated:
                return []
            return self._supersede(grant.rank, grant.incarnation - 1)
        if isinstance(event, Reboot) and outcome.changed:  # it raised the incarnation
            return self._supersede(event.rank, self.table.entry(event.rank).incarnation - 1)
        return []

    def _void(
        self, rank: int, incarnation: int, reason: str, now: float, at: int | None = None
    ) -> list[Action]:
        """Have every parent that may still admit (rank, incarnation) drop its key and cut its
        broker off (one-way): those rank 0 told, `at` (the broker that reported it welcomed),
        and the one it is attached to. The parents report nothing of it, so an incarnation the
        table still shows connected ends there too (Void): status never shows a broker that its
        parent has cut off."""
        if self.table.parent_of(rank) is None and self.topology.parent(rank) is None:
            return []  # rank 0 as the root: no parent admits it
        also = {at} if at is not None else set()
        attached = self.table.entry(rank).attached_to
        if attached is not None:
            also.add(attached)
        actions: list[Action] = []
        voided = Void(rank, incarnation, reason)
        chains = self._chains_before(voided)
        if self.table.apply(voided, now).applied:  # else nothing of it is connected
            said = f"FLUB: rank {rank} incarnation {incarnation} voided: {reason}"
            actions += [warning(said), *self._heal(voided, now, chains)]
        return actions + self._revoke(rank, incarnation, reason, also)

    def _supersede(self, rank: int, incarnation: int) -> list[Action]:
        """`rank` has a new incarnation: the one before it (if there was one) is revoked
        wherever it may still be admitted (issue 20)."""
        if incarnation < 1:
            return []
        why = f"superseded: rank {rank} is now incarnation {incarnation + 1}"
        return self._revoke(rank, incarnation, why)

    def _revoke(
        self, rank: int, incarnation: int, reason: str, also: set[int] | None = None
    ) -> list[Action]:
        """`flub.revoke` to every parent that may still admit (rank, incarnation), and to those
        in `also` that may admit it at all."""
        parents = self.admissions.withdraw(rank, incarnation) | (also or set())
        notice = {"rank": rank, "incarnation": incarnation, "reason": reason}
        return [
            Send(Message(Kind.REQUEST, "flub.revoke", dict(notice), nodeid=parent))
            for parent in sorted(parents)
            if may_admit(self.topology, parent, rank) or parent == self.table.parent_of(rank)
        ]

    # --- steps 4 and 5: healing ---------------------------------------------------------------

    def _heal(self, event: Event | Reserve, now: float, chains: Chains) -> list[Action]:
        """`chains`: those of the rank the event ended, as they were before (_chains_before)."""
        actions: list[Action] = []
        if isinstance(event, Lost | Departed | Void):
            actions = self._foster_below(event.rank, chains)
        elif (
            isinstance(event, Dropped)
            and self.table.entries.peek(event.gone).state not in CONNECTED
        ):
            actions = self._foster_below(event.gone, chains)  # a child's word ended it (adrift)
        elif isinstance(event, Online):
            actions = self._welcomed(event)
        return actions + self._withdraw_moot()

    def _welcomed(self, event: Online) -> list[Action]:
        """An Online applied: the parent that welcomed it may admit it again, and the ranks
        away from home go home (`_send_home`)."""
        self._told(event)
        return self._send_home(event.rank, event.parent)

    def _told(self, event: Online) -> None:
        """The parent that welcomed an Online applied may admit that incarnation again."""
        welcomer = event.parent if event.parent is not None else self.topology.parent(event.rank)
        if welcomer is not None:
            self.admissions.told(event.rank, event.incarnation, welcomer)

    def _chains_before(self, event: Event | Reserve) -> Chains:
        """The chains of links above the rank this event may end, taken before the table applies
        it (the table forgets an ended rank's links): its foster parents are chosen from them."""
        if isinstance(event, Lost | Departed | Void):
            return self.table.links_above(event.rank)
        if isinstance(event, Dropped) and 0 <= event.gone < self.table.size:
            return self.table.links_above(event.gone)
        return []

    def _foster_below(self, rank: int, chains: Chains) -> list[Action]:
        admitted = cut_off_below(self.table, rank)
        if not admitted:
            return []
        fosters = foster_parents(self.table, rank, chains)
        for foster in fosters:
            for admitted_rank, incarnation, _ in admitted:
                self.admissions.fostered(admitted_rank, incarnation, foster)
        orders = [
            {"ranks": [list(admission) for admission in part], "for": self.table.reattach_grace}
            for part in in_orders(admitted)
        ]
        shown = ",".join(str(r) for r, _, _ in admitted[:8]) + ("..." if len(admitted) > 8 else "")
        who = f"rank {fosters[0]}" if len(fosters) == 1 else "ranks " + ",".join(map(str, fosters))
        actions: list[Action] = [info(f"rank {rank} ended: {who} fosters what it held ({shown})")]
        for foster in fosters:
            actions += [self._foster_at(foster, order) for order in orders]
        return actions

    def _foster_at(self, foster: int, order: dict[str, object]) -> Call:
        return Call(
            Message(Kind.REQUEST, "heal.foster", dict(order), nodeid=foster),
            then=lambda reply, now: _unless_failed(reply, f"fostering at rank {foster}"),
        )

    def _send_home(self, rank: int, parent: int | None) -> list[Action]:
        """`rank` is online: its children away from home go back to it, and it goes home itself
        if it came online under a foster parent while its own parent is there."""
        actions: list[Action] = [
            self._adopt(rank, child, incarnation, key)
            for child, incarnation, key in away_from_home(self.table, rank)
        ]
        home = goes_home(self.table, rank, parent)
        if home is not None:
            entry = self.table.entry(rank)
            actions.append(self._adopt(home, rank, entry.incarnation, entry.key or ""))
        return actions

    def _adopt(self, parent: int, child: int, incarnation: int, key: str) -> Call:
        """Have `parent` admit `child`, then tell the child to go to it."""
        order = {"rank": child, "incarnation": incarnation, "public_key": key}
        self.admissions.told(child, incarnation, parent)

        def adopted(reply: Message, now: float) -> list[Action]:
            if reply.errnum:
                return [warning(f"rank {parent} could not take rank {child} home: {reply.errstr}")]
            card = {k: reply.payload.get(k) for k in ("rank", "endpoint", "public_key")}
            go = Message(Kind.REQUEST, "heal.home", {**card, "incarnation": incarnation})
            go.nodeid = child
            return [
                info(f"rank {child} goes home to rank {parent}"),
                Call(go, then=lambda r, now: _unless_failed(r, f"sending rank {child} home")),
            ]

        return Call(Message(Kind.REQUEST, "heal.adopt", order, nodeid=parent), then=adopted)

    def _withdraw_moot(self) -> list[Action]:
        """Close each open foster admission that its rank used, and withdraw each that is moot
        (state/healing.py); a parent that is not connected is not told."""
        if not self.admissions.any_open():  # as at every Online of a wire-up
            return []
        moot: dict[int, list[tuple[int, int]]] = {}
        for rank, incarnation, parent in self.admissions.open():
            fate = admission_fate(self.table, rank, incarnation, parent)
            if fate is Fate.OPEN:
                continue
            self.admissions.close(rank, parent)
            if fate is Fate.MOOT:
                moot.setdefault(parent, []).append((rank, incarnation))
        return [
            Send(
                Message(
                    Kind.REQUEST,
                    "heal.withdraw",
                    {"ranks": [list(a) for a in part]},
                    nodeid=parent,
                )
            )
            for parent, ranks in sorted(moot.items())
            if self.table.entries.peek(parent).state in CONNECTED
            for part in in_orders(ranks)
        ]


def _unless_failed(reply: Message, what: str) -> list[Action]:
    return [warning(f"{what}: {reply.errstr}")] if reply.errnum else []
