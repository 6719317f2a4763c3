"""The child's side of a link (overlay/links/upward.py), without sockets: each transition, each
refused stimulus, the deadlines, and a hypothesis state machine over random stimuli."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tbon import exitcodes
from tbon.overlay.links.uplink import seeking_seconds
from tbon.overlay.links.upward import (
    DISMISS_WAIT,
    RETRY_AFTER,
    RETRY_AFTER_KEY,
    TRANSITIONS,
    AttachedTo,
    Close,
    Decline,
    Detached,
    Ended,
    Exit,
    Flush,
    Fostered,
    GoingHome,
    Home,
    HomeOrder,
    LineageChanged,
    LineageSaid,
    Linger,
    LinkLost,
    Open,
    ParentSeeking,
    Refused,
    ReportDropped,
    Seeking,
    SendMoved,
    Silent,
    Stop,
    TellChildren,
    Tick,
    Unexpected,
    Upward,
    Waiting,
    Welcomed,
)

CARD0 = (0, "tcp://127.0.0.1:1000", "0" * 40)
CARD1 = (1, "tcp://127.0.0.1:1001", "1" * 40)
CARD3 = (3, "tcp://127.0.0.1:1003", "3" * 40)
LINEAGE = (CARD0, CARD1)  # what rank 1 tells its child, rank 3
REATTACH = 5.0


def machine(shared_key: bool = False) -> Upward:
    """Rank 3 of a kary:2 tree: its parent is rank 1, whose parent is rank 0."""
    return Upward(3, 1, 1, REATTACH, shared_key=shared_key)


def home(lineage: tuple = LINEAGE) -> Upward:
    m = machine()
    m.handle(Welcomed(0, 1, 1, lineage), 0.0)
    return m


def seeking(now: float = 10.0) -> Upward:
    m = home()
    m.handle(LinkLost(0, "lost the connection to the parent"), now)
    return m


def fostered() -> Upward:
    """Seeking, then welcomed by rank 0 on link 1 (rank 1's candidate was link 2)."""
    m = seeking()
    m.handle(Welcomed(1, 0, 1, (CARD0,)), 10.5)
    return m


# --- waiting for the first welcome ---------------------------------------------------------------


def test_the_first_welcome_attaches_home_and_flushes_the_hold() -> None:
    m = machine()
    assert m.parent_link is None and not m.admits_children
    out = m.handle(Welcomed(0, 1, 2, LINEAGE), 1.0)
    assert out == [AttachedTo(1, True, "welcomed by the parent"), LineageChanged(LINEAGE), Flush()]
    assert m.state == Home(0, 1) and m.parent_link == 0 and m.peer == 1
    assert m.incarnation == 2 and m.lineage == LINEAGE and m.admits_children


def test_a_first_welcome_from_another_ancestor_is_fostering() -> None:
    m = machine()
    m.handle(Welcomed(0, 0, 1, (CARD0,)), 1.0)
    assert m.state == Fostered(0, 0)


@pytest.mark.parametrize(
    ("stimulus", "code"),
    [
        (Silent(0, "no answer to hello"), exitcodes.LOST),
        (Refused(0, exitcodes.REFUSED, "key refused", key=True), exitcodes.REFUSED),
        (Refused(0, exitcodes.SHUTDOWN, "shutting down"), exitcodes.SHUTDOWN),
        (LinkLost(0, "full"), exitcodes.LOST),
    ],
)
def test_without_a_welcome_the_first_link_s_end_is_the_broker_s(stimulus, code) -> None:
    m = machine()
    out = m.handle(stimulus, 1.0)
    assert out == [Close(0, Linger.NONE), Exit(code, stimulus.reason)]
    assert m.state == Ended(code, stimulus.reason) and not m.open_links


def test_an_order_home_before_the_first_welcome_is_declined() -> None:
    assert isinstance(machine().handle(HomeOrder(CARD1), 1.0)[0], Decline)


@pytest.mark.parametrize("stimulus", [LineageSaid(0, LINEAGE), ParentSeeking(0, 1.0)])
def test_what_only_a_welcomed_child_hears_is_refused_before_the_welcome(stimulus) -> None:
    m = machine()
    with pytest.raises(Unexpected, match="state=Waiting"):
        m.handle(stimulus, 1.0)
    assert m.state == Waiting(0)


# --- attached ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "loss",
    [
        LinkLost(0, "lost the connection to the parent"),
        Silent(0, "the parent has been silent for 3.0s"),
        Refused(0, exitcodes.LOST, "refused by the parent: rank 3 incarnation 1 was lost"),
    ],
)
def test_a_lost_parent_starts_a_search_of_every_ancestor(loss) -> None:
    m = home()
    out = m.handle(loss, 10.0)
    assert out == [
        Close(0, Linger.NONE),
        Detached(loss.reason),
        TellChildren(10.0 + REATTACH),
        Open(1, CARD0, 1),
        Open(2, CARD1, 1),
    ]
    dropped = 1 if isinstance(loss, LinkLost) else None  # the parent to tell rank 0 of
    assert m.state == Seeking(10.0 + REATTACH, {0: 1, 1: 2}, dropped=dropped)
    assert m.parent_link is None and m.next_deadline() == 10.0 + REATTACH


def test_a_parent_that_refuses_with_77_ends_the_broker() -> None:
    m = home()
    out = m.handle(Refused(0, exitcodes.REFUSED, "superseded"), 1.0)
    assert out[-1] == Exit(exitcodes.REFUSED, "superseded")


def test_a_stopping_broker_does_not_seek() -> None:
    m = home()
    assert m.handle(Stop(), 1.0) == [] and m.stopping
    assert m.handle(LinkLost(0, "dropped"), 2.0)[-1] == Exit(exitcodes.LOST, "dropped")


def test_a_broker_that_knows_no_ancestor_does_not_seek() -> None:
    m = home(lineage=())
    assert m.handle(LinkLost(0, "dropped"), 2.0)[-1] == Exit(exitcodes.LOST, "dropped")


def test_the_lineage_said_again_replaces_the_old_one() -> None:
    m = home()
    assert m.handle(LineageSaid(0, (CARD0,)), 1.0) == [LineageChanged((CARD0,))]
    assert m.lineage == (CARD0,)


def test_a_repeated_welcome_on_the_parent_link_is_refused() -> None:
    with pytest.raises(Unexpected, match="Welcomed on a parent link when state=Home"):
        home().handle(Welcomed(0, 1, 1, LINEAGE), 1.0)


def test_an_attached_broker_keeps_no_deadline() -> None:
    m = home()
    assert m.next_deadline() is None and m.handle(Tick(), 100.0) == []


# --- seeking -----------------------------------------------------------------------------------


def test_the_first_ancestor_to_welcome_is_the_parent_and_the_others_are_dismissed() -> None:
    m = seeking()
    out = m.handle(Welcomed(1, 0, 1, (CARD0,)), 10.5)
    assert out == [
        SendMoved(2, 0),
        AttachedTo(0, False, "reattached under rank 0"),
        LineageChanged((CARD0,)),
        Flush(),
        ReportDropped(1, "connection dropped"),
    ]
    assert m.state == Fostered(1, 0) and m.open_links == {1, 2}
    assert m.role(2) == "dismissed" and m.next_deadline() == 10.5 + DISMISS_WAIT


def test_a_dismissed_link_stays_open_for_its_moved_to_be_read_then_closes() -> None:
    """Issue 20, item 2: closed right behind its `moved`, the link lost it at times, and the
    parent reported the broker lost instead of moved."""
    m = fostered()
    assert m.handle(Welcomed(2, 1, 1, LINEAGE), 11.0) == []  # the hello it had said: ignored
    assert m.handle(LineageSaid(2, LINEAGE), 11.0) == []
    assert m.handle(ParentSeeking(2, 1.0), 11.0) == [] and m.state == Fostered(1, 0)
    assert m.handle(Tick(), 10.5 + DISMISS_WAIT - 0.01) == [] and 2 in m.open_links
    assert m.handle(Tick(), 10.5 + DISMISS_WAIT) == [Close(2, Linger.BRIEF)]
    assert m.open_links == {1} and m.role(2) is None and m.next_deadline() is None


@pytest.mark.parametrize(
    "end",
    [
        Refused(2, exitcodes.LOST, "rank 3 incarnation 1 has moved to another parent"),
        Refused(2, exitcodes.REFUSED, "key refused", key=True),
        LinkLost(2, "lost the connection to the parent"),
        Silent(2, "no answer to hello"),
    ],
    ids=["refused", "key", "dropped", "silent"],
)
def test_a_dismissed_link_that_ends_sooner_closes_at_once_and_changes_nothing(end) -> None:
    m = fostered()
    assert m.handle(end, 11.0) == [Close(2, Linger.NONE)]
    assert m.state == Fostered(1, 0) and m.open_links == {1} and not m.dismissed


def test_a_broker_that_ends_closes_its_dismissed_links_too() -> None:
    m = fostered()
    out = m.handle(Refused(1, exitcodes.REFUSED, "superseded"), 11.0)
    assert out == [Close(1, Linger.NONE), Close(2, Linger.NONE), Exit(77, "superseded")]
    assert not m.open_links and not m.dismissed


def test_the_home_parent_taking_its_child_back_makes_it_home() -> None:
    m = seeking()
    out = m.handle(Welcomed(2, 1, 1, LINEAGE), 10.5)
    assert m.state == Home(2, 1)
    assert not any(isinstance(i, ReportDropped) for i in out)  # the link is back: no news


@pytest.mark.parametrize(
    "loss",
    [
        Silent(0, "the parent has been silent for 3.0s"),
        Refused(0, exitcodes.LOST, "refused by the parent: rank 3 incarnation 1 was lost"),
        LinkLost(0, "the link to the parent is full", full=True),
    ],
    ids=["silent", "refused", "full"],
)
def test_only_a_dropped_connection_is_told_once_welcomed_elsewhere(loss) -> None:
    """A parent found silent, one that refused this broker, or one that stopped reading may be
    alive and seeking: that is not evidence of its end (ranktable.py, Dropped)."""
    m = home()
    m.handle(loss, 10.0)
    out = m.handle(Welcomed(1, 0, 1, (CARD0,)), 10.5)
    assert m.state == Fostered(1, 0)
    assert not any(isinstance(i, ReportDropped) for i in out)


def test_the_drop_is_told_once_after_the_welcome_and_not_on_a_later_search() -> None:
    m = fostered()
    out = m.handle(Silent(1, "the parent has been silent for 3.0s"), 20.0)
    assert isinstance(m.state, Seeking) and m.state.dropped is None
    out = m.handle(Welcomed(m.state.candidates[0], 0, 1, (CARD0,)), 20.5)
    assert not any(isinstance(i, ReportDropped) for i in out)


def test_a_key_refused_at_the_handshake_is_tried_again_soon() -> None:
    m = seeking(now=10.0)
    out = m.handle(Refused(1, exitcodes.REFUSED, "key refused", key=True), 10.1)
    assert out == [Close(1, Linger.NONE)]
    assert m.next_deadline() == pytest.approx(10.1 + RETRY_AFTER_KEY)
    assert m.handle(Tick(), 10.1) == []
    assert m.handle(Tick(), 10.1 + RETRY_AFTER_KEY) == [Open(3, CARD0, 1)]
    assert isinstance(m.state, Seeking) and m.state.candidates == {0: 3, 1: 2}


def test_a_hello_refused_with_75_is_asked_again_later() -> None:
    m = seeking(now=10.0)
    m.handle(Refused(1, exitcodes.LOST, "was lost"), 10.0)
    assert m.next_deadline() == pytest.approx(10.0 + RETRY_AFTER)


def test_a_hello_refused_with_77_ends_the_broker_unless_it_holds_the_shared_key() -> None:
    m = seeking()
    assert m.handle(Refused(1, exitcodes.REFUSED, "superseded"), 10.1)[-1] == Exit(
        exitcodes.REFUSED, "superseded"
    )
    shared = Upward(3, 1, 1, REATTACH, shared_key=True)
    shared.handle(Welcomed(0, 1, 1, LINEAGE), 0.0)
    shared.handle(LinkLost(0, "dropped"), 10.0)
    assert shared.handle(Refused(1, exitcodes.REFUSED, "not expected"), 10.1) == [
        Close(1, Linger.NONE)
    ]


def test_an_ancestor_shutting_down_ends_the_search_with_0() -> None:
    m = seeking()
    out = m.handle(Refused(2, exitcodes.SHUTDOWN, "the instance is shutting down"), 10.1)
    assert out == [
        Close(1, Linger.NONE),
        Close(2, Linger.NONE),
        Exit(exitcodes.SHUTDOWN, "the instance is shutting down"),
    ]


def test_a_candidate_that_drops_or_stays_silent_is_asked_again_later() -> None:
    m = seeking(now=10.0)
    m.handle(Silent(2, "no answer to hello"), 11.0)
    assert isinstance(m.state, Seeking) and m.state.retries == {1: 11.0 + RETRY_AFTER}


def test_the_search_ends_at_its_deadline_with_75() -> None:
    m = seeking(now=10.0)
    assert m.handle(Tick(), 10.0 + REATTACH - 0.01) == []
    out = m.handle(Tick(), 10.0 + REATTACH)
    assert out[:2] == [Close(1, Linger.NONE), Close(2, Linger.NONE)]
    assert isinstance(out[-1], Exit) and out[-1].code == exitcodes.LOST
    assert m.next_deadline() is None and not m.open_links


def test_a_seeking_broker_declines_to_go_home_and_keeps_seeking_once_stopped() -> None:
    m = seeking()
    assert m.handle(HomeOrder(CARD1), 10.1) == [Decline("this broker is seeking a parent")]
    assert m.handle(Stop(), 10.2) == [] and isinstance(m.state, Seeking)


# --- going home --------------------------------------------------------------------------------


def test_a_fostered_broker_goes_home_and_tells_the_foster_parent() -> None:
    m = fostered()
    m.handle(Tick(), 20.0)  # the candidate dismissed while seeking is closed
    assert m.handle(HomeOrder(CARD1), 21.0) == [Open(3, CARD1, 1)]
    assert m.state == GoingHome(1, 0, CARD1, 3) and m.parent_link == 1
    out = m.handle(Welcomed(3, 1, 1, LINEAGE), 21.2)
    assert out == [
        SendMoved(1, 1),
        AttachedTo(1, False, "home again under rank 1"),
        LineageChanged(LINEAGE),
    ]
    assert m.state == Home(3, 1) and m.open_links == {1, 3} and m.role(1) == "dismissed"
    assert m.handle(Tick(), 21.2 + DISMISS_WAIT) == [Close(1, Linger.BRIEF)]
    assert m.open_links == {3}


def test_a_key_refused_at_home_is_tried_again() -> None:
    m = fostered()
    m.handle(HomeOrder(CARD1), 11.0)
    assert m.handle(Refused(3, exitcodes.REFUSED, "key", key=True), 11.0) == [Close(3, Linger.NONE)]
    assert m.next_deadline() == pytest.approx(11.0 + RETRY_AFTER_KEY)
    assert m.handle(Tick(), 11.0 + RETRY_AFTER_KEY) == [Open(4, CARD1, 1)]


def test_any_other_end_of_the_way_home_gives_up_going_home() -> None:
    m = fostered()
    m.handle(HomeOrder(CARD1), 11.0)
    out = m.handle(Silent(3, "no answer to hello"), 12.0)
    assert out[0] == Close(3, Linger.NONE) and isinstance(out[1], Decline)
    assert m.state == Fostered(1, 0)


def test_the_foster_parent_lost_on_the_way_home_closes_both_and_seeks() -> None:
    m = fostered()
    m.handle(HomeOrder(CARD1), 11.0)
    out = m.handle(LinkLost(1, "dropped"), 12.0)
    assert out[:2] == [Close(1, Linger.NONE), Close(3, Linger.NONE)]
    assert isinstance(m.state, Seeking)


def test_an_order_home_to_where_it_is_is_nothing_and_to_elsewhere_declined() -> None:
    assert home().handle(HomeOrder(CARD1), 1.0) == []
    assert isinstance(fostered().handle(HomeOrder(CARD3), 11.0)[0], Decline)


def test_stopping_abandons_the_way_home() -> None:
    m = fostered()
    m.handle(HomeOrder(CARD1), 11.0)
    assert m.handle(Stop(), 11.1) == [Close(3, Linger.NONE)]
    assert m.state == Fostered(1, 0)
    assert isinstance(m.handle(HomeOrder(CARD1), 11.2)[0], Decline)


# --- defect 5: a seeking parent's deadline is its children's --------------------------------------


def test_a_child_of_a_seeking_parent_passes_the_deadline_on() -> None:
    m = home()
    assert m.handle(ParentSeeking(0, 2.0), 10.0) == [TellChildren(12.0)]
    assert m.state == Home(0, 1, parent_until=12.0)


def test_a_child_whose_seeking_parent_goes_seeks_no_longer_than_it() -> None:
    m = home()
    m.handle(ParentSeeking(0, 2.0), 10.0)
    out = m.handle(LinkLost(0, "dropped"), 11.0)
    assert TellChildren(12.0) in out and m.state == Seeking(12.0, {0: 1, 1: 2}, dropped=1)


def test_a_child_whose_parent_went_at_the_end_of_its_search_ends_at_once() -> None:
    m = home()
    m.handle(ParentSeeking(0, 2.0), 10.0)
    out = m.handle(LinkLost(0, "dropped"), 12.1)
    assert out[-1].code == exitcodes.LOST and isinstance(m.state, Ended)
    assert not any(isinstance(i, Open) for i in out)


def test_a_parent_attached_again_clears_the_deadline() -> None:
    m = home()
    m.handle(ParentSeeking(0, 2.0), 10.0)
    m.handle(LineageSaid(0, LINEAGE), 11.0)
    m.handle(LinkLost(0, "dropped"), 20.0)
    assert isinstance(m.state, Seeking) and m.state.until == 20.0 + REATTACH


def test_the_deadline_a_child_must_hear_is_the_search_s_or_the_parent_s() -> None:
    m = machine()
    assert m.search_until is None  # waiting
    m.handle(Welcomed(0, 1, 1, LINEAGE), 1.0)
    assert m.search_until is None  # home, nobody above seeks
    m.handle(ParentSeeking(0, 2.0), 10.0)
    assert m.search_until == 12.0  # its parent's
    m.handle(LineageSaid(0, LINEAGE), 11.0)
    assert m.search_until is None  # its parent was welcomed again
    m.handle(LinkLost(0, "dropped"), 20.0)
    assert m.search_until == 20.0 + REATTACH  # its own
    m.handle(Tick(), 20.0 + REATTACH)
    assert m.search_until is None  # ended


def test_a_child_welcomed_while_its_parent_seeks_hears_the_deadline_and_keeps_it() -> None:
    """Issue 20: a child welcomed after its parent began seeking was never told, and would seek
    for its full reattach timeout should that parent go. The parent says `seeking` right after
    the welcome (children.py), from `search_until`."""
    parent = Upward(1, 0, 1, REATTACH)
    parent.handle(Welcomed(0, 0, 1, (CARD0,)), 0.0)
    parent.handle(LinkLost(0, "dropped"), 10.0)  # rank 0's link lost: rank 1 seeks till 15
    assert parent.search_until == 10.0 + REATTACH
    child = machine()
    child.handle(Welcomed(0, 1, 1, LINEAGE), 11.0)  # rank 1 welcomes rank 3 meanwhile
    left = seeking_seconds(parent.search_until, 11.0)
    assert child.handle(ParentSeeking(0, left), 11.0) == [TellChildren(10.0 + REATTACH)]
    assert child.search_until == 10.0 + REATTACH  # what it tells its own children, too
    out = child.handle(LinkLost(0, "dropped"), 12.0)  # then rank 1 goes
    assert isinstance(child.state, Seeking) and child.state.until == 10.0 + REATTACH
    assert TellChildren(10.0 + REATTACH) in out


# --- defect 7: a lineage before any child is welcomed -----------------------------------------


def test_children_are_admitted_only_once_welcomed() -> None:
    """A broker reads no child's hello before its own welcome, so every welcome it gives
    carries its lineage (the broker registers its children's socket on `admits_children`)."""
    m = machine()
    assert not m.admits_children
    assert m.handle(Tick(), 1.0) == [] and not m.admits_children
    m.handle(Welcomed(0, 1, 1, LINEAGE), 1.0)
    assert m.admits_children
    m.handle(LinkLost(0, "dropped"), 2.0)
    assert m.admits_children  # seeking: children stay, and new ones are still admitted


def test_an_empty_lineage_filled_in_later_lets_the_broker_seek() -> None:
    m = home(lineage=())
    m.handle(LineageSaid(0, LINEAGE), 1.0)
    m.handle(LinkLost(0, "dropped"), 2.0)
    assert isinstance(m.state, Seeking) and set(m.state.candidates) == {0, 1}


# --- the end, and stale links --------------------------------------------------------------------


def test_ended_is_final() -> None:
    m = machine()
    m.handle(Silent(0, "x"), 1.0)
    for stimulus in (Welcomed(0, 1, 1, LINEAGE), Tick(), Stop(), HomeOrder(CARD1)):
        assert m.handle(stimulus, 2.0) == []
    assert m.state == Ended(exitcodes.LOST, "x")


def test_input_from_a_link_already_closed_is_ignored() -> None:
    m = seeking()
    m.handle(Welcomed(1, 0, 1, (CARD0,)), 10.5)
    assert m.handle(Welcomed(2, 1, 1, LINEAGE), 10.6) == []
    assert m.handle(LinkLost(0, "late"), 10.6) == []
    assert m.state == Fostered(1, 0)


def test_every_row_names_a_known_role() -> None:
    roles = {"parent", "home", "candidate", "dismissed", "-"}
    assert {role for _, _, role in TRANSITIONS} == roles


# --- random stimuli ------------------------------------------------------------------------------


class UpwardMachine(RuleBasedStateMachine):
    """Random stimuli on random links (held or not); the instructions must keep the books."""

    def __init__(self) -> None:
        super().__init__()
        self.m = Upward(3, 1, 1, REATTACH, shared_key=False)
        self.now = 0.0
        self.opened: set[int] = {0}  # what the instructions left open
        self.welcomed_once = False
        self.exits = 0

    def feed(self, stimulus) -> None:
        before = self.m.state
        was_ended = isinstance(before, Ended)
        try:
            out = self.m.handle(stimulus, self.now)
        except Unexpected:
            assert self.m.state == before  # a refused stimulus changes nothing
            return
        if was_ended:
            assert out == [] and self.m.state == before
        seen_welcome = False
        for instruction in out:
            if isinstance(instruction, Open):
                assert instruction.link not in self.opened
                self.opened.add(instruction.link)
            elif isinstance(instruction, Close):
                assert instruction.link in self.opened, instruction
                self.opened.discard(instruction.link)
            elif isinstance(instruction, SendMoved):
                assert instruction.link in self.opened
            elif isinstance(instruction, AttachedTo):
                assert instruction.first != self.welcomed_once
                self.welcomed_once = seen_welcome = True
            elif isinstance(instruction, Flush):
                assert seen_welcome  # nothing goes up before a welcome but the hello
            elif isinstance(instruction, ReportDropped):
                assert seen_welcome and instruction.parent != self.m.peer
            elif isinstance(instruction, Exit):
                self.exits += 1
                assert isinstance(self.m.state, Ended)

    def some_link(self, data) -> int:
        held = sorted(self.opened)
        return data.draw(st.sampled_from([*held, 99]))  # 99: a link never opened

    @rule(data=st.data(), peer=st.sampled_from([0, 1]), lineage=st.sampled_from([(), LINEAGE]))
    def welcome(self, data, peer: int, lineage) -> None:
        self.feed(Welcomed(self.some_link(data), peer, 1, lineage))

    @rule(data=st.data(), kind=st.sampled_from(["lost", "full", "silent", "key", "75", "77", "0"]))
    def loss(self, data, kind: str) -> None:
        link = self.some_link(data)
        stimulus = {
            "lost": LinkLost(link, "dropped"),
            "full": LinkLost(link, "full", full=True),
            "silent": Silent(link, "silent"),
            "key": Refused(link, exitcodes.REFUSED, "key", key=True),
            "75": Refused(link, exitcodes.LOST, "was lost"),
            "77": Refused(link, exitcodes.REFUSED, "superseded"),
            "0": Refused(link, exitcodes.SHUTDOWN, "shutting down"),
        }[kind]
        self.feed(stimulus)

    @rule(data=st.data(), seconds=st.floats(0, 10))
    def parent_seeking(self, data, seconds: float) -> None:
        self.feed(ParentSeeking(self.some_link(data), seconds))

    @rule(data=st.data())
    def lineage(self, data) -> None:
        self.feed(LineageSaid(self.some_link(data), LINEAGE))

    @rule(card=st.sampled_from([CARD0, CARD1, CARD3]))
    def home_order(self, card) -> None:
        self.feed(HomeOrder(card))

    @rule()
    def stop(self) -> None:
        self.feed(Stop())

    @rule(dt=st.floats(0, 3))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick())

    @invariant()
    def books_kept(self) -> None:
        assert self.m.open_links == self.opened
        parents = [link for link in self.opened if self.m.role(link) == "parent"]
        assert len(parents) <= 1
        if self.m.parent_link is not None:
            assert self.m.parent_link in self.opened
        # a dismissed link is open, neither parent nor candidate, and closed within DISMISS_WAIT
        assert set(self.m.dismissed) <= self.opened
        assert all(self.m.role(link) == "dismissed" for link in self.m.dismissed)
        assert all(when <= self.now + DISMISS_WAIT for when in self.m.dismissed.values())
        if self.m.dismissed:
            deadline = self.m.next_deadline()
            assert deadline is not None and deadline <= min(self.m.dismissed.values())

    @invariant()
    def a_search_has_a_deadline(self) -> None:
        if isinstance(self.m.state, Seeking):
            deadline = self.m.next_deadline()
            assert deadline is not None and deadline <= self.m.state.until
            assert self.m.state.until <= self.now + REATTACH

    @invariant()
    def the_end_is_said_once(self) -> None:
        assert self.exits == (1 if isinstance(self.m.state, Ended) else 0)
        if isinstance(self.m.state, Ended):
            assert not self.opened

    @invariant()
    def nothing_is_attached_before_a_welcome(self) -> None:
        if not self.welcomed_once:
            assert self.m.parent_link is None
            assert isinstance(self.m.state, Waiting | Ended)


TestUpwardMachine = UpwardMachine.TestCase
TestUpwardMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
