"""The connection ledger: monitor events matched to peers, descriptors reused."""

from __future__ import annotations

from tbon.overlay.links.connections import ConnectionLedger


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
