"""The broker's local connector as a plain Unix stream socket (overlay/links/local.py).

First the framing (overlay/wire/frames.py) without sockets, then LocalServer on real sockets in
this process (no broker: the test plays the broker's loop), then real brokers: a garbled stream,
a frame too large, a client killed mid-stream, the connection cap, and a command that never
imports ZeroMQ. Every wait has a deadline; every process started is reaped by PID.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import resource
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEADLINE, TBON, child_env, process_gone, wait_for
from hypothesis import given
from hypothesis import strategies as st
from rawlocal import RawClient, partial_writes

from tbon.overlay.links.local import (
    FIRST_NUMBER_BYTES,
    MAX_INPUT,
    LocalServer,
    RateLimit,
    client_cap,
    first_number,
)
from tbon.overlay.wire.frames import (
    COPY_BELOW,
    MAX_FRAME,
    MAX_FRAMES,
    FrameError,
    FrameReader,
    Outbox,
    encode_frames,
    frame_parts,
)
from tbon.overlay.wire.message import Kind, Message, decode, encode

U32 = struct.Struct(">I")

# --- framing, without sockets ----------------------------------------------------------------

messages_st = st.lists(
    st.lists(st.binary(max_size=40), min_size=1, max_size=5), min_size=1, max_size=8
)


@given(messages_st, st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_any_chunking_of_a_stream_yields_the_same_messages(
    messages: list[list[bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode_frames(frames) for frames in messages)
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    reader, read = FrameReader(), []
    for start, end in itertools.pairwise(bounds):
        reader.feed(stream[start:end])
        read += reader.drain()
    assert read == messages and len(reader) == 0


@given(
    messages_st,
    st.lists(st.integers(min_value=-1, max_value=300), min_size=1).filter(
        lambda takes: max(takes) > 0
    ),
)
def test_an_outbox_writes_every_byte_in_order_however_little_each_write_takes(
    messages: list[list[bytes]], takes: list[int]
) -> None:
    """`takes`: how much each write accepts, in turn (-1: none, as a full socket)."""
    outbox = Outbox()
    sendmsg, written = partial_writes(takes)
    for frames in messages:  # each sent at once as far as it goes, the rest queued in order
        outbox.send(frame_parts(frames), sendmsg)
    for _ in range(10_000):
        if not outbox:
            break
        outbox.flush(sendmsg)
    assert bytes(written) == b"".join(encode_frames(frames) for frames in messages)
    assert outbox.size == 0


def test_a_large_frame_goes_to_the_socket_as_it_is() -> None:
    data = memoryview(os.urandom(COPY_BELOW))
    parts = frame_parts([b"head", b"", data])
    assert any(part is data for part in parts)  # not copied
    assert b"".join(bytes(p) for p in parts) == encode_frames([b"head", b"", bytes(data)])


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (U32.pack(0), "a message of 0 frames"),
        (U32.pack(MAX_FRAMES + 1), f"a message of {MAX_FRAMES + 1} frames"),
        (U32.pack(1) + U32.pack(MAX_FRAME + 1), f"a frame of {MAX_FRAME + 1} bytes"),
    ],
)
def test_a_stream_out_of_bounds_is_refused_as_soon_as_the_number_arrives(
    header: bytes, why: str
) -> None:
    reader = FrameReader()
    reader.feed(header)  # and none of the bytes it announces
    with pytest.raises(FrameError, match=why):
        reader.next()


def test_a_message_over_the_readers_bound_is_refused_before_it_is_all_held() -> None:
    reader = FrameReader(max_message=1000)
    reader.feed(U32.pack(2) + U32.pack(600) + b"x" * 600 + U32.pack(600))
    with pytest.raises(FrameError, match="a message of over 1000 bytes"):
        reader.next()


def test_the_client_cap_is_a_quarter_of_the_descriptors_within_bounds() -> None:
    assert client_cap(1024) == 256
    assert client_cap(20) == 16
    assert client_cap(1 << 20) == 4096


def test_refusals_are_logged_at_most_once_per_period_and_the_rest_counted() -> None:
    limit = RateLimit(10.0)
    assert [limit.due(t) for t in (100.0, 101.0, 109.9, 110.0)] == [True, False, False, True]
    assert limit.missed == 2


# --- LocalServer on real sockets, this process playing the broker's loop ----------------------


class Loop:
    """What the broker's loop is told about each connection (links/local.py `Watch`)."""

    def __init__(self) -> None:
        self.watched: dict[int, bool] = {}
        self.told: list[tuple[int, bool | None]] = []

    def __call__(self, fd: int, writing: bool | None) -> None:
        self.told.append((fd, writing))
        if writing is None:
            del self.watched[fd]
        else:
            self.watched[fd] = writing


@pytest.fixture
def server() -> Iterator[tuple[LocalServer, Loop]]:
    with tempfile.TemporaryDirectory(prefix="tls") as rundir:
        local = LocalServer(rundir, backlog=1 << 20, cap=3)
        loop = Loop()
        local.watch_with(loop)
        try:
            yield local, loop
        finally:
            local.close()


def connect(local: LocalServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(local.path)
    sock.settimeout(DEADLINE)
    return sock


def request(topic: str, tag: int, **payload: object) -> bytes:
    return encode_frames(encode(Message(Kind.REQUEST, topic, dict(payload), tag=tag)))


def serve(local: LocalServer, fd: int) -> list[tuple[str, Message]]:
    """What one turn of the loop reads from `fd`, once it is readable."""
    assert select.select([fd], [], [], DEADLINE)[0]
    return list(local.read(fd))


def read_all(sock: socket.socket) -> list[list[bytes]]:
    """Every message until the server closes its end."""
    reader = FrameReader()
    while data := sock.recv(1 << 20):
        reader.feed(data)
    return reader.drain()


def test_clients_are_named_by_hops_never_reused_and_gone_only_if_they_spoke(server) -> None:
    local, loop = server
    first, second = connect(local), connect(local)
    local.accept()
    fds = list(loop.watched)
    assert len(fds) == 2 and loop.watched == dict.fromkeys(fds, False)  # input only
    first.sendall(request("broker.ping", 1))
    [(hop, message)] = serve(local, fds[0])
    assert hop.startswith("l") and message.topic == "broker.ping" and message.tag == 1
    number = int(hop[1:], 16)
    assert hop == f"l{number:x}"  # lower-case hex, no leading zeros
    first.close()
    second.close()
    assert serve(local, fds[0]) == [] and serve(local, fds[1]) == []
    assert local.gone() == [hop]  # the silent one started nothing: nothing to clean up
    assert local.send(hop, message.respond()) is False
    third = connect(local)
    local.accept()
    third.sendall(request("broker.ping", 2))
    [(later, _)] = serve(local, next(iter(loop.watched)))
    assert later == f"l{number + 2:x}"  # a new connection, maybe on an old descriptor: a new name
    third.close()


def hops_named(first: int | None, clients: int) -> list[str]:
    """The hops a new server names its first `clients` connections by, one after another."""
    hops = []
    with tempfile.TemporaryDirectory(prefix="tls") as rundir:
        local = LocalServer(rundir, backlog=1 << 20, cap=3, first=first)
        loop = Loop()
        local.watch_with(loop)
        try:
            for _ in range(clients):
                client, fd, hop, _ = pinged(local, loop, 0)
                client.close()
                assert serve(local, fd) == [] and local.gone() == [hop]
                hops.append(hop)
        finally:
            local.close()
    return hops


def test_a_server_numbers_its_clients_from_where_it_is_told_or_at_random() -> None:
    """`first` names the first connection, in hex, and the count goes on past 64 bits; by
    default each server draws its own 64-bit start, so two servers (two brokers that held one
    rank, one after the other) do not both start at 1, nor anywhere near each other."""
    assert hops_named(0xFFFF_FFFF_FFFF_FFFF, 2) == ["lffffffffffffffff", "l10000000000000000"]
    assert hops_named(1, 2) == ["l1", "l2"]
    starts = {first_number() for _ in range(64)}
    assert len(starts) == 64 and all(0 <= n < 1 << (8 * FIRST_NUMBER_BYTES) for n in starts)
    assert any(n >= 1 << 60 for n in starts)  # drawn across the width, not a small counter
    [one], [other] = hops_named(None, 1), hops_named(None, 1)
    assert abs(int(one[1:], 16) - int(other[1:], 16)) > 1 << 20  # 2**-43 to fail by chance


def pinged(local: LocalServer, loop: Loop, pad: int) -> tuple[socket.socket, int, str, Message]:
    """A client that has asked one ping: its socket, its descriptor and hop at the server, and
    an answer padded with `pad` bytes."""
    client = connect(local)
    local.accept()
    [fd] = loop.watched
    client.sendall(request("broker.ping", 1))
    [(hop, ping)] = serve(local, fd)
    return client, fd, hop, ping.respond({"pad": "x" * pad})


def test_clients_together_are_held_to_the_total_and_the_greediest_goes(server) -> None:
    """Three clients that never read, at 1 MiB each and 1.25 MiB in all, the first sent twice as
    much as the others: it is dropped once the sum would pass, whoever tipped it, and told why,
    long before its own bound; the sum the server holds never passes the total."""
    local, loop = server
    sockets, fds, hops = [], [], []
    for _ in range(3):
        sock = connect(local)
        local.accept()
        fd = max(loop.watched)
        sock.sendall(request("broker.ping", 1))
        [(hop, ping)] = serve(local, fd)
        sockets.append(sock)
        fds.append(fd)
        hops.append(hop)
    answer = ping.respond({"pad": "x" * 16384})
    assert local.ledger.total_bound == 5 << 18
    for turn in itertools.count():
        if not local.send(hops[(0, 0, 1, 2)[turn % 4]], answer):
            break
        assert local.ledger.total <= local.ledger.total_bound
    assert local.gone() == [hops[0]]
    assert local.ledger.unread[hops[0]] < 16384 + 1024  # all but one answer given up at once
    reader, messages = FrameReader(), []
    while True:  # it reads at last: what its socket took before, the notice, then the end
        local.flush(fds[0])  # the loop, on POLLOUT
        assert select.select([sockets[0]], [], [], DEADLINE)[0]
        if not (data := sockets[0].recv(1 << 20)):
            break
        reader.feed(data)
        messages += reader.drain()
    last = decode(messages[-1])
    assert last.topic == "client.dropped" and last.errnum == errno.ENOBUFS
    assert (
        "the most of all local clients, past broker.client-backlog-total, 1.25 MiB" in last.errstr
    )
    for sock in sockets:
        sock.close()


def test_output_is_polled_for_only_while_some_waits(server) -> None:
    local, loop = server
    client, fd, hop, answer = pinged(local, loop, 4096)
    sent = 0
    while not loop.watched[fd]:  # until the socket takes no more
        assert local.send(hop, answer)
        sent += 1
    assert loop.told[-1] == (fd, True)
    reader, got = FrameReader(), 0
    while got < sent:
        reader.feed(client.recv(1 << 20))
        got += len(reader.drain())
        local.flush(fd)  # the loop, on POLLOUT
    assert loop.watched[fd] is False and got == sent
    client.close()


def test_a_client_that_does_not_read_is_dropped_at_its_backlog_and_told_why(server) -> None:
    local, loop = server
    client, fd, hop, answer = pinged(local, loop, 65536)
    sends = 0
    while local.send(hop, answer):
        sends += 1
        assert sends < 100, "never dropped"
    assert local.gone() == [hop]
    assert local.send(hop, answer) is False  # dropped: nothing more for it
    # What it had not begun to be sent is given up at once: the broker holds at most the rest
    # of the answer being written and the notice, and the ledger counts that alone.
    held = local.ledger.unread[hop]
    assert held == local.ledger.total < len(b"".join(map(bytes, frame_parts(encode(answer))))) + 512
    client.sendall(request("broker.ping", 2))  # and nothing it says is heard
    reader, messages = FrameReader(), []
    while True:  # it reads at last: what its socket took before, the notice, then the end
        assert select.select([client], [], [], DEADLINE)[0]
        data = client.recv(1 << 20)
        if not data:
            break
        reader.feed(data)
        messages += reader.drain()
        assert list(local.read(fd)) == []
    *answers, last = [decode(frames) for frames in messages]
    assert 0 < len(answers) < sends and last.topic == "client.dropped"
    assert all(a.topic == "broker.ping" for a in answers)
    assert last.errnum == errno.ENOBUFS and "went unread" in last.errstr
    assert "past broker.client-backlog, 1 MiB" in last.errstr
    assert local.gone() == []  # reported once, when dropped
    client.close()


def test_a_connection_over_the_cap_is_told_and_closed(server) -> None:
    local, loop = server
    kept = [connect(local) for _ in range(local.cap)]
    extra = connect(local)  # the listener takes it; the broker refuses it
    local.accept()
    assert len(loop.watched) == local.cap
    [notice] = [decode(frames) for frames in read_all(extra)]
    assert notice.topic == "client.dropped" and notice.errnum == errno.EMFILE
    assert "already serves 3 local clients" in notice.errstr
    for sock in (*kept, extra):
        sock.close()


def test_a_garbled_stream_closes_that_connection_alone(server) -> None:
    local, loop = server
    good, bad = connect(local), connect(local)
    local.accept()
    good_fd, bad_fd = loop.watched
    bad.sendall(request("broker.ping", 1) + U32.pack(0))
    [(hop, _)] = serve(local, bad_fd)  # what came before the garbage is heard
    assert bad_fd not in loop.watched and local.gone() == [hop]
    [notice] = [decode(frames) for frames in read_all(bad)]
    assert (
        notice.errnum == errno.EPROTO and "garbled input (a message of 0 frames)" in notice.errstr
    )
    good.sendall(request("broker.ping", 2))
    [(_, ping)] = serve(local, good_fd)
    assert ping.tag == 2
    good.close()
    bad.close()


# --- real brokers -----------------------------------------------------------------------------


def ping(client: RawClient, tag: int) -> dict:
    head = {"v": 1, "k": "request", "t": "broker.ping", "n": 0, "g": tag}
    client.send_multipart([json.dumps(head).encode(), b""])
    while True:
        header = json.loads(client.recv_multipart()[0])
        if header.get("g") == tag:
            return header


def notice_then_end(client: RawClient) -> dict:
    """The one message a closed connection got, once it has closed."""
    assert client.wait_closed(DEADLINE), "the broker kept the connection"
    [frames] = list(client.ready)
    return json.loads(frames[0])


@pytest.mark.parametrize(
    ("garbage", "why"),
    [
        pytest.param(U32.pack(0), "a message of 0 frames", id="no-frames"),
        pytest.param(U32.pack(1) + U32.pack(MAX_FRAME + 1), "a frame of", id="huge-frame"),
        pytest.param(
            U32.pack(2)
            + U32.pack(MAX_INPUT // 2 + 1)
            + b"x" * (MAX_INPUT // 2 + 1)
            + U32.pack(MAX_INPUT // 2),
            "a message of over",
            id="huge-message",
        ),
    ],
)
def test_a_garbled_stream_is_closed_and_nobody_else_is_harmed(
    instance, garbage: bytes, why: str
) -> None:
    inst = instance(2)
    with RawClient(inst.uri) as bystander, RawClient(inst.uri) as garbler:
        ping(bystander, 1)
        ping(garbler, 2)
        garbler.send_raw(garbage)
        header = notice_then_end(garbler)
        assert header["t"] == "client.dropped" and header["e"] == errno.EPROTO
        assert why in header["es"]
        assert ping(bystander, 3)["t"] == "broker.ping"
    status = inst.status()
    assert [rank["state"] for rank in status["ranks"]] == ["online", "online"]
    wait_for(lambda: "garbled input" in inst.stderr(), "the broker's log line")
    assert sum("garbled input" in line for line in inst.stderr().splitlines()) == 1


def test_a_client_killed_mid_stream_has_its_job_killed(instance, tmp_path: Path) -> None:
    inst = instance(2)
    pidfile = tmp_path / "pid"
    script = f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec yes streaming"
    client = subprocess.Popen(
        [TBON, "exec", inst.uri, "-r", "1", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        assert client.stdout is not None
        assert client.stdout.read(65536)  # the stream flows
        wait_for(pidfile.exists, "the job to start")
        job = int(pidfile.read_text())
        client.kill()
        client.wait(timeout=DEADLINE)
        wait_for(lambda: process_gone(job), f"the job (pid {job}) to be killed")
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
    assert inst.status()["ranks"][1]["state"] == "online"


def test_a_relay_carries_the_stream_and_ends_with_a_broker_that_closes_it(instance) -> None:
    """`tbon relay` copies bytes: a ping goes through, and garbage reaches the broker, which
    closes the connection with its notice; the relay passes that on and exits 1."""
    inst = instance(1)
    path = inst.uri.removeprefix("local://")
    relay = subprocess.Popen(
        [TBON, "relay", path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    try:
        assert relay.stdin is not None and relay.stdout is not None
        head = {"v": 1, "k": "request", "t": "broker.ping", "n": 0, "g": 4}
        relay.stdin.write(encode_frames([json.dumps(head).encode(), b""]) + U32.pack(0))
        relay.stdin.flush()  # and left open: the relay ends because the broker's end did
        assert relay.wait(timeout=DEADLINE) == 1
        out, err = relay.communicate()
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    reader = FrameReader()
    reader.feed(out)
    pong, notice = [decode(frames) for frames in reader.drain()]
    assert pong.topic == "broker.ping" and pong.tag == 4
    assert notice.topic == "client.dropped" and notice.errnum == errno.EPROTO
    assert (
        err.decode().strip()
        == f"tbon relay: lost the connection to {inst.uri}: the broker ended it"
    )


@contextlib.contextmanager
def instance_with_descriptors(nofile: int) -> Iterator[str]:
    """`tbon start --test-size=1` whose broker may hold `nofile` descriptors: its URI. The hard
    limit too: a broker raises its soft limit to the hard one (links/descriptors.py)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            [TBON, "start", "--test-size=1"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=child_env(),
            preexec_fn=limit,
        )
        try:
            assert process.stdout is not None
            with selectors.DefaultSelector() as selector:
                selector.register(process.stdout, selectors.EVENT_READ)
                assert selector.select(DEADLINE), "no URI from tbon start"
            uri = process.stdout.readline().strip()
            assert uri.startswith("local://"), uri
            yield uri
            stderr.seek(0)
            said = stderr.read()
            assert "Traceback" not in said and "refused a local client" in said, said
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def test_clients_over_the_cap_are_refused_clearly_and_the_others_served() -> None:
    cap = client_cap(64)
    with instance_with_descriptors(64) as uri, contextlib.ExitStack() as stack:
        clients: list[RawClient] = []
        while True:  # tbon start itself may hold a connection or two: count none
            client = stack.enter_context(RawClient(uri))
            head = {"v": 1, "k": "request", "t": "broker.ping", "n": 0, "g": 1}
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                client.send_multipart([json.dumps(head).encode(), b""])
            header = json.loads(client.recv_multipart()[0]) if client.poll(30_000) else {}
            if header.get("t") != "broker.ping":
                break
            clients.append(client)
            assert len(clients) <= cap
        assert cap - 2 <= len(clients) and client.wait_closed(DEADLINE)
        assert header["t"] == "client.dropped" and header["e"] == errno.EMFILE
        assert f"already serves {cap} local clients" in header["es"]
        refused = subprocess.run(
            [TBON, "status", uri], capture_output=True, text=True, timeout=60, env=child_env()
        )
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"refused this connection: it already serves {cap} local clients" in refused.stderr
        assert ping(clients[-1], 99)["t"] == "broker.ping"  # the others are served on
        clients.pop().close()
        wait_for(lambda: status_ok(uri), "the place freed to be taken")


def status_ok(uri: str) -> bool:
    done = subprocess.run(
        [TBON, "status", "--json", uri], capture_output=True, timeout=60, env=child_env()
    )
    return done.returncode == 0


# --- a command never imports ZeroMQ -----------------------------------------------------------


def imported(argv: list[str], uri: str) -> list[str]:
    """The modules the real `tbon` script imports for `argv` (python -X importtime)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", TBON, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(TBON_URI=uri),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]


@pytest.mark.parametrize("argv", [["status", "--json"], ["exec", "-r", "0", "true"]])
def test_a_command_on_a_local_uri_never_imports_zmq(instance, argv: list[str]) -> None:
    inst = instance(1)
    modules = imported(argv, inst.uri)
    assert "tbon.overlay.connectors.client" in modules  # it did talk to the broker
    assert not [name for name in modules if name == "zmq" or name.startswith("zmq.")]
