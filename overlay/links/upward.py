"""A broker's way up the tree as a plain state machine: which link is its parent, what it does
when that link is lost, and when it gives up (docs/protocol.md §12). No sockets: stimuli in,
instructions out; uplink.py carries the instructions out on real links.

States.
- `Waiting`: bootstrap opened the first link and said hello; no welcome yet. Nothing goes up
  but the hello: what would is held (uplink.py) until the welcome.
- `Home`: attached to the topology parent. `Fostered`: attached to another ancestor, one rank 0
  told to take it in. `GoingHome`: fostered, with a link open (or about to be opened again) to
  the home parent's broker that rank 0 named. In all three the welcoming link is the parent,
  and nothing else is.
- `Seeking`: the parent link was lost; a link is open to each ancestor in the lineage (but this
  broker), and to each member of the root group it may seek (below), that has not refused it
  lately, until a deadline.
- `Ended`: the broker must exit with a code and a reason. It is final.

Links are named by an id (`LinkId`) that the machine hands out in its `Open` instructions. A
stimulus names the link it came on; the table is keyed by (state, stimulus type, the link's role
in that state): `parent`, `home` (the link home), `candidate` (an ancestor asked while seeking),
`dismissed` (a link told `moved`, kept open a while), or `-` for a stimulus of no link (an order,
the clock).

Rules.
- The first welcome attaches (Home or Fostered by the welcoming rank) and flushes the hold.
- A loss of the parent link (connection dropped, link full, the parent silent, or a `refuse` of
  75) starts a search if the broker may seek (`may_seek`): it is not stopping and its lineage
  names an ancestor, or the root group names a member it may seek. Otherwise the broker ends
  with 75. Any other `refuse` ends it with its code.
- The root group (docs/protocol.md §13.4): the members' cards come with the lineage (`group`;
  a welcome or lineage without one means none, a malformed one is dropped by the adapter and
  the cards known kept). Seeking, a broker asks its ancestors and, at the same time, the members
  `group_seeks` names: a non-member every member; a member only the members ranked below itself
  (rank 1 none: it waits to be elected), and the root of the latest term it knows of
  (`RootKnown`, from the term fence or the member's own machine) if that is not itself. So no
  two members ever seek each other, and no cycle forms: a member is sought only by higher
  members, by non-members, or as the root, which seeks nobody. A root learned while seeking is
  asked at once; a member fostered by another member that is not that root goes to the root
  as a rank goes home (`GoingHome`, the root's card in place of home's), since the table holds
  a member only under its parent or the root.
- While seeking, the first candidate to welcome it is its parent; every other candidate is
  dismissed (below). A candidate that refused the key at the handshake is
  asked again after RETRY_AFTER_KEY (rank 0's admission reaches it within a round trip); one
  that refused the hello with 75, or with 77 when this broker holds the instance's shared key
  (config bootstrap: every handshake lets it through), or that dropped, after RETRY_AFTER. A
  `refuse` of 0 (shutting down) ends the broker with 0; any other 77 ends it with 77.
- A broker whose parent's connection dropped (not one that fell silent, filled up or refused
  it) and that another ancestor welcomes says so up its new link (`ReportDropped`): the rank
  table believes it about that parent if nothing else holds a link to it (ranktable.py,
  Dropped). Welcomed by that same parent again, it says nothing: the link is back.
- The search ends (75) at its deadline: `reattach_timeout` after the loss, or sooner if the
  parent had said it was itself seeking (below).
- A broker that starts seeking tells its children when its search ends (`TellChildren`); a
  child attached to a seeking parent keeps that deadline (`parent_until`) and passes it on to its
  own children; a child welcomed later hears it right after its welcome (`search_until`).
  Should its parent then go, its own search ends no later than the parent's did:
  the parent had tried every ancestor the child would try, for the whole window. So rank 0's
  death takes the whole tree within `tbon.timeout` + `broker.reattach-timeout`, whatever its
  depth. A `lineage` message (the parent attached again) clears the deadline.
- The lineage is what the parent last said: a welcome's or a `lineage` message's. Each change
  is passed on to the children (`LineageChanged`). A parent welcomes no child before it is itself
  welcomed (`admits_children`), so that no child is given an empty lineage by a parent that has
  one coming.
- A home order while fostered opens a link home (GoingHome). Once welcomed there, the foster
  parent is dismissed. A key refused at home is asked again after RETRY_AFTER_KEY; any other end
  of the link home gives up going home (rank 0 will order it again). A home order naming the
  current parent is ignored; one while waiting, seeking, stopping or already going home
  elsewhere is declined with a reason.
- Dismissed: a link left for another is told `moved` and kept open, unread and without
  heartbeats, for DISMISS_WAIT, then closed. Closed right behind the `moved`, the link lost it
  at times (its handshake still under way, or the connection's close overtaking what the parent
  had not read), and the parent reported the broker lost instead of moved (issue 20, item 2).
  Any end of the link before then (dropped, silent, refused: the parent answered or went)
  closes it at once; a welcome or anything else on it is ignored. In every state but Waiting
  and Ended (which closes it with the rest), each Tick closes the dismissed links that are due.
- Stop (the broker's shutdown began) is a mode, not a state: a parent lost from then on is not
  sought; a search under way goes on (a parent found is told goodbye); a way home is abandoned.
- Ignored: anything once ended; a stimulus about a link the machine no longer holds (its socket
  may still hold input read in the same batch); Tick where no deadline is kept.
- A pair the table does not list is a peer or adapter at fault: `handle` raises `Unexpected`,
  naming state, stimulus and role; uplink.py logs it and drops the stimulus.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from tbon import exitcodes
from tbon.overlay.links.cards import Card  # rank, endpoint, public key (Z85)
from tbon.record import Record, replaced

LinkId = int

RETRY_AFTER = 0.25
"""Seconds before an ancestor that refused a hello (not yet told to expect it) is asked again."""

DISMISS_WAIT = 2.0
"""Seconds a link told `moved` stays open before it is closed: time for a handshake under way to
finish and for the parent to read the hello and the `moved` behind it, before the connection
closes."""

RETRY_AFTER_KEY = 0.05
"""Seconds before an ancestor that refused this broker's key is tried again: rank 0 tells the
foster parent to expect it within a round trip of the loss."""


# --- states -----------------------------------------------------------------------------------
# Records, not dataclasses, as every value class here: every broker with a parent defines them
# at its start (tbon/record.py); replaced() stands in for dataclasses.replace.


class Waiting(Record):
    __slots__ = __match_args__ = ("link",)

    def __init__(self, link: LinkId) -> None:
        self.link = link


class Home(Record):
    __slots__ = __match_args__ = ("link", "peer", "parent_until")

    def __init__(self, link: LinkId, peer: int, parent_until: float | None = None) -> None:
        self.link = link
        self.peer = peer
        self.parent_until = parent_until  # the parent's own search ends then (it said so)


class Fostered(Record):
    __slots__ = __match_args__ = ("link", "peer", "parent_until")

    def __init__(self, link: LinkId, peer: int, parent_until: float | None = None) -> None:
        self.link = link
        self.peer = peer
        self.parent_until = parent_until


class GoingHome(Record):
    __slots__ = __match_args__ = ("link", "peer", "card", "trying", "retry_at", "parent_until")

    def __init__(
        self,
        link: LinkId,
        peer: int,
        card: Card,
        trying: LinkId | None,
        retry_at: float | None = None,
        parent_until: float | None = None,
    ) -> None:
        self.link = link
        self.peer = peer
        self.card = card  # where rank 0 sent it
        self.trying = trying  # the link home; None while waiting for `retry_at`
        self.retry_at = retry_at
        self.parent_until = parent_until


class Seeking(Record):
    __slots__ = __match_args__ = ("until", "candidates", "retries", "dropped")

    def __init__(
        self,
        until: float,
        candidates: dict[int, LinkId] | None = None,
        retries: dict[int, float] | None = None,
        dropped: int | None = None,
    ) -> None:
        self.until = until
        # ancestor rank -> link
        self.candidates: dict[int, LinkId] = {} if candidates is None else candidates
        # ancestor rank -> ask again at
        self.retries: dict[int, float] = {} if retries is None else retries
        self.dropped = dropped  # the parent whose connection dropped, to be said once attached


class Ended(Record):
    __slots__ = __match_args__ = ("code", "reason")

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


State = Waiting | Home | Fostered | GoingHome | Seeking | Ended
Attached = Home | Fostered | GoingHome


# --- stimuli ------------------------------------------------------------------------------------


class Welcomed(Record):
    __slots__ = __match_args__ = ("link", "peer", "incarnation", "lineage", "group")

    def __init__(
        self,
        link: LinkId,
        peer: int,
        incarnation: int,
        lineage: tuple[Card, ...] | None,
        group: tuple[Card, ...] | None = None,
    ) -> None:
        self.link = link
        self.peer = peer
        self.incarnation = incarnation
        self.lineage = lineage  # None: the welcome carried none (malformed)
        self.group = group  # the root group's cards; None: malformed, kept


class LineageSaid(Record):
    """The parent sent its lineage again: it was welcomed anew, by whomever."""

    __slots__ = __match_args__ = ("link", "lineage", "group")

    def __init__(
        self, link: LinkId, lineage: tuple[Card, ...], group: tuple[Card, ...] | None = None
    ) -> None:
        self.link = link
        self.lineage = lineage
        self.group = group


class RootKnown(Record):
    """The root of the latest term this broker knows of (§13.3): a member may seek it."""

    __slots__ = __match_args__ = ("rank",)

    def __init__(self, rank: int) -> None:
        self.rank = rank


class LinkLost(Record):
    """The connection dropped, or the link is full (`full`: its broker stopped reading)."""

    __slots__ = __match_args__ = ("link", "reason", "full")

    def __init__(self, link: LinkId, reason: str, full: bool = False) -> None:
        self.link = link
        self.reason = reason
        self.full = full


class Silent(Record):
    """The peer said nothing for tbon.timeout (or never answered the hello)."""

    __slots__ = __match_args__ = ("link", "reason")

    def __init__(self, link: LinkId, reason: str) -> None:
        self.link = link
        self.reason = reason


class Refused(Record):
    """The peer refused this broker: its key at the CURVE handshake (`key`), or by `refuse`."""

    __slots__ = __match_args__ = ("link", "code", "reason", "key")

    def __init__(self, link: LinkId, code: int, reason: str, key: bool = False) -> None:
        self.link = link
        self.code = code
        self.reason = reason
        self.key = key


class ParentSeeking(Record):
    """The parent lost its own parent, and its search ends in `seconds`."""

    __slots__ = __match_args__ = ("link", "seconds")

    def __init__(self, link: LinkId, seconds: float) -> None:
        self.link = link
        self.seconds = seconds


class HomeOrder(Record):
    __slots__ = __match_args__ = ("card",)

    def __init__(self, card: Card) -> None:
        self.card = card


class Stop(Record):
    __slots__ = __match_args__ = ()


class Tick(Record):
    __slots__ = __match_args__ = ()


Loss = LinkLost | Silent | Refused
Stimulus = Welcomed | LineageSaid | Loss | ParentSeeking | HomeOrder | RootKnown | Stop | Tick


# --- instructions -------------------------------------------------------------------------------


class Linger(Enum):
    NONE = "none"  # drop what is queued
    BRIEF = "brief"  # a dismissed link at its end: a moment for anything still queued


class Open(Record):
    __slots__ = __match_args__ = ("link", "card", "incarnation")

    def __init__(self, link: LinkId, card: Card, incarnation: int) -> None:
        self.link = link
        self.card = card
        self.incarnation = incarnation


class Close(Record):
    __slots__ = __match_args__ = ("link", "linger")

    def __init__(self, link: LinkId, linger: Linger) -> None:
        self.link = link
        self.linger = linger


class SendMoved(Record):
    __slots__ = __match_args__ = ("link", "to")

    def __init__(self, link: LinkId, to: int) -> None:
        self.link = link
        self.to = to


class Flush(Record):
    """Send what was held to the parent now attached."""

    __slots__ = __match_args__ = ()

class AttachedTo(Record):
    __slots__ = __match_args__ = ("peer", "first", "why")

    def __init__(self, peer: int, first: bool, why: str) -> None:
        self.peer = peer
        self.first = first  # the first welcome of this broker's life
        self.why = why  # for the log


class Detached(Record):
    __slots__ = __match_args__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class LineageChanged(Record):
    __slots__ = __match_args__ = ("lineage",)

    def __init__(self, lineage: tuple[Card, ...]) -> None:
        self.lineage = lineage


class TellChildren(Record):
    """Tell every child this broker is seeking a parent until `until`."""

    __slots__ = __match_args__ = ("until",)

    def __init__(self, until: float) -> None:
        self.until = until


class Decline(Record):
    """An order this broker cannot follow now (or gave up following), and why."""

    __slots__ = __match_args__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class ReportDropped(Record):
    """Tell rank 0, up the parent link now attached, that the connection to `parent` dropped."""

    __slots__ = __match_args__ = ("parent", "reason")

    def __init__(self, parent: int, reason: str) -> None:
        self.parent = parent
        self.reason = reason


class Exit(Record):
    __slots__ = __match_args__ = ("code", "reason")

    def __init__(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


Instruction = (
    Open
    | Close
    | SendMoved
    | Flush
    | AttachedTo
    | Detached
    | LineageChanged
    | TellChildren
    | Decline
    | ReportDropped
    | Exit
)


class Unexpected(Exception):
    """A stimulus the table does not list for the state it arrived in."""


# --- the machine --------------------------------------------------------------------------------

Handler = Callable[["Upward", Any, str, float], list[Instruction]]


class Upward:
    def __init__(
        self,
        rank: int,
        home: int,
        incarnation: int,
        reattach_timeout: float,
        shared_key: bool = False,
    ) -> None:
        """A broker of `rank` whose topology parent is `home`, its first link (id 0) opened and
        the hello said on it as `incarnation`."""
        self.rank, self.home = rank, home
        self.incarnation = incarnation
        self.reattach_timeout = reattach_timeout
        self.shared_key = shared_key
        self.lineage: tuple[Card, ...] = ()
        self.group: tuple[Card, ...] = ()  # the root group's members (§13.4)
        self.root: int | None = None  # the root of the latest term known, once past rank 0
        self.stopping = False
        self.state: State = Waiting(0)
        self._next_link = 1
        self.open_links: set[LinkId] = {0}
        self.dismissed: dict[LinkId, float] = {}  # told `moved`: closed at that time

    # --- what the adapter asks ------------------------------------------------------------

    @property
    def parent_link(self) -> LinkId | None:
        """The link to the parent, while attached: the one link anything is sent up on."""
        return self.state.link if isinstance(self.state, Attached) else None

    @property
    def peer(self) -> int | None:
        return self.state.peer if isinstance(self.state, Attached) else None

    @property
    def search_until(self) -> float | None:
        """When this broker's search for a parent ends, or its parent's (which its own would not
        outlast): what every child must hear, those welcomed since as well as those told as it
        began (docs/protocol.md §5.6). None: nobody above it seeks, as far as it knows."""
        state = self.state
        if isinstance(state, Seeking):
            return state.until
        return state.parent_until if isinstance(state, Attached) else None

    @property
    def admits_children(self) -> bool:
        """Whether this broker has been welcomed once (so its children get a lineage)."""
        return not isinstance(self.state, Waiting)

    def role(self, link: LinkId) -> str | None:
        """What `link` is to this broker now; None: not one it holds."""
        state = self.state
        if link in self.dismissed:
            return "dismissed"
        if isinstance(state, Waiting | Home | Fostered | GoingHome) and link == state.link:
            return "parent"
        if isinstance(state, GoingHome) and link == state.trying:
            return "home"
        if isinstance(state, Seeking) and link in state.candidates.values():
            return "candidate"
        return None

    def next_deadline(self) -> float | None:
        state = self.state
        if not self.dismissed and not isinstance(state, (Seeking, GoingHome)):  # most turns
            return None
        deadlines = list(self.dismissed.values())
        if isinstance(state, Seeking):
            deadlines += [state.until, *state.retries.values()]
        if isinstance(state, GoingHome) and state.retry_at is not None:
            deadlines.append(state.retry_at)
        return min(deadlines) if deadlines else None

    def handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        """Apply one stimulus at `now`; returns what to do."""
        if isinstance(self.state, Ended):
            return []
        link = getattr(stimulus, "link", None)
        role = "-" if link is None else self.role(link)
        if role is None:
            return []  # a link closed already: late input from it
        rule = TRANSITIONS.get((type(self.state), type(stimulus), role))
        if rule is None:
            raise Unexpected(
                f"can't handle {type(stimulus).__name__} on a {role} link"
                f" when state={type(self.state).__name__}"
            )
        return rule(self, stimulus, role, now)

    # --- helpers ----------------------------------------------------------------------------

    def _open(self, card: Card) -> Open:
        link = self._next_link
        self._next_link += 1
        self.open_links.add(link)
        return Open(link, card, self.incarnation)

    def _close(self, link: LinkId, linger: Linger) -> Close:
        self.open_links.discard(link)
        self.dismissed.pop(link, None)
        return Close(link, linger)

    def _dismiss(self, link: LinkId, to: int, now: float) -> SendMoved:
        """Tell `link`'s parent this broker went to `to`; the link stays open a while."""
        self.dismissed[link] = now + DISMISS_WAIT
        return SendMoved(link, to)

    def _cards(self) -> list[Card]:
        return [card for card in self.lineage if card[0] != self.rank]

    def _seek_cards(self) -> list[Card]:
        """Whom a search asks: the ancestors first, then the members `group_seeks` names."""
        cards = self._cards()
        known = {card[0] for card in cards}
        more = group_seeks(self.rank, self.group, self.root)
        return cards + [card for card in more if card[0] not in known]

    def _end(self, code: int, reason: str) -> list[Instruction]:
        closing = [self._close(link, Linger.NONE) for link in sorted(self.open_links)]
        self.state = Ended(code, reason)
        return [*closing, Exit(code, reason)]

    def _attach(self, link: LinkId, peer: int) -> Home | Fostered:
        return Home(link, peer) if peer == self.home else Fostered(link, peer)


# --- guards -------------------------------------------------------------------------------------


def may_seek(machine: Upward) -> str | None:
    """A lost parent is sought again unless the broker is stopping or knows nobody to ask."""
    if machine.stopping:
        return "shutting down"
    if not machine._seek_cards():
        return "no ancestor known to ask"
    return None


def group_seeks(rank: int, group: tuple[Card, ...], root: int | None) -> list[Card]:
    """The root group's members a broker of `rank` asks while seeking, in rank order: every
    member, if it is not one; else the members ranked below it, and `root` (the root of the
    latest term it knows of) if that is a member other than itself."""
    members = {card[0]: card for card in group}
    if rank not in members:
        return [members[r] for r in sorted(members)]
    ranks = {r for r in members if r < rank}
    if root is not None and root != rank and root in members:
        ranks.add(root)
    return [members[r] for r in sorted(ranks)]


def asks_again(machine: Upward, refused: Refused) -> bool:
    """A candidate's refusal that a retry may turn: its key not yet admitted, a lost broker told
    so (75), or a shared-key broker whose hello was not yet expected."""
    if refused.key or refused.code == exitcodes.LOST:
        return True
    return refused.code == exitcodes.REFUSED and machine.shared_key


# --- transitions --------------------------------------------------------------------------------


def welcome_first(m: Upward, s: Welcomed, role: str, now: float) -> list[Instruction]:
    m.incarnation = s.incarnation
    m.state = m._attach(s.link, s.peer)
    welcomed = AttachedTo(s.peer, True, "welcomed by the parent")
    return [welcomed, *_adopt(m, s.lineage, s.group), Flush()]


def lineage_said(m: Upward, s: LineageSaid, role: str, now: float) -> list[Instruction]:
    """The parent was welcomed again: its search is over, and its ancestors may have changed."""
    assert isinstance(m.state, Attached)
    m.state = replaced(m.state, parent_until=None)
    return _adopt(m, s.lineage, s.group)


def _adopt(
    m: Upward, lineage: tuple[Card, ...] | None, group: tuple[Card, ...] | None
) -> list[Instruction]:
    """What the parent said: its lineage (None: malformed, kept) and the group's cards (None:
    malformed, kept)."""
    regrouped = group is not None and group != m.group
    if group is not None:
        m.group = group
    if lineage is None and not regrouped:
        return []
    if lineage is not None:
        m.lineage = lineage
    return [LineageChanged(m.lineage)]


def parent_lost(m: Upward, s: Loss, role: str, now: float) -> list[Instruction]:
    """The parent link is over: seek, or end."""
    if isinstance(s, Refused) and s.code != exitcodes.LOST:
        return m._end(s.code, s.reason)
    if may_seek(m) is not None:
        return m._end(exitcodes.LOST, s.reason)
    state = m.state
    assert isinstance(state, Attached)
    out: list[Instruction] = [m._close(state.link, Linger.NONE)]
    if isinstance(state, GoingHome) and state.trying is not None:
        out.append(m._close(state.trying, Linger.NONE))
    until = now + m.reattach_timeout
    if state.parent_until is not None:
        until = min(until, state.parent_until)
    if until <= now:
        return out + m._end(
            exitcodes.LOST, f"{s.reason}; the parent's own search for a parent had ended"
        )
    opens = [m._open(card) for card in m._seek_cards()]
    dropped = state.peer if isinstance(s, LinkLost) and not s.full else None
    m.state = Seeking(until, {o.card[0]: o.link for o in opens}, dropped=dropped)
    return [*out, Detached(s.reason), TellChildren(until), *opens]


def waiting_ended(m: Upward, s: Loss, role: str, now: float) -> list[Instruction]:
    """No welcome: the first link's end is the broker's."""
    code = s.code if isinstance(s, Refused) else exitcodes.LOST
    return m._end(code, s.reason)


def parent_seeking(m: Upward, s: ParentSeeking, role: str, now: float) -> list[Instruction]:
    assert isinstance(m.state, Attached)
    until = now + max(0.0, s.seconds)
    m.state = replaced(m.state, parent_until=until)
    return [TellChildren(until)]


def candidate_welcomed(m: Upward, s: Welcomed, role: str, now: float) -> list[Instruction]:
    """The first ancestor to welcome it is its parent; the others are dismissed."""
    state = m.state
    assert isinstance(state, Seeking)
    out: list[Instruction] = []
    for _rank, link in sorted(state.candidates.items()):
        if link != s.link:
            out.append(m._dismiss(link, s.peer, now))
    m.incarnation = s.incarnation
    m.state = m._attach(s.link, s.peer)
    out.append(AttachedTo(s.peer, False, f"reattached under rank {s.peer}"))
    out += [*_adopt(m, s.lineage or m.lineage, s.group), Flush()]
    if state.dropped is not None and state.dropped != s.peer:
        out.append(ReportDropped(state.dropped, DROPPED))
    return out


def candidate_refused(m: Upward, s: Refused, role: str, now: float) -> list[Instruction]:
    if s.code == exitcodes.SHUTDOWN or not asks_again(m, s):
        return m._end(s.code, s.reason)
    return _drop(m, s.link, now + (RETRY_AFTER_KEY if s.key else RETRY_AFTER))


def candidate_gone(m: Upward, s: LinkLost | Silent, role: str, now: float) -> list[Instruction]:
    return _drop(m, s.link, now + RETRY_AFTER)


def _drop(m: Upward, link: LinkId, retry_at: float) -> list[Instruction]:
    state = m.state
    assert isinstance(state, Seeking)
    rank = next(r for r, candidate in state.candidates.items() if candidate == link)
    candidates = {r: c for r, c in state.candidates.items() if r != rank}
    m.state = replaced(state, candidates=candidates, retries={**state.retries, rank: retry_at})
    return [m._close(link, Linger.NONE)]


def seeking_tick(m: Upward, s: Tick, role: str, now: float) -> list[Instruction]:
    """The search's deadline, then its retries."""
    state = m.state
    assert isinstance(state, Seeking)
    if now >= state.until:
        return m._end(
            exitcodes.LOST, "lost the parent, and no live ancestor took this broker back in time"
        )
    due = [rank for rank, when in state.retries.items() if now >= when]
    if not due:
        return []
    cards = {card[0]: card for card in m._seek_cards()}
    opens = [m._open(cards[rank]) for rank in sorted(due) if rank in cards]
    retries = {r: w for r, w in state.retries.items() if r not in due}
    candidates = {**state.candidates, **{o.card[0]: o.link for o in opens}}
    m.state = replaced(state, candidates=candidates, retries=retries)
    return list(opens)


def home_order(m: Upward, s: HomeOrder, role: str, now: float) -> list[Instruction]:
    state = m.state
    assert isinstance(state, Attached)
    if s.card[0] == state.peer:
        return []  # home already
    if m.stopping:
        return [Decline("this broker is shutting down")]
    if s.card[0] != m.home:
        return [Decline(f"rank {s.card[0]} is not this broker's parent")]
    out: list[Instruction] = []
    if isinstance(state, GoingHome) and state.trying is not None:
        out.append(m._close(state.trying, Linger.NONE))
    opened = m._open(s.card)
    m.state = GoingHome(state.link, state.peer, s.card, opened.link, None, state.parent_until)
    return [*out, opened]


def _to_the_root(m: Upward, state: Fostered, root: int) -> list[Instruction]:
    """A member that the dead root's death left under another member (with K=4 the members
    seek the members below them, and the first to welcome wins, §13.4) moves under the root
    once it knows it, as a rank goes home: the rank table holds a member only under its own
    parent or the root, so its word on this link would not be believed, and the member it
    hangs under reports on nobody outside its own subtree."""
    cards = {card[0]: card for card in m.group}
    if m.stopping or m.rank not in cards or root not in cards:
        return []
    if root in (m.rank, state.peer) or state.peer not in cards:
        return []
    opened = m._open(cards[root])
    m.state = GoingHome(state.link, state.peer, cards[root], opened.link, None, state.parent_until)
    return [opened]


def declined(reason: str) -> Handler:
    def decline(m: Upward, s: HomeOrder, role: str, now: float) -> list[Instruction]:
        return [Decline(reason)]

    return decline


def home_welcomed(m: Upward, s: Welcomed, role: str, now: float) -> list[Instruction]:
    state = m.state
    assert isinstance(state, GoingHome)
    out: list[Instruction] = [m._dismiss(state.link, s.peer, now)]
    m.incarnation = s.incarnation
    m.state = m._attach(s.link, s.peer)
    out.append(AttachedTo(s.peer, False, f"home again under rank {s.peer}"))
    return [*out, *_adopt(m, s.lineage or m.lineage, s.group)]


def home_refused(m: Upward, s: Loss, role: str, now: float) -> list[Instruction]:
    """A key refused at home is tried again soon; anything else gives up going home."""
    state = m.state
    assert isinstance(state, GoingHome) and state.trying is not None
    out: list[Instruction] = [m._close(state.trying, Linger.NONE)]
    if isinstance(s, Refused) and s.key:
        m.state = replaced(state, trying=None, retry_at=now + RETRY_AFTER_KEY)
        return out
    m.state = Fostered(state.link, state.peer, state.parent_until)
    return [*out, Decline(f"going home to rank {state.card[0]}: {s.reason}")]


def home_retry(m: Upward, s: Tick, role: str, now: float) -> list[Instruction]:
    state = m.state
    assert isinstance(state, GoingHome)
    if state.trying is not None or state.retry_at is None or now < state.retry_at:
        return []
    opened = m._open(state.card)
    m.state = replaced(state, trying=opened.link, retry_at=None)
    return [opened]


def root_known(m: Upward, s: RootKnown, role: str, now: float) -> list[Instruction]:
    """A later term's root: remembered; a search under way asks it at once if it may, and a
    member fostered by another member that is not the root goes to the root (`_to_the_root`)."""
    m.root = s.rank
    state = m.state
    if isinstance(state, Fostered):
        return _to_the_root(m, state, s.rank)
    if not isinstance(state, Seeking):
        return []
    asked = {*state.candidates, *state.retries}
    opens = [m._open(card) for card in m._seek_cards() if card[0] not in asked]
    candidates = {**state.candidates, **{o.card[0]: o.link for o in opens}}
    m.state = replaced(state, candidates=candidates)
    return list(opens)


def stop(m: Upward, s: Stop, role: str, now: float) -> list[Instruction]:
    m.stopping = True
    state = m.state
    if isinstance(state, GoingHome):
        out: list[Instruction] = []
        if state.trying is not None:
            out.append(m._close(state.trying, Linger.NONE))
        m.state = Fostered(state.link, state.peer, state.parent_until)
        return out
    return []


def nothing(m: Upward, s: Stimulus, role: str, now: float) -> list[Instruction]:
    return []


def dismissed_ended(m: Upward, s: Loss, role: str, now: float) -> list[Instruction]:
    """A dismissed link's parent answered or went: nothing is left to wait for."""
    return [m._close(s.link, Linger.NONE)]


def ticking(handler: Handler) -> Handler:
    """A Tick closes the dismissed links that are due, then is the state's own."""

    def tick(m: Upward, s: Tick, role: str, now: float) -> list[Instruction]:
        due = sorted(link for link, when in m.dismissed.items() if now >= when)
        return [*(m._close(link, Linger.BRIEF) for link in due), *handler(m, s, role, now)]

    return tick


SEEKING_NOW = "this broker is seeking a parent"
DROPPED = "connection dropped"  # as a parent words a child's drop (children.py)

TRANSITIONS: dict[tuple[type, type, str], Handler] = {
    # waiting for the first welcome
    (Waiting, Welcomed, "parent"): welcome_first,
    (Waiting, LinkLost, "parent"): waiting_ended,
    (Waiting, Silent, "parent"): waiting_ended,
    (Waiting, Refused, "parent"): waiting_ended,
    (Waiting, HomeOrder, "-"): declined("this broker has not been welcomed yet"),
    (Waiting, Stop, "-"): stop,
    **{
        (state, RootKnown, "-"): root_known
        for state in (Waiting, Home, Fostered, GoingHome, Seeking)
    },
    (Waiting, Tick, "-"): nothing,
    # attached: home, fostered, going home (the parent link alike in all three)
    **{
        (state, stimulus, "parent"): handler
        for state in (Home, Fostered, GoingHome)
        for stimulus, handler in (
            (LineageSaid, lineage_said),
            (LinkLost, parent_lost),
            (Silent, parent_lost),
            (Refused, parent_lost),
            (ParentSeeking, parent_seeking),
        )
    },
    (Home, HomeOrder, "-"): home_order,
    (Fostered, HomeOrder, "-"): home_order,
    (GoingHome, HomeOrder, "-"): home_order,
    (Home, Stop, "-"): stop,
    (Fostered, Stop, "-"): stop,
    (GoingHome, Stop, "-"): stop,
    (Home, Tick, "-"): ticking(nothing),
    (Fostered, Tick, "-"): ticking(nothing),
    (GoingHome, Tick, "-"): ticking(home_retry),
    # the link home
    (GoingHome, Welcomed, "home"): home_welcomed,
    (GoingHome, Refused, "home"): home_refused,
    (GoingHome, LinkLost, "home"): home_refused,
    (GoingHome, Silent, "home"): home_refused,
    # seeking
    (Seeking, Welcomed, "candidate"): candidate_welcomed,
    (Seeking, Refused, "candidate"): candidate_refused,
    (Seeking, LinkLost, "candidate"): candidate_gone,
    (Seeking, Silent, "candidate"): candidate_gone,
    (Seeking, Tick, "-"): ticking(seeking_tick),
    (Seeking, Stop, "-"): stop,
    (Seeking, HomeOrder, "-"): declined(SEEKING_NOW),
    # a dismissed link, in any state that may hold one
    **{
        (state, stimulus, "dismissed"): handler
        for state in (Home, Fostered, GoingHome, Seeking)
        for stimulus, handler in (
            (Welcomed, nothing),
            (LineageSaid, nothing),
            (ParentSeeking, nothing),
            (LinkLost, dismissed_ended),
            (Silent, dismissed_ended),
            (Refused, dismissed_ended),
        )
    },
}
"""Every transition: (state, stimulus, role of its link) -> handler. Ended is absent: it ignores
everything (see the rules)."""
