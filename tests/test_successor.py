"""A root that stepped down alone asks the root group whether a later term exists
(overlay/links/successor.py, docs/protocol.md §13.5): whom it dials, when again, and what a
refusal tells its term fence. Pure: no sockets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_children_judge import ACCEPTED, bare_children, hello_message, public_key

from tbon import exitcodes
from tbon.overlay.links.children import Inbound
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.successor import RETRY_AFTER, Ask, Asking, Hang, named_root
from tbon.overlay.state.terms import TERMED_CONTROLS, Superseded, Terms
from tbon.overlay.state.topology import Topology

KEY = "k" * 40
CARDS = tuple((rank, f"tcp://127.0.0.1:{5000 + rank}", KEY) for rank in (0, 1, 2))


def test_alone_it_asks_every_member_but_itself_once() -> None:
    asking = Asking(0)
    assert asking.tick(True, CARDS, 10.0) == [Ask(CARDS[1]), Ask(CARDS[2])]
    assert asking.tick(True, CARDS, 10.1) == []  # one link per member at a time
    assert asking.next_deadline() is None


def test_not_alone_it_asks_nobody_and_closes_what_it_opened() -> None:
    asking = Asking(0)
    assert asking.tick(False, CARDS, 10.0) == []
    asking.tick(True, CARDS, 10.0)
    assert asking.tick(False, CARDS, 10.5) == [Hang(1), Hang(2)]
    assert asking.tick(False, CARDS, 20.0) == []


def test_a_member_whose_link_ended_is_asked_again_after_a_while() -> None:
    asking = Asking(0)
    asking.tick(True, CARDS, 10.0)
    assert asking.ended(1, 10.2) == [Hang(1)]
    assert asking.ended(1, 10.3) == []  # closed already
    assert asking.next_deadline() == 10.2 + RETRY_AFTER
    assert asking.tick(True, CARDS, 10.5) == []
    assert asking.tick(True, CARDS, 10.2 + RETRY_AFTER) == [Ask(CARDS[1])]
    assert asking.next_deadline() is None


def test_a_card_learned_later_is_asked_at_the_next_tick() -> None:
    asking = Asking(0)
    assert asking.tick(True, CARDS[:2], 1.0) == [Ask(CARDS[1])]
    assert asking.tick(True, CARDS, 1.1) == [Ask(CARDS[2])]


@given(
    st.lists(
        st.tuples(st.sampled_from(["tick", "ended"]), st.booleans(), st.sampled_from([1, 2])),
        max_size=40,
    )
)
def test_never_two_links_to_one_member_nor_one_left_open_once_not_alone(steps) -> None:
    asking, now, open_ = Asking(0), 0.0, set()
    for kind, alone, rank in steps:
        now += 0.2
        out = asking.tick(alone, CARDS, now) if kind == "tick" else asking.ended(rank, now)
        for instruction in out:
            if isinstance(instruction, Ask):
                assert instruction.card[0] not in open_ and instruction.card[0] != 0
                open_.add(instruction.card[0])
            else:
                open_.remove(instruction.rank)
        if kind == "tick" and not alone:
            assert not open_
        assert open_ == asking.asking


def test_a_refusal_naming_a_later_terms_root_supersedes_a_former_root() -> None:
    terms = Terms(0, leading=True)  # rank 0 led term 1
    news = terms.heard(2, named_root(1))
    assert len(news) == 1 and isinstance(news[0], Superseded)
    assert news[0].reason == "superseded: rank 1 is the root in term 2"


def test_a_refusal_of_the_same_term_or_of_no_term_says_nothing() -> None:
    terms = Terms(0, leading=True)
    assert terms.heard(None, named_root(None)) == []  # an older broker's refuse: term 1
    assert terms.heard(1, named_root(2)) == []


def test_a_root_is_a_rank() -> None:
    assert named_root(3) == 3 and named_root(0) == 0
    assert named_root(True) is None and named_root(-1) is None and named_root("1") is None


def test_the_root_that_took_over_refuses_the_dead_roots_hello_naming_itself() -> None:
    """At the takeover the new root admits the dead root's key and revokes it at once
    (broker.py `_take_over`): the woken root's hello is heard, refused 77, and the refusal
    names the root of the term it is stamped with."""
    children, sent = bare_children(Topology("kary:4", 9), 1)
    children.terms = Terms(1, leading=False)
    children.terms.lead(2)
    children.authorize(0, 1, public_key(0), foster_until=1e9)
    children.revoke(0, 1, "superseded: rank 1 is the root in term 2")
    children._connection_event(ACCEPTED, 11)
    inbound = Inbound()
    children._hello(b"old", 11, Identity(0, 1), hello_message(Identity(0, 1)), 1.0, inbound)
    assert inbound.reports == []  # never welcomed
    (refuse,) = sent
    assert refuse.topic == "refuse" and "refuse" in TERMED_CONTROLS  # stamped with term 2
    assert refuse.payload["exit_code"] == exitcodes.REFUSED and refuse.payload["root"] == 1
    assert "superseded: rank 1 is the root in term 2" in refuse.payload["reason"]
