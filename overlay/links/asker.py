"""The links of a root that stepped down and asks the root group whether a later term exists
(successor.py decides whom and when; docs/protocol.md §13.5): one ParentLink per member asked,
read by the broker's loop, what each answer says of the term handed to the term fence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tbon.overlay.links import successor
from tbon.overlay.links.cards import Card
from tbon.overlay.state.terms import News, Terms

if TYPE_CHECKING:  # opened by the broker's `open_link`, only by a root that stepped down
    from tbon.overlay.links.parent import ParentLink

log = logging.getLogger("tbon.broker")

OnReady = Callable[[float], None]


class Asker:
    def __init__(
        self,
        rank: int,
        open_link: Callable[[Card], ParentLink],
        watch: Callable[[ParentLink, OnReady], None],
        unwatch: Callable[[ParentLink], None],
        terms: Terms,
        on_news: Callable[[list[News]], None],
    ) -> None:
        """`open_link` dials a card and says hello; `watch` has the loop call back when a link's
        socket or monitor is ready; what the fence learns goes to `on_news`."""
        self.machine = successor.Asking(rank)
        self._open, self._watch, self._unwatch = open_link, watch, unwatch
        self.terms, self.on_news = terms, on_news
        self.links: dict[int, ParentLink] = {}

    def tick(self, alone: bool, cards: tuple[Card, ...], now: float) -> None:
        """The broker's timers: links silent past tbon.timeout end, then the machine's turn."""
        for rank, link in sorted(self.links.items()):
            if link.tick(now) is not None:  # no answer to the hello
                self._perform(self.machine.ended(rank, now))
        self._perform(self.machine.tick(alone, cards, now))

    def next_deadline(self) -> float | None:
        if not self.links:  # every turn of every broker asks: most never ask anything
            return self.machine.next_deadline()
        deadlines = [link.next_deadline() for link in self.links.values()]
        deadlines.append(self.machine.next_deadline())
        return min((d for d in deadlines if d is not None), default=None)

    def close(self) -> None:
        for link in self.links.values():
            self._unwatch(link)
            link.close(linger=False)
        self.links.clear()

    def _perform(self, instructions: list[successor.Instruction]) -> None:
        for instruction in instructions:
            match instruction:
                case successor.Ask(card):
                    link = self._open(card)
                    link.quiet = True  # a member that never admitted this key refuses it
                    self.links[card[0]] = link
                    self._watch(link, self._reader(card[0], link))
                    log.debug("asking rank %d whether a later term exists", card[0])
                case successor.Hang(rank):
                    if rank in self.links:
                        gone = self.links.pop(rank)
                        self._unwatch(gone)
                        gone.close(linger=False)

    def _reader(self, rank: int, link: ParentLink) -> OnReady:
        return lambda now: self._ready(rank, link, now)

    def _ready(self, rank: int, link: ParentLink, now: float) -> None:
        """A member's link is ready: its key refused (no news), or its answer read."""
        if self.links.get(rank) is not link:
            return
        news: list[News] = []
        done = link.drain_monitor() is not None
        while not done and link.readable():
            inbound = link.read(now)
            if inbound is None or not (inbound.welcomed or inbound.ended is not None):
                continue
            done = True
            if inbound.welcomed:
                cards = inbound.lineage
                root = cards[0][0] if cards else None
                said = "welcomed it"
            else:
                assert inbound.ended is not None
                root, said = successor.named_root(inbound.root), inbound.ended.reason
            log.info("asked rank %d whether a later term exists: %s", rank, said)
            news += self.terms.heard(inbound.term, root)
        if done:
            self._perform(self.machine.ended(rank, now))
        if news:
            self.on_news(news)
