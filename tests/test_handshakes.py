"""A child's CURVE handshakes with a busy parent (overlay/links/handshakes.py): a retry that
succeeds is told at info level, not as a failure; a run of failures that goes on is a warning.

The last test is the case seen at `tbon start --test-size=1024` on a loaded machine: a parent
(rank 0, still booting) answers its ZAP requests after its handshake timeout, ZeroMQ closes the
child's connection ("Broken pipe" at the child), and the child gets in on ZeroMQ's own retry.
It runs a real parent side (links/children.py) and a real child link (links/parent.py) on CURVE
sockets, and holds the parent's ZAP answers back past the timeout.
"""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from tbon.overlay.config.attributes import broker_config
from tbon.overlay.links.children import Children
from tbon.overlay.links.handshakes import WARN_AFTER, Handshakes
from tbon.overlay.links.parent import ParentLink
from tbon.overlay.state.topology import Topology


def test_a_failure_then_a_success_is_info_only() -> None:
    shakes = Handshakes("tcp://10.0.0.1:4000")
    level, text = shakes.failure("Broken pipe", protocol=False, quiet=False)
    assert level == logging.INFO
    assert text.startswith("CURVE handshake with the parent at tcp://10.0.0.1:4000 did not")
    assert "Broken pipe" in text and "retrying" in text
    assert shakes.success() == (
        logging.INFO,
        "CURVE handshake with the parent at tcp://10.0.0.1:4000 done after 1 failed try",
    )
    assert shakes.success() is None  # no failure since: nothing to say


def test_failures_that_go_on_are_warned_about_at_three_thirty_and_three_hundred() -> None:
    shakes = Handshakes("e")
    warned = [
        n + 1
        for n in range(400)
        if shakes.failure("Connection reset by peer", False, False)[0] == logging.WARNING
    ]
    assert warned == [WARN_AFTER, 10 * WARN_AFTER, 100 * WARN_AFTER]
    shakes.success()
    assert shakes.failure("Broken pipe", False, False)[0] == logging.INFO  # counted anew


def test_a_protocol_error_is_a_warning_and_an_expected_refusal_debug() -> None:
    shakes = Handshakes("e")
    assert shakes.failure("protocol error 0x11", protocol=True, quiet=False)[0] == logging.WARNING
    assert shakes.failure("Broken pipe", protocol=False, quiet=True)[0] == logging.DEBUG


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    context.term()


def test_a_parent_that_answers_zap_after_its_handshake_timeout_lets_the_child_in_quietly(
    context: zmq.Context, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tbon")
    config = broker_config({"broker.handshake-timeout": "200ms", "tbon.timeout": "30s"})
    parent_public, parent_secret = zmq.curve_keypair()
    child_public, child_secret = zmq.curve_keypair()
    children = Children(context, 0, Topology("kary:2", 3), config, parent_secret.decode())
    endpoint = children.bind("tcp://127.0.0.1:*")
    children.authorize(1, 1, child_public.decode())
    keys = (child_public.decode(), child_secret.decode())
    link = ParentLink(context, 1, 1, config, keys, (endpoint, parent_public.decode()), 0.0, 0)
    try:
        # the parent's loop is elsewhere (booting): its ZAP requests wait, past its timeout,
        # until the child has seen its handshake closed
        deadline = time.monotonic() + 20
        while link.handshakes.failed == 0:
            assert time.monotonic() < deadline, "the child saw no handshake closed"
            assert link.drain_monitor() is None
            link.monitor.poll(100)
        welcomed = False
        while not welcomed:  # now the parent answers, as its loop does
            assert time.monotonic() < deadline, "the child was not welcomed"
            while children.zap.socket.poll(0):
                children.zap.handle()
            children.drain_monitor()
            while children.readable():
                children.read(time.monotonic())
            assert link.drain_monitor() is None
            if link.readable():
                inbound = link.read(time.monotonic())
                welcomed = inbound is not None and inbound.welcomed
            waited = [children.zap.socket, children.socket, link.socket, link.monitor]
            zmq.select(waited, [], [], 0.05)
    finally:
        link.socket.close(linger=0)
        link.monitor.close()
        children.close()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tbon.parent"]
    assert not [text for level, text in lines if level >= logging.WARNING]
    assert any("did not complete" in text and "retrying" in text for _, text in lines)
    assert any(text.endswith(("failed try", "failed tries")) for _, text in lines)
    assert children.attached(1)
    assert not children.blocklist.blocked  # a legitimate child that retried is not blocked
