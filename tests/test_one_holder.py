"""One rank, one broker, even while the tree heals (issue 20): real brokers killed, stopped,
replaced and woken; what a user sees asserted (who holds a rank, exit codes, shutdown)."""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import process_gone, tbon, wait_for

QUICK = ("tbon.heartbeat=100ms", "tbon.torpid=0", "tbon.timeout=1500ms")
"""Liveness settings short enough for a stopped broker to be judged within a test."""


def pids(status: dict[str, Any]) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in status["ranks"] if r["pid"]}


def attached(status: dict[str, Any], *ranks: int) -> list[Any]:
    return [status["ranks"][rank].get("attached_to") for rank in ranks]


def test_a_fostered_broker_replaced_while_stopped_is_refused_when_woken(instance) -> None:
    """Rank 3, fostered by rank 0 since rank 1 died, is stopped past tbon.timeout and replaced:
    woken, its old broker is refused as superseded (77) wherever it knocks, and exits."""
    inst = instance(7, "tbon.fanout=2", *QUICK)
    before = pids(inst.status())
    old = before[3]
    os.kill(before[1], signal.SIGKILL)
    inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "ranks 3 and 4 fostered by rank 0")
    os.kill(old, signal.SIGSTOP)
    try:
        inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")
        result = tbon("expand", inst.uri, "--fill")
        assert result.returncode == 0, result.stderr
        replaced = inst.wait_status(
            lambda s: s["ranks"][3]["state"] == "online" and s["ranks"][3]["incarnation"] == 2,
            "rank 3 replaced",
        )
    finally:
        os.kill(old, signal.SIGCONT)
    new = replaced["ranks"][3]["pid"]
    assert new != old
    wait_for(lambda: process_gone(old), "the superseded broker to exit")
    status = inst.status()
    assert status["ranks"][3]["state"] == "online" and status["ranks"][3]["pid"] == new
    assert status["ranks"][3]["incarnation"] == 2
    assert tbon("exec", inst.uri, "-r", "3", "true").returncode == 0
    inst.stop()
    assert f"rank 3 (pid {old}) exited with status 77" in inst.stderr()


def test_a_shutdown_after_a_heal_does_not_wait_for_admissions_never_used(instance) -> None:
    """Rank 1 dies: rank 0 admits every broker below it, though only ranks 3 and 4 lost their
    parent. Their children never come; a shutdown then ends as soon as every broker has left,
    long before broker.shutdown-timeout (60 s here; the test's deadline is a third of it)."""
    inst = instance(15, "tbon.fanout=2", "tbon.timeout=0", "broker.shutdown-timeout=60s")
    os.kill(inst.pid(1), signal.SIGKILL)
    inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "ranks 3 and 4 fostered by rank 0")
    assert inst.stop() == 0
    assert "shutdown: gave up waiting" not in inst.stderr()
