"""Every request a local client can send is answered, whatever it carries, or is one-way.

A raw client (it frames its own messages: tests/rawlocal.py) sends every topic of the broker's
dispatch table, and one no broker knows, with hostile payloads (missing fields, wrong types,
huge integers and strings, nested junk, targets outside the instance) to rank 0, to no rank, to
another rank and to a rank that cannot exist. Each request that is not one-way must get a
response or an error within the deadline; afterwards the instance still answers `tbon status`.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from conftest import DEADLINE, tbon
from rawlocal import RawClient

from tbon.overlay.broker.dispatch import ONE_WAY_TOPICS, Services
from tbon.overlay.config.attributes import broker_config
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.ping import Whoami
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.topology import Topology

FIELDS = [
    "id",
    "argv",
    "cwd",
    "env",
    "targets",
    "eof",
    "window",
    "bytes",
    "signal",
    "rank",
    "incarnation",
    "public_key",
    "hostname",
    "reason",
    "force",
    "timeout",
    "event",
    "running",
    "killed",
    "why",
    "name",
    "level",
    "clear",
    "backlog",
    "follow",
    "next",
    "watch",
    "ranks",
    "card",
    "endpoint",
]
JUNK: Any = [[[{"a": [None, {"b": [[[]]]}]}]]]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": [value]}
    return value


PAYLOADS: dict[str, dict[str, Any]] = {
    "missing fields": {},
    "wrong types": {f: ({}, "x", [1], True, 1.5)[i % 5] for i, f in enumerate(FIELDS)},
    "huge integers": dict.fromkeys(FIELDS, 10**30),
    "negative integers": dict.fromkeys(FIELDS, -5),
    "huge strings": dict.fromkeys(FIELDS[:6], "x" * 200_000),
    "nested junk": {**dict.fromkeys(FIELDS, JUNK), "deep": nested(60)},
    "a rank past the size": {"id": "a", "argv": ["true"], "targets": [5], "rank": 5},
    "a negative rank": {"id": "a", "argv": ["true"], "targets": [-5], "rank": -5},
    "a rank of 10**30": {"id": "a", "argv": ["true"], "targets": [10**30], "rank": 10**30},
    "no targets": {"id": "a", "argv": ["true"], "targets": []},
    "rank 0 sent elsewhere": {"id": "a", "argv": ["true"], "targets": [0]},
}
NODEIDS = (0, -1, 2, 10**30)


def all_topics() -> set[str]:
    """Every topic of rank 0's dispatch table (a superset of any other rank's)."""
    topology = Topology("kary:2", 4)
    table = RankTable(topology, ["h"] * 4, 0.0)
    me = Whoami(0, "h", 1, "local:///x", "tcp://h:1", "K" * 40)
    return set(Services.build(me, broker_config({}), topology, table, Lifecycle()).handlers())


def test_the_one_way_topics_are_documented_as_unanswered() -> None:
    protocol = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    for topic in ONE_WAY_TOPICS:
        row = re.search(rf"^\| `{re.escape(topic)}` \|.*$", protocol, re.MULTILINE)
        assert row is not None, topic
        assert re.search(r"\| (none|—)[^|]*\|$", row.group(0)), (topic, row.group(0))
    assert all_topics() >= ONE_WAY_TOPICS


def test_every_request_is_answered_whatever_it_carries(instance) -> None:
    inst = instance(4, "tbon.topo=kary:2")
    # instance.shutdown is walked too, but only where it cannot be obeyed: another rank, no rank
    topics = [*sorted(all_topics() - ONE_WAY_TOPICS), "no.such.topic"]
    expected: dict[int, tuple[str, str, int]] = {}
    answered: dict[int, dict[str, Any]] = {}
    read = 0
    with RawClient(inst.uri) as client:

        def send(topic: str, payload: dict[str, Any], nodeid: int, tag: int) -> None:
            header = {"v": 1, "k": "request", "t": topic, "n": nodeid, "g": tag}
            client.send_multipart([json.dumps(header).encode(), json.dumps(payload).encode()])

        def collect(until: float) -> None:
            nonlocal read
            while len(answered) < len(expected) and client.poll(
                max(1, int((until - time.monotonic()) * 1000))
            ):
                frames = client.recv_multipart()
                read += sum(map(len, frames))
                header = json.loads(frames[0])
                assert header["t"] != "client.dropped", header
                if header.get("g") in expected:
                    answered[header["g"]] = header
                send("client.ack", {"bytes": read}, 0, 0)  # it reads: never dropped for that

        tag = 1
        for topic in topics:
            for name, payload in PAYLOADS.items():
                for nodeid in NODEIDS:
                    if topic == "instance.shutdown" and nodeid in (0, -1):
                        continue
                    expected[tag] = (topic, name, nodeid)
                    send(topic, payload, nodeid, tag)
                    tag += 1
            collect(time.monotonic() + 0.05)  # keep up: what it was sent is read as it goes
        for topic in sorted(ONE_WAY_TOPICS | {"client.ack"}):  # no answer owed: only survival
            for payload in PAYLOADS.values():
                send(topic, payload, 0, 0)
        collect(time.monotonic() + DEADLINE)
        unanswered = sorted({expected[t] for t in expected.keys() - answered.keys()}, key=str)
        assert not unanswered, f"{len(unanswered)} requests unanswered: {unanswered[:20]}"
        # Each answer is a response to its own request: same topic, and an error or a payload.
        assert all(answered[t]["t"] == expected[t][0] for t in answered)
    status = tbon("status", inst.uri)
    assert status.returncode == 0 and status.stdout.count(": full") == 4, status
