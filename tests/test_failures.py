"""Brokers that die, stall, or are impersonated; bytes that are not our protocol."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket

import pytest
import zmq
from conftest import launcher_said, process_gone, start_exec, tbon, wait_for
from rawlocal import RawClient
from zmq.utils.monitor import recv_monitor_message

from tbon.keys.cert import generate_keypair
from tbon.overlay.wire.message import Kind, Message, encode


def healthy(inst, size: int) -> None:
    """Every rank online with the broker it started with, and reachable by ping."""
    status = inst.status()
    assert [r["state"] for r in status["ranks"]] == ["online"] * size
    assert {r["pid"] for r in status["ranks"]} == inst.broker_pids
    for rank in range(size):
        assert tbon("ping", inst.uri, str(rank)).returncode == 0


def test_killed_leaf_is_lost_at_once_and_its_parent_degraded(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")  # no timeout: only the drop can tell
    pid = inst.pid(3)
    os.kill(pid, signal.SIGKILL)
    status = inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")
    assert status["ranks"][3]["pid"] is None
    assert status["ranks"][1]["subtree"] == "degraded"
    assert status["ranks"][0]["subtree"] == "degraded"
    assert status["ranks"][2]["subtree"] == "full"
    shown = tbon("status", inst.uri).stdout
    assert re.search(r"^0 \S+: degraded$", shown, re.M)
    assert re.search(r"3 \S+: lost$", shown, re.M)
    ping = tbon("ping", inst.uri, "3")
    assert ping.returncode == 68 and ping.stderr.strip() == "tbon ping: rank 3 is lost"
    inst.stop()
    assert launcher_said(inst.stderr(), 3, pid, "killed by signal SIGKILL")


def test_silent_broker_goes_torpid_then_lost_and_returns_as_itself_on_waking(instance) -> None:
    """A stopped broker is flagged torpid, then lost; woken, nothing having replaced it, it
    comes back as the same incarnation (a partition healed: docs/protocol.md §12)."""
    inst = instance(3, "tbon.heartbeat=100ms", "tbon.torpid=400ms", "tbon.timeout=1500ms")
    pid = inst.pid(2)
    os.kill(pid, signal.SIGSTOP)
    try:
        torpid = inst.wait_status(lambda s: s["ranks"][2]["torpid"], "rank 2 torpid")
        assert torpid["ranks"][2]["state"] == "online"
        assert "(torpid)" in tbon("status", inst.uri).stdout
        lost = inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
        assert lost["ranks"][0]["subtree"] == "degraded"
    finally:
        os.kill(pid, signal.SIGCONT)
    back = inst.wait_status(lambda s: s["ranks"][2]["state"] == "online", "rank 2 back")
    assert back["ranks"][2]["pid"] == pid and back["ranks"][2]["incarnation"] == 1
    assert back["ranks"][0]["subtree"] == "full"
    assert tbon("ping", inst.uri, "2").returncode == 0


def broker_info(inst, rank: int = 0) -> dict:
    with inst.client() as client:
        return client.rpc("broker.info", nodeid=rank)


def handshake_outcome(
    endpoint: str, server_key: str, keypair: tuple[str, str] | None = None
) -> tuple[int, bool]:
    """Connect with `keypair` (default: a fresh one) and say hello as rank 1; (monitor event,
    got an answer)."""
    public, secret = keypair or generate_keypair()
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.linger = 0
    monitor = rogue.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_SUCCEEDED
    )
    rogue.curve_publickey, rogue.curve_secretkey = public.encode(), secret.encode()
    rogue.curve_serverkey = server_key.encode()
    rogue.connect(endpoint)
    hello = Message(
        Kind.CONTROL,
        "hello",
        {"rank": 1, "incarnation": 1, "version": 1, "hostname": "rogue", "pid": 1},
    )
    rogue.send_multipart(encode(hello))
    try:
        assert monitor.poll(10_000), "no handshake outcome"
        event = recv_monitor_message(monitor)["event"]
        return event, bool(rogue.poll(200))
    finally:
        rogue.disable_monitor()
        monitor.close()
        rogue.close()
        context.term()


def test_unauthorized_key_is_refused_and_instance_undisturbed(instance) -> None:
    inst = instance(3)
    info = broker_info(inst)
    # Worst case: the attacker knows rank 0's real public key (it is no secret).
    event, answered = handshake_outcome(info["endpoint"], info["public_key"])
    assert event == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert not answered
    # Without the server key, the handshake cannot even start.
    event, answered = handshake_outcome(info["endpoint"], generate_keypair()[0])
    assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED and not answered
    healthy(inst, 3)
    assert [r["incarnation"] for r in inst.status()["ranks"]] == [1, 1, 1]


def test_a_foreign_key_that_keeps_knocking_is_warned_about_once(instance) -> None:
    """Its first refusal is said at debug level only (an orphan knocks so during a heal); one
    still refused past the grace is warned about, and not again for a minute."""
    inst = instance(3, "tbon.heartbeat=100ms")
    info = broker_info(inst)
    keypair = generate_keypair()
    warned = re.compile(
        rf"warning: refused a child from 127\.0\.0\.1: CURVE key {re.escape(keypair[0])} "
        r"is not authorized"
    )

    def knocked() -> bool:
        event, answered = handshake_outcome(info["endpoint"], info["public_key"], keypair)
        assert event == zmq.EVENT_HANDSHAKE_FAILED_AUTH and not answered
        return warned.search(inst.stderr()) is not None

    wait_for(knocked, "a warning about the foreign key")
    for _ in range(5):
        knocked()
    healthy(inst, 3)
    inst.stop()
    assert len(warned.findall(inst.stderr())) == 1, inst.stderr()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 64,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f" + os.urandom(200),  # a ZMTP-like start
        os.urandom(4096),
    ],
    ids=["zeros", "http", "zmtp-like", "random"],
)
def test_garbage_on_the_tcp_port_leaves_every_broker_running(instance, garbage: bytes) -> None:
    inst = instance(3)
    host, port = broker_info(inst)["endpoint"][len("tcp://") :].rsplit(":", 1)
    # The broker may hang up mid-way: that is a fine answer to garbage.
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        contextlib.suppress(OSError),
    ):
        raw.sendall(garbage)
        raw.shutdown(socket.SHUT_WR)
        while raw.recv(4096):
            pass
    healthy(inst, 3)


def test_garbage_on_the_local_socket_leaves_every_broker_running(instance) -> None:
    inst = instance(3)
    path = inst.uri[len("local://") :]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(path)
        raw.sendall(os.urandom(8192))
    dealer = RawClient(path)
    malformed = [
        [b"only one frame"],
        [b"{}", b"{}", b"three"],
        [b"not json", b""],
        [b"[1,2]", b""],
        [b'{"v":1,"k":"request"}', b""],
        [b'{"v":1,"k":"request","t":"broker.ping","n":"zero"}', b""],
        [b'{"v":1,"k":"request","t":"broker.ping","r":[1,2]}', b""],
        [b'{"v":1,"k":"bogus","t":"x"}', b""],
        [b'{"v":1,"k":"request","t":"broker.ping"}', b"[not an object]"],
        [b'{"v":1,"k":"request","t":"broker.ping","n":99999}', b""],
        [b'{"v":1,"k":"request","t":"no.such.topic","n":2,"g":5}', b""],
        [b'{"v":1,"k":"response","t":"x","r":["c1","p","zz"]}', b"{}"],
        [b'{"v":1,"k":"control","t":"hello"}', b"{}"],
        [b'{"v":1,"k":"request","t":"broker.ping","n":1}', b"x" * (5 * 1024 * 1024)],
    ]
    try:
        for frames in malformed:
            dealer.send_multipart(frames)
        # The two well-formed requests get errors; nothing else gets an answer.
        answers = []
        while dealer.poll(1000):
            answers.append(dealer.recv_multipart())
        assert len(answers) == 2
    finally:
        dealer.close()
    healthy(inst, 3)


def test_healthy_brokers_never_turn_torpid(instance) -> None:
    """Heartbeats start at once after the welcome: a quiet, healthy instance stays unflagged
    for several torpid periods (watched through rank 0's pushed status)."""
    inst = instance(
        7, "tbon.fanout=2", "tbon.heartbeat=100ms", "tbon.torpid=400ms", "tbon.timeout=5s"
    )
    try:
        flagged = inst.wait_status(
            lambda s: any(r["torpid"] for r in s["ranks"]), "a torpid rank", timeout=2.0
        )
    except AssertionError:
        flagged = None  # two seconds, five torpid periods, nobody flagged: as it should be
    assert flagged is None, flagged
    healthy(inst, 7)


def test_brokers_cut_off_for_good_take_their_exec_jobs_with_them(instance) -> None:
    """Rank 0 dies mid-command: the others find no ancestor to take them back, exit 75 after
    the reattach timeout, and their jobs die with them."""
    inst = instance(
        7, "tbon.fanout=2", "tbon.heartbeat=100ms", "tbon.timeout=1s", "broker.reattach-timeout=1s"
    )
    uri = inst.uri.replace("/0/local", "/1/local")
    job = start_exec(uri, "-r", "3,4", "-l", "sh", "-c", "echo $$; exec sleep 60")
    try:
        assert job.stdout is not None
        pids = [int(job.stdout.readline().split(": ")[1]) for _ in range(2)]
        os.kill(inst.pid(0), signal.SIGKILL)
        wait_for(lambda: all(process_gone(pid) for pid in pids), "the cut-off jobs to end")
        job.communicate(timeout=20)
        assert job.returncode != 0
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_requests_with_payloads_of_the_wrong_types_are_answered_not_fatal(instance) -> None:
    from tbon.overlay.connectors.client import RequestError

    inst = instance(3)
    wrong = [
        ("flub.authorize", {"rank": "one", "incarnation": [], "public_key": 5}, 1),
        ("flub.allocate", {"public_key": "x", "hostname": 3, "rank": "2"}, 0),
        ("flub.kex", {"rank": "1", "incarnation": None, "public_key": {}}, 0),
        ("exec.start", {"id": 1, "argv": "true", "targets": "all"}, 0),
        ("exec.stdin", {"id": "x", "data": 5, "targets": [1]}, 0),
        ("exec.signal", {"id": "x", "signal": "TERM", "targets": [1, "2"]}, 0),
        ("flub.revoke", {"rank": "x"}, 1),
    ]
    with inst.client() as client:
        for topic, payload, rank in wrong:
            try:
                client.rpc(topic, payload, nodeid=rank, timeout=5)
            except RequestError as error:
                assert "Traceback" not in str(error)
            except Exception as error:  # a missing answer is fine for one-way topics
                assert "no answer" in str(error), (topic, error)
    healthy(inst, 3)
