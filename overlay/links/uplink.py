"""A broker's links up the tree, on real sockets: the adapter around the machine of upward.py
(docs/protocol.md §12).

The machine decides (which link is the parent, when to seek, go home or give up); this module
owns the `ParentLink`s it names by id, turns what they read into stimuli, and carries out the
instructions that come back. What it tells the broker is an `UplinkNews`.

While no parent is attached (before the first welcome, or seeking), what goes up waits here,
bounded: responses (job output, answers to requests from above) and reports, so that a stream
survives its path's repair. A response names the parent it came from ("p<rank>"); when it leaves
by another (a foster parent), the hops that the brokers in between pushed are taken off first
(`_skip_to`), so the foster parent finds its own on top. Requests of its own subtree's are not
held: the router fails them (EHOSTUNREACH) at once.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable

from tbon import exitcodes
from tbon.overlay.links import upward
from tbon.overlay.links.parent import LinkEnded, ParentInbound, ParentLink
from tbon.overlay.links.upward import Card, Linger, LinkId, Upward
from tbon.overlay.state.rankevents import Dropped, Event
from tbon.overlay.state.reports import decode_events, encode_events
from tbon.overlay.state.terms import News, Refuse, Terms
from tbon.overlay.wire.flow import LINK_HWM
from tbon.overlay.wire.message import Kind, Message, MessageError
from tbon.overlay.wire.route import parent_hop
from tbon.record import Record

log = logging.getLogger("tbon.parent")

__all__ = ["Card", "Uplink", "UplinkNews"]

DISMISS_LINGER_MS = 200
"""How long what is still queued on a dismissed link may take to leave once it is closed: its
`moved` was sent upward.DISMISS_WAIT before."""

HELD_BYTES = 64 << 20
"""The most a broker holds for its parent while it has none (besides LINK_HWM messages)."""


class UplinkNews(Record):
    """What one read of (or one tick on) the links up means to the broker."""

    __slots__ = __match_args__ = (
        "attached",
        "first",
        "detached",
        "ended",
        "shutdown",
        "retire",
        "lineage",
        "seeking_until",
        "declined",
        "messages",
        "peer",
        "terms",
    )
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        attached: bool = False,
        first: bool = False,
        detached: str = "",
        ended: LinkEnded | None = None,
        shutdown: bool = False,
        retire: dict | None = None,
        lineage: bool = False,
        seeking_until: float | None = None,
        declined: str = "",
        messages: list[Message] | None = None,
        peer: int | None = None,
        terms: list[News] | None = None,
    ) -> None:
        self.attached = attached  # attached now (first welcome, reattached, or moved home)
        self.first = first  # ... and it is the first welcome of this broker's life
        self.detached = detached  # the link to the parent is lost: seeking (why)
        self.ended = ended  # exit with this
        self.shutdown = shutdown
        self.retire = retire
        self.lineage = lineage  # the lineage changed: tell the children
        self.seeking_until = seeking_until  # tell the children this broker seeks until then
        self.declined = declined  # an order it could not follow (going home)
        self.messages: list[Message] = [] if messages is None else messages
        self.peer = peer  # the parent the messages came from
        self.terms: list[News] = [] if terms is None else terms  # what the term fence learned


Opener = Callable[[Card, int], ParentLink]
"""Opens a link to an ancestor's card, saying hello as the given incarnation."""


class Uplink:
    def __init__(
        self,
        first: ParentLink,
        opener: Opener,
        reattach_timeout: float,
        watch: Callable[[ParentLink], None],
        unwatch: Callable[[ParentLink], None],
        terms: Terms | None = None,
    ) -> None:
        """`first` is the link bootstrap opened; `opener` opens more; `watch`/`unwatch` have the
        broker's loop poll a link's sockets, or stop; `terms`, the broker's term fence, is raised
        by welcomes and lineages and judges a parent's `retire` and `shutdown` (§13.3)."""
        home = first.peer if first.peer is not None else -1
        self.machine = Upward(
            first.rank, home, first.incarnation, reattach_timeout, shared_key=first.shared_key
        )
        self.open = opener
        self.watch, self.unwatch = watch, unwatch
        self._links: dict[LinkId, ParentLink] = {0: first}
        self._ids: dict[ParentLink, LinkId] = {first: 0}
        self.held: deque[tuple[Message, int | None]] = deque()
        self._held_bytes = 0
        self._dropped = False
        self.terms = terms if terms is not None else Terms(first.rank, leading=False)
        watch(first)

    # --- state, as the broker and the router ask it -------------------------------------------

    @property
    def link(self) -> ParentLink | None:
        """The link to the parent while attached (or the first, while waiting for its welcome)."""
        state = self.machine.state
        if isinstance(state, upward.Waiting):
            return self._links.get(state.link)
        parent = self.machine.parent_link
        return None if parent is None else self._links.get(parent)

    @property
    def welcomed(self) -> bool:
        """Attached to a parent now (not seeking, not waiting for the first welcome)."""
        return self.machine.parent_link is not None

    @property
    def admits_children(self) -> bool:
        return self.machine.admits_children

    @property
    def peer(self) -> int | None:
        return self.machine.peer

    @property
    def incarnation(self) -> int:
        return self.machine.incarnation

    @property
    def lineage(self) -> tuple[Card, ...]:
        return self.machine.lineage

    @property
    def group(self) -> tuple[Card, ...]:
        """The root group's cards, as the parent last said them (docs/protocol.md §13.4)."""
        return self.machine.group

    def seeking_for(self, now: float) -> float | None:
        """What a child welcomed now is told right after its welcome: the seconds left of this
        broker's search for a parent, or of its parent's (upward.search_until); None: none."""
        until = self.machine.search_until
        return None if until is None else seeking_seconds(until, now)

    @property
    def overflow(self) -> LinkEnded | None:
        link = self.link
        return link.overflow if link is not None and self.welcomed else None

    def holds(self, link: ParentLink) -> bool:
        """Whether `link` is still one of this broker's links up (a read may close it)."""
        return link in self._ids

    def links(self) -> list[ParentLink]:
        return list(self._links.values())

    # --- sending up ---------------------------------------------------------------------------

    def send(self, message: Message) -> bool:
        """Send to the parent, or hold it while there is none; False if it could not be held."""
        link = self.link if self.welcomed else None
        if link is not None:
            link.send(message)
            return True
        return self._hold(message, None)

    def send_response(self, reply: Message, came_from: int | None) -> bool:
        """Send a response up toward the parent it came from (`came_from`), taking off the hops
        of brokers the link skips now; False if its way up is gone."""
        link = self.link if self.welcomed else None
        if link is None:
            return self._hold(reply, came_from)
        if not _skip_to(reply, came_from, link.peer):
            return False
        link.send(reply)
        return True

    def _hold(self, message: Message, came_from: int | None) -> bool:
        if isinstance(self.machine.state, upward.Ended):
            return False
        size = len(message.data) if message.data else 0
        if len(self.held) >= LINK_HWM or self._held_bytes + size > HELD_BYTES:
            if not self._dropped:
                log.warning("no parent yet: dropped what no longer fits in the hold")
                self._dropped = True
            return False
        self.held.append((message, came_from))
        self._held_bytes += size
        return True

    def take_reports(self) -> list[Event]:
        """The reports held for a parent that never came, taken out to be applied here: this
        broker took over as the root (docs/protocol.md §13.4)."""
        events: list[Event] = []
        kept: deque[tuple[Message, int | None]] = deque()
        for message, came_from in self.held:
            if message.kind is Kind.CONTROL and message.topic == "report":
                try:
                    events += decode_events(message.payload)
                except MessageError as error:
                    log.warning("dropped a held report: %s", error)
                continue
            kept.append((message, came_from))
        self.held = kept
        return events

    def _flush(self) -> None:
        held, self.held, self._held_bytes, self._dropped = self.held, deque(), 0, False
        for message, came_from in held:
            if message.kind is Kind.RESPONSE:
                self.send_response(message, came_from)
            else:
                self.send(message)

    # --- input --------------------------------------------------------------------------------

    def read(self, link: ParentLink, now: float) -> UplinkNews | None:
        """One message from `link`; None if there was nothing in it for the broker (a heartbeat,
        answered by the link: the one message of an idle link, kept cheap)."""
        inbound: ParentInbound | None = link.read(now)
        if inbound is None:
            return None
        news = UplinkNews()
        lid = self._ids.get(link)
        if lid is None:
            return news
        if inbound.welcomed or inbound.lineage is not None:
            cards = inbound.lineage
            news.terms += self.terms.heard(inbound.term, cards[0][0] if cards else None)
        if inbound.welcomed:
            assert link.peer is not None or lid == 0
            peer = link.peer if link.peer is not None else self.machine.home
            lineage = _cards(inbound.lineage)
            welcomed = upward.Welcomed(lid, peer, link.incarnation, lineage, inbound.group)
            self._feed(welcomed, now, news)
        elif inbound.lineage is not None:
            lineage = _cards(inbound.lineage)
            assert lineage is not None
            self._feed(upward.LineageSaid(lid, lineage, inbound.group), now, news)
        if inbound.seeking is not None:
            self._feed(upward.ParentSeeking(lid, inbound.seeking), now, news)
        if lid == self.machine.parent_link:
            news.messages, news.peer = inbound.messages, link.peer
            if inbound.shutdown or inbound.retire is not None:
                self._order(inbound, news)
        if inbound.ended is not None:
            ended = inbound.ended
            self._feed(upward.Refused(lid, ended.exit_code, ended.reason), now, news)
        return news

    def _order(self, inbound: ParentInbound, news: UplinkNews) -> None:
        """A parent's `shutdown` or `retire`, passed on the root's order: obeyed unless of a
        stale term (or of no term at all); a control has no answer, so the refusal is logged."""
        verdict, learned = self.terms.order(inbound.term, None)
        news.terms += learned
        if isinstance(verdict, Refuse):
            topic = "shutdown" if inbound.shutdown else "retire"
            log.warning("did not obey the parent's %s: %s", topic, verdict.errstr)
            return
        news.shutdown, news.retire = inbound.shutdown, inbound.retire

    def monitor(self, link: ParentLink, now: float) -> UplinkNews:
        """Connection events of `link`: a drop, or its key refused at the handshake."""
        news = UplinkNews()
        ended = link.drain_monitor()
        lid = self._ids.get(link)
        if ended is None or lid is None:
            return news
        if ended.exit_code == exitcodes.REFUSED:
            stimulus: upward.Stimulus = upward.Refused(lid, ended.exit_code, ended.reason, key=True)
        else:
            stimulus = upward.LinkLost(lid, ended.reason)
        self._feed(stimulus, now, news)
        return news

    def tick(self, now: float) -> UplinkNews:
        """Heartbeats and silences on every link up; then the machine's clock (the search's
        retries and deadline, the way home's retry)."""
        news = UplinkNews()
        for lid, link in list(self._links.items()):
            if lid not in self._links or lid in self.machine.dismissed:
                continue  # closed by what an earlier link's end set off; or left: unheard
            ended = link.tick(now)
            if ended is None:
                continue
            if link.overflow is not None:
                self._feed(upward.LinkLost(lid, ended.reason, full=True), now, news)
            else:
                self._feed(upward.Silent(lid, ended.reason), now, news)
            if news.ended is not None:
                return news
        self._feed(upward.Tick(), now, news)
        return news

    def overflowed(self, now: float) -> UplinkNews:
        """The parent link is full (its broker stopped reading): as good as lost."""
        news = UplinkNews()
        overflow, parent = self.overflow, self.machine.parent_link
        if overflow is not None and parent is not None:
            self._feed(upward.LinkLost(parent, overflow.reason, full=True), now, news)
        return news

    def move_home(self, card: Card, now: float) -> UplinkNews:
        """Rank 0 says this broker's own parent has a broker again: go to it."""
        news = UplinkNews()
        self._feed(upward.HomeOrder(card), now, news)
        return news

    def learn_root(self, root: int, now: float) -> UplinkNews:
        """The root of the latest term this broker knows of: a member may seek it."""
        news = UplinkNews()
        if root != self.machine.root:
            self._feed(upward.RootKnown(root), now, news)
        return news

    def stop(self, now: float) -> None:
        """The broker's shutdown began: a parent lost from now on is not sought."""
        news = UplinkNews()
        self._feed(upward.Stop(), now, news)

    # --- the machine's instructions -----------------------------------------------------------

    def _feed(self, stimulus: upward.Stimulus, now: float, news: UplinkNews) -> None:
        try:
            instructions = self.machine.handle(stimulus, now)
        except upward.Unexpected as error:
            log.warning("ignored from the parent side: %s", error)
            return
        for instruction in instructions:
            self._carry_out(instruction, news)

    def _carry_out(self, instruction: upward.Instruction, news: UplinkNews) -> None:
        match instruction:
            case upward.Open(lid, card, incarnation):
                link = self.open(card, incarnation)
                link.quiet = True
                self._links[lid], self._ids[link] = link, lid
                self.watch(link)
            case upward.Close(lid, linger):
                self._close(lid, linger)
            case upward.SendMoved(lid, to):
                link = self._links[lid]
                if link.handshaken:
                    link.send(Message(Kind.CONTROL, "moved", {"to": to}))
                else:
                    # Nobody ever answered there, so nobody welcomed this broker: nothing to
                    # tell. Left open, ZeroMQ would connect it to the next broker at that
                    # address (its rank restarted) and deliver a stale hello and "moved".
                    self._close(lid, Linger.NONE)
            case upward.Flush():
                self._flush()
            case upward.AttachedTo(_peer, first, why):
                news.attached, news.first = True, first
                if not first:
                    log.info("%s", why)
            case upward.Detached(reason):
                log.warning("%s: seeking a live ancestor", reason)
                news.detached = reason
            case upward.LineageChanged():
                news.lineage = True
            case upward.TellChildren(until):
                news.seeking_until = until
            case upward.Decline(reason):
                news.declined = reason
            case upward.ReportDropped(parent, reason):
                said = Dropped(self.machine.rank, self.machine.incarnation, parent, reason)
                self.send(Message(Kind.CONTROL, "report", encode_events([said])))
            case upward.Exit(code, reason):
                news.ended = LinkEnded(code, reason)
            case _:
                raise AssertionError(f"no way to carry out {instruction!r}")

    def _close(self, lid: LinkId, linger: Linger) -> None:
        link = self._links.pop(lid, None)
        if link is None:
            return
        del self._ids[link]
        self.unwatch(link)
        if linger is Linger.BRIEF:
            link.socket.linger = DISMISS_LINGER_MS
        link.close(linger=linger is not Linger.NONE)

    # --- the clock and the end ----------------------------------------------------------------

    def verdict_due(self, now: float) -> bool:
        link = self.link
        return link is not None and link.verdict_due(now)

    def next_deadline(self) -> float | None:
        deadlines = [
            d
            for lid, link in self._links.items()
            if lid not in self.machine.dismissed and (d := link.next_deadline()) is not None
        ]
        if (own := self.machine.next_deadline()) is not None:
            deadlines.append(own)
        return min(deadlines) if deadlines else None

    def goodbye(self) -> None:
        link = self.link if self.welcomed else None
        if link is not None:
            link.goodbye()

    def close(self, linger: bool) -> None:
        parent = self.machine.parent_link
        for lid, link in list(self._links.items()):
            self.unwatch(link)
            link.close(linger=linger and lid == parent)
        self._links.clear()
        self._ids.clear()


def _cards(lineage: list | None) -> tuple[Card, ...] | None:
    if lineage is None:
        return None
    return tuple((int(rank), str(endpoint), str(key)) for rank, endpoint, key in lineage)


def seeking_seconds(until: float, now: float) -> float:
    """What a `seeking` control message says: the seconds left of the search, never negative."""
    left = until - now
    return max(0.0, left) if math.isfinite(left) else 0.0


def _skip_to(reply: Message, came_from: int | None, parent: int | None) -> bool:
    """Take off the route the hops of the brokers between the one a response came from and the
    parent it now goes to: each pushed "p<rank>" naming the broker before it. False if the way
    back does not pass `parent` (the response cannot be delivered)."""
    current = came_from
    for _ in range(len(reply.route) + 1):
        if current is None or current == parent:
            return True
        if not reply.route:
            return False
        current = parent_hop(reply.route[-1])
        if current is None:
            return False
        reply.route.pop()
    return False
