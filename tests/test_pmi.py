"""PMI-1: the line codec, the sans-I/O server, the client against canned replies in the formats
real servers send (Hydra 3, MPICH 4 Hydra, Slurm, Flux), and real forked processes served by
``SocketPmiServer``. Every wait has a deadline; every child is reaped, pass or fail."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tbon.errors import TbonError
from tbon.overlay.boot.pmi_client import WIRE_LINE_MAX, PmiClient, PmiError
from tbon.overlay.launch.pmi_server import PmiClientError, PmiServer
from tbon.overlay.launch.pmi_sockets import SocketPmiServer
from tbon.overlay.wire.pmi import (
    MAX_LINE_BYTES,
    LineBuffer,
    PmiProtocolError,
    format_command,
    parse_line,
)

DEADLINE = 20.0  # seconds for any one multi-process test; generous for loaded CI machines

# ---------------------------------------------------------------------------- wire codec


def test_format_command_exact_bytes() -> None:
    assert format_command("put", kvsname="k", key="a", value="b") == (
        b"cmd=put kvsname=k key=a value=b\n"
    )
    assert format_command("barrier_in") == b"cmd=barrier_in\n"
    assert format_command("maxes", keylen_max=64) == b"cmd=maxes keylen_max=64\n"


def test_parse_line_splits_at_first_equals_and_on_space_runs() -> None:
    assert parse_line(b"cmd=get_result  rc=0   value=a=b==\n") == {
        "cmd": "get_result",
        "rc": "0",
        "value": "a=b==",
    }
    assert parse_line(b"cmd=barrier_out") == {"cmd": "barrier_out"}
    assert parse_line(b"cmd=my_kvsname kvsname=\xc6\x92AB") == {
        "cmd": "my_kvsname",
        "kvsname": "\u0192AB",
    }


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\n",
        b"hello",
        b"cmd=",
        b"cmd=put =x",
        b"key=a cmd=put",
        b"cmd=put key=a key=b",
        b"cmd=put value=a b",
        b"cmd=put\nkey=a",
        b"cmd=\xff\xfe",
        b"cmd=x v=" + b"y" * MAX_LINE_BYTES,
    ],
)
def test_parse_line_rejects_garbage(line: bytes) -> None:
    with pytest.raises(PmiProtocolError) as info:
        parse_line(line)
    assert isinstance(info.value, TbonError)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("cmd", "fields"),
    [
        ("put", {"value": "a b"}),
        ("put", {"value": "a\nb"}),
        ("put", {"k=ey": "v"}),
        ("put", {"": "v"}),
        ("p t", {}),
        ("", {}),
    ],
)
def test_format_command_refuses_what_the_line_cannot_carry(
    cmd: str, fields: dict[str, str]
) -> None:
    with pytest.raises(PmiProtocolError):
        format_command(cmd, **fields)


_name_text = st.text(
    alphabet=st.characters(blacklist_characters=" \n=", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
_value_text = st.text(
    alphabet=st.characters(blacklist_characters=" \n", blacklist_categories=("Cs",)),
    max_size=40,
)


@given(
    cmd=_name_text,
    fields=st.dictionaries(_name_text.filter(lambda k: k != "cmd"), _value_text, max_size=6),
)
def test_codec_round_trip(cmd: str, fields: dict[str, str]) -> None:
    line = format_command(cmd, **fields)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_line(line) == {"cmd": cmd, **fields}
    assert list(parse_line(line)) == ["cmd", *fields]


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_line_buffer_reassembles_any_chunking(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    buf = LineBuffer()
    out: list[bytes] = []
    for start, end in pairwise(points):
        out.extend(buf.feed(stream[start:end]))
    assert out == lines
    assert buf.pending == 0


def test_line_buffer_is_bounded() -> None:
    buf = LineBuffer(max_line=16)
    assert buf.feed(b"0123456789") == []
    assert buf.pending == 10
    with pytest.raises(PmiProtocolError):
        buf.feed(b"0123456789")  # 20 bytes and still no newline
    buf = LineBuffer(max_line=16)
    with pytest.raises(PmiProtocolError):
        buf.feed(b"x" * 17 + b"\n")
    assert LineBuffer().max_line == 64 * 1024


# ---------------------------------------------------------------------------- server core


STATELESS_REQUESTS = [
    b"cmd=init pmi_version=1 pmi_subversion=1",
    b"cmd=init pmi_version=1 pmi_subversion=0",
    b"cmd=init pmi_version=2 pmi_subversion=0",
    b"cmd=get_maxes",
    b"cmd=get_appnum",
    b"cmd=get_my_kvsname",
    b"cmd=get_universe_size",
]


def _lines(replies: list[tuple[int, bytes]], rank: int) -> list[bytes]:
    return [line for r, line in replies if r == rank]


def test_server_replies_in_hydra_field_order() -> None:
    server = PmiServer(3, kvsname="kvs_42", appnum=5)
    replies = server.receive(
        1,
        b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\ncmd=get_appnum\n"
        b"cmd=get_my_kvsname\ncmd=get_universe_size\n"
        b"cmd=put kvsname=kvs_42 key=k1 value=v=1\ncmd=get kvsname=kvs_42 key=k1\n",
    )
    assert _lines(replies, 1) == [
        b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
        b"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n",
        b"cmd=appnum appnum=5\n",
        b"cmd=my_kvsname kvsname=kvs_42\n",
        b"cmd=universe_size size=3\n",
        b"cmd=put_result rc=0 msg=success\n",
        b"cmd=get_result rc=0 msg=success value=v=1\n",
    ]
    assert server.kvs == {"k1": "v=1"}


@given(st.lists(st.sampled_from(STATELESS_REQUESTS), min_size=1, max_size=30))
def test_a_stateless_reply_is_the_same_kept_or_not(requests: list[bytes]) -> None:
    """The server keeps the reply to a request about the job (init, maxes, kvsname...) by its
    line: whichever rank asks, and however often, it reads what a fresh server would say."""
    kept = PmiServer(3, kvsname="kvs_7", appnum=2)
    for i, request in enumerate(requests):
        fresh = PmiServer(3, kvsname="kvs_7", appnum=2)
        assert kept.receive(i % 3, request + b"\n") == fresh.receive(i % 3, request + b"\n")


def test_the_kept_stateless_replies_are_bounded() -> None:
    server = PmiServer(2)
    for subversion in range(200):  # distinct lines, each an init of an unsupported version
        line = f"cmd=init pmi_version=1 pmi_subversion={subversion} x={subversion}\n".encode()
        reply = server.receive(0, line)
        assert reply[0][1].startswith(b"cmd=response_to_init ")
    assert len(server._answers) <= 64


def test_server_error_replies_never_raise() -> None:
    server = PmiServer(2)
    cases = {
        b"cmd=init pmi_version=2 pmi_subversion=0": b"cmd=response_to_init pmi_version=1 "
        b"pmi_subversion=1 rc=-1 msg=unsupported_version_2.0\n",
        b"cmd=get key=nope": b"cmd=get_result rc=-1 msg=key_nope_not_found\n",
        b"cmd=get": b"cmd=get_result rc=-1 msg=missing_key\n",
        b"cmd=put key=a": b"cmd=put_result rc=-1 msg=missing_value\n",
        b"cmd=put kvsname=other key=a value=b": b"cmd=put_result rc=-1 msg=unknown_kvsname\n",
        b"cmd=put key=" + b"k" * 64 + b" value=b": b"cmd=put_result rc=-1 msg=key_too_long\n",
        b"cmd=put key=a value=" + b"v" * 1024: b"cmd=put_result rc=-1 msg=value_too_long\n",
        b"cmd=put key=a value=two words": b"cmd=put_result rc=-1 msg=malformed_request\n",
        b"cmd=frobnicate x=1": b"cmd=frobnicate_response rc=-1 msg=unknown_command\n",
        b"cmd=publish_name service=s port=p": b"cmd=publish_result rc=-1 msg=unsupported_command\n",
    }
    for request, reply in cases.items():
        assert server.receive(0, request + b"\n") == [(0, reply)], request
    server.receive(0, b"cmd=put key=a value=1\n")
    assert server.receive(0, b"cmd=put key=a value=1\n") == [
        (0, b"cmd=put_result rc=0 msg=success\n")
    ]
    assert server.receive(0, b"cmd=put key=a value=2\n") == [
        (0, b"cmd=put_result rc=-1 msg=duplicate_key_a\n")
    ]


def test_server_barrier_releases_everyone_once() -> None:
    server = PmiServer(3)
    assert server.receive(2, b"cmd=barrier_in\n") == []
    assert server.receive(0, b"cmd=barrier_in\ncmd=barrier_in\n") == []  # duplicate ignored
    out = server.receive(1, b"cmd=barrier_in\n")
    assert sorted(out) == [(r, b"cmd=barrier_out\n") for r in range(3)]
    assert server.barriers_completed == 1 and server.in_barrier == set()


def test_server_fails_a_barrier_that_cannot_complete() -> None:
    server = PmiServer(3)
    assert server.receive(0, b"cmd=barrier_in\n") == []
    out = server.disconnect(2)
    assert out == [(0, b"cmd=barrier_out rc=-1 msg=rank_2_exited_before_the_barrier\n")]
    # Later barriers fail at once, and nothing is addressed to the departed rank.
    assert server.receive(1, b"cmd=barrier_in\n") == [
        (1, b"cmd=barrier_out rc=-1 msg=rank_2_exited_before_the_barrier\n")
    ]
    assert server.receive(2, b"cmd=get_maxes\n") == []

    server = PmiServer(2)
    assert server.receive(0, b"cmd=finalize\n") == [(0, b"cmd=finalize_ack\n")]
    assert server.finalized == {0}
    assert server.receive(1, b"cmd=barrier_in\n") == [
        (1, b"cmd=barrier_out rc=-1 msg=rank_0_finalized_before_the_barrier\n")
    ]


def test_server_garbage_raises_but_keeps_owed_replies() -> None:
    server = PmiServer(2)
    server.receive(0, b"cmd=barrier_in\n")
    with pytest.raises(PmiClientError) as info:
        server.receive(1, b"cmd=barrier_in\nGET / HTTP/1.1\ncmd=get_maxes\n")
    assert isinstance(info.value, PmiProtocolError)
    assert info.value.rank == 1
    assert sorted(info.value.replies) == [(0, b"cmd=barrier_out\n"), (1, b"cmd=barrier_out\n")]
    with pytest.raises(PmiClientError):
        server.receive(0, b"x" * (MAX_LINE_BYTES + 1))
    with pytest.raises(ValueError):
        server.receive(2, b"cmd=get_maxes\n")


def test_server_records_abort_with_free_text_message() -> None:
    server = PmiServer(2)
    assert server.receive(1, b"cmd=abort exitcode=7 error_msg=disk on fire\n") == []
    assert server.aborted == (1, 7, "disk on fire")
    server = PmiServer(2)
    assert server.receive(0, b"cmd=abort\n") == []
    assert server.aborted == (0, 1, "")


def test_socket_server_closes_a_connection_that_sends_garbage() -> None:
    with SocketPmiServer(1) as server:
        client_end = server.make_pair(0)
        with client_end:
            client_end.sendall(b"\x00\x01 garbage\n")
            (server_end,) = server.fileobjs()
            server.handle(server_end)
            client_end.settimeout(DEADLINE)
            assert client_end.recv(100) == b""  # EOF: the server hung up
        assert server.connected == set()
        assert len(server.protocol_errors) == 1 and "rank 0" in server.protocol_errors[0]


# ---------------------------------------------------------------------------- client, canned


INIT_HYDRA3 = (
    b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
    b"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n"
    b"cmd=my_kvsname kvsname=kvs_1234_0\n"
)
INIT_FLUX = (
    b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n"
    b"cmd=maxes rc=0 kvsname_max=64 keylen_max=64 vallen_max=1024\n"
    b"cmd=my_kvsname rc=0 kvsname=\xc6\x92ABRxM89qL3\n"
)


@contextmanager
def canned(replies: bytes, timeout: float = DEADLINE) -> Iterator[tuple[PmiClient, socket.socket]]:
    """A client whose server is a socket already holding ``replies`` (read in order)."""
    client_end, server_end = socket.socketpair()
    server_end.sendall(replies)
    client = PmiClient(client_end, 0, 4, timeout=timeout)
    try:
        yield client, server_end
    finally:
        client.close()
        server_end.close()


def _sent(server_end: socket.socket) -> list[bytes]:
    server_end.setblocking(False)
    data = b""
    try:
        while chunk := server_end.recv(65536):
            data += chunk
    except BlockingIOError:
        pass
    return data.splitlines()


@pytest.mark.parametrize("init", [INIT_HYDRA3, INIT_FLUX])
def test_client_speaks_to_hydra_and_flux_reply_styles(init: bytes) -> None:
    rest = (
        b"cmd=put_result rc=0 msg=success\n"
        b"cmd=barrier_out\n"
        b"cmd=get_result rc=0 found=TRUE value=tcp://h:1/x=y\n"
        b"cmd=finalize_ack rc=0\n"
    )
    with canned(init + rest) as (client, server_end):
        client.init()
        client.put("addr-0", "tcp://h:1/x=y")
        client.barrier()
        assert client.get("addr-0") == "tcp://h:1/x=y"
        client.finalize()
        sent = _sent(server_end)
    assert sent[:3] == [
        b"cmd=init pmi_version=1 pmi_subversion=1",
        b"cmd=get_maxes",
        b"cmd=get_my_kvsname",
    ]
    assert (
        sent[3]
        == b"cmd=put kvsname=" + client.kvsname.encode() + b" key=addr-0 value=tcp://h:1/x=y"
    )
    assert sent[4:] == [
        b"cmd=barrier_in",
        b"cmd=get kvsname=" + client.kvsname.encode() + b" key=addr-0",
        b"cmd=finalize",
    ]
    assert (client.keylen_max, client.vallen_max) == (64, 1024)


def test_client_asks_the_universe_size_only_when_asked() -> None:
    with canned(INIT_HYDRA3 + b"cmd=universe_size size=-1\n") as (client, server_end):
        with pytest.raises(PmiError, match="before init"):
            client.universe_size()
        client.init()
        assert _sent(server_end)[-1] == b"cmd=get_my_kvsname"  # not asked by init
        assert client.universe_size() == -1  # Hydra's unlimited universe
        assert _sent(server_end) == [b"cmd=get_universe_size"]


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        (b"cmd=get_result rc=-1 msg=key_nope-7_not_found value=unknown\n", "key_nope-7_not_found"),
        (b"cmd=get_result rc=1\n", "rc=1"),  # MPICH 4 Hydra, Slurm: no msg
        (b"cmd=get_result rc=0 found=FALSE\n", "not found"),
    ],
)
def test_client_get_of_missing_key_names_the_key(reply: bytes, detail: str) -> None:
    with canned(INIT_HYDRA3 + reply) as (client, _):
        client.init()
        with pytest.raises(PmiError) as info:
            client.get("nope-7")
    message = str(info.value)
    assert "'nope-7'" in message and detail in message and "\n" not in message


def test_client_reports_failed_barrier_and_unexpected_reply() -> None:
    with canned(INIT_HYDRA3 + b"cmd=barrier_out rc=1 msg=kvs_fence_failed\n") as (client, _):
        client.init()
        with pytest.raises(PmiError, match=r"barrier_in failed: server returned rc=1 \("):
            client.barrier()
    with canned(INIT_HYDRA3 + b"cmd=finalize_ack\n") as (client, _):
        client.init()
        with pytest.raises(PmiError, match="unexpected reply to PMI barrier_in"):
            client.barrier()
    with canned(b"no equals sign here\n") as (client, _), pytest.raises(PmiError, match="garbage"):
        client.init()


def test_client_eof_is_an_error_not_a_hang() -> None:
    with canned(INIT_HYDRA3) as (client, server_end):
        client.init()
        server_end.shutdown(socket.SHUT_WR)
        start = time.monotonic()
        with pytest.raises(PmiError, match="closed the connection"):
            client.barrier()
        assert time.monotonic() - start < DEADLINE
    with canned(b"") as (client, server_end):
        server_end.close()
        with pytest.raises(PmiError):
            client.init()


def test_client_timeout_is_a_clear_error() -> None:
    with canned(INIT_HYDRA3, timeout=0.05) as (client, _):
        client.init()
        with pytest.raises(PmiError, match=r"no reply to PMI barrier_in within 0\.05s"):
            client.barrier()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("k", "a b", "contains a space"),
        ("k", "a\nb", "contains a newline"),
        ("k", "a\\b", "contains a backslash"),
        ("k", "", "empty"),
        ("k", "v" * 1024, "at most 1023"),
        ("k" * 64, "v", "at most 63"),
        ("a b", "v", "keys may use only"),
        ("a=b", "v", "keys may use only"),
        ("tbon.uri", "v", "keys may use only"),
        ("PMI_process_mapping", "v", "reserved"),
        ("k", "v" * 1000, f"at most {WIRE_LINE_MAX}"),
    ],
)
def test_client_refuses_bad_keys_and_values_before_sending(
    key: str, value: str, match: str
) -> None:
    with canned(INIT_HYDRA3) as (client, server_end):
        client.init()
        with pytest.raises(PmiError, match=match):
            client.put(key, value)
        assert not any(line.startswith(b"cmd=put") for line in _sent(server_end))


def test_client_refuses_use_before_init_and_after_close() -> None:
    with canned(INIT_HYDRA3) as (client, _):
        with pytest.raises(PmiError, match="before init"):
            client.put("k", "v")
        client.init()
        client.close()
        with pytest.raises(PmiError, match="closed"):
            client.barrier()


def test_client_abort_sends_one_line_and_does_not_wait() -> None:
    with canned(INIT_HYDRA3) as (client, server_end):
        client.init()
        client.abort(3, "bad thing\nhappened")
        sent = _sent(server_end)
    assert sent[-1] == b"cmd=abort exitcode=3 message=bad_thing_happened"
    server = PmiServer(1)
    server.receive(0, sent[-1] + b"\n")
    assert server.aborted == (0, 3, "bad_thing_happened")


def test_from_environment() -> None:
    assert PmiClient.from_environment({}) is None
    assert PmiClient.from_environment({"PMI_RANK": "0", "PMI_SIZE": "1"}) is None
    with pytest.raises(PmiError, match="PMI_RANK is not set"):
        PmiClient.from_environment({"PMI_FD": "0", "PMI_SIZE": "2"})
    with pytest.raises(PmiError, match="PMI_FD='x' is not an integer"):
        PmiClient.from_environment({"PMI_FD": "x", "PMI_RANK": "0", "PMI_SIZE": "1"})
    r, w = os.pipe()
    try:
        with pytest.raises(PmiError, match="not an open socket"):
            PmiClient.from_environment({"PMI_FD": str(r), "PMI_RANK": "0", "PMI_SIZE": "1"})
    finally:
        os.close(r)
        os.close(w)
    a, b = socket.socketpair()
    with b:
        fd = a.detach()
        with pytest.raises(PmiError, match="rank 2 is not within a job of size 2"):
            PmiClient.from_environment({"PMI_FD": str(fd), "PMI_RANK": "2", "PMI_SIZE": "2"})
        with pytest.raises(OSError):
            os.fstat(fd)  # the refused fd was closed, not leaked
    with pytest.raises(PmiError, match="not host:port"):
        PmiClient.from_environment({"PMI_PORT": "nohost", "PMI_ID": "0"})


# ---------------------------------------------------------------------------- real processes


class Children:
    """Forked children with a pidfd each (so exits wake the selector) and a report pipe."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.status: dict[int, int] = {}
        self.pidfds: dict[int, int] = {}
        self.reports: dict[int, int] = {}

    def fork(self, body: Callable[[], None], close_in_child: list[socket.socket]) -> int:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            code = 1
            try:
                os.close(read_fd)
                for sock in close_in_child:
                    sock.close()
                body()
                code = 0
            except BaseException:
                os.write(write_fd, traceback.format_exc().encode()[-4000:])
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pids.append(pid)
        self.reports[pid] = read_fd
        self.pidfds[pid] = os.pidfd_open(pid)
        return pid

    def reap_exited(self) -> None:
        for pid in self.pids:
            if pid not in self.status:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    self.status[pid] = os.waitstatus_to_exitcode(status)
                    os.close(self.pidfds.pop(pid))

    def report(self, pid: int) -> str:
        chunks = []
        while chunk := os.read(self.reports[pid], 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def cleanup(self) -> None:
        """Kill and reap every survivor by its pid; close our descriptors."""
        for pid in self.pids:
            if pid not in self.status:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                self.status[pid] = os.waitstatus_to_exitcode(status)
        for fd in [*self.pidfds.values(), *self.reports.values()]:
            os.close(fd)
        self.pidfds.clear()
        self.reports.clear()


@contextmanager
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.cleanup()


def serve_until_exit(kids: Children, server: SocketPmiServer | None = None) -> None:
    """Run the PMI server and wait for every child to exit, failing past the deadline."""
    deadline = time.monotonic() + DEADLINE
    with selectors.DefaultSelector() as sel:
        if server is not None:
            server.register(sel)
        for fd in kids.pidfds.values():
            sel.register(fd, selectors.EVENT_READ, "exit")
        # Until every child has exited and the server has seen every connection close.
        while len(kids.status) < len(kids.pids) or (server is not None and server.connected):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"children or connections still open after {DEADLINE}s")
            for key, _ in sel.select(timeout=remaining):
                if key.data is server and server is not None:
                    server.handle(key.fileobj)  # type: ignore[arg-type]
                else:
                    sel.unregister(key.fileobj)
                    kids.reap_exited()


def assert_all_ok(kids: Children) -> None:
    failures = {pid: kids.report(pid) for pid, code in kids.status.items() if code != 0}
    assert not failures, failures


def spawn_ranks(
    kids: Children, server: SocketPmiServer, body: Callable[[int, dict[str, str]], None]
) -> None:
    """Fork one child per rank with PMI_FD/PMI_RANK/PMI_SIZE, as a launcher would."""
    for rank in range(server.size):
        client_end = server.make_pair(rank)
        env = {
            "PMI_FD": str(client_end.fileno()),
            "PMI_RANK": str(rank),
            "PMI_SIZE": str(server.size),
        }
        kids.fork(lambda rank=rank, env=env: body(rank, env), server.fileobjs())
        client_end.close()  # the child has it; keeping it would hide the child's exit


def _address(rank: int) -> str:
    return f"tcp://127.0.0.1:{40000 + rank}/Z85:rq:A+a<7kLw{rank}"


def _full_exchange(rank: int, env: dict[str, str]) -> None:
    client = PmiClient.from_environment(env, timeout=DEADLINE)
    assert client is not None
    client.init()
    size = client.size
    assert (client.rank, client.kvsname, client.universe_size()) == (rank, "tbon", size)
    assert (client.keylen_max, client.vallen_max) == (64, 1024)
    client.put(f"addr-{rank}", _address(rank))
    client.barrier()
    for peer in range(size):
        assert client.get(f"addr-{peer}") == _address(peer)
    client.barrier()
    client.finalize()


@pytest.mark.parametrize("size", [1, 2, 8])
def test_real_processes_exchange_addresses(size: int) -> None:
    with SocketPmiServer(size) as server, children() as kids:
        spawn_ranks(kids, server, _full_exchange)
        serve_until_exit(kids, server=server)
        assert_all_ok(kids)
        assert server.finalized == set(range(size))
        assert server.aborted is None
        assert server.core.barriers_completed == 2
        assert server.core.kvs == {f"addr-{r}": _address(r) for r in range(size)}
        assert server.connected == set()


def _get_missing(rank: int, env: dict[str, str]) -> None:
    client = PmiClient.from_environment(env, timeout=DEADLINE)
    assert client is not None
    client.init()
    with pytest.raises(PmiError, match="'no-such-key'"):
        client.get("no-such-key")
    client.finalize()


def test_real_get_of_missing_key() -> None:
    with SocketPmiServer(1) as server, children() as kids:
        spawn_ranks(kids, server, _get_missing)
        serve_until_exit(kids, server=server)
        assert_all_ok(kids)


def _raw_then_normal(rank: int, env: dict[str, str]) -> None:
    if rank == 1:  # misbehave first, on a duplicate of the PMI fd
        with socket.socket(fileno=os.dup(int(env["PMI_FD"]))) as raw:
            raw.settimeout(DEADLINE)
            replies = LineBuffer()
            for request, expect in [
                (b"cmd=put kvsname=tbon key=bad value=has space\n", b"cmd=put_result rc=-1 "),
                (b"cmd=frobnicate\n", b"cmd=frobnicate_response rc=-1 "),
                (b"cmd=barrier_in junk\n", b"cmd=barrier_out rc=-1 "),
            ]:
                raw.sendall(request)
                got: list[bytes] = []
                while not got:
                    got = replies.feed(raw.recv(1024))
                assert got[0].startswith(expect), got
    _full_exchange(rank, env)


def test_real_malformed_input_gets_error_reply_and_others_are_unaffected() -> None:
    with SocketPmiServer(3) as server, children() as kids:
        spawn_ranks(kids, server, _raw_then_normal)
        serve_until_exit(kids, server=server)
        assert_all_ok(kids)
        assert server.finalized == {0, 1, 2}
        assert "bad" not in server.core.kvs


def _expect_barrier_failure(rank: int, env: dict[str, str]) -> None:
    if rank == 1:
        os._exit(0)  # a broker that dies before the barrier
    client = PmiClient.from_environment(env, timeout=DEADLINE)
    assert client is not None
    client.init()
    client.put("addr-0", "x")
    with pytest.raises(PmiError, match="rank_1_exited_before_the_barrier"):
        client.barrier()


def test_real_rank_exit_fails_the_barrier_instead_of_hanging() -> None:
    with SocketPmiServer(2) as server, children() as kids:
        spawn_ranks(kids, server, _expect_barrier_failure)
        serve_until_exit(kids, server=server)
        assert_all_ok(kids)
        assert server.finalized == set()


def _wait_for_server_eof(rank: int, env: dict[str, str]) -> None:
    if rank == 2:  # keeps the barrier from completing; sees the hang-up too
        with socket.socket(fileno=int(env["PMI_FD"])) as raw:
            raw.settimeout(DEADLINE)
            assert raw.recv(1) == b""
        return
    client = PmiClient.from_environment(env, timeout=DEADLINE)
    assert client is not None
    client.init()
    with pytest.raises(PmiError, match="closed the connection"):
        client.barrier()


def test_real_server_eof_is_an_error_in_the_child() -> None:
    with SocketPmiServer(3) as server, children() as kids:
        spawn_ranks(kids, server, _wait_for_server_eof)
        # Serve until ranks 0 and 1 wait in the barrier, then hang up on everyone.
        deadline = time.monotonic() + DEADLINE
        with selectors.DefaultSelector() as sel:
            server.register(sel)
            while server.core.in_barrier != {0, 1}:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pytest.fail("children never reached the barrier")
                for key, _ in sel.select(timeout=remaining):
                    server.handle(key.fileobj)  # type: ignore[arg-type]
        server.close()
        serve_until_exit(kids)
        assert_all_ok(kids)


HYDRA3_INITACK = b"cmd=initack\ncmd=set size=1\ncmd=set rank=0\ncmd=set debug=0\n"
MPICH4_INITACK = (
    b"cmd=initack rc=0 rank=0 size=1 appnum=0 debug=0\n"
    b"cmd=set size=1\ncmd=set rank=0\ncmd=set debug=0\n"
)


def _port_client(rank: int, env: dict[str, str]) -> None:
    client = PmiClient.from_environment(env, timeout=DEADLINE)
    assert client is not None
    assert (client.rank, client.size) == (0, 1)
    client.init()
    client.put("addr-0", "here")
    client.barrier()
    assert client.get("addr-0") == "here"
    client.finalize()


@pytest.mark.parametrize("initack", [HYDRA3_INITACK, MPICH4_INITACK])
def test_real_pmi_port_handshake(initack: bytes) -> None:
    """Hydra's PMI_PORT + PMI_ID mode: initack, three ``set`` lines, then plain PMI-1."""
    core = PmiServer(1)
    buffer = LineBuffer()
    with socket.create_server(("127.0.0.1", 0)) as listener, children() as kids:
        port = listener.getsockname()[1]
        env = {"PMI_PORT": f"127.0.0.1:{port}", "PMI_ID": "0"}
        kids.fork(lambda: _port_client(0, env), [listener])
        deadline = time.monotonic() + DEADLINE
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ, "accept")
            for fd in kids.pidfds.values():
                sel.register(fd, selectors.EVENT_READ, "exit")
            while len(kids.status) < len(kids.pids):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pytest.fail("PMI_PORT child still running")
                for key, _ in sel.select(timeout=remaining):
                    if key.data == "accept":
                        conn, _ = listener.accept()
                        sel.register(conn, selectors.EVENT_READ, "conn")
                    elif key.data == "conn":
                        conn = key.fileobj  # type: ignore[assignment]
                        data = conn.recv(65536)
                        if not data:
                            sel.unregister(conn)
                            conn.close()
                            continue
                        for line in buffer.feed(data):
                            if line == b"cmd=initack pmiid=0":
                                conn.sendall(initack)
                            else:
                                for _, reply in core.receive(0, line + b"\n"):
                                    conn.sendall(reply)
                    else:
                        sel.unregister(key.fileobj)
                        kids.reap_exited()
            for key in list(sel.get_map().values()):
                if key.data == "conn":
                    key.fileobj.close()  # type: ignore[union-attr]
        assert_all_ok(kids)
        assert core.finalized == {0}
