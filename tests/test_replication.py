"""The root group's replication and commit wait (docs/protocol.md §13.2), with real brokers:
standbys hold the root's table, a grant waits for a majority of the group, and none is given
without one. `group.state` gives each member's applied index and a digest of its table."""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import Instance, tbon, wait_for

from tbon.overlay.connectors.client import Client, RequestError

GROUP = ("tbon.standbys=2", "tbon.topo=kary:2", "tbon.timeout=30s")


def group_state(inst: Instance, rank: int) -> dict[str, Any]:
    with Client(inst.uri) as client:
        return client.rpc("group.state", nodeid=rank)


def wait_replicas_equal(inst: Instance, members: tuple[int, ...]) -> dict[str, Any]:
    """Wait until every member has applied what the root committed, with the same table."""
    seen: dict[int, dict[str, Any]] = {}

    def equal() -> bool:
        for rank in members:
            try:
                seen[rank] = group_state(inst, rank)
            except RequestError:  # a refilled member not yet sent the log's start
                return False
        root = seen[0]
        return all(
            (s["applied"], s["digest"]) == (root["applied"], root["digest"]) for s in seen.values()
        )

    wait_for(equal, f"the replicas of {members} to equal the root's")
    return seen[0]


def online(inst: Instance, rank: int) -> dict[str, Any]:
    return inst.wait_status(lambda s: s["ranks"][rank]["state"] == "online", f"rank {rank} online")


def test_joins_retires_and_a_heal_reach_every_standby(instance) -> None:
    inst = instance(4, "size=6", *GROUP)
    before = wait_replicas_equal(inst, (0, 1, 2))
    assert before["root"] and not group_state(inst, 1)["root"]
    inst.join()
    online(inst, 4)
    assert tbon("retire", inst.uri, "4").returncode == 0
    os.kill(inst.pid(3), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")
    after = wait_replicas_equal(inst, (0, 1, 2))
    assert after["applied"] > before["applied"]
    status = inst.status()
    assert status["group"]["paused"] is False
    assert {s["rank"] for s in status["group"]["standbys"]} == {1, 2}


def test_a_dead_standby_stops_nothing_and_its_refill_catches_up(instance) -> None:
    inst = instance(3, "size=5", *GROUP)
    os.kill(inst.pid(2), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
    joiner = inst.join()  # granted with rank 1's answer alone: the lost rank 2, refilled
    refilled = online(inst, 2)["ranks"][2]
    assert (refilled["pid"], refilled["incarnation"]) == (joiner.pid, 2)
    wait_replicas_equal(inst, (0, 1, 2))  # the new incarnation is sent the log from its start


def test_without_a_majority_a_join_is_refused_and_never_granted(instance) -> None:
    inst = instance(3, "size=5", *GROUP, "broker.join-timeout=4s")
    for rank in (1, 2):
        os.kill(inst.pid(rank), signal.SIGKILL)
    wait_for(lambda: inst.status()["group"]["paused"], "grants paused")
    joiner = inst.join("broker.join-timeout=4s")  # its own deadline: it asks again until then
    assert joiner.stderr is not None
    code = joiner.wait(timeout=30)
    said = joiner.stderr.read()
    assert code == 75, said
    assert "grants are paused: no majority of the root group (ranks 0,1,2) answers" in said
    assert "trying the boot servers again" in said, said
    status = inst.status()
    assert [r["state"] for r in status["ranks"][3:]] == ["vacant", "vacant"]
    summary = tbon("status", inst.uri, "--summary").stdout
    assert "grants paused" in summary, summary


def test_a_stopped_standby_catches_up(instance) -> None:
    inst = instance(3, "size=5", *GROUP)
    stopped = inst.pid(2)
    os.kill(stopped, signal.SIGSTOP)
    try:
        inst.join()
        online(inst, 3)  # granted with rank 1's answer alone
        lagging = {s["rank"]: s["lag"] for s in inst.status()["group"]["standbys"]}
        assert lagging[2] > 0, lagging
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_replicas_equal(inst, (0, 1, 2))
