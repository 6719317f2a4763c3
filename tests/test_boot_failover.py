"""Boot-server failover: broker.boot-server as a list of URIs, tried in order by a joiner, and a
boot server that goes away in the middle of a join (issue 12).

The unit tests need no broker. The process-level ones start real instances (conftest.Instance),
kill brokers only by PID, and bound every wait with a deadline: a joiner that hung instead of
failing over or exiting 75 fails the test at Popen.wait(timeout=...)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import DEADLINE, TBON, Instance, child_env, tbon, wait_for

from tbon import exitcodes
from tbon.errors import TbonError, UsageError
from tbon.overlay.config.attributes import broker_config
from tbon.overlay.connectors.client import Client
from tbon.overlay.connectors.uri import MAX_URIS, parse_uri, split_uris
from tbon.overlay.wire.frames import FrameReader, encode_frames
from tbon.overlay.wire.message import decode, encode

# --- the list: parsing and validation ----------------------------------------------------------


def test_a_list_of_uris_is_kept_whole_and_split_in_order() -> None:
    text = "local:///tmp/a/local,ssh://alice@node7:2222/tmp/b/local,local:///tmp/c/local"
    config = broker_config({"broker.boot-server": text})
    assert config.boot_server == text
    assert split_uris(text) == [
        "local:///tmp/a/local",
        "ssh://alice@node7:2222/tmp/b/local",
        "local:///tmp/c/local",
    ]
    assert [parse_uri(uri).scheme for uri in split_uris(text)] == ["local", "ssh", "local"]


def test_one_uri_is_a_list_of_one() -> None:
    assert split_uris("local:///tmp/a/local") == ["local:///tmp/a/local"]


@pytest.mark.parametrize(
    ("text", "bad", "where"),
    [
        ("local:///a/local,bogus", "bogus", "URI 2 of 2"),
        ("tcp://h:1,local:///a/local", "tcp://h:1", "URI 1 of 2"),
        ("local:///a/local,", "", "URI 2 of 2"),
        ("local:///a/local, local:///b/local", " local:///b/local", "URI 2 of 2"),
        ("local:///a,ssh://h:99999/x,local:///c", "ssh://h:99999/x", "URI 2 of 3"),
        ("local:///a,local://relative", "local://relative", "URI 2 of 2"),
    ],
)
def test_a_bad_uri_in_the_list_is_a_usage_error_naming_it(text: str, bad: str, where: str) -> None:
    with pytest.raises(UsageError) as caught:
        broker_config({"broker.boot-server": text})
    message = str(caught.value)
    assert message.startswith(f"invalid broker.boot-server {bad!r} ({where}): ")
    assert "local://PATH" in message and "ssh://" in message and "\n" not in message
    assert caught.value.exit_code == exitcodes.USAGE


def test_a_list_longer_than_the_limit_is_a_usage_error() -> None:
    text = ",".join(f"local:///tmp/{n}/local" for n in range(MAX_URIS + 1))
    with pytest.raises(UsageError, match=rf"{MAX_URIS + 1} URIs, at most {MAX_URIS}"):
        broker_config({"broker.boot-server": text})
    fits = ",".join(f"local:///tmp/{n}/local" for n in range(MAX_URIS))
    assert broker_config({"broker.boot-server": fits}).boot_server == fits


def test_the_broker_refuses_a_bad_list_before_it_starts(tmp_path: Path) -> None:
    good = f"local://{tmp_path}/nothing"
    result = tbon("broker", "-S", f"broker.boot-server={good},nope")
    assert result.returncode == 2
    assert "invalid broker.boot-server 'nope' (URI 2 of 2)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_expand_refuses_a_bad_boot_server_list_in_its_attributes() -> None:
    result = tbon("expand", "local:///nonexistent/local", "-n", "1", "-S",
                  "broker.boot-server=local:///x,nope")  # fmt: skip
    assert result.returncode == 2
    assert "'nope' (URI 2 of 2)" in result.stderr


# --- a server that dies with a request in flight ---------------------------------------------


def fake_server(path: Path) -> socket.socket:
    """A listener at `path` that plays a broker which dies (the test closes it)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(DEADLINE)
    return server


def read_message(conn: socket.socket) -> list[bytes]:
    """One framed message from `conn` (blocking, with the socket's timeout)."""
    reader = FrameReader()
    while (frames := reader.next()) is None:
        data = conn.recv(65536)
        assert data, "the connection closed before a whole message came"
        reader.feed(data)
    return frames


def test_a_request_in_flight_to_a_server_that_dies_fails_at_once(tmp_path: Path) -> None:
    """The client sees the broker's end of the connection close, and says it was lost, rather
    than waiting out the request's timeout."""
    path = tmp_path / "local"
    with fake_server(path) as server, Client(f"local://{path}") as client:
        client.send("broker.ping", {}, nodeid=0)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(DEADLINE)
            assert decode(read_message(conn)).topic == "broker.ping"  # the request is here
        with pytest.raises(TbonError, match=r"lost the connection to local://"):
            client.rpc("broker.ping", {}, nodeid=0, timeout=3600)


def test_a_client_reads_what_the_broker_sent_before_it_died(tmp_path: Path) -> None:
    path = tmp_path / "local"
    with fake_server(path) as server, Client(f"local://{path}") as client:
        tag = client.send("broker.ping", {}, nodeid=0)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(DEADLINE)
            request = decode(read_message(conn))
            conn.sendall(encode_frames(encode(request.respond({"pong": 1}))))
        assert tag == request.tag
        reply = client.receive(DEADLINE)  # what was sent before the end is read first

        assert reply is not None and reply.payload == {"pong": 1}
        with pytest.raises(TbonError, match=r"lost the connection to local://"):
            client.receive(3600)


def test_a_relay_whose_broker_dies_ends_and_says_why(tmp_path: Path) -> None:
    """Over ssh:// the client sees the session end only if the relay ends: it ends when the
    broker's end of its connection does, after passing on what the broker sent before."""
    path = tmp_path / "local"
    with fake_server(path) as server:
        relay = subprocess.Popen(
            [TBON, "relay", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        )
        try:
            assert relay.stdin is not None and relay.stderr is not None
            assert relay.stdout is not None
            relay.stdin.write(encode_frames([b"hello"]))  # through the relay: it is connected
            relay.stdin.flush()
            conn, _ = server.accept()
            with conn:
                conn.settimeout(DEADLINE)
                assert read_message(conn) == [b"hello"]
                conn.sendall(encode_frames([b"last", b"words"]))
            assert relay.wait(timeout=DEADLINE) == 1  # its stdin still open: it ended by itself
            assert relay.stdout.read() == encode_frames([b"last", b"words"])
            said = relay.stderr.read().decode()
            assert f"lost the connection to local://{path}: the broker ended it" in said
        finally:
            if relay.poll() is None:
                relay.kill()
            relay.communicate()


# --- real joiners --------------------------------------------------------------------------


def uri_of(inst: Instance, rank: int) -> str:
    with inst.client() as client:
        return client.rpc("broker.info", nodeid=rank)["uri"]


def stale_socket(path: Path) -> str:
    """A socket file that nobody listens on any more: connecting is refused."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    return f"local://{path}"


def test_a_joiner_passes_over_boot_servers_it_cannot_reach(instance, tmp_path: Path) -> None:
    inst = instance(1, "size=3", "tbon.fanout=2")
    nothing, refused = f"local://{tmp_path}/nothing", stale_socket(tmp_path / "stale")
    log = tmp_path / "joiner.log"
    joiner = inst.join("broker.rank=2", boot=[nothing, refused, inst.uri], log=log)
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "online", "rank 2 online")
    shown = json.loads(tbon("status", inst.uri, "--json").stdout)["ranks"][2]
    assert shown["state"] == "online" and shown["pid"] == joiner.pid
    said = log.read_text()
    assert f"no such socket (is the instance running?); trying {refused}" in said, said
    assert f"connection refused (the broker is gone); trying {inst.uri}" in said, said


def test_a_joiner_fails_over_when_its_boot_server_dies_mid_join(instance, tmp_path: Path) -> None:
    """The joiner reserves rank 5 through rank 1's socket and waits for its parent, rank 2.
    Rank 1 is killed: the joiner goes on through rank 0's socket, where rank 0 names the same
    reservation, and joins once rank 2 is online, though the reservation was granted to a
    connection that no longer exists (flub.kex would be refused there)."""
    inst = instance(2, "size=6", "tbon.fanout=2", "tbon.timeout=0", "broker.join-timeout=300s")
    boot = uri_of(inst, 1)
    log = tmp_path / "joiner.log"
    joiner = inst.join("broker.rank=5", boot=[boot, inst.uri], log=log)
    wait_for(lambda: "waiting for parent rank 2" in log.read_text(), "the joiner to wait")
    reserved = inst.status()["ranks"][5]
    assert reserved["state"] == "reserved" and reserved["incarnation"] == 1
    os.kill(inst.pid(1), signal.SIGKILL)
    wait_for(lambda: f"trying {inst.uri}" in log.read_text(), "the joiner to fail over")
    assert joiner.poll() is None, log.read_text()
    inst.join("broker.rank=2")
    status = inst.wait_status(
        lambda s: s["ranks"][5]["state"] == "online" or joiner.poll() is not None,
        "rank 5 online, or its joiner gone",
    )
    said = log.read_text()
    assert status["ranks"][5]["state"] == "online", said
    assert status["ranks"][5]["pid"] == joiner.pid
    assert status["ranks"][5]["incarnation"] == 1  # the reservation it held all along
    assert f"lost the connection to {boot}" in said and "holding rank 5 incarnation 1" in said


def test_a_joiner_moves_on_from_a_boot_server_that_does_not_answer(
    instance, tmp_path: Path
) -> None:
    """A stopped broker keeps its socket, and its connections open: only the request's timeout
    (the joiner's broker.join-timeout) tells the joiner to go on through the next URI."""
    inst = instance(2, "size=3", "tbon.fanout=2", "tbon.timeout=0")
    silent, pid = uri_of(inst, 1), inst.pid(1)
    log = tmp_path / "joiner.log"
    os.kill(pid, signal.SIGSTOP)
    try:
        joiner = inst.join("broker.join-timeout=1s", boot=[silent, inst.uri], log=log)
        status = inst.wait_status(
            lambda s: s["ranks"][2]["state"] == "online" or joiner.poll() is not None,
            "rank 2 online, or its joiner gone",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    said = log.read_text()
    assert status["ranks"][2]["state"] == "online", said
    assert status["ranks"][2]["pid"] == joiner.pid
    assert (
        f"FLUB: {silent}: no answer from rank 0 within 1s (is it stopped or overloaded?); "
        f"trying {inst.uri}"
    ) in said, said


def exits_75_at_once(
    inst: Instance, boot: str, rank: int, parent: int, kill: int, log: Path
) -> str:
    """Start a joiner for `rank` through `boot` alone, let it wait for `parent`, kill the broker
    of rank `kill` by PID, and check that the joiner exits 75 once the connection drops, long
    before any of its timeouts (300 s) would have ended the wait. What it said last."""
    joiner = inst.join(f"broker.rank={rank}", "broker.join-timeout=300s", boot=[boot], log=log)
    wait_for(lambda: f"waiting for parent rank {parent}" in log.read_text(), "the joiner to wait")
    os.kill(inst.pid(kill), signal.SIGKILL)
    try:
        code = joiner.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        joiner.kill()
        joiner.wait()
        raise AssertionError(f"the joiner hung: {log.read_text()}") from None
    said = log.read_text()
    assert code == exitcodes.LOST, said
    last = said.strip().splitlines()[-1]
    assert f"FLUB: lost the connection to {boot}" in last, said
    assert last.endswith(f"the reservation of rank {rank} incarnation 1 lapses with its lease")
    return last


def test_a_joiner_whose_only_boot_server_dies_exits_75(instance, tmp_path: Path) -> None:
    inst = instance(2, "size=6", "tbon.fanout=2", "tbon.timeout=0", "broker.join-timeout=300s")
    exits_75_at_once(inst, uri_of(inst, 1), 5, 2, 1, tmp_path / "joiner.log")
    # the instance lives on, and the rank stays reserved until its lease ends
    assert inst.status()["ranks"][5]["state"] == "reserved"


def test_a_joiner_whose_instance_dies_under_it_exits_75(instance, tmp_path: Path) -> None:
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=300s")
    exits_75_at_once(inst, inst.uri, 3, 1, 0, tmp_path / "joiner.log")


# --- tbon expand ---------------------------------------------------------------------------


def test_expand_gives_its_brokers_every_uri_it_knows(instance) -> None:
    inst = instance(3, "size=5", "tbon.fanout=2")
    result = tbon("expand", inst.uri, "-n", "1", "--json")
    assert result.returncode == 0, result.stderr
    [joined] = json.loads(result.stdout)["joined"]
    # expand's brokers log from level info, in the given broker's run directory (tbon-expand(1))
    [log] = (Path(inst.uri[len("local://") :]).parent / "expand").glob("broker-*-0.log")
    [line] = [line for line in log.read_text().splitlines() if "FLUB: boot servers" in line]
    # the URI it was given first (rank 0's here), then the other brokers of this host
    assert line.endswith(f"in order: {inst.uri} {uri_of(inst, 1)} {uri_of(inst, 2)}"), line
    assert inst.status()["ranks"][joined["rank"]]["pid"] == joined["pid"]
