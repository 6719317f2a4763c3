"""One rank, one broker, even while the tree heals (issue 20): real brokers killed, stopped,
replaced and woken; what a user sees asserted (who holds a rank, exit codes, shutdown)."""

from __future__ import annotations

import json
import os
import signal
import time

from conftest import HEAL_QUICK as QUICK
from conftest import attached, pids, process_gone, tbon, wait_for

from tbon.overlay.links.upward import DISMISS_WAIT


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


def _rank_1_replaced(inst, *home: int) -> dict[int, int]:
    """Kill -9 rank 1 (kary:2), wait for ranks 3 and 4 fostered by rank 0, fill rank 1 with a
    joiner, and wait until ranks `home` are back under it; the pids before, by rank."""
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "ranks 3 and 4 fostered by rank 0")
    joiner = inst.join()
    inst.wait_status(
        lambda s: s["ranks"][1]["pid"] == joiner.pid and attached(s, *home) == [1] * len(home),
        f"rank 1 replaced and ranks {home} home",
    )
    return before


def test_a_second_heal_finds_no_admission_left_open_by_the_first(instance) -> None:
    """Issue 20 item 2. Rank 1's death has rank 0 admit every broker cut off below it, its
    grandchildren 7-10 too, which stay with their own parents: those admissions are moot at
    once. Rank 1 replaced and its children home, rank 3 dies: rank 0 has the new rank 1 foster
    7 and 8, and itself too (rank 3 was fostered by rank 0 in this incarnation: its children may
    hold that lineage still). They keep whichever welcomes them first and leave the other: that
    link's end, read as a loss, once had the rank handed out again while its broker ran on (the
    first heal's admission left open). Each stays one broker, under one of the two, never lost."""
    inst = instance(15, "tbon.fanout=2", *QUICK, "broker.reattach-timeout=60s")
    before = _rank_1_replaced(inst, 3, 4)
    # Rank 3 keeps its link to rank 0, told `moved`, open for DISMISS_WAIT after going home; a
    # kill inside that window is another race (issue 20's note), not this item's: wait it out.
    time.sleep(DISMISS_WAIT + 0.5)
    os.kill(before[3], signal.SIGKILL)
    inst.wait_status(
        lambda s: s["ranks"][3]["state"] == "lost" and set(attached(s, 7, 8)) <= {0, 1},
        "ranks 7 and 8 fostered by the new rank 1 or rank 0",
    )
    # Stay a while: two liveness timeouts, in which a second welcome's end would be reported.
    watched_until = time.monotonic() + 2 * 1.5
    while time.monotonic() < watched_until:
        status = inst.status()
        for rank in (7, 8):
            entry = status["ranks"][rank]
            assert (entry["state"], entry["pid"], entry["incarnation"]) == (
                "online",
                before[rank],
                1,
            ), _said(status, rank)
            # welcomed by both, it may show under one until its move to the other is reported
            assert entry.get("attached_to") in (0, 1), entry
        time.sleep(0.1)  # a poll's pace, not a wait for anything
    assert tbon("exec", inst.uri, "-r", "7,8", "true").returncode == 0


def test_a_rank_killed_on_its_way_home_leaves_its_children_a_parent_they_can_find(
    instance,
) -> None:
    """Issue 20, the race its note named: rank 3, fostered by rank 0, goes home to rank 1's new
    broker and is killed at once, its foster link still open (DISMISS_WAIT), perhaps before it
    passed the new lineage to ranks 7 and 8. They hold [0, 3] or [0, 1, 3]: rank 0 fosters them
    as well as rank 1 (healing.py rule 3), and they come back under one of the two, never lost.
    Before, only the new rank 1 was told to admit them, and they could exit 75 unable to find
    it."""
    inst = instance(15, "tbon.fanout=2", *QUICK, "broker.reattach-timeout=60s")
    before = _rank_1_replaced(inst, 3)
    os.kill(before[3], signal.SIGKILL)
    inst.wait_status(
        lambda s: s["ranks"][3]["state"] == "lost" and set(attached(s, 7, 8)) <= {0, 1},
        "ranks 7 and 8 fostered by rank 0 or the new rank 1",
    )
    status = inst.status()
    for rank in (7, 8):
        entry = status["ranks"][rank]
        assert (entry["state"], entry["pid"]) == ("online", before[rank]), entry
    assert tbon("exec", inst.uri, "-r", "7,8", "true").returncode == 0


def _said(status: dict, rank: int) -> str:
    """The whole entry of `rank` and its neighbours' states and links, for a failure to explain
    itself (the entry's reason says who declared it lost, and why)."""
    others = {e["rank"]: (e["state"], e.get("attached_to")) for e in status["ranks"]}
    return f"{json.dumps(status['ranks'][rank])}; all: {others}"
