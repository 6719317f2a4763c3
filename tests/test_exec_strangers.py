"""A client cannot speak for another client's job: an `exec.taken` only the client's broker
sends (docs/protocol.md §7.1), which makes a target forget what it keeps of a job for a heal, is
ignored when a client writes it.

Each wait is for an answer on one connection, whose order makes a later request's answer a
barrier for everything sent before it along the same way.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import DEADLINE, wait_for
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
