"""A broker's way up the tree: the link to the broker it is attached to, and what it does when
that link is lost (docs/protocol.md §12).

A broker that loses its parent does not exit. It keeps its rank, incarnation, jobs and children,
and *seeks*: it opens a link to every ancestor whose card it holds (the lineage each parent
gives its children at welcome) and says hello on each. Only an ancestor that rank 0 told to
expect it (a foster parent), or its own parent taking back a lost child, lets its key through;
the others refuse it at the CURVE handshake, which ZeroMQ retries on its own. The first to
welcome it is its parent from then on; any other that welcomes it is told "moved" and closed.
Should none take it back within broker.reattach-timeout, it exits 75, as before.

Once attached to a foster parent, rank 0 may send it home (`move_home`): it opens a link to its
own parent's new broker and, once welcomed there, tells the foster parent "moved" and closes.

While seeking, what goes up waits here, bounded: responses (job output, answers to requests
from above) and reports, so that a stream survives its path's repair. A response names the
parent it came from ("p<rank>"); when it leaves by another (a foster parent), the hops that the
brokers in between pushed are taken off first, so the foster parent finds its own on top.
Requests of its own subtree's are not held: the router fails them (EHOSTUNREACH) at once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tbon import exitcodes
from tbon.overlay.links.parent import LinkEnded, ParentInbound, ParentLink
from tbon.overlay.services.flow import LINK_HWM
from tbon.overlay.services.trust import parent_hop
from tbon.overlay.wire.message import Kind, Message

log = logging.getLogger("tbon.parent")

Card = tuple[int, str, str]
"""An ancestor as its child knows it: rank, endpoint, public key (Z85)."""

DISMISS_LINGER_MS = 200
"""How long a "moved" to an ancestor that welcomed this broker second may take to leave."""

HELD_BYTES = 64 << 20
"""The most a broker holds for its parent while it seeks one (besides LINK_HWM messages)."""

RETRY_AFTER = 0.25
"""Seconds before an ancestor that refused a hello (not yet told to expect it) is asked again."""

RETRY_AFTER_KEY = 0.05
"""Seconds before an ancestor that refused this broker's key is tried again: rank 0 tells the
foster parent to expect it within a round trip of the loss."""


@dataclass(slots=True)
class UplinkNews:
    """What one read of an up link means to the broker."""

    attached: bool = False  # attached now (first welcome, reattached, or moved home)
    detached: str = ""  # the link to the parent is lost: seeking (why)
    ended: LinkEnded | None = None  # exit with this
    shutdown: bool = False
    retire: dict | None = None
    lineage: bool = False  # the lineage changed: tell the children
    messages: list[Message] = field(default_factory=list)
    peer: int | None = None  # the parent the messages came from


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
    ) -> None:
        """`first` is the link bootstrap opened; `opener` opens more; `watch`/`unwatch` have the
        broker's loop poll a link's sockets, or stop."""
        self.link: ParentLink | None = first
        self.rank = first.rank
        self._incarnation = first.incarnation
        self.open = opener
        self.reattach_timeout = reattach_timeout
        self.watch, self.unwatch = watch, unwatch
        self.lineage: list[Card] = []
        self.seeking_until: float | None = None
        self.candidates: dict[int, ParentLink] = {}
        self._retry: dict[int, float] = {}  # ancestor rank -> when to ask it again
        self.moving: ParentLink | None = None
        self._home: Card | None = None  # where rank 0 sent this broker, while it goes
        self._home_retry: float | None = None
        self.held: deque[tuple[Message, int | None]] = deque()
        self._held_bytes = 0
        self._dropped = False
        self.stopping = False
        watch(first)

    # --- state --------------------------------------------------------------------------------

    @property
    def welcomed(self) -> bool:
        """Attached to a parent now (not seeking, not waiting for the first welcome)."""
        return self.link is not None and self.link.welcomed

    @property
    def peer(self) -> int | None:
        return self.link.peer if self.welcomed and self.link is not None else None

    @property
    def incarnation(self) -> int:
        return self.link.incarnation if self.link is not None else self._incarnation

    @property
    def overflow(self) -> LinkEnded | None:
        return self.link.overflow if self.link is not None else None

    def holds(self, link: ParentLink) -> bool:
        """Whether `link` is still one of this broker's links up (a read may close it)."""
        return link is self.link or link is self.moving or self._candidate(link)

    def _candidate(self, link: ParentLink) -> bool:
        return link.peer is not None and self.candidates.get(link.peer) is link

    def links(self) -> list[ParentLink]:
        current = [self.link] if self.link is not None else []
        moving = [self.moving] if self.moving is not None else []
        return current + list(self.candidates.values()) + moving

    # --- sending up ---------------------------------------------------------------------------

    def send(self, message: Message) -> bool:
        """Send to the parent, or hold it while seeking one (reports, responses); False if it
        could not be sent or held."""
        if self.welcomed:
            assert self.link is not None
            self.link.send(message)
            return True
        if self.link is not None:  # before the first welcome: queued on the socket as before
            self.link.send(message)
            return True
        return self._hold(message, None)

    def send_response(self, reply: Message, came_from: int | None) -> bool:
        """Send a response up toward the parent it came from (`came_from`), taking off the hops
        of brokers the link skips now; False if its way up is gone."""
        if not self.welcomed:
            return self._hold(reply, came_from) if self.link is None else False
        assert self.link is not None
        if not _skip_to(reply, came_from, self.link.peer):
            return False
        self.link.send(reply)
        return True

    def _hold(self, message: Message, came_from: int | None) -> bool:
        size = len(message.data) if message.data else 0
        if len(self.held) >= LINK_HWM or self._held_bytes + size > HELD_BYTES:
            if not self._dropped:
                log.warning("seeking a parent: dropped what no longer fits in the hold")
                self._dropped = True
            return False
        self.held.append((message, came_from))
        self._held_bytes += size
        return True

    def _flush(self) -> None:
        held, self.held, self._held_bytes, self._dropped = self.held, deque(), 0, False
        for message, came_from in held:
            if message.kind is Kind.RESPONSE:
                self.send_response(message, came_from)
            else:
                self.send(message)

    # --- reading ------------------------------------------------------------------------------

    def read(self, link: ParentLink, now: float) -> UplinkNews:
        """One message from `link`."""
        inbound = link.read(now)
        if link is self.link:
            return self._from_parent(inbound, now)
        if link is self.moving:
            return self._from_home(link, inbound, now)
        if self._candidate(link):
            return self._from_candidate(link, inbound, now)
        return UplinkNews()

    def monitor(self, link: ParentLink, now: float) -> UplinkNews:
        """Connection events of `link`."""
        ended = link.drain_monitor()
        if ended is None:
            return UplinkNews()
        if link is self.link:
            return self._lost(ended, now)
        # An ancestor not (yet) told to expect this broker refuses its key. ZeroMQ would try
        # the handshake again, but without the hello queued on the link: open a new one.
        if link is self.moving:
            self._close_moving()
            if ended.exit_code == exitcodes.REFUSED and self._home is not None:
                self._home_retry = now + RETRY_AFTER_KEY
            else:
                log.warning("going home: %s", ended.reason)
                self._home = None
        elif self._candidate(link):
            self._drop_candidate(link, now + RETRY_AFTER_KEY)
        return UplinkNews()

    def _from_parent(self, inbound: ParentInbound, now: float) -> UplinkNews:
        assert self.link is not None
        news = UplinkNews(
            shutdown=inbound.shutdown,
            retire=inbound.retire,
            messages=inbound.messages,
            peer=self.link.peer,
        )
        if inbound.welcomed:
            news.attached = True
            self._incarnation = self.link.incarnation
        if inbound.lineage is not None:
            self._adopt_lineage(inbound.lineage)
            news.lineage = True
        if inbound.ended is not None:
            lost = self._lost(inbound.ended, now)
            lost.messages, lost.shutdown, lost.retire = news.messages, news.shutdown, news.retire
            return lost
        return news

    def _from_candidate(self, link: ParentLink, inbound: ParentInbound, now: float) -> UplinkNews:
        if inbound.ended is not None:
            code = inbound.ended.exit_code
            if code == exitcodes.SHUTDOWN or (code == exitcodes.REFUSED and not _asks_again(link)):
                self._stop_seeking()
                return UplinkNews(ended=inbound.ended)
            self._drop_candidate(link, now + RETRY_AFTER)
            return UplinkNews()
        if not inbound.welcomed:
            return UplinkNews()  # nothing comes before a welcome from a broker that did
        # the first ancestor to welcome it is its parent now; any other may have welcomed it
        # too (its welcome unread): each is told "moved", so that it reports no loss
        del self.candidates[link.peer]  # type: ignore[arg-type]
        self.link = link
        self._incarnation = link.incarnation
        for other in self.candidates.values():
            other.send(Message(Kind.CONTROL, "moved", {"to": link.peer}))
            other.socket.linger = DISMISS_LINGER_MS
        self._stop_seeking(linger=True)
        log.info("reattached under rank %s", link.peer)
        if inbound.lineage is not None:
            self._adopt_lineage(inbound.lineage)
        self._flush()
        return UplinkNews(attached=True, lineage=True, messages=inbound.messages, peer=link.peer)

    def _from_home(self, link: ParentLink, inbound: ParentInbound, now: float) -> UplinkNews:
        if inbound.ended is not None:
            log.warning("going home to rank %s: %s", link.peer, inbound.ended.reason)
            self._close_moving()
            return UplinkNews()
        if not inbound.welcomed:
            return UplinkNews()
        old, self.link, self.moving, self._home = self.link, link, None, None
        if old is not None:
            old.send(Message(Kind.CONTROL, "moved", {"to": link.peer}))
            self._close(old, linger=True)
        log.info("home again under rank %s", link.peer)
        if inbound.lineage is not None:
            self._adopt_lineage(inbound.lineage)
        return UplinkNews(attached=True, lineage=True, messages=inbound.messages, peer=link.peer)

    # --- the link lost, and the search ------------------------------------------------------

    def _lost(self, ended: LinkEnded, now: float) -> UplinkNews:
        """The parent link ended: seek an ancestor if it was lost and one may take us back."""
        link = self.link
        if (
            ended.exit_code != exitcodes.LOST
            or link is None
            or not link.welcomed
            or self.stopping
            or not self._cards()
        ):
            return UplinkNews(ended=ended)
        log.warning("%s: seeking a live ancestor", ended.reason)
        self._close(link, linger=False)
        self.link = None
        self._close_moving()
        self.seeking_until = now + self.reattach_timeout
        for card in self._cards():
            self._open_candidate(card)
        return UplinkNews(detached=ended.reason)

    def _cards(self) -> list[Card]:
        return [card for card in self.lineage if card[0] != self.rank]

    def _open_candidate(self, card: Card) -> None:
        link = self.open(card, self._incarnation)
        link.quiet = True
        self.candidates[card[0]] = link
        self.watch(link)

    def _drop_candidate(self, link: ParentLink, retry_at: float) -> None:
        assert link.peer is not None
        self.candidates.pop(link.peer, None)
        self._close(link, linger=False)
        self._retry[link.peer] = retry_at

    def _stop_seeking(self, linger: bool = False) -> None:
        for link in self.candidates.values():
            self._close(link, linger=linger)
        self.candidates.clear()
        self._retry.clear()
        self.seeking_until = None

    def move_home(self, card: Card) -> str:
        """Rank 0 says this broker's own parent has a broker again: go to it. Returns why not,
        or ""."""
        if not self.welcomed or self.link is None:
            return "this broker is seeking a parent"
        if self.link.peer == card[0]:
            return ""  # home already
        self._close_moving()
        self._home, self._home_retry = card, None
        self.moving = self.open(card, self._incarnation)
        self.moving.quiet = True
        self.watch(self.moving)
        log.info("going home to rank %d", card[0])
        return ""

    def _close_moving(self) -> None:
        if self.moving is not None:
            self._close(self.moving, linger=False)
            self.moving = None

    def _adopt_lineage(self, lineage: list) -> None:
        self.lineage = [(int(rank), str(endpoint), str(key)) for rank, endpoint, key in lineage]

    # --- the clock ----------------------------------------------------------------------------

    def tick(self, now: float) -> UplinkNews:
        """Heartbeats and silence on the parent link; the way home; the search's retries and
        its deadline."""
        if self.link is not None and (ended := self.link.tick(now)) is not None:
            return self._lost(ended, now)
        if self.moving is not None and self.moving.tick(now) is not None:
            log.warning("going home to rank %s: no answer", self.moving.peer)
            self._close_moving()
            self._home = None
        if self._home_retry is not None and now >= self._home_retry:
            self._home_retry = None
            if self._home is not None and self.moving is None and self.welcomed:
                self.moving = self.open(self._home, self._incarnation)
                self.moving.quiet = True
                self.watch(self.moving)
        for rank, when in list(self._retry.items()):
            if now >= when:
                del self._retry[rank]
                card = next((c for c in self._cards() if c[0] == rank), None)
                if card is not None and rank not in self.candidates and self.link is None:
                    self._open_candidate(card)
        if self.seeking_until is not None and now >= self.seeking_until:
            waited = self.reattach_timeout
            self._stop_seeking()
            reason = f"lost the parent, and no live ancestor took this broker back in {waited:g}s"
            return UplinkNews(ended=LinkEnded(exitcodes.LOST, reason))
        return UplinkNews()

    def overflowed(self, now: float) -> UplinkNews:
        """The parent link is full (its broker stopped reading): as good as lost."""
        overflow = self.overflow
        return self._lost(overflow, now) if overflow is not None else UplinkNews()

    def verdict_due(self, now: float) -> bool:
        return self.link is not None and self.link.verdict_due(now)

    def next_deadline(self) -> float | None:
        deadlines = [
            d
            for link in (self.link, self.moving)
            if link is not None and (d := link.next_deadline()) is not None
        ]
        deadlines += self._retry.values()
        if self._home_retry is not None:
            deadlines.append(self._home_retry)
        if self.seeking_until is not None:
            deadlines.append(self.seeking_until)
        return min(deadlines) if deadlines else None

    def goodbye(self) -> None:
        if self.link is not None:
            self.link.goodbye()

    def _close(self, link: ParentLink, linger: bool) -> None:
        self.unwatch(link)
        link.close(linger=linger)

    def close(self, linger: bool) -> None:
        for link in self.links():
            self._close(link, linger=linger and link is self.link)
        self.link, self.moving = None, None
        self.candidates.clear()


def _asks_again(link: ParentLink) -> bool:
    """A config-booted broker holds the instance's shared key, which every parent's handshake
    lets through, so an ancestor not yet told to expect it refuses its hello: ask again."""
    return link.shared_key


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
