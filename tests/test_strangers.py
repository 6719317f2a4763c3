"""The decisions about a connection flood (links/strangers.py, blocklist.py, descriptors.py):
which strangers to close, what to log, which addresses to block, how many descriptors to keep
back. Pure, but for the filter, which is tried on a real listening socket on 127.0.0.2."""

from __future__ import annotations

import json
import os
import resource
import socket
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tbon.errors import UsageError
from tbon.overlay.config.attributes import broker_config
from tbon.overlay.links.blocklist import MAX_BLOCKED, Blocklist, attach
from tbon.overlay.links.descriptors import Reserve, hand_down, reserve_size, target_limit
from tbon.overlay.links.strangers import Caps, FloodLog, Strangers, caps_for

CAPS = Caps(per_source=3, in_all=5)


def test_a_source_past_its_cap_loses_its_oldest_stranger() -> None:
    strangers = Strangers(CAPS)
    assert [strangers.accepted(fd, "a") for fd in (10, 11, 12)] == [[], [], []]
    assert strangers.accepted(13, "a") == [(10, "a")]
    assert strangers.from_source("a") == 3


def test_past_the_cap_in_all_the_biggest_holder_loses_its_oldest() -> None:
    strangers = Strangers(CAPS)
    for fd in (1, 2, 3):
        strangers.accepted(fd, "flood")
    strangers.accepted(4, "b")
    strangers.accepted(5, "c")
    assert strangers.accepted(6, "newcomer") == [(1, "flood")]  # never the newcomer
    assert len(strangers) == 5


def test_a_stranger_that_speaks_or_closes_is_forgotten_once() -> None:
    strangers = Strangers(CAPS)
    strangers.accepted(7, "a")
    assert strangers.forget(7)
    assert not strangers.forget(7)
    assert strangers.from_source("a") == 0


def test_a_reused_descriptor_is_a_new_stranger() -> None:
    strangers = Strangers(CAPS)
    strangers.accepted(7, "a")
    strangers.accepted(7, "b")  # its first connection's close was not seen
    assert (strangers.from_source("a"), strangers.from_source("b")) == (0, 1)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20), st.sampled_from("abcd"))))
def test_the_caps_always_hold(steps: list[tuple[bool, int, str]]) -> None:
    strangers = Strangers(CAPS)
    held: dict[int, str] = {}
    for accept, fd, source in steps:
        if accept:
            held.pop(fd, None)
            held[fd] = source
            for victim, victim_source in strangers.accepted(fd, source):
                assert held.pop(victim) == victim_source
                assert victim != fd or len(held) >= CAPS.in_all  # the newcomer keeps its turn
        else:
            assert strangers.forget(fd) == (held.pop(fd, None) is not None)
        assert len(strangers) == len(held) <= CAPS.in_all
        assert all(strangers.from_source(s) <= CAPS.per_source for s in "abcd")


def test_caps_follow_the_limit() -> None:
    assert caps_for(256, reserve_size(256)) == Caps(per_source=28, in_all=56)
    assert caps_for(1 << 20, reserve_size(1 << 20)) == Caps(per_source=512, in_all=1024)
    # a broker's own children may all connect at once from one host: room for them on top
    assert caps_for(40, reserve_size(40), children=8) == Caps(per_source=12, in_all=16)
    assert caps_for(16, 16) == Caps(per_source=4, in_all=8)


def test_the_flood_is_logged_once_per_interval_with_counts() -> None:
    flood = FloodLog(10.0)
    flood.accepted()
    assert flood.line(0.0, CAPS) is None  # no cap reached: nobody floods
    flood.closed(["x"])
    first = flood.line(1.0, CAPS)
    assert first is not None and "3 per address, 5 in all" in first
    for _ in range(1000):
        flood.accepted()
        flood.closed(["x"])
        assert flood.line(5.0, CAPS) is None
    flood.closed(["y"])
    assert flood.line(11.0, CAPS) == (
        "connection flood on the tree port: 1000 accepted and 1001 closed over the caps in 10s, "
        "from 2 addresses"
    )
    assert flood.next_deadline() == 21.0
    assert flood.line(21.0, CAPS) == "the connection flood on the tree port is over"
    assert flood.next_deadline() is None


def test_an_address_is_blocked_until_an_interval_passes_quiet() -> None:
    blocklist = Blocklist(5.0)
    assert blocklist.over(["10.0.0.1", "?"], 0.0) == {"10.0.0.1"}
    assert blocklist.over(["10.0.0.1"], 1.0) is None  # blocked already
    assert blocklist.tick(4.0) is None
    assert blocklist.tick(5.0) is None  # it went past its cap in that interval
    assert blocklist.tick(10.0) == frozenset()  # quiet throughout the next
    assert blocklist.next_deadline() is None


def test_the_blocklist_is_bounded() -> None:
    blocklist = Blocklist(5.0)
    many = [f"10.0.{n // 256}.{n % 256}" for n in range(MAX_BLOCKED + 10)]
    blocked = blocklist.over(many, 0.0)
    assert blocked is not None and len(blocked) == MAX_BLOCKED


def _connects(port: int, source: str) -> bool:
    with socket.socket() as client:
        client.bind((source, 0))
        client.settimeout(0.3)  # a dropped SYN is retried after 1 s: this is long enough
        try:
            client.connect(("127.0.0.1", port))
        except TimeoutError:
            return False
        return True


def test_the_filter_drops_new_connections_from_blocked_addresses_only() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        attach(listener.fileno(), frozenset({"127.0.0.2", "127.0.0.9"}))
        assert _connects(port, "127.0.0.1")
        assert not _connects(port, "127.0.0.2")
        attach(listener.fileno(), frozenset())
        assert _connects(port, "127.0.0.2")


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    assert target_limit(1024, 524288, None) == 524288
    assert target_limit(1024, resource.RLIM_INFINITY, 1048576) == 1048576
    assert target_limit(4096, 4096, None) == 4096
    assert [reserve_size(n) for n in (16, 40, 64, 1024, 1 << 20)] == [2, 5, 8, 128, 256]


def test_the_reserve_lends_and_fills_again() -> None:
    reserve = Reserve(4)
    try:
        assert len(reserve) == 4
        with reserve.lending():
            assert reserve.release(3) == 3
            assert len(reserve) == 1
        assert len(reserve) == 4
    finally:
        reserve.close()
    assert len(reserve) == 0


def _open(fd: int) -> bool:
    return os.path.exists(f"/proc/self/fd/{fd}")


def test_closing_the_reserve_closes_its_own_descriptors_only() -> None:
    reserve = Reserve(6)
    other = None
    try:
        reserve.release(3)  # the three highest: one of them is taken by another, in between
        other = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        reserve.refill()
        held = list(reserve._held)
        assert other in range(min(held), max(held))  # the reserve is two runs around it
        reserve.close()
        assert len(reserve) == 0 and not any(_open(fd) for fd in held)
        assert _open(other)
    finally:
        reserve.close()
        if other is not None:
            os.close(other)


def in_a_fork(work: Callable[[], Any]) -> Any:
    """What `work` returns (JSON) when run in a process forked from this one, as the launcher
    forks a broker; the child is reaped, and never returns into pytest."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say, and leave at once, whatever happens
        code = 1
        try:
            os.write(write, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as said:
        text = said.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return json.loads(text)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_broker_takes_the_reserve_its_launcher_handed_down() -> None:
    launcher = Reserve(4)
    hand_down(launcher)
    try:

        def broker() -> list[Any]:
            taken = Reserve(4)  # what it inherited becomes its own
            again = Reserve(4)  # taken once only: another reserve opens its own
            return [taken._held, again._held]

        taken, again = in_a_fork(broker)
        assert taken == launcher._held and set(again).isdisjoint(launcher._held)
        # The launcher's own reserve is its own: a reserve it makes opens new descriptors.
        own = Reserve(4)
        assert set(own._held).isdisjoint(launcher._held)
        own.close()
    finally:
        hand_down(None)
        launcher.close()


def test_a_reserve_handed_down_at_another_size_is_closed_not_left_open() -> None:
    """A broker whose reserve is of another size than its launcher's (another limit) cannot
    take what it inherited: it closes it, rather than hold it open for nothing."""
    launcher = Reserve(4)
    hand_down(launcher)
    try:

        def broker() -> list[Any]:
            own = Reserve(3)  # (it may open the numbers it closed: those are its own now)
            return [own._held, [fd for fd in launcher._held if is_open(fd) and fd not in own._held]]

        held, left = in_a_fork(broker)
        assert len(held) == 3 and left == [], (held, left)
        assert all(is_open(fd) for fd in launcher._held)  # the launcher's, untouched
    finally:
        hand_down(None)
        launcher.close()


def test_the_handshake_timeout_attribute() -> None:
    assert broker_config({}).handshake_timeout == 5.0
    assert broker_config({"broker.handshake-timeout": "250ms"}).handshake_timeout == 0.25
    for bad in ("0", "2m", "soon"):
        try:
            broker_config({"broker.handshake-timeout": bad})
        except UsageError as error:
            assert "handshake-timeout" in str(error)
        else:
            raise AssertionError(f"{bad!r} was taken")


def test_a_parent_blocks_on_its_own_tree_port_found_at_the_first_block() -> None:
    """Children looks for ZeroMQ's listening socket only when it first blocks someone (the
    look walks every descriptor): the filter still lands on the tree port's listener."""
    import zmq

    from tbon.overlay.links.children import Children
    from tbon.overlay.state.topology import Topology

    context = zmq.Context()
    children = Children(
        context, 0, Topology("kary:2", 3), broker_config({}), zmq.curve_keypair()[1].decode()
    )
    try:
        port = int(children.bind("tcp://127.0.0.1:*").rsplit(":", 1)[1])
        assert _connects(port, "127.0.0.2")
        children._block(frozenset({"127.0.0.2"}))
        assert not _connects(port, "127.0.0.2")
        assert _connects(port, "127.0.0.1")
        children._block(frozenset())
        assert _connects(port, "127.0.0.2")
    finally:
        children.close()
        context.term()
