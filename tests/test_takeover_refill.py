"""Refilling the dead root's rank (docs/protocol.md §13.6), with real brokers in kary:4 and two
standbys: after a takeover, `tbon expand --ranks 0` through the new root's URI starts a broker
that FLUB grants rank 0 under the root that took over. The root role stays there; the new rank
0 is a member (a voter once caught up), so killing the root afterwards makes a second takeover,
and every live broker keeps its pid."""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import Instance, child_env, tbon, wait_for
from test_takeover import FAILED, status_through
from test_takeover_siblings import KARY4, uris_of, wait_moved

SIZE = 9


def wait_refilled(inst: Instance, uris: str, root: int) -> dict[str, Any]:
    """Wait until rank 0 is online again as a new incarnation under `root`, still the root,
    and the root reports it a voter."""
    seen: dict[str, Any] = {}

    def refilled() -> bool:
        status = status_through(uris)
        if status is None:
            return False
        seen.clear()
        seen.update(status)
        zero = status["ranks"][0]
        voters = {s["rank"]: s.get("voter") for s in status.get("group", {}).get("standbys", [])}
        return (
            status["root"] == root
            and zero["state"] == "online"
            and zero["incarnation"] > 1
            and 0 in status["standbys"]
            and voters.get(0) is True
        )

    try:
        wait_for(refilled, f"rank 0 refilled under rank {root}, a voter")
    except AssertionError as error:
        tail = "\n".join(inst.stderr().splitlines()[-60:])
        raise AssertionError(f"{error}; last status {seen} {FAILED}; stderr:\n{tail}") from None
    return seen


def test_rank_zero_refilled_after_a_takeover_then_the_root_killed_again(instance) -> None:
    inst = instance(SIZE, *KARY4)
    uris = uris_of(inst)
    env = {**child_env(), "TBON_URI": uris}
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    os.kill(before[0], signal.SIGKILL)
    wait_moved(inst, uris, before)  # rank 1 the root, every other rank online as before
    new_root = uris.split(",")[1]
    expanded = tbon("expand", "--ranks", "0", new_root, env=env)
    assert expanded.returncode == 0, expanded.stderr + inst.stderr()[-4000:]
    seen = wait_refilled(inst, uris, root=1)
    zero = seen["ranks"][0]
    assert zero["pid"] not in before.values() and zero.get("attached_to") == 1, zero
    for rank, pid in before.items():
        if rank:
            assert seen["ranks"][rank]["pid"] == pid, (rank, seen["ranks"][rank])
    # the second takeover: the group {0,1,2} keeps ranks 0 and 2, a majority
    refilled_pid = zero["pid"]
    os.kill(before[1], signal.SIGKILL)
    alive = {r: p for r, p in before.items() if r not in (0, 1)} | {0: refilled_pid}
    after: dict[str, Any] = {}

    def taken_over_again() -> bool:
        status = status_through(uris)
        if status is None:
            return False
        after.clear()
        after.update(status)
        ranks = status["ranks"]
        return (
            status["root"] in (0, 2)
            and ranks[1]["state"] == "lost"
            and all(
                ranks[r]["state"] == "online" and ranks[r]["pid"] == p for r, p in alive.items()
            )
        )

    try:
        wait_for(taken_over_again, "a second takeover, every live rank online as before")
    except AssertionError as error:
        tail = "\n".join(inst.stderr().splitlines()[-80:])
        raise AssertionError(f"{error}; last status {after}; stderr:\n{tail}") from None
    assert "took over in term" in after["ranks"][1]["reason"], after["ranks"][1]
    ran = tbon("exec", "-r", "all", "true", env=env)
    assert ran.returncode == 0, ran.stderr
    # the refilled rank 0, a voter with the whole log, is first in the stagger: it usually wins
    assert sorted([after["root"], *after["standbys"]]) == [0, 1, 2], after
