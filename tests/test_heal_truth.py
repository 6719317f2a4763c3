"""Issue 20, items 4, 5 and 6, black-box: status tells the truth soon after a double death, rank
0's death ends every broker at once whatever the depth, and a shutdown after a heal does not
wait for ranks that will never come.

Each test waits with a deadline far from both the target and what the defect costs (a large
`broker.reattach-timeout` or `broker.shutdown-timeout`), so that a loaded machine cannot make it
pass or fail by timing alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

from brokers import alive
from conftest import launcher_said, pids, process_gone, tbon, wait_for

FAST = ("tbon.heartbeat=100ms", "tbon.torpid=0")


def home(status: dict[str, Any]) -> bool:
    """Every rank online under its own topology parent."""
    return all(
        r["state"] == "online" and not r.get("reattaching") and r.get("attached_to") == r["parent"]
        for r in status["ranks"]
    )


def test_a_rank_killed_with_its_parent_reads_lost_long_before_the_reattach_timeout(
    instance,
) -> None:
    # The target is tbon.timeout (2 s); the defect costs tbon.timeout + reattach-timeout (62 s).
    inst = instance(
        15,
        "tbon.fanout=2",
        *FAST,
        "tbon.timeout=2s",
        "broker.reattach-timeout=60s",
        "broker.shutdown-timeout=5s",
    )
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    os.kill(before[3], signal.SIGKILL)
    wait_for(lambda: process_gone(before[1]) and process_gone(before[3]), "ranks 1 and 3 to die")
    status = inst.wait_status(
        lambda s: s["ranks"][1]["state"] == "lost" and s["ranks"][3]["state"] == "lost",
        "ranks 1 and 3 both lost (rank 3's children saw its connections drop)",
        timeout=20.0,
    )
    survivors = [rank for rank in range(15) if rank not in (1, 3)]
    assert all(status["ranks"][rank]["state"] == "online" for rank in survivors)
    # rank 3's own children told: its reattach grace (62 s) did not run out
    assert status["ranks"][3]["reason"] in (
        f"connection dropped, seen by rank {child} below it" for child in (7, 8)
    ), status["ranks"][3]


def test_when_rank0_dies_every_broker_is_gone_within_one_reattach_timeout_at_any_depth(
    instance,
) -> None:
    # A chain of 10 (depth 9): the target is tbon.timeout + reattach-timeout (1 s + 3 s); level
    # by level it takes 9 x 3 s. The launcher must not kill them for us: its exit timeout is long.
    inst = instance(
        10,
        "tbon.topo=kary:1",
        *FAST,
        "tbon.timeout=1s",
        "broker.reattach-timeout=3s",
        exit_timeout="120s",
    )
    before = pids(inst.status())
    os.kill(before[0], signal.SIGKILL)
    started = time.monotonic()
    try:
        wait_for(
            lambda: all(process_gone(pid) for pid in before.values()),
            "every broker of the chain to exit on its own",
            timeout=13.0,
        )
    finally:
        left = {rank: pid for rank, pid in before.items() if not process_gone(pid)}
        print(f"after {time.monotonic() - started:.1f}s, ranks still running: {sorted(left)}")
        for pid in left.values():  # ours (from its status): the launcher would wait 120 s
            os.kill(pid, signal.SIGKILL)
    inst.stop()
    log = inst.stderr()
    for rank in range(1, 10):
        assert launcher_said(log, rank, before[rank], "exited with status 75"), log


def test_a_shutdown_after_a_heal_does_not_wait_the_shutdown_timeout(instance) -> None:
    # Rank 1 has grandchildren (7-10): when it dies, rank 0 is told to expect its whole subtree,
    # though only its children (3, 4) come. broker.shutdown-timeout and the admissions' grace
    # (tbon.timeout + broker.reattach-timeout) are 60 s or more, and the launcher waits 120 s
    # more: a shutdown that waits for admissions nobody will use misses the 20 s deadline by
    # far; a healthy one takes well under a second.
    inst = instance(
        15,
        "tbon.fanout=2",
        *FAST,
        "tbon.timeout=2s",
        "broker.reattach-timeout=60s",
        "broker.shutdown-timeout=60s",
        exit_timeout="120s",
    )
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    inst.wait_status(
        lambda s: (
            s["ranks"][1]["state"] == "lost"
            and [s["ranks"][r].get("attached_to") for r in (3, 4)] == [0, 0]
        ),
        "rank 1 lost, ranks 3 and 4 fostered by rank 0",
    )
    expand = tbon("expand", inst.uri, "--fill", "--json", "--timeout", "20s")
    assert expand.returncode == 0, expand.stderr
    joined = [entry["pid"] for entry in json.loads(expand.stdout)["joined"]]
    try:
        inst.wait_status(home, "rank 1 replaced and every rank home")
        inst.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            inst.process.wait(timeout=20.0)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "tbon start still running 20s after SIGTERM (broker.shutdown-timeout=60s)"
            ) from None
        finally:
            print(f"shutdown after the heal: {time.monotonic() - started:.1f}s")
        wait_for(lambda: not any(alive(pid) for pid in joined), "the joined broker to leave")
    finally:
        # Whatever happened, leave nothing for the fixture to wait 60 s for: the brokers of this
        # instance (by PID, from its status) and the one our `tbon expand` started.
        for pid in [*before.values(), *joined]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
