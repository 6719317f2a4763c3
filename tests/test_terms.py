"""The term fence (docs/protocol.md §13.3) without sockets: the decision (state/terms.py), the
router's hook that every order served on a broker passes (services/trust.py, broker/router.py),
what a root's own orders and its links' controls carry, and the uplink's judgement of a parent's
`shutdown` and `retire`. Messages in, actions and news out."""

from __future__ import annotations

import errno
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_router import Recorder

from tbon.overlay.broker.router import Router
from tbon.overlay.links.parent import ParentInbound
from tbon.overlay.links.uplink import Uplink
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.trust import ORDERS
from tbon.overlay.state.leadership import StaleTerm
from tbon.overlay.state.terms import (
    MAX_TERM,
    BadTerm,
    Ignored,
    Obey,
    Refuse,
    Superseded,
    Terms,
    read_term,
)
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message, decode, encode

JUNK: list[Any] = [0, -1, -(10**30), 10**30, MAX_TERM + 1, "2", 2.0, 1.5, True, False, [], {}]

# --- the decision -------------------------------------------------------------------------------


def test_a_term_is_an_integer_from_1_and_none_is_the_first() -> None:
    assert read_term(None) == 1
    assert [read_term(t) for t in (1, 7, MAX_TERM)] == [1, 7, MAX_TERM]
    for junk in JUNK:
        with pytest.raises(BadTerm, match="a term is an integer from 1") as caught:
            read_term(junk)
        assert len(str(caught.value)) < 100  # one line, even for 10**30


def test_an_order_of_a_lower_term_is_refused_estale_naming_the_root() -> None:
    terms = Terms(5, leading=False)
    assert terms.order(1, 0) == (Obey(), [])
    assert terms.order(3, 2) == (Obey(), [])  # a later term raises the fence
    assert (terms.term, terms.root) == (3, 2)
    assert terms.order(3, 2) == (Obey(), [])  # the same term: obeyed
    verdict, news = terms.order(2, 0)
    assert verdict == Refuse(errno.ESTALE, "stale term 2: rank 2 is the root in term 3", 3, 2)
    assert news == [] and terms.term == 3  # a refusal moves nothing
    stale_untermed, _ = terms.order(None, 0)  # an older broker's order: term 1
    assert isinstance(stale_untermed, Refuse) and stale_untermed.errstr.startswith("stale term 1:")


def test_a_fence_whose_root_is_unknown_says_only_the_term() -> None:
    terms = Terms(5, leading=False)
    terms.order(4, None)  # a parent's shutdown names no root
    verdict, _ = terms.order(2, 0)
    assert isinstance(verdict, Refuse) and verdict.errstr == "stale term 2: term 4 is under way"
    terms.heard(4, 1)  # a lineage of that term names it
    assert terms.root == 1


def test_an_order_is_obeyed_from_the_root_of_its_term_only() -> None:
    terms = Terms(5, leading=False)
    refused, _ = terms.order(1, 2)  # the first term is rank 0's
    assert refused == Refuse(errno.EPERM, "not from the root: rank 0 is the root in term 1")
    assert terms.order(1, 0) == (Obey(), []) and terms.root == 0
    terms.heard(2, 1)  # the new root's lineage: rank 1 took over in term 2
    assert terms.order(2, 1) == (Obey(), [])
    forged, news = terms.order(2, 0)  # the old root claiming the new term
    assert forged == Refuse(errno.EPERM, "not from the root: rank 1 is the root in term 2")
    assert news == [] and (terms.term, terms.root) == (2, 1)
    stale, _ = terms.order(1, 0)  # the old root's own term: stale, not forged
    assert isinstance(stale, Refuse) and stale.errnum == errno.ESTALE
    assert terms.order(None, None)[0] == stale and terms.order(2, None) == (Obey(), [])


def test_the_first_order_of_a_later_term_names_its_root() -> None:
    terms = Terms(5, leading=False)
    terms.order(1, 0)
    assert terms.order(3, 2) == (Obey(), []) and (terms.term, terms.root) == (3, 2)
    assert terms.root_of(3) == 2 and terms.root_of(4) is None and terms.root_of(1) == 0
    refused, _ = terms.order(3, 1)
    assert isinstance(refused, Refuse) and refused.errnum == errno.EPERM


@pytest.mark.parametrize("junk", JUNK)
def test_a_malformed_term_is_a_clear_refusal_and_moves_nothing(junk: Any) -> None:
    terms = Terms(5, leading=False)
    terms.order(2, 0)
    verdict, news = terms.order(junk, 0)
    assert isinstance(verdict, Refuse) and verdict.errnum == errno.EINVAL
    assert "bad term" in verdict.errstr and news == []
    assert terms.heard(junk, 0) == [Ignored(verdict.errstr)]
    assert (terms.term, terms.root) == (2, 0)


def test_the_root_of_term_1_is_superseded_once_per_news() -> None:
    root = Terms(0, leading=True)
    assert (root.term, root.root, root.led) == (1, 0, 1)
    assert root.order(1, 0) == (Obey(), [])  # its own order, to itself
    assert root.heard(1, 0) == []
    [news] = root.heard(3, None)  # an ESTALE answer that names no root
    assert news == Superseded(StaleTerm(3), None)
    assert root.heard(3, None) == []  # said once
    [named] = root.heard(3, 2)
    assert named.reason == "superseded: rank 2 is the root in term 3"
    assert root.heard(2, 1) == [] and root.heard(3, 2) == []
    root.lead(4)  # elected again (the takeover's step)
    assert (root.term, root.root) == (4, 0) and root.heard(4, 0) == []


def test_a_broker_that_never_led_hears_of_later_terms_silently() -> None:
    terms = Terms(3, leading=False)
    assert terms.term == 1  # not yet welcomed: it stamps the first term
    assert terms.heard(None, 0) == [] and terms.heard(9, 1) == []
    assert (terms.term, terms.root) == (9, 1)


Arrival = tuple[str, Any]
arrivals = st.lists(
    st.tuples(
        st.sampled_from(["order", "heard"]),
        st.one_of(
            st.none(),
            st.integers(min_value=-3, max_value=12),
            st.sampled_from(JUNK),
            st.integers(min_value=MAX_TERM - 2, max_value=MAX_TERM + 2),
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(arrivals, st.booleans())
def test_no_lower_term_is_ever_obeyed_after_a_higher_one_was_seen(
    history: list[Arrival], leading: bool
) -> None:
    terms = Terms(0, leading=leading)
    seen = 1 if leading else 0  # the oracle: the highest well-formed term seen so far
    for what, raw in history:
        valid = raw is None or (type(raw) is int and 1 <= raw <= MAX_TERM)
        term = 1 if raw is None else raw
        if what == "order":
            verdict, _ = terms.order(raw, 0)
            assert isinstance(verdict, Obey) == (valid and term >= seen)
            if isinstance(verdict, Refuse):
                assert verdict.errnum == (errno.ESTALE if valid else errno.EINVAL)
        else:
            terms.heard(raw, 0)
        if valid:
            seen = max(seen, term)
        assert terms.fence.term == seen


# --- the router's hook: every order served here --------------------------------------------------


class Broker:
    """A router of rank `rank` in kary:2 of 7, whose order handlers record what they obey."""

    def __init__(self, rank: int) -> None:
        self.obeyed: list[Message] = []
        self.news: list[Any] = []
        self.parent = Recorder() if rank else None
        self.children, self.local = Recorder(), Recorder()
        self.terms = Terms(rank, leading=rank == 0)
        self.router = Router(
            rank,
            Topology("kary:2", 7),
            None,
            (self.parent, self.children, self.local),  # type: ignore[arg-type]
            {topic: self.obey for topic in ORDERS},
            frozenset(),
            self.perform,
            lambda hop, message: None,
            call_timeout=5.0,
            terms=self.terms,
        )
        self.router.on_terms = self.news.extend

    def obey(self, request: Message, now: float) -> list[Action]:
        self.obeyed.append(request)
        return [Respond(request.respond({"done": True}))]

    def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Respond):
                self.router.respond(action.message)

    def order(
        self, topic: str, term: Any, route: list[str] | None = None, via: str = "p0"
    ) -> Message:
        """An order of rank 0's arriving from the parent (route ["s"], pushed "p0" here); the
        answer, as sent back up."""
        nodeid = self.router.rank
        message = Message(Kind.REQUEST, topic, {"rank": 3}, nodeid=nodeid, tag=7, term=term)
        message.route = list(route or ["s"])
        sent = len(self.parent.sent) if self.parent is not None else 0
        self.router.route(message, via, 0.0)
        assert self.parent is not None
        [answer] = self.parent.sent[sent:]
        return answer


def wire(message: Message) -> Message:
    """The message as the next broker decodes it."""
    return decode(encode(message))


@pytest.mark.parametrize("topic", sorted(ORDERS))
def test_every_order_served_passes_the_fence(topic: str) -> None:
    broker = Broker(1)
    assert broker.order(topic, 2).errnum == 0  # raises the fence to 2, rank 0 its root
    refused = wire(broker.order(topic, 1))
    assert refused.errnum == errno.ESTALE
    assert refused.errstr == "stale term 1: rank 0 is the root in term 2"
    assert refused.term == 2 and refused.payload == {"root": 0}  # what the sender learns
    assert broker.order(topic, None).errnum == errno.ESTALE  # no term: term 1
    assert [m.term for m in broker.obeyed] == [2]


@pytest.mark.parametrize("junk", JUNK)
def test_an_order_with_a_malformed_term_is_refused_einval_never_obeyed(junk: Any) -> None:
    broker = Broker(1)
    answer = wire(broker.order("heal.foster", junk))
    assert answer.errnum == errno.EINVAL and "bad term" in answer.errstr
    assert broker.obeyed == [] and broker.terms.term == 1


def test_orders_without_a_term_are_obeyed_as_the_first_term() -> None:
    broker = Broker(1)
    assert broker.order("flub.revoke", None).errnum == 0
    assert broker.order("flub.revoke", 1).errnum == 0
    assert len(broker.obeyed) == 2 and broker.terms.term == 1


def test_an_order_not_from_the_root_never_moves_the_fence() -> None:
    broker = Broker(1)
    forged = Message(Kind.REQUEST, "flub.authorize", {"rank": 3}, nodeid=1, tag=5, term=99)
    broker.router.route(forged, "l1", 0.0)  # a local client: its service refuses it (EPERM)
    assert broker.terms.term == 1 and broker.terms.root is None
    assert broker.order("flub.authorize", 1).errnum == 0  # the root's term 1 still obeyed


@pytest.mark.parametrize("topic", sorted(ORDERS))
def test_after_a_takeover_the_new_roots_orders_are_obeyed_and_the_old_roots_refused(
    topic: str,
) -> None:
    broker = Broker(3)  # kary:2: rank 1 its parent; rank 1 took over in term 2
    broker.terms.heard(1, 0)
    broker.terms.heard(2, 1)  # rank 1's lineage
    assert broker.order(topic, 2, via="p1").errnum == 0
    old = wire(broker.order(topic, 1, route=["s", "p0"], via="p1"))
    assert old.errnum == errno.ESTALE and old.payload == {"root": 1}
    forged = wire(broker.order(topic, 2, route=["s", "p0"], via="p1"))
    assert forged.errnum == errno.EPERM
    assert forged.errstr == "not from the root: rank 1 is the root in term 2"
    assert [m.term for m in broker.obeyed] == [2] and broker.terms.root == 1


def test_a_new_roots_order_before_its_lineage_is_obeyed_and_names_it() -> None:
    broker = Broker(3)
    assert broker.order("retire.order", 1, route=["s", "p0"], via="p1").errnum == 0
    assert broker.order("retire.order", 2, via="p1").errnum == 0  # rank 1's, in term 2
    assert (broker.terms.term, broker.terms.root) == (2, 1)


def test_a_brokers_own_order_to_itself_is_obeyed_only_if_it_is_the_root() -> None:
    broker = Broker(3)
    broker.terms.heard(1, 0)
    own = Message(Kind.REQUEST, "heal.foster", {"rank": 3}, nodeid=3, tag=9, term=1)
    broker.router.route(own, "s", 0.0)  # stamped with its term, served here
    assert broker.obeyed == [] and broker.terms.root == 0
    broker.terms.lead(2)  # elected
    broker.router.route(Message(Kind.REQUEST, "heal.foster", {}, nodeid=3, tag=9), "s", 0.0)
    assert [m.term for m in broker.obeyed] == [2]


def test_a_request_that_is_not_an_order_needs_no_term() -> None:
    broker = Broker(1)
    broker.order("heal.home", 4)
    ping = Message(Kind.REQUEST, "broker.ping", nodeid=1, tag=2)
    broker.router.route(ping, "l1", 0.0)
    [answer] = broker.local.sent
    assert answer.errnum == errno.ENOSYS  # not served here, but not fenced either


# --- what the root stamps, and what it learns --------------------------------------------------


def test_the_roots_own_orders_carry_its_term_and_forwarding_keeps_it() -> None:
    root = Broker(0)
    for topic in sorted(ORDERS):
        root.router.call(Message(Kind.REQUEST, topic, nodeid=1), lambda r, now: [], 0.0)
    root.router.send(Message(Kind.REQUEST, "heal.withdraw", nodeid=2))
    root.router.call(Message(Kind.REQUEST, "broker.ping", nodeid=1), lambda r, now: [], 0.0)
    terms = [wire(m).term for m in root.children.sent]
    assert terms == [1] * (len(ORDERS) + 1) + [None]
    root.terms.lead(4)  # what a takeover does: the next orders carry the new term
    root.router.send(Message(Kind.REQUEST, "flub.revoke", nodeid=2))
    assert wire(root.children.sent[-1]).term == 4
    middle = Broker(1)  # an order for rank 3 passes rank 1, which does not restamp it
    passing = Message(Kind.REQUEST, "heal.foster", nodeid=3, route=["s"], term=4)
    middle.router.route(passing, "p0", 0.0)
    assert [m.term for m in middle.children.sent] == [4] and middle.terms.term == 1


def answered(topic: str, reply: dict[str, Any], came_from: str = "c1") -> Broker:
    """Rank 0 calls `topic` to rank 1; `reply` (header fields) comes back by `came_from`."""
    root = Broker(0)
    root.router.call(Message(Kind.REQUEST, topic, nodeid=1), lambda r, now: [], 0.0)
    [sent] = root.children.sent
    answer = sent.fail(reply["e"], reply.get("es", "x"))
    answer.term, answer.payload = reply.get("term"), reply.get("payload", {})
    root.router.route(wire(answer), came_from, 0.0)
    return root


def test_a_root_answered_estale_learns_the_later_term_and_its_root() -> None:
    root = answered("heal.foster", {"e": errno.ESTALE, "term": 3, "payload": {"root": 2}})
    assert root.news == [Superseded(StaleTerm(3), 2)]
    assert root.news[0].reason == "superseded: rank 2 is the root in term 3"
    unnamed = answered("retire.order", {"e": errno.ESTALE, "term": 3, "payload": {"root": "x"}})
    assert unnamed.news == [Superseded(StaleTerm(3), None)]


def test_a_root_is_told_nothing_by_answers_it_cannot_believe() -> None:
    forged = answered("flub.authorize", {"e": errno.ESTALE, "term": 9}, came_from="l0a")
    assert forged.news == [] and forged.terms.term == 1  # a local client, not the child
    other = answered("flub.authorize", {"e": errno.EPERM, "term": 9})
    assert other.news == [] and other.terms.term == 1  # not a stale order
    same = answered("flub.authorize", {"e": errno.ESTALE, "term": 1})
    assert same.news == []  # its own term: nothing later
    junk = answered("flub.authorize", {"e": errno.ESTALE, "term": "9"})
    assert [type(n) for n in junk.news] == [Ignored] and junk.terms.term == 1


# --- a parent's controls: welcome and lineage raise, shutdown and retire are judged -----------


class OneLink:
    """Stands in for the ParentLink under an Uplink: reads whatever inbound the test hands it."""

    def __init__(self) -> None:
        self.rank, self.peer, self.incarnation, self.shared_key = 3, 1, 1, False
        self.next = ParentInbound()

    def read(self, now: float) -> ParentInbound:
        return self.next


CARDS = [[0, "tcp://h0:1", "0" * 40], [1, "tcp://h1:1", "1" * 40]]


def uplink() -> tuple[Uplink, OneLink]:
    link = OneLink()
    terms = Terms(3, leading=False)
    up = Uplink(link, lambda *_: link, 10.0, lambda _: None, lambda _: None, terms)  # type: ignore[arg-type]
    return up, link


def read(up: Uplink, link: OneLink, **inbound: Any) -> Any:
    link.next = ParentInbound(**inbound)
    return up.read(link, 0.0)  # type: ignore[arg-type]


def test_a_welcome_and_a_lineage_raise_the_fence_and_name_the_root() -> None:
    up, link = uplink()
    read(up, link, welcomed=True, lineage=CARDS, term=2)
    assert (up.terms.term, up.terms.root) == (2, 0)
    read(up, link, lineage=[[4, "tcp://h4:1", "4" * 40], *CARDS[1:]], term=5)
    assert (up.terms.term, up.terms.root) == (5, 4)
    news = read(up, link, lineage=CARDS, term=1.5)
    assert [type(n) for n in news.terms] == [Ignored] and up.terms.term == 5
    read(up, link, lineage=CARDS, term=3)  # a parent that has not heard of term 5 yet
    assert up.terms.term == 5


def test_a_stale_shutdown_or_retire_from_the_parent_is_not_obeyed() -> None:
    up, link = uplink()
    read(up, link, welcomed=True, lineage=CARDS, term=2)
    assert not read(up, link, shutdown=True, term=1).shutdown
    assert not read(up, link, shutdown=True).shutdown  # an older parent's: term 1
    assert read(up, link, retire={"force": False}, term="2").retire is None
    assert read(up, link, retire={"force": True}, term=2).retire == {"force": True}
    assert read(up, link, shutdown=True, term=3).shutdown and up.terms.term == 3


def test_a_parent_stamps_its_term_on_welcomes_lineages_and_its_orders() -> None:
    from linkmodel import FrameByFrame

    from tbon.overlay.links.children import Children

    class Sink(FrameByFrame):
        """A socket that hands each whole message it is sent, frame by frame, to `take`."""

        def __init__(self, take: Any) -> None:
            super().__init__()
            self.take = take

        def send_multipart(self, frames: Any, flags: int = 0, copy: bool = True) -> None:
            self.take(frames)

    class Unwired(Children):
        """The parent's side with its socket a list of what was sent."""

        def __init__(self) -> None:
            config = SimpleNamespace(heartbeat=2.0, timeout=60.0, torpid=10.0, handshake_timeout=5)
            self._start(1, Topology("kary:2", 7), config)  # type: ignore[arg-type]
            self._full: set[bytes] = set()
            self.frames: list[Message] = []
            sent = self.frames.append
            self.socket = Sink(lambda frames: sent(decode(frames[1:])))  # type: ignore[assignment]

    down = Unwired()
    down.terms.heard(6, 0)
    for topic in ("welcome", "lineage", "retire", "shutdown", "heartbeat", "seeking"):
        down._send_raw(b"x", Message(Kind.CONTROL, topic))
    assert [m.term for m in down.frames] == [6, 6, 6, 6, None, None]
