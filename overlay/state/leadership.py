"""One member of the root group (the root and its standbys, docs/protocol.md §13) as a plain
state machine: stimuli in, instructions out, no sockets and no clock of its own. The payload of
the log is whatever the caller replicates (rank-table events); this module never reads it.

The group is a fixed tuple of ranks, `members` (ranks 0..K); a *majority* is more than half of
them. Every member keeps a term (the leader epoch), the member it voted for in that term, and a
`ReplicaLog` (replicalog.py). Exactly one role at a time:

- `Following`: it obeys the root of its term (`leader`, once known), appends what it sends,
  applies what it says is committed.
- `Campaigning`: it asks every member for its vote in a term of its own.
- `Leading`: it is the root: it appends the table's events, replicates them, commits each once a
  majority holds it, and acknowledges it to its asker while it holds a lease.

Rules.
- Terms. Every message carries its sender's term. A message of a higher term makes the member
  take that term and follow (a root or candidate steps down: `SteppedDown`); an order (append)
  or vote request of a lower term is refused with the member's own term (`ok`/`granted` false),
  which makes its sender step down in turn; a reply of a lower term is ignored. A tree broker
  that refuses an order for its stale term says so (`StaleTerm`, terms.py): the same rule.
- Incarnations. A member that died and was refilled (FLUB) is a new incarnation that remembers
  nothing. Replies and votes carry their sender's incarnation; one from an older incarnation
  than the member has heard from is ignored, and a newer one forgets what the old one held.
  A new incarnation is not a voter (`voter` false): it neither votes nor campaigns until a root
  has seen it hold every entry that root had committed and says so on an append (`voter`).
  So a committed entry whose holder forgot it is never missing from an election's majority.
  It forgot its term too, and the vote and quiet promised in it: until it is a voter, its
  replies say so (`voter` false) and renew no lease, and a root tells it that it is a voter only
  while its lease runs; told so, it counts as having voted for that root in its term.
- Quiet. A member that is root, or is not a voter, or heard its root (an append of its term) or
  gave a vote less than `election` seconds ago, ignores a vote request altogether: it neither
  answers nor takes the term. So a member that a root counted in its lease cannot help elect
  another root before that lease has run out (the lease rule, below), and a member cut off for
  a moment cannot depose a root that the others still hear. A root that stepped down for want
  of a majority (No quorum, below) stays quiet in its term: it helps elect no other root, and
  campaigns again itself once its own timeout runs, or follows a root that others elected
  without it. A live former root is superseded by the broker (it leaves, docs/protocol.md
  §13.5); had it voted for its successor, the vote it gave would be the majority its own
  leaving then breaks (K=2 with one member gone: the successor alone, no grant ever again).
- Patience. A follower told that its way to the root is gone (`RootUnreachable`: its broker
  lost the link to its parent, a root killed, say) suspects the root at once; one that only
  hears nothing waits `patience` first (the tree's own word, bounded: a root as slow as a
  loaded machine makes it is not deposed), and so does a root without a lease before it steps
  down. Neither wait bears on safety: the lease and the quiet do. An append of its root
  clears the suspicion.
- Election. A voter that suspects its root and has heard none for `election` plus `stagger`
  times its place in `members` (the lowest rank first), or that has heard none for
  `patience` plus that stagger, campaigns: it takes the next term, votes for
  itself and asks the others, again every `retry` seconds until answered. It first canvasses
  (Raft's pre-vote): it asks, for the term it would take, whether each would vote for it, and
  raises its term only once a majority (itself included) says yes. Answering a canvass changes
  nothing; a member says yes if it is not quiet and the log is at least as complete as its own.
  So a member whose log is behind, or that is cut off, never raises its term, and never makes a
  root step down through the refusal of its appends. A member grants its
  vote in a term once, and only to a candidate whose log is at least as complete as its own
  (last term, then length). A candidate with a majority's votes is root: it appends an empty
  entry of its term (`Entry(term, None)`), and replicates. One that has no majority by its
  timeout campaigns again in the next term.
- Replication. The root sends each member the entries that follow what it has acknowledged
  (`AppendEntries`, with the previous entry's index and term), at once for a new entry and every
  `heartbeat` to each member (empty, or what is unacknowledged). A member that holds the
  previous entry appends (replicalog.py) and answers with the index it matches; one that does
  not answers no with a hint, and the root steps back.
- Commit. The root commits index N once a majority (itself included) holds it and the entry at
  N is of its own term (an earlier term's entries are committed with it). Every member applies
  committed entries in order, each once (`Apply`); a member learns the commit index from the
  root's appends.
- Lease. Each reply and vote echoes the time (the root's clock) at which the root sent what it
  answers. The root's lease runs until `lease` after the latest time such that a majority
  (itself included) answered in its term something sent then. `lease` < `election`: a member
  that answered at that time is quiet until `election` after it received it, so no other root
  is elected before the lease ends. The root acknowledges (`Acknowledge`) a proposal only once
  it is committed and while its lease runs at `now`; a stopped root woken later finds its lease
  over by its own clock and acknowledges nothing until a majority answers it again in its term
  (which no member that has moved on to a later term does).
- No quorum. A root whose lease has been over for `election` (or `patience`, if longer) seconds
  steps down (`SteppedDown`, no leader): its proposals not yet acknowledged are abandoned
  (`Abandon`: their fate is unknown here; the asker retries, and the table's events are
  repeats when they were applied).
- Proposals. Only the root takes them (`Proposed` with the index); any other member answers
  `NotRoot` with the root it knows.
- Compaction (only with a `snapshot`, the caller's table as it stands). Before each stimulus the
  caller has carried out every instruction so far, so its table is as of `applied` then (the
  member's *table index*). The root discards the entries up to the lowest index some member has
  acknowledged, but keeps no more than `keep` entries behind its table index; it tells the
  others that point on its appends (`floor`), and each discards up to it, never beyond its own
  table index. A member that needs an entry the root has discarded (too far behind, or a new
  incarnation) is sent the root's table as of its table index instead (`InstallSnapshot`), then
  the log after it; it replaces its copy (`Restore`) and answers as to an append. The root sends
  a member a snapshot again only once an answer to something sent after it shows it still lacks
  it (lost on the way): a dead member is sent probes, empty appends, not tables.
- Ignored: a reply that no longer matters (not the root any more, a vote after the election),
  a tick with nothing due.

A pair the table does not list raises `Unexpected`, naming the role and the stimulus.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tbon.overlay.state.replicalog import Entry, ReplicaLog
from tbon.overlay.state.terms import StaleTerm

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds. `lease` < `election`: the margin covers how much faster one member's clock may
    run than another's (here 25%)."""

    heartbeat: float = 0.1
    lease: float = 0.4
    election: float = 0.5
    patience: float = 0.0  # silence alone: below `election`, `election` counts
    stagger: float = 0.1
    retry: float = 0.05
    batch: int = 256  # entries per append at most
    keep: int = 1024  # entries a root keeps behind its table for a member that lags (§13.2)

    def __post_init__(self) -> None:
        if self.keep < 0 or self.batch < 1:
            raise ValueError(f"keep ({self.keep}) must be >= 0 and batch ({self.batch}) >= 1")
        if not 0 < self.lease < self.election:
            raise ValueError(
                f"a lease ({self.lease}s) must be shorter than quiet ({self.election}s)"
            )


# --- messages between members -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendEntries(Generic[P]):
    sender: int
    term: int
    prev: int
    prev_term: int
    entries: tuple[Entry[P], ...]
    commit: int
    sent_at: float
    voter: bool = False  # the root saw this member hold all it had committed
    floor: int = 0  # every member holds up to here (or lags past `keep`): discard up to it


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """The root's table as of `index` (the entry of `index_term`), for a member that lacks what
    the root discarded; `state` is the caller's (the member never reads it). Answered with an
    `AppendReply` as an append of the entries up to `index` would be."""

    sender: int
    term: int
    index: int
    index_term: int
    state: Any
    commit: int
    sent_at: float
    voter: bool = False
    floor: int = 0


@dataclass(frozen=True, slots=True)
class AppendReply:
    sender: int
    incarnation: int
    term: int
    ok: bool
    match: int  # ok: the index up to which it matches; not ok: where to try next, minus 1
    sent_at: float  # echoed from the append
    voter: bool = True  # False: a new incarnation not yet a voter: its answer renews no lease


@dataclass(frozen=True, slots=True)
class VoteRequest:
    sender: int
    term: int
    last: int
    last_term: int
    sent_at: float
    pre: bool = False  # a canvass: would it vote for me in `term`? (changes nothing)


@dataclass(frozen=True, slots=True)
class VoteReply:
    sender: int
    incarnation: int
    term: int
    granted: bool
    sent_at: float  # echoed from the request
    pre: bool = False


Message = AppendEntries[Any] | AppendReply | VoteRequest | VoteReply | InstallSnapshot


# --- stimuli ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class Propose(Generic[P]):
    """A table event the root wants applied and acknowledged."""

    payload: P


@dataclass(frozen=True, slots=True)
class RootUnreachable:
    """This member's broker lost its link to its parent: the root may be gone."""


Stimulus = Message | Tick | Propose[Any] | StaleTerm | RootUnreachable


# --- instructions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    to: int
    message: Message


@dataclass(frozen=True, slots=True)
class Proposed:
    index: int


@dataclass(frozen=True, slots=True)
class NotRoot:
    leader: int | None


@dataclass(frozen=True, slots=True)
class Apply(Generic[P]):
    """Committed: apply to this member's copy of the table, in index order."""

    index: int
    payload: P


@dataclass(frozen=True, slots=True)
class Restore:
    """Replace this member's copy of the table with `state`, the root's as of `index` (later
    `Apply` instructions follow from `index` + 1)."""

    index: int
    state: Any


@dataclass(frozen=True, slots=True)
class Acknowledge(Generic[P]):
    """The root's own proposal is committed and its lease runs: tell the asker its outcome."""

    index: int
    payload: P


@dataclass(frozen=True, slots=True)
class Abandon:
    """A proposal this member can no longer vouch for: it stepped down before acknowledging."""

    index: int


@dataclass(frozen=True, slots=True)
class BecameRoot:
    term: int


@dataclass(frozen=True, slots=True)
class SteppedDown:
    term: int
    leader: int | None
    why: str


Instruction = (
    Send
    | Proposed
    | NotRoot
    | Apply[Any]
    | Restore
    | Acknowledge[Any]
    | Abandon
    | BecameRoot
    | SteppedDown
)


class Unexpected(Exception):
    """A stimulus the table does not list for the role it arrived in."""


# --- roles --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Following:
    leader: int | None


@dataclass(slots=True)
class Campaigning:
    started: float
    asked_at: float
    votes: dict[int, float] = field(default_factory=dict)  # voter -> its request's send time
    pre: bool = False  # canvassing: its term not yet raised


@dataclass(slots=True)
class Leading(Generic[P]):
    since: float
    first: int  # its entry that opens its term (0 for the root of term 1)
    beat_at: float  # the last heartbeat round
    next: dict[int, int]  # member -> next index to send
    match: dict[int, int]  # member -> index it holds up to (this incarnation)
    acked_at: dict[int, float]  # member -> latest send time it answered in this term
    promoted: set[int] = field(default_factory=set)  # told it is a voter
    voting: dict[int, bool] = field(default_factory=dict)  # member -> its last reply's `voter`
    pending: dict[int, P] = field(default_factory=dict)  # own proposals not yet acknowledged
    snapshot_sent: dict[int, float] = field(default_factory=dict)  # member -> when, unanswered


Role = Following | Campaigning | Leading[Any]


# --- the machine --------------------------------------------------------------------------------

Handler = Callable[["Member[Any]", Any, float], list[Instruction]]


class Member(Generic[P]):
    def __init__(
        self,
        rank: int,
        members: tuple[int, ...],
        now: float,
        timing: Timing = Timing(),
        incarnation: int = 1,
        fresh: bool = False,
        snapshot: Callable[[], Any] | None = None,
    ) -> None:
        """Member `rank` of the group `members` (the first is the root of term 1). At the
        instance's start every member is a voter and `members[0]` leads term 1 with an empty
        log; a `fresh` member (a refilled rank) follows, with term 0, and is no voter yet.
        `snapshot` returns the caller's table as it stands (as of `applied` before a stimulus);
        without it the log is never compacted."""
        assert rank in members
        self.rank, self.members, self.timing = rank, members, timing
        self.incarnation = incarnation
        self.peers = tuple(m for m in members if m != rank)
        self.majority = len(members) // 2 + 1
        self.position = members.index(rank)
        self.log: ReplicaLog[P] = ReplicaLog()
        self.applied = 0
        self.snapshot = snapshot
        self.table_index = 0  # `applied` when the stimulus being handled arrived
        self.floor = 0  # the root's word: every member holds up to here
        self.voter = not fresh
        self.term = 0 if fresh else 1
        self.voted_for: int | None = None if fresh else members[0]
        self.heard_at = now  # the last append of its root, or vote given
        self.suspect = False  # told its way to the root is gone since it last heard it
        self.led = 0  # the term it last led, once it stepped down in it for want of a majority
        self.incarnations: dict[int, int] = {}  # peer -> newest incarnation heard from
        self.role: Role = Following(None if fresh else members[0])
        if not fresh and rank == members[0]:
            self.role = self._leading(now)

    # --- what the caller asks ---------------------------------------------------------------

    @property
    def is_root(self) -> bool:
        return isinstance(self.role, Leading)

    @property
    def leader(self) -> int | None:
        """The root this member knows in its term (itself if root)."""
        if isinstance(self.role, Leading):
            return self.rank
        return self.role.leader if isinstance(self.role, Following) else None

    def lease_until(self) -> float:
        """While root: until when no other root can be elected (inf: a group of one)."""
        role = self.role
        if not isinstance(role, Leading):
            return -math.inf
        need = self.majority - 1
        if need == 0:
            return math.inf
        times = sorted(role.acked_at.values(), reverse=True)
        return times[need - 1] + self.timing.lease if len(times) >= need else -math.inf

    def may_acknowledge(self, now: float) -> bool:
        return self.is_root and now < self.lease_until()

    def serves(self, now: float) -> bool:
        """Whether a read of the table here is current: root, its lease running, and an entry
        of its own term committed (so it has applied all its predecessors committed; the root of
        term 1 had none)."""
        role = self.role
        return (
            isinstance(role, Leading)
            and role.first <= self.log.commit
            and self.may_acknowledge(now)
        )

    def next_deadline(self) -> float | None:
        role, t = self.role, self.timing
        if isinstance(role, Leading):
            return role.beat_at + t.heartbeat
        if isinstance(role, Campaigning):
            return min(role.asked_at + t.retry, role.started + self._timeout())
        return self.heard_at + self._waits() if self.voter else None

    def handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        """Apply one stimulus at `now` (this member's clock); returns what to do. The caller
        carries out every instruction, in order, before the next stimulus."""
        self.table_index = self.applied
        out = self._handle(stimulus, now)
        self._compact()
        return out

    def _handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        if not self._possible(stimulus):
            return []  # no member sends it: a peer at fault, ignored rather than obeyed
        if isinstance(stimulus, AppendReply | VoteReply) and not self._current(stimulus):
            return []  # from an incarnation that has died since
        if isinstance(stimulus, VoteRequest) and self._quiet(now):
            return []  # the quiet rule: no answer, no new term
        if isinstance(stimulus, VoteRequest | VoteReply) and stimulus.pre:
            return canvass(self, stimulus, now)  # a canvass changes no term
        term = getattr(stimulus, "term", None)
        if term is not None and term > self.term:
            leader = None
            if isinstance(stimulus, AppendEntries | InstallSnapshot):
                leader = stimulus.sender
            out += self._adopt(term, leader, now)
        if isinstance(stimulus, StaleTerm):
            return out
        if term is not None and term < self.term:
            return out + refuse_stale(self, stimulus, now)
        rule = TRANSITIONS.get((type(self.role), type(stimulus)))
        if rule is None:
            raise Unexpected(
                f"can't handle {type(stimulus).__name__} when role={type(self.role).__name__}"
            )
        out += rule(self, stimulus, now)
        return out + self._acknowledge(now)

    # --- helpers ----------------------------------------------------------------------------

    def _timeout(self) -> float:
        return self.timing.election + self.timing.stagger * self.position

    def _waits(self) -> float:
        """How long a follower hears nothing before it canvasses (Patience)."""
        if self.suspect:
            return self._timeout()
        return max(self.timing.election, self.timing.patience) + self.timing.stagger * self.position

    def _quiet(self, now: float) -> bool:
        return (
            isinstance(self.role, Leading)
            or not self.voter
            or now < self.heard_at + self.timing.election
            or self.led == self.term
        )

    def _possible(self, stimulus: Stimulus) -> bool:
        """Whether an honest member could have sent `stimulus`: from another member of the
        group, and, for an answer to appends, holding no more than this root has (an `ok` past
        its log would commit what no majority holds, then fail the next append)."""
        sender = getattr(stimulus, "sender", None)
        if sender is not None and sender not in self.peers:
            return False
        return not (
            isinstance(stimulus, AppendReply) and stimulus.ok and stimulus.match > self.log.last
        )

    def _current(self, reply: AppendReply | VoteReply) -> bool:
        """Note the sender's incarnation; False if the reply is from an older one."""
        known = self.incarnations.get(reply.sender, 0)
        if reply.incarnation < known:
            return False
        if reply.incarnation > known:
            self.incarnations[reply.sender] = reply.incarnation
            role = self.role
            if isinstance(role, Leading) and known:
                role.match[reply.sender] = 0
                role.next[reply.sender] = self.log.commit + 1
                role.acked_at.pop(reply.sender, None)
                role.promoted.discard(reply.sender)
                role.snapshot_sent.pop(reply.sender, None)
            if isinstance(role, Campaigning):
                role.votes.pop(reply.sender, None)
        return True

    def _adopt(self, term: int, leader: int | None, now: float) -> list[Instruction]:
        """A later term: take it and follow."""
        was = self.role
        self.term, self.voted_for = term, None
        self.role = Following(leader)
        out: list[Instruction] = []
        if isinstance(was, Leading | Campaigning):
            out.append(SteppedDown(term, leader, f"term {term} is under way"))
        if isinstance(was, Leading):
            out += [Abandon(index) for index in sorted(was.pending)]
        return out

    def _leading(self, now: float) -> Leading[P]:
        last = self.log.last
        return Leading(
            since=now,
            first=0,
            beat_at=now,
            next={p: last + 1 for p in self.peers},
            match={p: 0 for p in self.peers},
            acked_at={},
        )

    def _append_to(self, peer: int, now: float) -> Send:
        """The entries `peer` lacks (from what it is next sent), up to a batch; a snapshot if
        the root discarded some of them, or a probe if one is on its way."""
        role = self.role
        assert isinstance(role, Leading)
        prev = role.next[peer] - 1
        if prev < self.log.base:
            if peer not in role.snapshot_sent and self.snapshot is not None:
                return self._snapshot_to(peer, now)
            prev = self.log.base
        term = self.log.term_at(prev)
        assert term is not None
        entries = self.log.after(prev, self.timing.batch)
        role.next[peer] = prev + len(entries) + 1
        promoted, floor = self._promotes(peer, now), self.log.base
        message = AppendEntries(
            self.rank, self.term, prev, term, entries, self.log.commit, now, promoted, floor
        )
        return Send(peer, message)

    def _snapshot_to(self, peer: int, now: float) -> Send:
        role = self.role
        assert isinstance(role, Leading) and self.snapshot is not None
        index = self.table_index
        term = self.log.term_at(index)
        assert term is not None, "the table index is never discarded past"
        role.snapshot_sent[peer] = now
        role.next[peer] = index + 1
        message = InstallSnapshot(
            self.rank,
            self.term,
            index,
            term,
            self.snapshot(),
            self.log.commit,
            now,
            self._promotes(peer, now),
            self.log.base,
        )
        return Send(peer, message)

    def _promotes(self, peer: int, now: float) -> bool:
        """Whether to tell `peer` it is a voter: it held all this root had committed, and the
        lease runs (so no later root exists, whose commits it would lack)."""
        role = self.role
        assert isinstance(role, Leading)
        return peer in role.promoted and self.may_acknowledge(now)

    def _compact(self) -> None:
        """Discard what every member holds (a root: or what lags past `keep`), up to the table
        index at most: the caller's table stands for it."""
        if self.snapshot is None:
            return
        role = self.role
        if isinstance(role, Leading):
            held = min([self.table_index, *(role.match[p] for p in self.peers)])
            floor = max(held, self.table_index - self.timing.keep)
        else:
            floor = min(self.floor, self.table_index)
        self.log.compact(floor)

    def _commit_to(self, index: int) -> list[Instruction]:
        """Commit up to `index` and apply what is newly committed."""
        self.log.commit = max(self.log.commit, min(index, self.log.last))
        out: list[Instruction] = []
        while self.applied < self.log.commit:
            self.applied += 1
            payload = self.log.at(self.applied).payload
            if payload is not None:
                out.append(Apply(self.applied, payload))
        return out

    def _advance(self) -> list[Instruction]:
        """The root commits the highest index of its term that a majority holds."""
        role = self.role
        assert isinstance(role, Leading)
        for index in range(self.log.last, self.log.commit, -1):
            if self.log.term_at(index) != self.term:
                break
            holders = 1 + sum(1 for p in self.peers if role.match[p] >= index)
            if holders >= self.majority:
                return self._commit_to(index)
        return []

    def _acknowledge(self, now: float) -> list[Instruction]:
        role = self.role
        if not isinstance(role, Leading) or not role.pending or not self.may_acknowledge(now):
            return []
        done = sorted(i for i in role.pending if i <= self.log.commit)
        return [Acknowledge(i, role.pending.pop(i)) for i in done]

    def _canvass(self, now: float) -> list[Instruction]:
        """Before raising its term, ask whether a majority would vote for it."""
        self.role = Campaigning(started=now, asked_at=now, votes={self.rank: now}, pre=True)
        if len(self.role.votes) >= self.majority:
            return self._campaign(now)
        return self._ask(now)

    def _campaign(self, now: float) -> list[Instruction]:
        self.term += 1
        self.voted_for = self.rank
        self.role = Campaigning(started=now, asked_at=now, votes={self.rank: now})
        if len(self.role.votes) >= self.majority:
            return self._win(now)
        return self._ask(now)

    def _ask(self, now: float) -> list[Instruction]:
        role = self.role
        assert isinstance(role, Campaigning)
        role.asked_at = now
        term = self.term + 1 if role.pre else self.term
        request = VoteRequest(self.rank, term, self.log.last, self.log.last_term, now, role.pre)
        return [Send(p, request) for p in self.peers if p not in role.votes]

    def _win(self, now: float, votes: dict[int, float] | None = None) -> list[Instruction]:
        """Root: a vote is a promise of quiet, so the lease starts from the requests granted."""
        self.role = self._leading(now)
        self.role.acked_at.update(votes or {})
        self.role.first = self.log.append(Entry(self.term, None))
        out: list[Instruction] = [BecameRoot(self.term)]
        return out + [self._append_to(p, now) for p in self.peers] + self._advance()


# --- rules --------------------------------------------------------------------------------------


def refuse_stale(m: Member[Any], s: Any, now: float) -> list[Instruction]:
    """An order or a vote request of a lower term: answered no, with this member's term."""
    if isinstance(s, AppendEntries | InstallSnapshot):
        reply = AppendReply(m.rank, m.incarnation, m.term, False, m.log.last, s.sent_at, m.voter)
        return [Send(s.sender, reply)]
    if isinstance(s, VoteRequest):
        return [Send(s.sender, VoteReply(m.rank, m.incarnation, m.term, False, s.sent_at))]
    return []  # a reply of a lower term: it no longer matters


def follow(m: Member[Any], s: AppendEntries[Any], now: float) -> list[Instruction]:
    """An append of this member's term: its sender is the root."""
    out: list[Instruction] = []
    if isinstance(m.role, Campaigning):
        out.append(SteppedDown(m.term, s.sender, f"rank {s.sender} is the root"))
    m.role = Following(s.sender)
    m.heard_at = now
    m.suspect = False
    matched = m.log.accept(s.prev, s.prev_term, s.entries)
    if matched is None:
        hint = min(m.log.last, s.prev - 1)
        reply = AppendReply(m.rank, m.incarnation, m.term, False, hint, s.sent_at, m.voter)
        return [*out, Send(s.sender, reply)]
    promote(m, s)
    m.floor = max(m.floor, s.floor)
    out += m._commit_to(min(s.commit, matched))
    reply = AppendReply(m.rank, m.incarnation, m.term, True, matched, s.sent_at, m.voter)
    return [*out, Send(s.sender, reply)]


def promote(m: Member[Any], s: AppendEntries[Any] | InstallSnapshot) -> None:
    """Told it is a voter. A new incarnation counts as having voted for this root in its term:
    its predecessor may have voted in it, for this root (the one a majority elected) or for
    none, so it votes for no other."""
    if s.voter and not m.voter:
        m.voter = True
        if m.voted_for is None:
            m.voted_for = s.sender


def install(m: Member[Any], s: InstallSnapshot, now: float) -> list[Instruction]:
    """The root's table as of `s.index`: it replaces this member's copy and log up to there,
    unless this member has applied as far already (a late or repeated snapshot)."""
    out: list[Instruction] = []
    if isinstance(m.role, Campaigning):
        out.append(SteppedDown(m.term, s.sender, f"rank {s.sender} is the root"))
    m.role = Following(s.sender)
    m.heard_at = now
    if s.index > m.applied:
        m.log.install(s.index, s.index_term)
        m.applied = s.index
        out.append(Restore(s.index, s.state))
    promote(m, s)
    m.floor = max(m.floor, s.floor)
    out += m._commit_to(min(s.commit, m.log.last))
    reply = AppendReply(m.rank, m.incarnation, m.term, True, s.index, s.sent_at, m.voter)
    return [*out, Send(s.sender, reply)]


def vote(m: Member[Any], s: VoteRequest, now: float) -> list[Instruction]:
    """Once per term, to a candidate whose log is at least as complete."""
    granted = m.voted_for in (None, s.sender) and m.log.up_to_date(s.last, s.last_term)
    if granted:
        m.voted_for = s.sender
        m.heard_at = now
    return [Send(s.sender, VoteReply(m.rank, m.incarnation, m.term, granted, s.sent_at))]


def counted(m: Member[Any], s: VoteReply, now: float) -> list[Instruction]:
    role = m.role
    assert isinstance(role, Campaigning)
    if not s.granted or role.pre:
        return []
    role.votes[s.sender] = max(role.votes.get(s.sender, -math.inf), s.sent_at)
    if len(role.votes) < m.majority:
        return []
    return m._win(now, {p: at for p, at in role.votes.items() if p != m.rank})


def replied(m: Member[Any], s: AppendReply, now: float) -> list[Instruction]:
    """A member's answer to the root: what it holds, and a lease renewed."""
    role = m.role
    assert isinstance(role, Leading)
    peer = s.sender
    role.voting[peer] = s.voter  # shown in status (a refilled member: once promoted)
    if s.voter:  # a new incarnation may not know the term its predecessor promised quiet in
        role.acked_at[peer] = max(role.acked_at.get(peer, -math.inf), s.sent_at)
    if s.sent_at > role.snapshot_sent.get(peer, math.inf) and (s.ok or s.match < m.log.base):
        del role.snapshot_sent[peer]  # answered after it: it has the snapshot, or lost it
    if s.ok:
        role.match[peer] = max(role.match[peer], s.match)
        role.next[peer] = max(role.next[peer], role.match[peer] + 1)
        if role.match[peer] >= m.log.commit:
            role.promoted.add(peer)
        out = m._advance()
        if role.next[peer] <= m.log.last:
            out.append(m._append_to(peer, now))
        return out
    role.next[peer] = max(role.match[peer] + 1, min(role.next[peer] - 1, s.match + 1))
    if role.next[peer] <= m.log.base and peer in role.snapshot_sent:
        return []  # a snapshot is on its way: the next heartbeat probes again
    return [m._append_to(peer, now)]


def propose(m: Member[Any], s: Propose[Any], now: float) -> list[Instruction]:
    role = m.role
    assert isinstance(role, Leading)
    index = m.log.append(Entry(m.term, s.payload))
    role.pending[index] = s.payload
    sends = [m._append_to(p, now) for p in m.peers if role.next[p] == index]
    return [Proposed(index), *sends, *m._advance()]


def not_root(m: Member[Any], s: Propose[Any], now: float) -> list[Instruction]:
    return [NotRoot(m.leader)]


def lead_tick(m: Member[Any], s: Tick, now: float) -> list[Instruction]:
    """Every heartbeat, each member is sent what it has not acknowledged; a root without a
    lease for `election` (or `patience`) steps down."""
    role = m.role
    assert isinstance(role, Leading)
    if now >= max(m.lease_until(), role.since) + max(m.timing.election, m.timing.patience):
        m.role = Following(None)
        m.heard_at = now
        m.led = m.term  # quiet in its term: it campaigns again itself (the quiet rule)
        out: list[Instruction] = [SteppedDown(m.term, None, "no majority of the group answers")]
        return out + [Abandon(index) for index in sorted(role.pending)]
    if now < role.beat_at + m.timing.heartbeat:
        return []
    role.beat_at = now
    for p in m.peers:
        role.next[p] = role.match[p] + 1
    return [m._append_to(p, now) for p in m.peers]


def campaign_tick(m: Member[Any], s: Tick, now: float) -> list[Instruction]:
    role = m.role
    assert isinstance(role, Campaigning)
    if now >= role.started + m._timeout():
        return m._canvass(now)
    if now >= role.asked_at + m.timing.retry:
        return m._ask(now)
    return []


def suspect(m: Member[Any], s: RootUnreachable, now: float) -> list[Instruction]:
    m.suspect = True
    return []


def follow_tick(m: Member[Any], s: Tick, now: float) -> list[Instruction]:
    if m.voter and now >= m.heard_at + m._waits():
        return m._canvass(now)
    return []


def canvass(m: Member[Any], s: VoteRequest | VoteReply, now: float) -> list[Instruction]:
    """The canvass before a campaign (Raft's pre-vote): a member that could not win (its log
    behind a majority's) never raises its term, so it never deposes a root the others hear."""
    if isinstance(s, VoteRequest):
        granted = s.term > m.term and m.log.up_to_date(s.last, s.last_term)
        term = s.term if granted else m.term
        return [Send(s.sender, VoteReply(m.rank, m.incarnation, term, granted, s.sent_at, True))]
    role = m.role
    if not s.granted:
        return m._adopt(s.term, None, now) if s.term > m.term else []
    if not isinstance(role, Campaigning) or not role.pre or s.term != m.term + 1:
        return []  # an answer to an older canvass
    role.votes[s.sender] = s.sent_at
    return m._campaign(now) if len(role.votes) >= m.majority else []


def nothing(m: Member[Any], s: Any, now: float) -> list[Instruction]:
    return []


TRANSITIONS: dict[tuple[type, type], Handler] = {
    (Following, AppendEntries): follow,
    (Following, InstallSnapshot): install,
    (Campaigning, InstallSnapshot): install,
    (Following, VoteRequest): vote,
    (Following, AppendReply): nothing,  # a root's reply that came after it stepped down
    (Following, VoteReply): nothing,  # a vote that came after the election
    (Following, Propose): not_root,
    (Following, Tick): follow_tick,
    (Following, RootUnreachable): suspect,
    (Campaigning, RootUnreachable): nothing,  # it suspects already
    (Leading, RootUnreachable): nothing,  # a root has no parent to lose
    (Campaigning, AppendEntries): follow,  # a root of its own term was elected
    (Campaigning, VoteRequest): vote,  # of its term: it voted for itself, and says no
    (Campaigning, VoteReply): counted,
    (Campaigning, AppendReply): nothing,
    (Campaigning, Propose): not_root,
    (Campaigning, Tick): campaign_tick,
    (Leading, AppendReply): replied,
    (Leading, VoteReply): nothing,  # a vote after the election
    (Leading, Propose): propose,
    (Leading, Tick): lead_tick,
}
"""(role, stimulus) -> rule, for a stimulus of the member's own term (or none). A root is never
sent an append of its own term (one root per term), nor answers a vote request (quiet)."""

