"""The root group on a broker (docs/protocol.md §13.2): the driver of its `Member`
(state/leadership.py), and the commit wait at the root.

At the root (rank 0, with tbon.standbys K > 0), every event the table is asked to apply (an
`Apply` action: a service's, or a report's) is proposed to the group instead of applied. Once a
majority holds it, the member says `Apply`: the event enters the table through its one path
(RankPath.handle) with the clock the root read when it proposed it, and its follow-ups are held.
Once the root may acknowledge it (its lease runs), the member says `Acknowledge`: the follow-ups
are carried out, then the asking service's continuation. So nobody hears of a transition that a
takeover could forget. While no majority answers, nothing commits: a request that waits for its
event (`Apply.request`: a joiner's allocate, a release, a retire) is refused after `wait`
seconds with ETIMEDOUT, and said so in status (`view`). Events that no request waits for (reports)
wait, queued, for a majority.

At a standby, the member answers the root's appends and applies what is committed to a replica
table through its own RankPath, whose follow-ups are dropped: orders are the root's job. The
replica is built as the root's was, from the `origin` the root sends with its first entries
(the launched hosts, config bootstrap or not, the grace, the root's clock at the start).

Every member is ticked: a standby that hears no root canvasses and campaigns (§13.4), and one
elected becomes the root (`on_root`: its broker takes the table over), proposing from then on as
rank 0 did. A root that steps down because another root exists is superseded (`on_superseded`:
its broker exits 77); one whose lease lapsed with no successor known stays a member and follows.
With K = 0 this service is idle: `active` is false and the performer applies at once. A broker
that is no member never loads the member machine (state/leadership.py) nor its codec
(state/groupwire.py): the methods that drive a member import them, and run only once there is
one (tests/test_broker_imports.py).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tbon.overlay.links.cards import Card, card_ok
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.actions import Action, Apply, Respond, Send, Wake, fail, warning
from tbon.overlay.state.rankevents import Event, Reserve
from tbon.overlay.state.terms import StaleTerm
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message, MessageError
from tbon.overlay.wire.route import from_above, from_member, from_rank0

if TYPE_CHECKING:
    from tbon.overlay.state.groupwire import Proposal
    from tbon.overlay.state.leadership import AppendEntries, Instruction, Member
    from tbon.overlay.state.ranktable import RankTable  # the root's, and a standby's copy

log = logging.getLogger("tbon.broker")

PATIENCE = 1.0
"""Seconds a member hears nothing of its root before it canvasses, unless its broker lost the
link to its parent (then `election`, at once): tbon.timeout if shorter (docs/protocol.md
§13.4). A stall of a loaded machine up to this long deposes no root; a root's node lost
without a word is replaced this much later than one killed."""


def patience_for(timeout: float) -> float:
    """A member's patience in an instance whose tbon.timeout is `timeout` (0: off)."""
    return min(timeout, PATIENCE) if timeout > 0 else PATIENCE


PAUSED = "grants are paused: no majority of the root group (ranks {}) answers"


class Asked:
    """An Apply proposed (or queued) at the root: who waits for it, and until when."""

    __slots__ = ("action", "answered", "deadline")

    def __init__(self, action: Apply, deadline: float) -> None:
        self.action, self.deadline = action, deadline
        self.answered = False  # its request was refused: the event may still commit, unanswered


class GroupService:
    def __init__(
        self,
        rank: int,
        topology: Topology,
        members: tuple[int, ...],
        incarnation: Callable[[], int],
        now: float,
        wait: float,
        path: Any = None,
        origin: dict[str, Any] | None = None,
        patience: float = 0.0,
    ) -> None:
        """`members`: the root group as the root knows it (rank 0 and its standbys; () at any
        other broker, which learns it from the root's appends); `path` and `origin`: the
        root's RankPath and how its table was built (rank 0 only); `patience`: its member's
        (`patience_for`; 0: its election timeout alone, leadership.py)."""
        self.rank, self.topology, self.patience = rank, topology, patience
        self.incarnation = incarnation
        self.wait = wait
        self.members = members
        self.path = path
        self.origin = origin
        self.member: Member[Proposal] | None = None
        if rank == 0 and len(members) > 1:
            self.member = self._member(now, 1)  # it leads term 1
        self.leads = self.member is not None  # this broker serves the table (§13.4)
        # what the broker does when this member is elected (it takes the table over), and when
        # it learns that another root exists (it exits 77): set by broker.py
        self.on_root: Callable[[int, float], list[Action]] = lambda term, now: []
        self.on_superseded: Callable[[int, int], None] = lambda root, term: None
        # the members' cards (rank, endpoint, key: docs/protocol.md §13.4), sent with every
        # lineage: this broker's own (`card`, set by broker.py), said to the root on each answer;
        # at the root, each member's as it said it; `on_cards` when they change
        self.card: Card | None = None
        self.cards: dict[int, Card] = {}
        self.on_cards: Callable[[], None] = lambda: None
        self.asked: dict[int, Asked] = {}
        self.queued: list[Asked] = []
        self.held: dict[int, Any] = {}  # index -> Applied, committed, not yet acknowledged
        # the root of a later term as the term fence heard it (`stale`): the member's own
        # StaleTerm names none
        self.successor: tuple[int, int] | None = None
        self.formed = False  # a member has answered this root: the group has formed

    @property
    def active(self) -> bool:
        """Whether the root waits for the group before applying (rank 0 with K > 0, or the
        standby that took over)."""
        return self.leads and self.member is not None

    @property
    def waiting(self) -> bool:
        return bool(self.asked or self.queued)

    # --- the root: proposals ---------------------------------------------------------------

    def propose(self, action: Apply, now: float) -> list[Action]:
        """An event to apply once the group holds it (the performer's Apply, at the root)."""
        member = self.member
        assert member is not None and self.active
        if _repeat(action, self.asked.values(), self.queued):
            return []
        if self._at_once(action, now):
            applied = self.path.handle(action.event, now)
            then = action.then(applied.outcome, now) if action.then is not None else []
            return [*applied.actions, *then]
        return self._submit(Asked(action, now + self.wait), now)

    def _at_once(self, action: Apply, now: float) -> bool:
        """Whether the founding root answers `action` from its table without the group: the
        group has not formed yet (no member has ever answered it, so no other root can have
        been elected), no event of the same rank waits before it, and the event changes
        nothing (a config-booted rank's first hello: the members, config-booted themselves,
        could never be admitted to answer for their own; docs/protocol.md §13.2)."""
        rank = action.event.rank
        return (
            not self.formed
            and self.rank == 0
            and self.path is not None
            and all(a.action.event.rank != rank for a in (*self.asked.values(), *self.queued))
            and self.path.table.idle(action.event, now)
        )

    def _submit(self, asked: Asked, now: float) -> list[Action]:
        from tbon.overlay.state import leadership
        from tbon.overlay.state.groupwire import Proposal

        member = self.member
        assert member is not None
        if not member.is_root:
            self.queued.append(asked)
            return [Wake()]
        out = member.handle(leadership.Propose(Proposal(asked.action.event, now)), now)
        index = next(i.index for i in out if isinstance(i, leadership.Proposed))
        self.asked[index] = asked
        return [*self._carry_out(out, now), Wake()]

    def root_unreachable(self, now: float) -> list[Action]:
        """The broker lost the link to its parent: if it is a member, it suspects its root at
        once rather than after `patience` (leadership.py, Patience)."""
        if self.member is None:
            return []
        from tbon.overlay.state.leadership import RootUnreachable

        return self._carry_out(self.member.handle(RootUnreachable(), now), now)

    def tick(self, now: float) -> list[Action]:
        """The member's timers (every member's: a standby campaigns when its root is silent),
        and the waits that end."""
        member = self.member
        if member is None:
            return []
        from tbon.overlay.state.leadership import Tick

        actions: list[Action] = []
        due = member.next_deadline()
        if due is not None and now >= due:
            actions += self._carry_out(member.handle(Tick(), now), now)
        if not self.active:
            return actions
        if member.is_root and self.queued:
            queued, self.queued = self.queued, []
            for asked in queued:
                actions += self._submit(asked, now)
        return actions + self._give_up(now)

    def _give_up(self, now: float) -> list[Action]:
        """Refuse each request whose event has not been acknowledged within `wait`."""
        actions: list[Action] = []
        why = PAUSED.format(",".join(map(str, self.members)))
        for asked in [*self.asked.values(), *self.queued]:
            request = asked.action.request
            if request is not None and not asked.answered and now >= asked.deadline:
                actions += [warning(f"refused {request.topic}: {why}"), *_refuse(request, why)]
                asked.answered = True
        self.queued = [a for a in self.queued if not a.answered]  # never proposed: dropped
        return actions

    def next_deadline(self) -> float | None:
        if self.member is None:
            return None
        if not self.active:
            return self.member.next_deadline()
        times = [
            a.deadline
            for a in (*self.asked.values(), *self.queued)
            if a.action.request is not None and not a.answered
        ]
        due = self.member.next_deadline()
        if due is not None:
            times.append(due)
        return min(times, default=None)

    def stale(self, news: StaleTerm, root: int | None, now: float) -> list[Action]:
        """The broker's term fence heard of a later term than the one this member leads (an
        ESTALE answer to an order, a welcome or a lineage: docs/protocol.md §13.3), and of its
        root where it was named: the member steps down, and every request that waits here for
        a commit is answered."""
        if self.member is None:
            return []
        if root is not None and root != self.rank:
            self.successor = (root, news.term)
        return self._carry_out(self.member.handle(news, now), now)

    # --- messages -----------------------------------------------------------------------------

    def receive(self, request: Message, now: float) -> list[Action]:
        """group.append at a standby; group.append-reply (and the votes) at the root."""
        from tbon.overlay.state import groupwire
        from tbon.overlay.state.leadership import AppendEntries

        try:
            message = groupwire.decode(request.topic, request.payload)
        except MessageError as error:
            return [warning(f"ignored a {request.topic}: {error}")]
        down = message.sender == 0 and from_rank0(request)  # rank 0, which leads term 1
        above = from_above(request, message.sender)  # a member above this one (§13.4)
        if not (down or above or from_member(request, message.sender)):
            return [warning(f"ignored a {request.topic} not from a member of the root group")]
        # a member refilled at rank 0 after a takeover hears first from the root above it
        first = down or (above and self.rank == 0)
        if self.member is None and (not first or not self._stand_by(request, now)):
            return [warning(f"ignored a {request.topic}: this rank is not in the root group")]
        assert self.member is not None
        if self.leads:
            self._card_said(message.sender, request.payload.get("card"))
            self.formed = True
        self.member.incarnation = self.incarnation()
        if isinstance(message, AppendEntries):
            return self._appended(request, message, now)
        return self._carry_out(self.member.handle(message, now), now)

    def _stand_by(self, request: Message, now: float) -> bool:
        """The root's first message here: this rank is a member (`members`). A member is no
        voter until the root has seen it hold what was committed if it is a refilled rank
        (incarnation above 1), which may have forgotten what its rank held; the first
        incarnation never held anything, and votes as a member at the start does."""
        members = request.payload.get("members")
        if not (isinstance(members, list) and self.rank in members and 0 in members):
            return False
        self.members = tuple(int(m) for m in members if is_int(m))
        self.member = self._member(now, self.incarnation())
        log.info("standing by for the root (group %s)", ",".join(map(str, self.members)))
        return True

    def _member(self, now: float, incarnation: int) -> Member[Proposal]:
        """This rank's member machine, where state/leadership.py is first loaded: only a member
        of the group needs it. A refilled rank (`incarnation` above 1) starts fresh (_stand_by)."""
        from tbon.overlay.state.leadership import Member, Timing

        timing = Timing(patience=self.patience)
        return Member(self.rank, self.members, now, timing, incarnation, incarnation > 1)

    def _appended(
        self, request: Message, message: AppendEntries[Proposal], now: float
    ) -> list[Action]:
        assert self.member is not None
        if self.path is None and message.prev == 0:
            origin = request.payload.get("origin")
            self.path = _replica(self.topology, origin)
            if self.path is None:
                return [warning("ignored a group.append without the table's origin")]
            self.origin = origin  # sent on in turn, should this member lead (a refill's start)
            self.path.table.members = self.members
        # with no copy yet, an append after entry 0 finds no match: the answer (no, hint 0)
        # makes the root step back to the log's start, sent with the origin
        return self._carry_out(self.member.handle(message, now), now)

    # --- the members' cards -------------------------------------------------------------------

    def unapplied(self) -> list[Event | Reserve]:
        """The table events this member's log holds past what its table applied, in order: a
        member elected root commits them with its term's first entry (docs/protocol.md §13.4)."""
        member = self.member
        if member is None:
            return []
        entries = member.log.between(member.applied + 1, member.log.last)
        return [entry.payload.event for entry in entries if entry.payload is not None]

    def group_cards(self) -> tuple[Card, ...]:
        """The members' cards this root knows, its own included, in rank order."""
        return tuple(self.cards[rank] for rank in sorted(self.cards))

    def lead_with(self, cards: tuple[Card, ...]) -> None:
        """A member elected: the cards the dead root had sent it are the group's, its own too."""
        self.cards = {card[0]: card for card in cards if card[0] in self.members}
        if self.card is not None:
            self.cards[self.rank] = self.card

    def _card_said(self, sender: int, value: Any) -> None:
        """A member's own card on its answer (the route proved the sender): kept if it is one,
        of that member; a change is sent down with the lineage (`on_cards`)."""
        if not card_ok(value) or value[0] != sender or sender not in self.members:
            return
        card: Card = (int(value[0]), str(value[1]), str(value[2]))
        if self.cards.get(sender) != card:
            self.cards[sender] = card
            self.on_cards()

    # --- instructions -------------------------------------------------------------------------

    def _carry_out(self, instructions: list[Instruction], now: float) -> list[Action]:
        from tbon.overlay.state import groupwire, leadership

        actions: list[Action] = []
        for instruction in instructions:
            match instruction:
                case leadership.Send(to, message):
                    if isinstance(message, leadership.InstallSnapshot):
                        # never made: this Member is given no `snapshot`, so it compacts nothing
                        # (protocol §13.2: a refilled member replays the log from its start)
                        continue
                    payload = groupwire.encode(message)
                    payload["members"] = list(self.members)
                    if self.card is not None and not self.leads:
                        payload["card"] = list(self.card)  # the root sends it with the lineage
                    first = isinstance(message, leadership.AppendEntries) and message.prev == 0
                    if first and self.origin is not None:
                        payload["origin"] = self.origin
                    topic = groupwire.topic_of(message)
                    actions.append(Send(Message(Kind.REQUEST, topic, payload, nodeid=to)))
                case leadership.Apply(index, proposal):
                    actions += self._commit(index, proposal)
                case leadership.Acknowledge(index, _):
                    actions += self._acknowledge(index, now)
                case leadership.Abandon(index):
                    actions += self._abandon(index)
                case leadership.BecameRoot(term) if self.leads:
                    actions.append(warning(f"the root again, in term {term}"))
                case leadership.BecameRoot(term):
                    self.leads = True
                    actions.append(warning(f"rank {self.rank} is the root in term {term}"))
                    actions += self.on_root(term, now)
                case leadership.SteppedDown(term, leader, why) if self.leads and leader is None:
                    actions.append(warning(f"grants paused in term {term}: {why}"))
                case leadership.SteppedDown():
                    pass
                case leadership.Proposed() | leadership.NotRoot():
                    pass
        successor = self._successor()
        if self.leads and successor is not None:
            # another member leads a later term (a root that stepped down, or one woken from a
            # stop, follows it now): this broker is no root any more (§13.5), and what waits
            # here for a commit is answered before it goes
            self.leads = False
            actions += self._answer_all(now)
            self.on_superseded(*successor)
        return actions

    def _successor(self) -> tuple[int, int] | None:
        """The root of a later term than any this member led, as its member or its broker's
        fence knows it; None while no other root is known."""
        member = self.member
        if member is None:
            return None
        if member.leader not in (None, self.rank):
            return member.leader, member.term
        if self.successor is not None and not member.is_root and self.successor[1] >= member.term:
            return self.successor
        return None

    def _unanswered(self) -> str:
        """Why a request that waited here for a commit is refused (ETIMEDOUT: ask again)."""
        successor = self._successor()
        if successor is None:
            return PAUSED.format(",".join(map(str, self.members)))
        root, term = successor
        return f"superseded: rank {root} is the root in term {term}; ask again"

    def _answer_all(self, now: float) -> list[Action]:
        """Refuse every request still waiting here: this broker is no root any more, so none
        of them will be acknowledged here (a proposal its successor's log holds is applied
        there; asked again, a repeat gets the same outcome)."""
        why = self._unanswered()
        actions: list[Action] = []
        for asked in [*self.asked.values(), *self.queued]:
            request = asked.action.request
            if request is not None and not asked.answered:
                actions += [warning(f"refused {request.topic}: {why}"), *_refuse(request, why)]
                asked.answered = True
        self.asked, self.queued, self.held = {}, [], {}
        return actions

    def _commit(self, index: int, proposal: Proposal) -> list[Action]:
        """A committed entry enters this member's table through its one path."""
        assert self.path is not None
        applied = self.path.handle(proposal.event, proposal.now)
        if not self.leads:
            return []  # a standby's copy: the root gives the orders
        if index in self.asked:
            self.held[index] = applied
            return []
        return list(applied.actions)  # an earlier term's, committed with this one's mark

    def _acknowledge(self, index: int, now: float) -> list[Action]:
        asked = self.asked.pop(index, None)
        applied = self.held.pop(index)
        actions = list(applied.actions)
        if asked is not None and not asked.answered and asked.action.then is not None:
            actions += asked.action.then(applied.outcome, now)
        return actions

    def _abandon(self, index: int) -> list[Action]:
        asked = self.asked.pop(index, None)
        self.held.pop(index, None)
        if asked is None or asked.answered or asked.action.request is None:
            return []
        request = asked.action.request
        asked.answered = True
        why = self._unanswered()
        return [warning(f"refused {request.topic}: {why}"), *_refuse(request, why)]

    # --- what status and group.state show -----------------------------------------------------

    def view(self, now: float) -> dict[str, Any] | None:
        """The root group, for status: each standby's acknowledged index and lag, and whether
        grants are paused (the root cannot acknowledge now)."""
        member = self.member
        if member is None or not self.active:
            return None
        role = member.role
        match = getattr(role, "match", {})
        voting = getattr(role, "voting", {})
        last = member.log.last
        return {
            "term": member.term,
            "index": last,
            "commit": member.log.commit,
            "paused": not member.may_acknowledge(now),
            "standbys": [
                {
                    "rank": p,
                    "acked": match.get(p, 0),
                    "lag": last - match.get(p, 0),
                    "voter": voting.get(p, False),
                }
                for p in member.peers
            ],
        }

    def state(self, request: Message, now: float) -> list[Action]:
        """group.state: this member's term, log and applied index, and a digest of its table
        (two members that applied the same entries show the same digest)."""
        member, path = self.member, self.path
        if member is None or path is None:
            return fail(request, errno.ENOENT, f"rank {self.rank} holds no copy of the table")
        answer = {
            "rank": self.rank,
            "term": member.term,
            "root": member.is_root,
            "last": member.log.last,
            "commit": member.log.commit,
            "applied": member.applied,
            "digest": digest(path.table),
        }
        return [Respond(request.respond(answer))]


def digest(table: RankTable) -> str:
    """A digest of every rank's entry and the retired keys: equal tables, equal digests."""
    import hashlib  # here, not at the top: asked for by group.state alone, it loads OpenSSL

    hashed = hashlib.sha256()
    for rank in range(table.size):
        hashed.update(repr(table.entries.peek(rank)).encode())
    hashed.update(repr(sorted(table.retired_keys.items())).encode())
    return hashed.hexdigest()[:16]


def _replica(topology: Topology, origin: Any) -> Any:
    """A standby's copy of the table as the root built its own, and its one path."""
    from tbon.overlay.services.rankpath import RankPath
    from tbon.overlay.state.ranktable import RankTable

    if not isinstance(origin, dict):
        return None
    hosts, fixed, grace, start = (origin.get(k) for k in ("hosts", "fixed", "grace", "now"))
    if not (
        isinstance(hosts, list)
        and all(isinstance(h, str) for h in hosts)
        and isinstance(fixed, bool)
        and isinstance(grace, int | float)
        and isinstance(start, int | float)
    ):
        return None
    try:
        table = RankTable(topology, hosts, float(start), fixed=fixed, reattach_grace=grace)
    except ValueError:
        return None
    return RankPath(table)


def _refuse(request: Message, why: str) -> list[Action]:
    """ETIMEDOUT: the group did not commit it in time; a joiner exits 75 (try again later)."""
    return fail(request, errno.ETIMEDOUT, why)


def _repeat(action: Apply, asked: Any, queued: list[Asked]) -> bool:
    """An event no request waits for, asked again while the same one waits (the loop's timers
    find a lapsed reservation or a rank adrift at each turn until it is applied)."""
    if action.request is not None:
        return False
    return any(a.action.event == action.event for a in [*asked, *queued])
