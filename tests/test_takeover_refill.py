"""Refilling the dead root's rank (docs/protocol.md §13.6), with real brokers in kary:4: after a
takeover, `tbon expand --ranks 0` through the instance's URI list starts a broker that FLUB
grants rank 0 under whichever member took over. The root role stays there; the new rank 0 is a
member (a voter once caught up), so killing the root afterwards makes a second takeover, and
every live broker keeps its pid. Under load any member may win either election: the tests read
the winner from status, never assume it."""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import Instance, child_env, tbon, wait_for
from test_takeover import wait_through
from test_takeover_siblings import KARY4, uris_of, wait_moved

SIZE = 9
KARY4_FOUR = ("tbon.standbys=4", *KARY4[1:])


def wait_refilled(inst: Instance, uris: str, root: int) -> dict[str, Any]:
    """Wait until rank 0 is online again as a new incarnation under `root`, still the root,
    and the root reports it a voter."""

    def refilled(status: dict[str, Any]) -> bool:
        zero = status["ranks"][0]
        voters = {s["rank"]: s.get("voter") for s in status.get("group", {}).get("standbys", [])}
        return (
            status["root"] == root
            and zero["state"] == "online"
            and zero["incarnation"] > 1
            and 0 in status["standbys"]
            and voters.get(0) is True
        )

    return wait_through(inst, uris, refilled, f"rank 0 refilled under rank {root}, a voter")


def take_over_and_refill(
    inst: Instance, standbys: int
) -> tuple[str, dict[int, int], dict[str, Any]]:
    """Kill -9 rank 0, wait for any member to take over, refill rank 0 by `tbon expand` through
    the URI list; return the list, the pids before, and the status once rank 0 is a voter."""
    uris = uris_of(inst)
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    os.kill(before[0], signal.SIGKILL)
    root = wait_moved(inst, uris, before, range(1, standbys + 1))["root"]
    env = {**child_env(), "TBON_URI": uris}
    expanded = tbon("expand", "--ranks", "0", uris, env=env)
    assert expanded.returncode == 0, expanded.stderr + inst.stderr()[-4000:]
    seen = wait_refilled(inst, uris, root)
    zero = seen["ranks"][0]
    assert zero["pid"] not in before.values() and zero.get("attached_to") == root, zero
    for rank, pid in before.items():
        if rank:
            assert seen["ranks"][rank]["pid"] == pid, (rank, seen["ranks"][rank])
    return uris, before, seen


def wait_second_takeover(
    inst: Instance,
    uris: str,
    dead: set[int],
    alive: dict[int, int],
    members: set[int],
    adrift: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    """Wait until a member of `members` answers as the root, every rank of `dead` lost, every
    rank of `adrift` detached (lost, or reattaching until its grace ends) and every rank of
    `alive` online with its pid."""

    def taken_over_again(status: dict[str, Any]) -> bool:
        ranks = status["ranks"]
        return (
            status["root"] in members
            and all(ranks[r]["state"] == "lost" for r in dead)
            and all(ranks[r]["state"] == "lost" or ranks[r].get("reattaching") for r in adrift)
            and all(
                ranks[r]["state"] == "online" and ranks[r]["pid"] == p for r, p in alive.items()
            )
        )

    what = f"a second takeover by one of {sorted(members)}"
    return wait_through(inst, uris, taken_over_again, what, lines=80)


def exec_everywhere(uris: str, ranks: str = "all") -> None:
    """`tbon exec -r RANKS true` through the list exits 0 (`all` skips the lost ranks); with K=4
    a member hung under another member may be out of reach for a moment (protocol §13.4)."""
    env = {**child_env(), "TBON_URI": uris}
    ran = tbon("exec", "-r", ranks, "true", env=env)

    def reached() -> bool:
        nonlocal ran
        if ran.returncode == 0:
            return True
        ran = tbon("exec", "-r", ranks, "true", env=env)
        return ran.returncode == 0

    try:
        wait_for(reached, f"exec -r {ranks} to reach every live rank")
    except AssertionError as error:
        raise AssertionError(f"{error}: {ran.stderr}") from None


def test_rank_zero_refilled_after_a_takeover_then_the_root_killed_again(instance) -> None:
    inst = instance(SIZE, *KARY4)
    uris, before, seen = take_over_and_refill(inst, standbys=2)
    first = seen["root"]
    # the second takeover: the group {0,1,2} keeps rank 0 and the other standby, a majority
    os.kill(before[first], signal.SIGKILL)
    alive = {r: p for r, p in before.items() if r not in (0, first)} | {0: seen["ranks"][0]["pid"]}
    members = {0, 1, 2} - {first}
    after = wait_second_takeover(inst, uris, {first}, alive, members)
    assert "took over in term" in after["ranks"][first]["reason"], after["ranks"][first]
    exec_everywhere(uris)
    assert sorted([after["root"], *after["standbys"]]) == [0, 1, 2], after


def test_after_a_refill_a_member_other_than_rank_zero_wins_the_second_takeover(instance) -> None:
    """K=4: with the root that took over and the refilled rank 0 killed together, three of five
    members live, none of them rank 0: a standby that never led wins (rank 2 when rank 1 took
    over first, being first in the stagger among the living), and the instance still works.
    The refilled rank 0 hung under the killed root, the one broker that would have seen it go:
    the new root holds it adrift until its reattach grace ends (§12.1), as any such rank."""
    inst = instance(SIZE, *KARY4_FOUR)
    uris, before, seen = take_over_and_refill(inst, standbys=4)
    first = seen["root"]
    refilled = seen["ranks"][0]["pid"]
    os.kill(before[first], signal.SIGKILL)
    os.kill(refilled, signal.SIGKILL)
    alive = {r: p for r, p in before.items() if r not in (0, first)}
    members = {1, 2, 3, 4} - {first}
    after = wait_second_takeover(inst, uris, {first}, alive, members, frozenset({0}))
    root = after["root"]
    assert f"rank {root} took over in term" in after["ranks"][first]["reason"], after
    assert sorted([root, *after["standbys"]]) == [0, 1, 2, 3, 4], after
    exec_everywhere(uris, ",".join(str(r) for r in sorted(alive)))
    summary = tbon("status", "--summary", env={**child_env(), "TBON_URI": uris})
    assert summary.returncode == 0, summary.stderr
    assert f"root {root}" in summary.stdout and "(root)" in summary.stdout, summary.stdout
