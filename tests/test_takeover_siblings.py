"""The takeover where the standbys are the root's children side by side (docs/protocol.md
§13.4, step 4): with rank 0 killed, the members find each other by the group's cards that came
with their lineage, elect, and the new root fosters every broker the dead root held; no broker
restarts."""

from __future__ import annotations

import os
import signal

from conftest import Instance, child_env, process_gone, tbon, wait_for
from test_takeover import FAILED, status_through, wait_through

KARY4 = ("tbon.standbys=2", "tbon.topo=kary:4", "tbon.timeout=30s")


def uris_of(inst: Instance) -> str:
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.strip()


def wait_moved(
    inst: Instance, uris: str, before: dict[int, int], members: range = range(1, 3)
) -> dict:
    """Wait until the URI list answers with a member of `members` as the root, rank 0 lost
    and every other rank online with the pid it had."""
    dead_roots_children = [r for r in before if 1 <= r <= 4]  # kary:4, or 5 ranks of kary:32

    def moved(status: dict) -> bool:
        ranks = {r["rank"]: r for r in status["ranks"]}
        return (
            status["root"] in members
            and ranks[0]["state"] == "lost"
            and all(
                ranks[r].get("attached_to") == status["root"]
                for r in dead_roots_children
                if r != status["root"]
            )
            and all(
                ranks[r]["state"] == "online" and ranks[r]["pid"] == pid
                for r, pid in before.items()
                if r != 0
            )
        )

    what = f"a member of {members} the root, every other rank online as before"
    return wait_through(inst, uris, moved, what)


def kill_root_and_check(inst: Instance, size: int, standbys: int = 2) -> str:
    """Kill -9 rank 0: a standby takes over (rank 1, whose canvass comes first, unless the
    machine's load delays it past the next one's: any member elected is right), every other
    rank online with its pid, exec on all of them, and the summary names the new root."""
    uris = uris_of(inst)
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    os.kill(before[0], signal.SIGKILL)
    seen = wait_moved(inst, uris, before, range(1, standbys + 1))
    root = seen["root"]
    assert f"the root died; rank {root} took over in term" in seen["ranks"][0]["reason"], seen
    # exec on every other rank: the new root's own subtree and the ranks it fosters across the
    # dead root, each reached through the broker attached to it on its way
    env = {**child_env(), "TBON_URI": uris}
    ran = tbon("exec", "-r", f"1-{size - 1}", "hostname", env=env)
    if standbys > 2 and ran.returncode != 0:
        # K=4, known gap (protocol §13.4): a member hung under another member is unreachable
        # until it has moved under the root, which it does once it hears of the root's term
        def reached() -> bool:
            nonlocal ran
            ran = tbon("exec", "-r", f"1-{size - 1}", "hostname", env=env)
            return ran.returncode == 0

        wait_for(reached, "exec to reach every member once each hangs under the root")
    assert ran.returncode == 0, ran.stderr
    assert len(ran.stdout.splitlines()) == size - 1, ran.stdout
    summary = tbon("status", "--summary", env={**child_env(), "TBON_URI": uris})
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.startswith(f"{root} ") and "(root)" in summary.stdout, summary.stdout
    assert f"1 lost, {size - 1} online; root {root}" in summary.stdout, summary.stdout
    return uris


def test_sibling_standbys_take_over_in_kary4(instance) -> None:
    inst = instance(13, *KARY4)
    kill_root_and_check(inst, 13)


def test_four_sibling_standbys_take_over(instance) -> None:
    """K=4: the members may hang one under another across the dead root (rank 4 under 3 under
    2 under 1): the new root reaches each by the way its messages came up."""
    inst = instance(9, "tbon.standbys=4", "tbon.topo=kary:4", "tbon.timeout=30s")
    kill_root_and_check(inst, 9, standbys=4)


def test_sibling_standbys_take_over_in_the_default_topology(instance) -> None:
    inst = instance(5, "tbon.standbys=2", "tbon.timeout=30s")
    kill_root_and_check(inst, 5)


def test_the_root_and_its_first_standby_killed_together_end_the_instance_in_time(
    instance,
) -> None:
    """K=2 and two of three members dead: no majority, no takeover; every broker seeks as in
    §12.1 (the last standby its lower member, the others every member) and exits 75 at the end
    of its reattach grace (§13.6)."""
    inst = instance(8, *KARY4[:2], "tbon.timeout=2s", "broker.reattach-timeout=2s")
    pids = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    os.kill(pids[0], signal.SIGKILL)
    os.kill(pids[1], signal.SIGKILL)
    # bounded: the grace (2 s + 2 s), well within the wait
    wait_for(lambda: all(process_gone(p) for p in pids.values()), "every broker to leave", 30)
    err = inst.stderr()
    assert "no live ancestor took this broker back in time" in err, err
    assert "status 75" in err, err
    assert "took over" not in err, err


def test_after_a_takeover_tbon_shutdown_ends_the_instance_through_the_new_root(instance) -> None:
    """`tbon shutdown` asks the root where its socket is: after a takeover, the member that
    leads, not the lost rank 0 (which it asked before, and failed)."""
    inst = instance(5, "tbon.standbys=2", "tbon.timeout=30s")
    uris = kill_root_and_check(inst, 5)
    status = status_through(uris)
    assert status is not None, FAILED
    pids = [r["pid"] for r in status["ranks"] if r["pid"] and r["state"] == "online"]
    done = tbon("shutdown", env={**child_env(), "TBON_URI": uris})
    assert done.returncode == 0, done.stderr
    wait_for(lambda: all(process_gone(p) for p in pids), "every broker to leave", 30)
