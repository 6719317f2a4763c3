"""The resend logic of exec streams (overlay/wire/resend.py), without sockets: a sender that numbers
and keeps, a channel that loses, duplicates and reorders, a receiver that takes each message once
and in order, and the credit window that bounds what is kept."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.services.actions import GrantCredit
from tbon.overlay.services.exec import ExecService
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message
from tbon.overlay.wire.resend import (
    ACK_MESSAGES,
    ASK_AGAIN_S,
    QUIET_MAX_S,
    QUIET_S,
    Handoff,
    Inbox,
    Outbox,
    Prompts,
    Verdict,
)

# What the channel does to each message in flight: deliver it, lose it, deliver it twice, or hold
# it back behind the next one; and when the sender's way up changes (it sends again).
FATES = st.sampled_from(["deliver", "lose", "twice", "late"])


class Pair:
    """A sender and a receiver joined by a channel the test drives, with a credit window of
    `window` messages: the sender sends only while credit is left, the receiver returns credit
    (and acknowledges) every `every` messages taken."""

    def __init__(self, window: int, every: int) -> None:
        self.outbox: Outbox[str] = Outbox()
        self.inbox = Inbox()
        self.window, self.every = window, every
        self.credit = window
        self.owed = 0
        self.taken: list[str] = []
        self.in_flight: list[tuple[int, str]] = []
        self.most_kept = 0

    def send(self, item: str, fate: str) -> None:
        seq = self.outbox.number(item)
        self.credit -= 1
        self.most_kept = max(self.most_kept, len(self.outbox.kept))
        self._channel([(seq, item)], fate)

    def _channel(self, messages: list[tuple[int, str]], fate: str) -> None:
        for message in messages:
            if fate == "lose":
                continue
            if fate == "late":
                self.in_flight.append(message)
                continue
            self.deliver(message)
            if fate == "twice":
                self.deliver(message)
        if fate != "late":
            held, self.in_flight = self.in_flight, []
            for message in held:
                self.deliver(message)

    def deliver(self, message: tuple[int, str]) -> None:
        seq, item = message
        if self.inbox.take(seq) is Verdict.TAKE:
            self.taken.append(item)
            self.owed += 1
            if self.owed >= self.every:  # credit back, with the acknowledgement
                self.outbox.acknowledged(self.inbox.acked())
                self.credit = min(self.window, self.credit + self.owed)
                self.owed = 0

    def resend(self, fate: str = "deliver") -> None:
        """The way up changed: everything kept goes again."""
        self._channel(self.outbox.unacknowledged(), fate)

    def settle(self) -> None:
        """The last heal is over: what is in flight arrives, and one resend reaches the
        receiver whole."""
        held, self.in_flight = self.in_flight, []
        for message in held:
            self.deliver(message)
        self.resend()


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.tuples(FATES, st.booleans(), FATES), min_size=1, max_size=120),
    window=st.integers(1, 12),
    every=st.integers(1, 12),
)
def test_every_message_is_taken_once_in_order_whatever_the_channel_does(
    steps: list[tuple[str, bool, str]], window: int, every: int
) -> None:
    every = min(every, window)  # credit comes back before the window is spent
    pair = Pair(window, every)
    sent: list[str] = []
    for number, (fate, heal, resend_fate) in enumerate(steps):
        if pair.credit <= 0:  # the window is spent: only a heal's resend can move things on
            pair.settle()
            if pair.credit <= 0:
                break
        item = f"line {number}"
        sent.append(item)
        pair.send(item, fate)
        if heal:
            pair.resend(resend_fate)
        # never out of order, never twice: what was taken is always a prefix of what was sent
        assert pair.taken == sent[: len(pair.taken)]
    pair.settle()
    assert pair.taken == sent
    # kept is bounded by the window: what is kept is credit not yet returned
    assert pair.most_kept <= window


@given(st.lists(st.integers(0, 40), max_size=80))
def test_the_receiver_takes_only_the_next_number(numbers: list[int]) -> None:
    inbox = Inbox()
    taken = []
    for seq in numbers:
        before = inbox.expected
        verdict = inbox.take(seq)
        if seq == before:
            assert verdict is Verdict.TAKE
            taken.append(seq)
        else:
            assert verdict is (Verdict.DUPLICATE if seq < before else Verdict.AHEAD)
    assert taken == list(range(len(taken))) and inbox.expected == len(taken)


@given(sent=st.integers(0, 50), acks=st.lists(st.integers(0, 80), max_size=10))
def test_an_acknowledgement_frees_what_is_below_it_and_no_more(sent: int, acks: list[int]) -> None:
    outbox: Outbox[int] = Outbox()
    for n in range(sent):
        assert outbox.number(n) == n
    upto = 0
    for ack in acks:  # late or repeated acknowledgements change nothing
        outbox.acknowledged(ack)
        upto = max(upto, min(ack, sent))
        assert [seq for seq, _ in outbox.kept] == list(range(upto, sent))
        assert [item for _, item in outbox.unacknowledged(upto + 1)] == list(range(upto + 1, sent))
    assert outbox.settled == (upto == sent)


def test_a_sender_whose_receiver_does_not_acknowledge_keeps_nothing() -> None:
    outbox: Outbox[str] = Outbox(keep=False)
    assert [outbox.number("a"), outbox.number("b")] == [0, 1]
    assert outbox.settled and outbox.unacknowledged() == []
    kept: Outbox[str] = Outbox()
    kept.number("a")
    kept.stop_keeping()  # its client went away
    assert kept.settled


def test_a_hole_is_asked_for_once_then_again_only_after_a_while() -> None:
    inbox = Inbox()
    assert inbox.take(0) is Verdict.TAKE
    assert inbox.take(2) is Verdict.AHEAD
    assert inbox.ask_resend(10.0)
    assert inbox.take(3) is Verdict.AHEAD
    assert not inbox.ask_resend(10.1)  # the resend is on its way
    assert inbox.ask_resend(10.0 + ASK_AGAIN_S)  # it was lost too: ask again
    assert inbox.take(1) is Verdict.TAKE
    assert inbox.take(3) is Verdict.AHEAD  # 2 is missing now: a new hole, asked for at once
    assert inbox.ask_resend(10.0 + ASK_AGAIN_S)


def test_answers_that_cost_no_credit_are_acknowledged_every_so_often() -> None:
    inbox = Inbox()
    due = []
    for seq in range(2 * ACK_MESSAGES):
        inbox.take(seq)
        if inbox.took_free():
            due.append(seq)
            assert inbox.acked() == seq + 1
    assert due == [ACK_MESSAGES - 1, 2 * ACK_MESSAGES - 1]


def _credit(payload: dict) -> list:
    service = ExecService(3, Topology("kary:2", 7), Lifecycle())
    request = Message(Kind.REQUEST, "exec.credit", payload, nodeid=3)
    return service.credit(request, 0.0)


def test_exec_credit_carries_acknowledgements_and_resend_requests() -> None:
    assert _credit({"id": "j", "bytes": 10}) == [GrantCredit("j", 10)]
    assert _credit({"id": "j", "bytes": 10, "seq": 4}) == [GrantCredit("j", 10, 4)]
    assert _credit({"id": "j", "bytes": 0, "seq": 4}) == [GrantCredit("j", 0, 4)]
    asked = {"id": "j", "bytes": 0, "seq": 4, "resend": True}
    assert _credit(asked) == [GrantCredit("j", 0, 4, True)]
    for bad in (
        {"id": "j", "bytes": 0},  # nothing at all
        {"id": "j", "bytes": -1, "seq": 1},
        {"id": "j", "bytes": 1, "seq": -1},
        {"id": "j", "bytes": 1, "seq": True},
        {"id": "j", "bytes": 1, "seq": 1, "resend": "yes"},
        {"id": 7, "bytes": 1},
    ):
        assert _credit(bad) == [], bad


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 300_000)), max_size=80))
def test_the_client_s_broker_acknowledges_only_what_the_client_will_take(
    arrivals: list[tuple[int, int]],
) -> None:
    """Whatever order and repeats answers reach the client's broker in, what it acknowledges
    never passes what an Inbox fed the same answers has taken: nothing the client may still
    need is freed at its rank."""
    handoff, inbox = Handoff(1024 * 1024), Inbox()
    for seq, cost in arrivals:
        upto = handoff.handed(seq, cost)
        inbox.take(seq)
        assert upto is None or upto <= inbox.expected
    assert handoff.expected == inbox.expected


def test_the_client_s_broker_acknowledges_every_quarter_window_and_a_last_word_at_once() -> None:
    handoff = Handoff(4096)
    assert handoff.handed(0, 500) is None
    assert handoff.handed(1, 600) == 2  # 1100 of a 4096 window: a quarter
    assert handoff.handed(2, 10, last=True) == 3
    assert handoff.handed(1, 10) == 3  # a duplicate: its rank still keeps it, told once
    assert handoff.handed(1, 10) is None
    assert handoff.handed(5, 4096) is None  # after a hole: not taken


def test_a_silent_rank_is_asked_again_less_and_less_often_and_a_heard_one_not_at_all() -> None:
    prompts = Prompts(0.0)
    pending = {1, 2}
    assert prompts.ask(pending, QUIET_S - 0.1) == []
    prompts.heard(1, 0.5)
    prompts.heard(2, QUIET_S - 0.1)
    assert prompts.ask(pending, QUIET_S) == []
    assert prompts.ask(pending, QUIET_S + 1) == [1]  # silent since 0.5
    asked = [t for t in range(0, 200) if prompts.ask({1}, QUIET_S + 1 + t * 0.5)]
    quiet = Prompts(0.0)  # nothing heard at all: the fan-out may still be on its way
    assert quiet.ask({1}, QUIET_MAX_S - 1.5) == [] and quiet.ask({1}, QUIET_MAX_S) == [1]
    gaps = [(b - a) * 0.5 for a, b in itertools.pairwise(asked)]
    assert gaps[0] == 2 * QUIET_S and max(gaps) <= QUIET_MAX_S + 1 and gaps == sorted(gaps)
    assert prompts.ask({2}, 200.0) == [2]  # silent since: asked too


def test_a_rank_not_heard_from_waits_while_answers_flow_but_not_past_the_longest_interval() -> (
    None
):
    prompts = Prompts(0.0)
    pending = {2, 3}  # rank 1 is done: its answers came (say, its exit)
    for now in (1.0, 2.5, 4.0, 5.5):  # a slow fan-out: one rank's answer after another
        prompts.heard(1, now)
        assert prompts.ask(pending, now + 0.1) == []
    assert prompts.ask(pending, 5.5 + QUIET_S) == [2, 3]  # the answers stopped: asked
    late = Prompts(0.0)
    for tick in range(40):  # answers never stop: the ranks unheard are asked all the same
        late.heard(1, tick * 0.5)
        if asked := late.ask({2}, tick * 0.5):
            break
    assert asked == [2] and tick * 0.5 == QUIET_MAX_S


def test_a_status_change_brings_a_long_interval_back_to_the_short_one() -> None:
    prompts = Prompts(0.0)
    prompts.heard(1, 0.0)  # and silent since
    for now in (2.0, 6.0, 14.0):  # asked at 2, 6 (4 s later), 14 (8 s later)
        assert prompts.ask({1}, now) == [1]
    assert prompts.ask({1}, 20.0) == []  # next due at 30
    prompts.soon(20.0)
    assert prompts.ask({1}, 20.0) == [1]  # due QUIET_S after it was last asked
    assert prompts.ask({1}, 21.0) == []
