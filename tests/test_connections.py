"""The connection ledger: monitor events matched to peers, descriptors reused."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.links.connections import Connection, ConnectionLedger


def test_a_peer_is_gone_when_its_connection_closes() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    assert ledger.heard("a", 7)
    assert ledger.closed(7) == ["a"]
    assert ledger.closed(7) == []


def test_a_reused_descriptor_does_not_end_the_new_peer() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    ledger.heard("old", 7)
    assert ledger.closed(7) == ["old"]
    ledger.accepted(7)
    assert ledger.heard("new", 7)
    ledger.accepted(8)
    assert ledger.closed(8) == []
    assert ledger.closed(7) == ["new"]


def test_a_peer_that_hung_up_before_its_message_was_read_is_gone_at_once() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    ledger.closed(7)
    assert not ledger.heard("quick", 7)


def test_a_peer_keeps_its_connection_whatever_the_descriptor_says_later() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    ledger.heard("a", 7)
    assert ledger.heard("a", 7)
    assert ledger.closed(7) == ["a"]
    assert not ledger.heard("a", 7)


def test_a_peer_heard_on_a_new_connection_moves_there() -> None:
    """A child that says hello again on a new connection: the old one's close is stale."""
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    assert ledger.heard("child", 7)
    ledger.accepted(8)
    assert ledger.heard("child", 8)
    assert ledger.closed(7) == []
    assert ledger.tied("child")
    assert ledger.closed(8) == ["child"]
    assert not ledger.tied("child")


def test_a_peer_heard_on_a_connection_already_closed_is_on_none() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    ledger.heard("child", 7)
    ledger.accepted(8)
    ledger.closed(8)
    assert not ledger.heard("child", 8)
    assert not ledger.tied("child")
    assert ledger.closed(7) == []


def test_a_connection_named_earlier_is_judged_by_its_own_generation() -> None:
    """A tie made later (a rejoin that waited for rank 0) is to the connection then named."""
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    named = ledger.connection(7)
    assert named == Connection(7, 1) and ledger.is_open(named)
    ledger.closed(7)
    ledger.accepted(7)
    assert not ledger.is_open(named)
    assert not ledger.tie("late", named)
    assert ledger.tie("other", ledger.connection(7))
    assert ledger.closed(7) == ["other"]


def test_a_forgotten_peer_is_not_news_when_its_connection_closes() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    ledger.accepted(7)
    ledger.heard("a", 7)
    ledger.heard("b", 7)
    ledger.forget("a")
    ledger.forget("a")  # twice is harmless
    assert ledger.closed(7) == ["b"]


def test_a_descriptor_never_seen_accepted_is_taken_as_open() -> None:
    ledger: ConnectionLedger[str] = ConnectionLedger()
    assert ledger.heard("a", 9)
    assert ledger.closed(9) == ["a"]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.integers(0, 3)),
        st.tuples(st.just("close"), st.integers(0, 3)),
        st.tuples(st.just("heard"), st.sampled_from("abc"), st.integers(0, 3)),
        st.tuples(st.just("forget"), st.sampled_from("abc")),
    ),
    max_size=40,
)


@given(operations)
@settings(max_examples=200, deadline=None)
def test_the_ledger_against_an_oracle(steps: list[tuple[Any, ...]]) -> None:
    """The oracle numbers every connection once, with no descriptors or generations: a peer is
    on the last connection it was heard on while that one is open, and gone when it closes."""
    ledger: ConnectionLedger[str] = ConnectionLedger()
    serial = itertools.count(1)
    on_fd: dict[int, int] = {}  # descriptor -> the connection on it now (0: never accepted)
    open_: set[int] = set()  # connections open (the never-accepted 0s of each fd included)
    where: dict[str, int] = {}
    for fd in range(4):
        on_fd[fd] = -fd - 1  # one never-accepted connection per descriptor, open
        open_.add(on_fd[fd])
    for step in steps:
        match step:
            case ("accept", fd):
                on_fd[fd] = next(serial)
                open_.add(on_fd[fd])
                ledger.accepted(fd)
            case ("close", fd):
                open_.discard(on_fd[fd])
                expected = sorted(p for p, c in where.items() if c == on_fd[fd])
                where = {p: c for p, c in where.items() if c != on_fd[fd]}
                assert sorted(ledger.closed(fd)) == expected
            case ("heard", peer, fd):
                where.pop(peer, None)
                if on_fd[fd] in open_:
                    where[peer] = on_fd[fd]
                assert ledger.heard(peer, fd) == (peer in where)
            case ("forget", peer):
                where.pop(peer, None)
                ledger.forget(peer)
        for peer in "abc":
            assert ledger.tied(peer) == (peer in where)
