"""A client cannot speak for another client's job: an `exec.taken` only the client's broker
sends (docs/protocol.md §7.1), which makes a target forget what it keeps of a job for a heal, is
ignored when a client writes it; and an `exec.signal`, `exec.stdin` or `exec.credit` naming a job
another client started is ignored by the job's rank (§7: a job is its client's), with a warning
in its log, whoever learned the job's id. A stranger's `exec.signal` or `exec.stdin` stops sooner,
at the broker it is a client of, which knows its clients' jobs: it never travels the tree. A
client of a broker that refilled a lost rank is a stranger to the jobs of the lost broker's
clients, though both brokers held that rank (links/local.py `first_number`).

Each wait is for an answer on one connection, whose order makes a later request's answer a
barrier for everything sent before it along the same way.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from conftest import DEADLINE, tbon, wait_for
from rawlocal import RawClient


def send(client: RawClient, topic: str, tag: int, payload: dict[str, Any], nodeid: int = 0) -> None:
    header = {"v": 1, "k": "request", "t": topic, "n": nodeid, "g": tag}
    client.send_multipart([json.dumps(header).encode(), json.dumps(payload).encode()])


def read(client: RawClient) -> tuple[dict[str, Any], dict[str, Any]]:
    frames = client.recv_multipart(int(DEADLINE * 1000))
    return json.loads(frames[0]), json.loads(frames[1]) if frames[1] else {}


def read_until(client: RawClient, tag: int) -> list[dict[str, Any]]:
    """The payloads that arrive before the answer tagged `tag`."""
    before = []
    while True:
        header, payload = read(client)
        if header.get("g") == tag:
            return before
        before.append(payload)


def test_a_stranger_s_exec_taken_does_not_drop_another_client_s_kept_answers(instance) -> None:
    inst = instance(2)
    with RawClient(inst.uri) as owner, RawClient(inst.uri) as stranger:
        start = {
            "id": "victim",
            "argv": ["sh", "-c", "echo hello; exec sleep 600"],
            "cwd": None,
            "targets": [1],
            "acks": True,
            "eof": True,
        }
        send(owner, "exec.start", 1, start)
        header, said = read(owner)
        assert header["g"] == 1 and said["stream"] == "stdout" and said["seq"] == 0, said
        # Rank 1 keeps that line until the owner's broker acknowledges it (after 64 answers, a
        # quarter window, or the job's end), so that a heal cannot lose it. A stranger names
        # the job in an exec.taken; a ping of rank 1 after it, along the same way, is answered
        # only once rank 1 has read it.
        send(stranger, "exec.taken", 2, {"id": "victim", "targets": [1]})
        send(stranger, "broker.ping", 3, {}, nodeid=1)
        assert read_until(stranger, 3) == []
        # The owner asks for what it has not acknowledged: the line comes again.
        send(owner, "exec.resend", 4, {"id": "victim", "targets": [1]})
        send(owner, "broker.ping", 5, {}, nodeid=1)
        again = [p for p in read_until(owner, 5) if p.get("stream") == "stdout"]
        assert [p["seq"] for p in again] == [0], "rank 1 forgot the job's line for a stranger"
        wait_for(lambda: "ignored exec.taken written by a client" in inst.stderr(), "the warning")


def start_victim(owner: RawClient, argv: list[str], eof: bool = True) -> None:
    """Start the owner's job "victim" on rank 1, acknowledging, and wait for its first line."""
    start = {"id": "victim", "argv": argv, "cwd": None, "targets": [1], "acks": True, "eof": eof}
    send(owner, "exec.start", 1, start)
    header, said = read(owner)
    assert header["g"] == 1 and said["stream"] == "stdout" and said["seq"] == 0, said


def after_rank1(client: RawClient, tag: int) -> list[dict[str, Any]]:
    """Everything `client` is sent until rank 1 answers a ping sent now: along the same way as
    what `client` sent before, so rank 1 has read all of that by then."""
    send(client, "broker.ping", tag, {}, nodeid=1)
    return read_until(client, tag)


def test_a_stranger_s_exec_signal_does_not_kill_another_client_s_job(instance) -> None:
    inst = instance(2)
    with RawClient(inst.uri) as owner, RawClient(inst.uri) as stranger:
        start_victim(owner, ["sh", "-c", "echo ready; exec sleep 600"])
        send(stranger, "exec.signal", 2, {"id": "victim", "targets": [1], "signal": 9})
        assert after_rank1(stranger, 3) == []
        # Still running: the owner's own SIGTERM is what ends it.
        send(owner, "exec.signal", 4, {"id": "victim", "targets": [1], "signal": 15})
        while "exit" not in (said := read(owner)[1]):
            pass
        assert said["signal"] == 15, f"the job ended by another signal: {said}"
        said_by_its_broker(inst, "exec.signal")


def said_by_its_broker(inst, topic: str) -> None:
    """The stranger's request was ignored by rank 0, the broker it is a client of, which knows
    its jobs: it never travelled to the job's rank 1 (which had read everything the stranger
    sent before answering its ping, and would have said so by then)."""
    warned = f"tbon-broker[0]: warning: ignored {topic} for job victim from l"
    wait_for(lambda: warned in inst.stderr(), "rank 0's warning")
    assert f"tbon-broker[1]: warning: ignored {topic}" not in inst.stderr(), "it reached rank 1"


def test_a_stranger_s_exec_credit_does_not_drop_another_client_s_kept_answers(instance) -> None:
    inst = instance(2)
    with RawClient(inst.uri) as owner, RawClient(inst.uri) as stranger:
        start_victim(owner, ["sh", "-c", "echo hello; exec sleep 600"])
        # Rank 1 keeps that line until the owner's broker acknowledges it; a stranger says
        # it took it (seq 1), which would let rank 1 forget it.
        credit = {"id": "victim", "bytes": 4096, "seq": 1}
        send(stranger, "exec.credit", 2, credit, nodeid=1)
        assert after_rank1(stranger, 3) == []
        send(owner, "exec.resend", 4, {"id": "victim", "targets": [1]})
        again = [p for p in after_rank1(owner, 5) if p.get("stream") == "stdout"]
        assert [p["seq"] for p in again] == [0], "rank 1 forgot the job's line for a stranger"
        wait_for(lambda: "ignored exec.credit for job victim" in inst.stderr(), "the warning")


def send_stdin(client: RawClient, tag: int, line: bytes) -> None:
    """The job "victim"'s input on rank 1: `line`, then its end."""
    header = {"v": 1, "k": "request", "t": "exec.stdin", "n": 0, "g": tag}
    payload = {"id": "victim", "targets": [1], "eof": True}
    client.send_multipart([json.dumps(header).encode(), json.dumps(payload).encode(), line])


def test_a_stranger_s_exec_stdin_does_not_reach_another_client_s_job(instance) -> None:
    inst = instance(2)
    with RawClient(inst.uri) as owner, RawClient(inst.uri) as stranger:
        start_victim(owner, ["sh", "-c", "echo ready; read line; echo got $line"], eof=False)
        send_stdin(stranger, 2, b"intruder\n")
        assert after_rank1(stranger, 3) == []
        send_stdin(owner, 4, b"mine\n")
        said, lines = {}, []
        while "exit" not in said:
            frames = owner.recv_multipart(int(DEADLINE * 1000))
            said = json.loads(frames[1])
            if said.get("stream") == "stdout":
                lines.append(frames[2])
        assert lines == [b"got mine\n"], f"the job read another's input: {lines}"
        said_by_its_broker(inst, "exec.stdin")


def uri_of(inst, rank: int) -> str:
    with inst.client() as client:
        return client.rpc("broker.info", nodeid=rank)["uri"]


def test_a_client_of_a_refilled_rank_is_a_stranger_to_the_lost_broker_s_jobs(instance) -> None:
    """Rank 2's first client starts a job on rank 1, and rank 2 is killed: the job runs on, its
    first line kept at rank 1 for a heal. `tbon expand --fill` puts a new broker at rank 2, and
    that broker's first client names the job: asked to send its kept answers again, or to
    forget them, rank 1 does neither (it would have, were both brokers to number their clients
    from 1: the same rank and the same hop), and says so in its log."""
    inst = instance(3, "tbon.fanout=2", "tbon.timeout=0")
    with RawClient(uri_of(inst, 2)) as owner:
        start_victim(owner, ["sh", "-c", "echo secret; exec sleep 600"])
        os.kill(inst.pid(2), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
    result = tbon("expand", inst.uri, "--fill")
    assert result.returncode == 0, result.stderr
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "online", "rank 2 refilled")
    with RawClient(uri_of(inst, 2)) as stranger:
        send(stranger, "exec.resend", 2, {"id": "victim", "targets": [1]})
        send(stranger, "exec.credit", 3, {"id": "victim", "bytes": 4096, "seq": 1}, nodeid=1)
        assert after_rank1(stranger, 4) == [], "rank 1 sent another client's output"
    warned = [f"tbon-broker[1]: warning: ignored {t} for job victim from l" for t in TRAVEL]
    wait_for(lambda: all(w in inst.stderr() for w in warned), "rank 1's warnings")


TRAVEL = ("exec.resend", "exec.credit")
"""What a client sends to its job's ranks that its own broker does not judge (§7)."""


def test_a_stranger_that_reuses_a_job_s_id_and_leaves_does_not_get_it_killed(instance) -> None:
    """A stranger starts a job of the owner's id on the owner's job's rank and hangs up at once:
    its broker kills the jobs it started, before the duplicate's refusal is back, with a kill
    that names the stranger, so the owner's job runs on (it would die of SIGKILL were the
    broker's kill taken as the owner's broker's word for any of its clients)."""
    inst = instance(2)
    with RawClient(inst.uri) as owner:
        start_victim(owner, ["sh", "-c", "echo ready; exec sleep 600"])
        with RawClient(inst.uri) as stranger:
            start = {"id": "victim", "argv": ["true"], "cwd": None, "targets": [1]}
            send(stranger, "exec.start", 1, start)
        wait_for(lambda: "exec.signal for job victim from s" in inst.stderr(), "the kill refused")
        send(owner, "exec.signal", 4, {"id": "victim", "targets": [1], "signal": 15})
        while "exit" not in (said := read(owner)[1]):
            pass
        assert said["signal"] == 15, f"the job ended by another signal: {said}"
