"""Rank 0's death takes the whole tree down within tbon.timeout + broker.reattach-timeout,
whatever its depth (docs/protocol.md §12.1, step 6): a seeking broker tells its children when its
search ends, so that theirs ends no later."""

from __future__ import annotations

import os
import signal
import time

from conftest import launcher_said, process_gone, wait_for

TIMEOUT, REATTACH = 1.5, 4.0


def test_rank0_s_death_ends_a_tree_three_levels_deep_within_one_reattach_timeout(
    instance,
) -> None:
    inst = instance(
        15,  # kary:2: ranks 7-14 are three links below rank 0
        "tbon.fanout=2",
        "tbon.heartbeat=100ms",
        "tbon.torpid=0",
        f"tbon.timeout={TIMEOUT}s",
        f"broker.reattach-timeout={REATTACH}s",
        exit_timeout="60s",  # tbon start kills brokers that outlive rank 0 by this: not here
    )
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    killed = time.monotonic()
    os.kill(before[0], signal.SIGKILL)
    wait_for(lambda: all(process_gone(pid) for pid in before.values()), "every broker to exit")
    took = time.monotonic() - killed
    # Level by level, rank 7 would go after 3 x REATTACH (12 s); one search for all is
    # TIMEOUT + REATTACH at most, and the margin stays well below a second REATTACH.
    assert took < TIMEOUT + REATTACH + REATTACH / 2, f"the tree took {took:.1f}s to go"
    inst.stop()
    log = inst.stderr()
    for rank in range(1, 15):
        assert launcher_said(log, rank, before[rank], "exited with status 75"), log
