"""Wire-up, status and ping through real instances started with `tbon start`."""

from __future__ import annotations

import json
import re
import time

import pytest
from conftest import DEADLINE, child_env, tbon

from tbon.overlay.state.topology import Topology


@pytest.mark.parametrize(
    ("size", "topo"),
    [
        (1, "kary:32"),
        (2, "kary:32"),
        (4, "kary:2"),
        (16, "kary:2"),
        (16, "kary:0"),
        (16, "kary:1"),
        (16, "binomial"),
        (16, "kary:3"),
    ],
)
def test_every_rank_comes_online_in_the_right_place(size: int, topo: str) -> None:
    result = tbon(
        "start",
        f"--test-size={size}",
        "-S",
        f"tbon.topo={topo}",
        "tbon",
        "status",
        "--json",
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    expected = Topology(topo, size)
    assert status["size"] == size and status["topo"] == topo
    assert [r["rank"] for r in status["ranks"]] == list(range(size))
    for entry in status["ranks"]:
        rank = entry["rank"]
        assert entry["state"] == "online"
        assert entry["subtree"] == "full"
        assert entry["incarnation"] == 1
        assert entry["torpid"] is False
        assert entry["pid"] > 0
        assert entry["parent"] == expected.parent(rank)
        assert entry["children"] == list(expected.children(rank))
    assert len({r["pid"] for r in status["ranks"]}) == size


def test_fanout_is_an_alias_for_kary() -> None:
    result = tbon(
        "start", "--test-size=5", "-S", "tbon.fanout=2", "tbon", "status", "--json", env=child_env()
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["topo"] == "kary:2"


def test_status_draws_the_tree(instance) -> None:
    inst = instance(7, "tbon.fanout=2")
    result = tbon("status", inst.uri)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 7
    assert re.fullmatch(r"0 \S+: full", lines[0])
    assert re.fullmatch(r"├─ 1 \S+: full", lines[1])
    assert re.fullmatch(r"│  ├─ 3 \S+: full", lines[2])
    assert re.fullmatch(r"│  └─ 4 \S+: full", lines[3])
    assert re.fullmatch(r"└─ 2 \S+: full", lines[4])
    assert re.fullmatch(r"   └─ 6 \S+: full", lines[6])

    plain = tbon("status", inst.uri, "--no-pretty", "--rank", "1").stdout.splitlines()
    assert [line.split()[0] for line in plain] == ["1", "3", "4"]
    assert plain[1].startswith("  3 ")

    summary = tbon("status", inst.uri, "--summary").stdout.strip()
    assert re.fullmatch(r"0 \S+: full \(7 ranks: 7 online\)", summary)

    verbose = tbon("status", inst.uri, "-v").stdout.splitlines()
    assert all(" for " in line and " rtt " in line for line in verbose), verbose


def test_status_uses_tbon_uri_from_the_environment() -> None:
    result = tbon(
        "start", "--test-size=3", "sh", "-c", 'tbon status && echo "uri=$TBON_URI"', env=child_env()
    )
    assert result.returncode == 0, result.stderr
    assert "0 " in result.stdout and re.search(r"uri=local:///\S+/0/local", result.stdout)


def test_wait_returns_when_reached_and_fails_on_timeout(instance) -> None:
    inst = instance(4)
    reached = tbon("status", inst.uri, "--wait", "full", "--timeout", "10s")
    assert reached.returncode == 0, reached.stderr
    missed = tbon("status", inst.uri, "--wait", "degraded", "--timeout", "200ms")
    assert missed.returncode == 1
    assert missed.stderr.strip() == (
        "tbon status: timed out after 0.2s waiting for rank 0 to be degraded (it is full)"
    )


def test_ping_reaches_every_rank_through_the_tree(instance) -> None:
    inst = instance(16, "tbon.fanout=2")
    topology = Topology("kary:2", 16)
    for rank in range(16):
        result = tbon("ping", inst.uri, str(rank), "--json")
        assert result.returncode == 0, result.stderr
        reply = json.loads(result.stdout)
        assert reply["rank"] == rank
        assert reply["hops"] == topology.level(rank)
        assert reply["rtt_ms"][0] > 0


def test_ping_counts_and_summarises(instance) -> None:
    inst = instance(2)
    result = tbon("ping", inst.uri, "1", "--count", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [
        re.match(r"rank 1 \(\S+\): seq=(\d) time=[\d.]+ ms hops=1", x)[1] for x in lines[:3]
    ] == ["0", "1", "2"]
    assert lines[3].startswith("3 pings: min/avg/max = ")


def test_status_watch_prints_each_change(instance) -> None:
    import subprocess

    from conftest import TBON

    inst = instance(3)
    watcher = subprocess.Popen(
        [TBON, "status", inst.uri, "--watch", "--no-pretty"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert watcher.stdout is not None
        first = [watcher.stdout.readline() for _ in range(5)]  # a line with the time first
        assert first[0][:4].isdigit() and first[1].startswith("0 ") and first[4] == "\n"
        import os
        import signal

        os.kill(inst.pid(2), signal.SIGKILL)
        seen = []
        for line in watcher.stdout:
            seen.append(line)
            if line.strip().startswith("2 ") and line.strip().endswith(": lost"):
                break
        assert any(line.strip().endswith(": lost") for line in seen)
    finally:
        watcher.kill()
        watcher.wait()


def test_a_status_stream_survives_the_previous_client_hanging_up(instance) -> None:
    """A closed client's socket descriptor is soon given to the next client: its hang-up must
    not be taken for the new client's, whose stream would then fall silent."""
    from tbon.overlay.connectors.client import Client

    inst = instance(1, "size=2")
    deadline = time.monotonic() + DEADLINE
    clients: list[Client] = []
    streams = []
    try:
        busy = Client(inst.uri)  # keeps rank 0 reading while clients come and go
        clients.append(busy)
        for _ in range(20):
            passing = Client(inst.uri)
            passing.rpc("status.get", {}, nodeid=0)
            for _ in range(100):
                busy.send("status.get", {}, nodeid=0)
            passing.close()
            clients.append(Client(inst.uri))
            streams.append(clients[-1].watch_status(deadline))
            assert next(streams[-1])["ranks"][1]["state"] == "vacant"
        inst.join()
        for number, stream in enumerate(streams):
            update = next(stream, None)
            assert update is not None, f"stream {number} heard nothing after a change"
            assert update["ranks"][1]["state"] in ("reserved", "online")
        # The joiner must be in before the instance stops: one stopped mid-join would wait out
        # its reattach timeout, and outlive it.
        inst.wait_status(lambda s: s["ranks"][1]["state"] == "online", "the joiner online")
    finally:
        for client in clients:
            client.close()
