"""A child's side of the heartbeats (overlay/links/parent.py, docs/protocol.md §5.2): it answers
its parent's beats at once, so that both ends wake once a beat, and beats unasked only when the
parent's beats stop. The ParentLink is the real one; its DEALER is a list."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from linkmodel import FrameByFrame

from tbon.overlay.config.attributes import BrokerConfig, broker_config
from tbon.overlay.links import parent as parent_module
from tbon.overlay.links.liveness import Liveness
from tbon.overlay.links.parent import OWN_BEAT, ParentLink
from tbon.overlay.wire.message import Kind, Message, decode, encode

HEARTBEAT = 1.0


class Dealer(FrameByFrame):
    """What the link sends (topics), and what the parent sent it: frame by frame, as the
    link's calls (links/zmqio.py) read and write them."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []
        self.inbox: deque[list[Any]] = deque()

    def send_multipart(self, frames: Any, flags: int = 0, copy: bool = True) -> None:
        self.sent.append(decode([bytes(f) for f in frames]).topic)


class Clock:
    now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(parent_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    return clock


def welcomed_link(now: float, config: BrokerConfig) -> tuple[ParentLink, Dealer]:
    """A link welcomed at `now`, the welcome its last read."""
    link = ParentLink.__new__(ParentLink)
    dealer = Dealer()
    link.socket = dealer  # type: ignore[assignment]
    link.config = config
    link.overflow = None
    link.welcomed = True
    link.answered = False
    link._last_sent = now
    link._liveness = Liveness(0, config.timeout, now, 3 * config.heartbeat)
    return link, dealer


def parent_says(link: ParentLink, dealer: Dealer, topic: str, now: float) -> None:
    dealer.inbox.append([bytes(f) for f in encode(Message(Kind.CONTROL, topic, {}))])
    link.read(now)


@pytest.fixture
def config() -> BrokerConfig:
    return broker_config({}).replaced(heartbeat=HEARTBEAT, torpid=5.0, timeout=10.0)


def test_a_parents_beat_is_answered_at_once(clock: Clock, config: BrokerConfig) -> None:
    link, dealer = welcomed_link(clock.now, config)
    clock.now += HEARTBEAT
    parent_says(link, dealer, "heartbeat", clock.now)
    assert dealer.sent == ["heartbeat"] and link.answered
    assert link.next_deadline() == clock.now + OWN_BEAT * HEARTBEAT


def test_no_answer_when_the_parent_heard_from_it_within_half_a_beat(
    clock: Clock, config: BrokerConfig
) -> None:
    link, dealer = welcomed_link(clock.now, config)
    clock.now += HEARTBEAT / 4
    parent_says(link, dealer, "heartbeat", clock.now)
    assert dealer.sent == [] and not link.answered


def test_it_beats_unasked_once_the_parents_beats_stop(clock: Clock, config: BrokerConfig) -> None:
    link, dealer = welcomed_link(clock.now, config)
    start = clock.now
    clock.now = start + HEARTBEAT
    assert link.tick(clock.now) is None and dealer.sent == []  # the parent's beat is awaited
    clock.now = start + OWN_BEAT * HEARTBEAT
    assert link.tick(clock.now) is None and dealer.sent == ["heartbeat"]
    assert link.next_deadline() == clock.now + OWN_BEAT * HEARTBEAT
