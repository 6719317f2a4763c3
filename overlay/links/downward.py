"""A parent's side of its links as a plain state machine: which child incarnations it admits,
which broker holds each, when one has ended, and whom a shutdown waits for (docs/protocol.md §5,
§12). No sockets: stimuli in, instructions out; children.py carries them out on the ROUTER.

Sessions. Each child rank has at most one current session here, for one incarnation
(sessions.py), in one of three phases:
- `Expected`: admitted (its key authorized, or a shared-key rank rank 0 said to expect); no
  broker welcomed yet. A foster admission (a rank whose topology parent is another broker, taken
  in at rank 0's word) carries a grace, `until`: if its broker has not come by then, its parent
  was alive after all, and the admission is forgotten.
- `Connected`: its broker was welcomed, on the connection the ledger (connections.py) ties it
  to; its silence is judged (liveness.py).
- `Ended`: lost, departed, retired, moved away or revoked, with the exit code its broker is told
  should it speak again. A lost one is `returnable`: its own broker (host and pid) may say hello
  again (a healed partition), and rank 0 then decides whether that incarnation is still current.
A session displaced by a newer incarnation's admission is no longer the rank's; it stays in the
ledger, so that its own connection's close still ends it (rank 0 ignores that report).

Stimuli name a rank (rank 0's word: `Admit`, `Withdraw`, `Revoke`, `Retire`), a routing id (a
live child spoke: `Heard`, `Goodbye`, `MovedAway`), or nothing but the machine (`Hello`,
`Rejoined`, `Stale`, connection events, `Settle`, `Tick`, `ShutdownBegan`). The table is keyed by
(the phase of the session named, or `Absent`, or "-" for the machine, stimulus type). A hello is
judged first (hello.py's `judge_hello`, a pure function); its word becomes a stimulus of the
session concerned (`Welcomed`, `Replaced`, `ToldShutdown`), as do a connection's close
(`Dropped`) and the clock (`Tick`).

Rules.
- An admission makes a new Expected session and authorizes its key ("" for a shared key: the
  rank's bound keys are revoked). Asking again for the incarnation already connected changes
  nothing (a repeated key exchange must not orphan its broker), nor does one for an incarnation
  revoked here (rank 0 ended it for good).
- A welcome ties the session to the hello's connection: a child whose TCP connection went
  half-dead may connect again and is welcomed there; the old connection's close is then stale.
  A hello of a broker welcomed before, from a connection already closed, says nothing of where
  that broker is now: ignored. So is a foster child's first hello from a closed connection (a
  seeking broker leaves the ancestors it gave up on, and may run on under another, whose Online
  would come after this link's Lost: rank 0 would declare it lost); its admission stays. Any
  other first hello from a closed connection is welcomed and lost at once.
- A connection that closes ends the sessions on it (lost, "connection dropped"), but only at
  `Settle`, after the messages it delivered before closing (a goodbye) were read; a session tied
  to another connection since is not ended.
- A goodbye ends the session (departed); `moved` ends the link but not the incarnation: the key
  is revoked and a foster session forgotten. Silence past tbon.timeout ends it lost; past
  tbon.torpid it is torpid until heard again.
- An ended incarnation's key is revoked, unless it was lost (a returnable broker must be heard).
  One that was retiring is retired however it ended, and told so (exit 0) should it speak again,
  even once the rank is refilled.
- A revocation ends the current incarnation for good (77): its broker, if connected, is told so;
  its key stays bound, so that a later hello is heard and answered 77. A revocation of any other
  incarnation only revokes its key.
- A withdrawal forgets a foster admission whose broker has not come; one that came is left.
- Once the shutdown began, every connected child is told to shut down; a foster child that
  knocks is told so too (exit 0) and forgotten, unless it is connected already (on another
  connection): then its session ends as any other, by its goodbye or its connection's close.
  A shutdown waits (`awaited`) for the children connected and for foster children still within
  their grace, nothing else.
- Heartbeats go to the connected children together, every tbon.heartbeat, from a phase the
  adapter draws at random (parents are not synchronized); a child sent anything within the last
  half heartbeat gets none (it has heard from this parent). Children answer them (uplink side).
- A census (`census`, a query) is every child's state as this parent reported it: an Online for
  each connected broker, the Lost or Departed it reported for each that ended (not one that
  moved or was revoked: rank 0 knows those). The broker says it again up every new link.
- Ignored: a routing id's stimulus for no live session never reaches the table (the adapter asks
  `live` first, and a message from a stale peer is a `Stale`). Any other pair the table does not
  list raises `Unexpected`, naming phase and stimulus.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from tbon import exitcodes
from tbon.overlay.links.connections import Connection, ConnectionLedger
from tbon.overlay.links.hello import (
    AskRankZero,
    Broker,
    Parent,
    Refusal,
    Welcome,
    hello_broker,
    judge_hello,
    judge_stale,
)
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.liveness import Liveness, Verdict
from tbon.overlay.links.sessions import (
    ChildSession,
    Connected,
    Ended,
    Expected,
    Sessions,
    Standings,
)
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.rankevents import Departed, Event, Lost, Moved, Online, Torpid
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message

INFO, WARNING = logging.INFO, logging.WARNING


@dataclass(frozen=True, slots=True)
class Timing:
    """The link's clocks (tbon.heartbeat, tbon.torpid, tbon.timeout), in seconds."""

    heartbeat: float
    torpid: float
    timeout: float


class Absent:
    """The phase key of a rank with no session here."""


# --- stimuli ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Rank 0 (or bootstrap) admits (rank, incarnation) by `key` ("": the shared key)."""

    rank: int
    incarnation: int
    key: str
    foster_until: float | None = None


@dataclass(frozen=True, slots=True)
class Withdraw:
    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Revoke:
    rank: int
    incarnation: int
    reason: str


@dataclass(frozen=True, slots=True)
class Retire:
    rank: int
    incarnation: int
    order: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Hello:
    """A hello on connection `fd` from the holder of a key bound to `key` (None: shared key)."""

    routing_id: bytes
    fd: int
    key: Identity | None
    hello: Message


@dataclass(frozen=True, slots=True)
class Rejoin:
    """A config-booted rank's broker is back (restarted on its host): rank 0 must raise the
    rank's incarnation before it is welcomed. `incarnation` is the one that ended. `fd` and
    `generation` name the connection the hello came on, which may close while rank 0 answers
    (no generation: whichever connection is on `fd` when it is welcomed)."""

    rank: int
    incarnation: int
    routing_id: bytes
    fd: int
    hello: Message
    generation: int | None = None


@dataclass(frozen=True, slots=True)
class Rejoined:
    """Rank 0's answer to a Rejoin: welcome as `incarnation`, or refuse (None) saying `why`."""

    rejoin: Rejoin
    incarnation: int | None
    why: str


@dataclass(frozen=True, slots=True)
class Heard:
    """A live child said something (any message is a sign of life)."""

    routing_id: bytes


@dataclass(frozen=True, slots=True)
class Goodbye:
    routing_id: bytes


@dataclass(frozen=True, slots=True)
class MovedAway:
    routing_id: bytes
    to: int


@dataclass(frozen=True, slots=True)
class Stale:
    """A message other than hello from a peer with no live session here."""

    routing_id: bytes
    sender: Identity
    what: str  # for the log


@dataclass(frozen=True, slots=True)
class Accepted:
    fd: int


@dataclass(frozen=True, slots=True)
class Closed:
    fd: int


@dataclass(frozen=True, slots=True)
class Settle:
    """The messages read so far are applied: judge the connections that closed."""


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class ShutdownBegan:
    pass


# what the machine makes of a hello, a close or the clock for one session


@dataclass(frozen=True, slots=True)
class Welcomed:
    routing_id: bytes
    connection: Connection
    broker: Broker


@dataclass(frozen=True, slots=True)
class Replaced:
    """Its host started a new broker (config bootstrap): the new one wins."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """Its connection closed, and it said no goodbye."""


@dataclass(frozen=True, slots=True)
class ToldShutdown:
    """Its broker knocked once the shutdown began, and was told to leave."""


Stimulus = (
    Admit
    | Withdraw
    | Revoke
    | Retire
    | Hello
    | Rejoined
    | Heard
    | Goodbye
    | MovedAway
    | Stale
    | Accepted
    | Closed
    | Settle
    | Tick
    | ShutdownBegan
)
ByRank = Admit | Withdraw | Revoke | Retire
ByRoute = Heard | Goodbye | MovedAway
_NEVER_HASTEN = (Heard, Settle)
"""Stimuli that bring no deadline sooner unless they give instructions (Downward.hastens)."""


# --- instructions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendWelcome:
    routing_id: bytes
    identity: Identity


@dataclass(frozen=True, slots=True)
class SendRefuse:
    routing_id: bytes
    reason: str
    exit_code: int


@dataclass(frozen=True, slots=True)
class SendControl:
    """A heartbeat, shutdown or retire order to a connected child."""

    routing_id: bytes
    topic: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Report:
    event: Event


@dataclass(frozen=True, slots=True)
class AskRejoin:
    rejoin: Rejoin


@dataclass(frozen=True, slots=True)
class AuthorizeKey:
    key: str
    identity: Identity


@dataclass(frozen=True, slots=True)
class RevokeKey:
    identity: Identity


@dataclass(frozen=True, slots=True)
class RevokeRank:
    """Revoke every key bound to `rank` (its admission is by the shared key now)."""

    rank: int


@dataclass(frozen=True, slots=True)
class Declined:
    """An order that could not be carried out, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the log."""

    level: int
    text: str


Instruction = (
    SendWelcome
    | SendRefuse
    | SendControl
    | Report
    | AskRejoin
    | AuthorizeKey
    | RevokeKey
    | RevokeRank
    | Declined
    | Note
)


class Unexpected(Exception):
    """A stimulus the table does not list for the phase it arrived in."""


# --- the machine --------------------------------------------------------------------------------

Handler = Callable[["Downward", Any, Any, float], list[Instruction]]


class Downward:
    def __init__(self, rank: int, topology: Topology, timing: Timing, phase: float = 0.0) -> None:
        """`phase`: the fraction of a heartbeat, in [0, 1), by which this parent's beats are
        late against a parent started at the same moment (the adapter draws it at random)."""
        self.rank = rank
        self.topology = topology
        self.timing = timing
        self.sessions = Sessions()  # knows its foster children's ranks (router.hop_down)
        self.retired: set[Identity] = set()  # told "retired" even once the rank is refilled
        self.shutting_down = False
        self.ledger: ConnectionLedger[ChildSession] = ConnectionLedger()
        self._by_routing: dict[bytes, ChildSession] = {}
        self._gone: list[ChildSession] = []  # off a closed connection; judged at Settle
        self._next_heartbeat = 0.0
        self._phase = phase
        # `next_deadline`'s answer, kept while no stimulus could have brought it sooner (see
        # `hastens`): a parent of many children walks them once per change, not once per turn
        self._soonest: float | None = None

    # --- what the adapter asks ------------------------------------------------------------

    def connected(self) -> list[int]:
        return [rank for rank, session in self.sessions.items() if session.connected]

    def attached(self, rank: int) -> bool:
        session = self.sessions.get(rank)
        return session is not None and session.connected

    @property
    def fosters(self) -> AbstractSet[int]:
        """Ranks whose session here is a foster child's (kept by Sessions: read, never change)."""
        return self.sessions.fosters

    def routing_id(self, rank: int) -> bytes | None:
        session = self.sessions.get(rank)
        return None if session is None else session.routing_id

    def live(self, routing_id: bytes, sender: Identity) -> bool:
        """Whether a message from `sender` on `routing_id` is from a live session here."""
        session = self._by_routing.get(routing_id)
        return session is not None and session.identity == sender and session.connected

    def session_on(self, routing_id: bytes) -> ChildSession | None:
        return self._by_routing.get(routing_id)

    def sent(self, routing_id: bytes, now: float) -> None:
        """The adapter sent the child on `routing_id` a message at `now`: a heartbeat to it is
        not needed for a while."""
        session = self._by_routing.get(routing_id)
        if session is not None and isinstance(phase := session.phase, Connected):
            phase.last_sent = now

    def census(self) -> list[Event]:
        """What this parent knows of its children, as the reports it made: an Online for each
        broker connected here, the Lost or Departed it reported for each that ended. Said again
        up a new link (this broker reattached, or came back as itself): a report in flight when
        the link went died with it, and rank 0 may have taken this parent's children for adrift.
        Rank 0's table takes what it knew already as a repeat, and refuses what is stale."""
        events: list[Event] = []
        for rank, session in sorted(self.sessions.items()):
            identity, phase = session.identity, session.phase
            if isinstance(phase, Connected) and session.broker is not None:
                host, pid = session.broker
                events.append(Online(rank, identity.incarnation, host, pid, self.rank, session.key))
            elif isinstance(phase, Ended) and phase.told is not None:
                events.append(phase.told)
        return events

    def awaited(self, now: float | None = None) -> list[int]:
        """What a shutdown waits for: the children connected, and the foster children still
        within their grace (told the instance is shutting down when they come)."""
        return [
            rank
            for rank, session in self.sessions.items()
            if session.connected
            or ((until := session.awaited_until) is not None and (now is None or now < until))
        ]

    def parent_view(self) -> Parent:
        """This parent as the hello judge sees it: each child's standing is built only if the
        judge asks for it (sessions.py's Standings), so a hello costs the same however many
        children this parent has."""
        children = Standings(self.sessions)
        return Parent(self.rank, self.topology, children, self.retired, self.shutting_down)

    def verdict_due(self, now: float) -> bool:
        """Whether some child's silence is about to be judged (torpid or lost) at `now`. None
        is while the soonest deadline kept, never later than the true one, is still ahead."""
        if self._soonest is not None and self._soonest > now:
            return False
        return any(
            (deadline := session.deadline()) is not None and deadline <= now
            for session in self.sessions.values()
        )

    @staticmethod
    def hastens(stimulus: Stimulus, instructions: list[Instruction]) -> bool:
        """Whether handling `stimulus` (with these `instructions` out) may have brought
        `next_deadline` sooner, so that the loop must recompute its timers at once. Only a
        Heard that changed no verdict cannot: hearing a child puts its silence's deadline off
        (a torpid child heard again is reported, and its torpid deadline comes back: sooner).
        Most of what a parent reads, so most reads leave the loop's timers as they are. Nor can
        a Settle that ended no session (no close was pending, or each was stale): it touches
        nothing but the closes it was to judge, and a parent settles after every read that
        drains its socket, which at a wire-up is most turns of the loop."""
        return bool(instructions) or type(stimulus) not in _NEVER_HASTEN

    def next_deadline(self) -> float:
        """The next heartbeat, silence judgement or foster grace due. Kept from the last walk
        of the sessions until a stimulus that `hastens` comes: one that does not can only have
        put a deadline off, so the kept one is at worst early (a wake-up that finds nothing due,
        and whose Tick walks them again)."""
        if self._soonest is None:
            soonest = self._next_heartbeat
            for session in self.sessions.values():
                deadline = session.deadline()
                if deadline is None:
                    deadline = session.awaited_until
                if deadline is not None and deadline < soonest:
                    soonest = deadline
            self._soonest = soonest
        return self._soonest

    # --- stimuli ------------------------------------------------------------------------------

    def handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        """Apply one stimulus at `now`; returns what to do. The deadline kept is dropped first
        (so a stimulus that raises leaves none) and kept again after one that cannot hasten."""
        kept, self._soonest = self._soonest, None
        instructions = self._handle(stimulus, now)
        if not self.hastens(stimulus, instructions):
            self._soonest = kept
        return instructions

    def _handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        session: ChildSession | None
        if isinstance(stimulus, ByRank):
            session = self.sessions.get(stimulus.rank)
            return self._dispatch(session, stimulus, now)
        if isinstance(stimulus, ByRoute):
            session = self._by_routing.get(stimulus.routing_id)
            return self._dispatch(session, stimulus, now)
        return self._rule("-", stimulus)(self, None, stimulus, now)

    def _dispatch(self, session: ChildSession | None, stimulus: Any, now: float) -> list:
        phase = Absent if session is None else type(session.phase)
        return self._rule(phase, stimulus)(self, session, stimulus, now)

    @staticmethod
    def _rule(phase: type | str, stimulus: Any) -> Handler:
        rule = TRANSITIONS.get((phase, type(stimulus)))
        if rule is None:
            name = phase if isinstance(phase, str) else phase.__name__
            raise Unexpected(f"can't handle {type(stimulus).__name__} when phase={name}")
        return rule

    # --- helpers ----------------------------------------------------------------------------

    def _unroute(self, session: ChildSession) -> None:
        """Its connection is no longer its own (it is ending): what comes on it is stale, and a
        welcome of the same session on another connection leaves no second way to it."""
        if session.routing_id is not None and self._by_routing.get(session.routing_id) is session:
            del self._by_routing[session.routing_id]

    def _end(self, session: ChildSession, how: str, why: str) -> list[Instruction]:
        """End its incarnation ("lost" or "departed") and say so. One that was retiring is
        retired whichever way it went: should it speak again, it is told so and exits 0. Its key
        is revoked unless it was lost (its own broker may come back when a partition heals; a
        new incarnation's key replaces it)."""
        identity = session.identity
        lost = how == "lost"
        self._unroute(session)
        out: list[Instruction] = []
        event: Lost | Departed
        if lost:
            out.append(Note(WARNING, f"rank {identity.rank} lost: {why}"))
            event = Lost(identity.rank, identity.incarnation, why, session.parent)
        else:
            gone = "retired" if session.retiring else "departed"
            out.append(Note(INFO, f"rank {identity.rank} {gone}"))
            event = Departed(identity.rank, identity.incarnation, session.parent)
        if session.retiring:
            session.phase = Ended("has retired", exitcodes.SHUTDOWN, told=event)
            self.retired.add(identity)
        elif lost:
            session.phase = Ended(f"was lost: {why}", exitcodes.LOST, not session.shared, event)
        else:
            session.phase = Ended(f"has {how}", exitcodes.LOST, told=event)
        if not session.returnable:
            out.append(RevokeKey(identity))
        self.ledger.forget(session)
        return [*out, Report(event)]

    def _forget(self, session: ChildSession) -> list[Instruction]:
        """Drop a foster session (or admission) whose broker is elsewhere, or never came."""
        rank = session.identity.rank
        if self.sessions.get(rank) is session:
            del self.sessions[rank]
        return [RevokeKey(session.identity)]


# --- transitions: rank 0's word -----------------------------------------------------------------


def admit(m: Downward, s: ChildSession | None, st: Admit, now: float) -> list[Instruction]:
    identity = Identity(st.rank, st.incarnation)
    if s is not None and s.identity == identity and (s.connected or _revoked(s)):
        return []
    out: list[Instruction] = [AuthorizeKey(st.key, identity) if st.key else RevokeRank(st.rank)]
    if s is not None and s.routing_id is not None:
        m._by_routing.pop(s.routing_id, None)
    foster = m.topology.parent(st.rank) != m.rank
    m.sessions[st.rank] = ChildSession(
        identity,
        Expected(st.foster_until if foster else None),
        key=st.key,
        shared=not st.key,
        foster=foster,
        expected=foster or not st.key,
        parent=m.rank,
    )
    return out


def _revoked(s: ChildSession) -> bool:
    return isinstance(s.phase, Ended) and s.phase.why.startswith("was revoked")


def withdraw(m: Downward, s: ChildSession | None, st: Withdraw, now: float) -> list[Instruction]:
    """Forget a moot foster admission (the rank reaches rank 0 through another broker, or its
    incarnation ended) unless its broker came: its own link's end is reported as any other."""
    if s is None or s.identity != Identity(st.rank, st.incarnation) or s.awaited_until is None:
        return []
    note = Note(INFO, f"rank {st.rank} incarnation {st.incarnation}: foster admission withdrawn")
    return [note, *m._forget(s)]


def revoke(m: Downward, s: ChildSession | None, st: Revoke, now: float) -> list[Instruction]:
    identity = Identity(st.rank, st.incarnation)
    if s is None or s.identity != identity:
        return [RevokeKey(identity)]
    if s.ended and not s.returnable:
        return []  # ended for good already, and answered so
    out: list[Instruction] = []
    if s.routing_id is not None:
        out.append(SendRefuse(s.routing_id, st.reason, exitcodes.REFUSED))
    m._unroute(s)
    s.phase = Ended(f"was revoked: {st.reason}", exitcodes.REFUSED)
    m.ledger.forget(s)
    text = f"rank {st.rank} incarnation {st.incarnation} revoked: {st.reason}"
    return [*out, Note(WARNING, text)]


def retire(m: Downward, s: ChildSession | None, st: Retire, now: float) -> list[Instruction]:
    if s is None or s.identity != Identity(st.rank, st.incarnation) or s.ended:
        return [
            Declined(
                f"rank {st.rank} incarnation {st.incarnation} is not a current child of this broker"
            )
        ]
    s.retiring = True
    if s.routing_id is None:
        return [Declined(f"rank {st.rank} is not connected")]
    note = Note(INFO, f"rank {st.rank} incarnation {st.incarnation}: retiring")
    return [SendControl(s.routing_id, "retire", st.order), note]


# --- transitions: hellos ------------------------------------------------------------------------


def hello(m: Downward, s: None, st: Hello, now: float) -> list[Instruction]:
    """Act on the judge's word on a hello."""
    payload = st.hello.payload
    connection = m.ledger.connection(st.fd)
    match judge_hello(payload, st.key, m.parent_view()):
        case Refusal() as refusal:
            rank = payload.get("rank")
            out = _refuse_hello(st.routing_id, rank, refusal)
            session = m.sessions.get(rank) if is_int(rank) else None
            if session is not None and refusal.exit_code == exitcodes.SHUTDOWN:
                out += m._dispatch(session, ToldShutdown(), now)
            return out
        case Welcome(identity):
            welcomed = Welcomed(st.routing_id, connection, hello_broker(payload))
            return m._dispatch(m.sessions[identity.rank], welcomed, now)
        case AskRankZero(rank, ended, replaces):
            out = []
            old = m.sessions.get(rank)
            if replaces and old is not None:
                out += m._dispatch(old, Replaced(), now)
            rejoin = Rejoin(rank, ended, st.routing_id, st.fd, st.hello, connection.generation)
            return [*out, AskRejoin(rejoin)]
    raise AssertionError("judge_hello returns a Judgement")


def _refuse_hello(routing_id: bytes, rank: Any, refusal: Refusal) -> list[Instruction]:
    return [
        Note(WARNING, f"refused hello from rank {rank}: {refusal.reason}"),
        SendRefuse(routing_id, refusal.reason, refusal.exit_code),
    ]


def rejoined(m: Downward, s: None, st: Rejoined, now: float) -> list[Instruction]:
    rejoin = st.rejoin
    if st.incarnation is None:
        refusal = Refusal(st.why, exitcodes.REFUSED)
        return _refuse_hello(rejoin.routing_id, rejoin.rank, refusal)
    session = ChildSession(Identity(rejoin.rank, st.incarnation), shared=True, parent=m.rank)
    m.sessions[rejoin.rank] = session
    connection = (
        m.ledger.connection(rejoin.fd)
        if rejoin.generation is None
        else Connection(rejoin.fd, rejoin.generation)
    )
    welcomed = Welcomed(rejoin.routing_id, connection, hello_broker(rejoin.hello.payload))
    return m._dispatch(session, welcomed, now)


def welcome(m: Downward, s: ChildSession, st: Welcomed, now: float) -> list[Instruction]:
    """Welcome a child on the hello's connection, which its session is tied to from now on (if
    it had said hello on another, that one's close is no longer news)."""
    if s.routing_id is not None:
        m._by_routing.pop(s.routing_id, None)
    timing = m.timing
    liveness = Liveness(timing.torpid, timing.timeout, now, pause_after=3 * timing.heartbeat)
    s.phase = Connected(st.routing_id, liveness)
    s.broker = host, pid = st.broker
    m._by_routing[st.routing_id] = s
    identity = s.identity
    online = Online(identity.rank, identity.incarnation, host, pid, m.rank, s.key)
    out: list[Instruction] = [SendWelcome(st.routing_id, identity), Report(online)]
    if not m.ledger.tie(s, st.connection):
        out += m._end(s, "lost", "connection dropped")
    return out


def welcome_first(m: Downward, s: ChildSession, st: Welcomed, now: float) -> list[Instruction]:
    """An expected broker's first hello: welcomed, unless it is a foster child's on a connection
    already closed. A seeking broker asks several ancestors at once and leaves those it gives up
    on: such a hello says nothing of where it is, and welcomed and lost at once it had rank 0
    declare lost a broker that ran on under the ancestor it kept, whose Online came later. Its
    admission stays, within its grace: it may knock again."""
    if s.foster and not m.ledger.is_open(st.connection):
        rank = s.identity.rank
        return [Note(INFO, f"ignored a hello of foster rank {rank} from a closed connection")]
    return welcome(m, s, st, now)


def welcome_again(m: Downward, s: ChildSession, st: Welcomed, now: float) -> list[Instruction]:
    """A broker welcomed before (back from a partition, or on a new connection): welcomed
    again, unless it has already left the connection its hello came on."""
    if not m.ledger.is_open(st.connection):
        return [Note(INFO, f"ignored a hello of rank {s.identity.rank} from a closed connection")]
    return welcome(m, s, st, now)


def replaced(m: Downward, s: ChildSession, st: Replaced, now: float) -> list[Instruction]:
    return m._end(s, "lost", "its host started a new broker")


def told_shutdown(m: Downward, s: ChildSession, st: ToldShutdown, now: float) -> list[Instruction]:
    """A foster child not connected here, told the instance is shutting down, leaves: nobody
    waits for it."""
    return m._forget(s) if s.foster else []


# --- transitions: a live child speaks -----------------------------------------------------------


def heard(m: Downward, s: ChildSession, st: Heard, now: float) -> list[Instruction]:
    assert isinstance(s.phase, Connected)
    if s.phase.liveness.heard(now) is Verdict.ALIVE:
        identity = s.identity
        return [Report(Torpid(identity.rank, identity.incarnation, False, s.parent))]
    return []


def goodbye(m: Downward, s: ChildSession, st: Goodbye, now: float) -> list[Instruction]:
    return m._end(s, "departed", "said goodbye")


def moved_away(m: Downward, s: ChildSession, st: MovedAway, now: float) -> list[Instruction]:
    """The child went home to its own parent (or on to another ancestor): this link ends
    without ending its incarnation."""
    identity = s.identity
    m._by_routing.pop(st.routing_id, None)
    s.phase = Ended("has moved to another parent", exitcodes.LOST)
    m.ledger.forget(s)
    out: list[Instruction] = [Note(INFO, f"rank {identity.rank} moved to rank {st.to}")]
    if s.foster:
        out += m._forget(s)
    else:
        out.append(RevokeKey(identity))
    return [*out, Report(Moved(identity.rank, identity.incarnation, m.rank, st.to))]


def stale(m: Downward, s: None, st: Stale, now: float) -> list[Instruction]:
    """Answer a broker whose incarnation has ended, so that it exits instead of lingering."""
    refusal = judge_stale(st.sender, m.parent_view())
    if refusal is None:
        return [Note(WARNING, f"dropped {st.what} from rank {st.sender.rank}: not connected")]
    return [SendRefuse(st.routing_id, refusal.reason, refusal.exit_code)]


# --- transitions: connections and the clock -----------------------------------------------------


def accepted(m: Downward, s: None, st: Accepted, now: float) -> list[Instruction]:
    m.ledger.accepted(st.fd)
    return []


def closed(m: Downward, s: None, st: Closed, now: float) -> list[Instruction]:
    """Only noted: applied at Settle, after what the connection delivered before it closed."""
    m._gone += m.ledger.closed(st.fd)
    return []


def settle(m: Downward, s: None, st: Settle, now: float) -> list[Instruction]:
    """End every session whose connection closed without a goodbye, unless it said hello again
    on another connection since."""
    out: list[Instruction] = []
    gone, m._gone = m._gone, []
    for session in gone:
        if session.connected and not m.ledger.tied(session):
            out += m._dispatch(session, Dropped(), now)
    return out


def dropped(m: Downward, s: ChildSession, st: Dropped, now: float) -> list[Instruction]:
    return m._end(s, "lost", "connection dropped")


def tick(m: Downward, s: None, st: Tick, now: float) -> list[Instruction]:
    """Heartbeats when due (to the children not sent anything lately), then each session's
    clock. The first interval is shortened by the phase, so that parents beat out of step."""
    out: list[Instruction] = []
    if now >= m._next_heartbeat:
        beat = m.timing.heartbeat
        m._next_heartbeat = now + beat * (1.0 - m._phase)
        m._phase = 0.0
        recent = now - beat / 2
        for session in m.sessions.values():
            phase = session.phase
            if isinstance(phase, Connected) and phase.last_sent <= recent:
                phase.last_sent = now
                out.append(SendControl(phase.routing_id, "heartbeat"))
    for session in list(m.sessions.values()):
        out += m._dispatch(session, st, now)
    return out


def silence(m: Downward, s: ChildSession, st: Tick, now: float) -> list[Instruction]:
    """What its silence at `now` makes it: torpid, lost (and so ended), or nothing new."""
    assert isinstance(s.phase, Connected)
    liveness = s.phase.liveness
    verdict = liveness.check(now)
    identity = s.identity
    if verdict is Verdict.TORPID:
        torpid = Torpid(identity.rank, identity.incarnation, True, s.parent)
        return [Note(WARNING, f"rank {identity.rank} is torpid"), Report(torpid)]
    if verdict is Verdict.LOST:
        return m._end(s, "lost", f"silent for {now - liveness.last_heard:.1f}s")
    return []


def grace(m: Downward, s: ChildSession, st: Tick, now: float) -> list[Instruction]:
    """A foster child that has not come within its grace: its parent was alive after all."""
    until = s.awaited_until
    return m._forget(s) if until is not None and now >= until else []


def shutdown_began(m: Downward, s: None, st: ShutdownBegan, now: float) -> list[Instruction]:
    m.shutting_down = True
    return _to_each_connected(m, "shutdown")


def _to_each_connected(m: Downward, topic: str) -> list[Instruction]:
    return [
        SendControl(session.routing_id, topic)
        for session in m.sessions.values()
        if session.routing_id is not None
    ]


def nothing(m: Downward, s: Any, st: Any, now: float) -> list[Instruction]:
    return []


TRANSITIONS: dict[tuple[type | str, type], Handler] = {
    # rank 0's word, about whatever session the rank has here
    **{(phase, Admit): admit for phase in (Absent, Expected, Connected, Ended)},
    **{(phase, Withdraw): withdraw for phase in (Absent, Expected, Connected, Ended)},
    **{(phase, Revoke): revoke for phase in (Absent, Expected, Connected, Ended)},
    **{(phase, Retire): retire for phase in (Absent, Expected, Connected, Ended)},
    # hellos, judged; and rank 0's answer to a shared-key broker back on its host
    ("-", Hello): hello,
    ("-", Rejoined): rejoined,
    (Expected, Welcomed): welcome_first,
    (Connected, Welcomed): welcome_again,
    (Ended, Welcomed): welcome_again,  # a lost one's own broker, back (the judge saw to that)
    (Connected, Replaced): replaced,
    (Expected, ToldShutdown): told_shutdown,
    (Connected, ToldShutdown): nothing,  # its connection's close (or goodbye) ends it
    (Ended, ToldShutdown): told_shutdown,
    # a live child speaks; a peer with no live session is answered or dropped
    (Connected, Heard): heard,
    (Connected, Goodbye): goodbye,
    (Connected, MovedAway): moved_away,
    ("-", Stale): stale,
    # connections
    ("-", Accepted): accepted,
    ("-", Closed): closed,
    ("-", Settle): settle,
    (Connected, Dropped): dropped,
    # the clock, and the shutdown
    ("-", Tick): tick,
    (Connected, Tick): silence,
    (Expected, Tick): grace,
    (Ended, Tick): nothing,
    ("-", ShutdownBegan): shutdown_began,
}
"""Every transition: (phase of the session concerned, Absent, or "-" for the machine as a whole;
stimulus type) -> handler."""
