"""The self-healing tree (docs/protocol.md §12), as a user sees it: real brokers killed, stopped
and replaced; ranks, pids, exit codes and job output asserted."""

from __future__ import annotations

import errno
import os
import re
import signal

from conftest import HEAL_QUICK as QUICK
from conftest import (
    attached,
    launcher_said,
    pids,
    process_gone,
    start_exec,
    tbon,
    wait_for,
)


def test_an_interior_broker_killed_costs_one_rank_not_its_subtree(instance) -> None:
    inst = instance(7, "tbon.fanout=2", "tbon.timeout=0")  # no timeout: only the drop tells
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    status = inst.wait_status(
        lambda s: s["ranks"][1]["state"] == "lost" and attached(s, 3, 4) == [0, 0],
        "ranks 3 and 4 fostered by rank 0",
    )
    assert [r["state"] for r in status["ranks"]] == ["online", "lost"] + ["online"] * 5
    assert status["ranks"][0]["subtree"] == "degraded"
    assert status["ranks"][3]["parent"] == 1  # the topology's parent never changes
    assert {rank: pid for rank, pid in pids(status).items()} == {
        rank: pid for rank, pid in before.items() if rank != 1
    }
    assert tbon("exec", inst.uri, "-r", "0,2-6", "true").returncode == 0
    ping = tbon("ping", inst.uri, "4")
    assert ping.returncode == 0 and "hops=1" in ping.stdout  # through its foster parent
    shown = tbon("status", inst.uri).stdout
    assert re.search(r"^[├└]─ 3 \S+: full \(fostered, home is rank 1\)$", shown, re.M), shown


def test_a_job_under_the_broker_that_died_ends_normally_and_its_output_arrives(instance) -> None:
    inst = instance(15, "tbon.fanout=2", "tbon.timeout=0")
    victim = inst.pid(1)
    job = start_exec(inst.uri, "-r", "7,8", "-l", "sh", "-c", "echo up; sleep 2; echo done")
    try:
        assert job.stdout is not None
        assert sorted(job.stdout.readline().strip() for _ in range(2)) == ["7: up", "8: up"]
        os.kill(victim, signal.SIGKILL)
        out, err = job.communicate(timeout=30)
        assert job.returncode == 0, err
        assert sorted(out.split("\n")[:2]) == ["7: done", "8: done"], out
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_two_levels_dying_at_once_leave_the_levels_below_fostered(instance) -> None:
    inst = instance(15, "tbon.fanout=2", *QUICK, "broker.reattach-timeout=1s")
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    os.kill(before[3], signal.SIGKILL)
    status = inst.wait_status(
        lambda s: attached(s, 4, 7, 8) == [0, 0, 0] and s["ranks"][3]["state"] == "lost",
        "ranks 4, 7 and 8 fostered by rank 0, rank 3 lost",
    )
    assert status["ranks"][1]["state"] == "lost"
    # rank 3's children saw its connection drop (its grace, 2.5 s, would say "did not reattach")
    assert status["ranks"][3]["reason"] in (
        f"connection dropped, seen by rank {child} below it" for child in (7, 8)
    ), status["ranks"][3]
    survivors = [rank for rank in range(15) if rank not in (1, 3)]
    assert all(pids(status)[rank] == before[rank] for rank in survivors)
    targets = "0,2,4-14"
    assert tbon("exec", inst.uri, "-r", targets, "true").returncode == 0


def test_a_replacement_takes_the_rank_back_and_the_children_go_home(instance) -> None:
    inst = instance(7, "tbon.fanout=2", "tbon.timeout=0")
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "ranks 3 and 4 fostered")
    joiner = inst.join()
    status = inst.wait_status(
        lambda s: s["ranks"][0]["subtree"] == "full" and attached(s, 3, 4) == [1, 1],
        "rank 1 replaced and ranks 3 and 4 home",
    )
    assert status["ranks"][1]["pid"] == joiner.pid and status["ranks"][1]["incarnation"] == 2
    assert all(pids(status)[rank] == before[rank] for rank in (0, 2, 3, 4, 5, 6))
    shown = tbon("status", inst.uri).stdout
    assert "fostered" not in shown
    ping = tbon("ping", inst.uri, "3")
    assert ping.returncode == 0 and "hops=2" in ping.stdout


def test_a_stopped_parent_woken_after_it_was_declared_lost_rejoins_as_itself(instance) -> None:
    """A partition (flux-core #4124): the parent is judged lost while stopped; its children go
    to rank 0. Woken, nothing replaced it, so it comes back as the same incarnation and its
    children go home to it."""
    inst = instance(7, "tbon.fanout=2", *QUICK)
    before = pids(inst.status())
    os.kill(before[1], signal.SIGSTOP)
    try:
        inst.wait_status(
            lambda s: s["ranks"][1]["state"] == "lost" and attached(s, 3, 4) == [0, 0],
            "rank 1 lost and its children fostered",
        )
    finally:
        os.kill(before[1], signal.SIGCONT)
    status = inst.wait_status(
        lambda s: s["ranks"][1]["state"] == "online" and attached(s, 3, 4) == [1, 1],
        "rank 1 back and its children home",
    )
    assert pids(status) == before
    assert status["ranks"][1]["incarnation"] == 1
    assert tbon("exec", inst.uri, "-r", "all", "true").returncode == 0


def test_a_stopped_parent_replaced_meanwhile_is_refused_when_woken(instance) -> None:
    inst = instance(7, "tbon.fanout=2", *QUICK)
    before = pids(inst.status())
    os.kill(before[1], signal.SIGSTOP)
    try:
        inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "rank 1's children fostered")
        joiner = inst.join()
        inst.wait_status(
            lambda s: s["ranks"][1]["pid"] == joiner.pid and attached(s, 3, 4) == [1, 1],
            "rank 1 replaced and its children home",
        )
    finally:
        os.kill(before[1], signal.SIGCONT)
    wait_for(lambda: process_gone(before[1]), "the superseded broker to exit")
    inst.stop()
    assert launcher_said(inst.stderr(), 1, before[1], "exited with status 77")


def test_when_rank0_dies_the_rest_exit_75_after_the_reattach_timeout(instance) -> None:
    inst = instance(7, "tbon.fanout=2", *QUICK, "broker.reattach-timeout=1s")
    before = pids(inst.status())
    os.kill(before[0], signal.SIGKILL)
    wait_for(lambda: all(process_gone(pid) for pid in before.values()), "every broker to exit")
    inst.stop()
    log = inst.stderr()
    for rank in range(1, 7):
        assert launcher_said(log, rank, before[rank], "exited with status 75"), log


def test_a_fostered_broker_can_be_retired_where_it_is(instance) -> None:
    inst = instance(7, "tbon.fanout=2", "tbon.timeout=0")
    os.kill(inst.pid(1), signal.SIGKILL)
    inst.wait_status(lambda s: attached(s, 3, 4) == [0, 0], "ranks 3 and 4 fostered")
    pid = inst.pid(3)
    assert tbon("retire", inst.uri, "3").returncode == 0
    wait_for(lambda: process_gone(pid), "the retired broker to exit")
    status = inst.wait_status(lambda s: s["ranks"][3]["state"] == "vacant", "rank 3 vacant")
    assert status["ranks"][3].get("retired") is True


NOT_AUTHORIZED = re.compile(r"warning: refused a child from \S+: CURVE key \S+ is not authorized")


def test_a_normal_heal_warns_of_no_refused_key(instance) -> None:
    """An orphan knocks at its grandparent before rank 0's order to admit it arrives: those
    first refusals are expected, and said at debug level only (issue 22, item 3)."""
    inst = instance(15, "tbon.fanout=2", *QUICK)
    before = pids(inst.status())
    os.kill(before[1], signal.SIGKILL)
    inst.wait_status(
        lambda s: s["ranks"][1]["state"] == "lost" and attached(s, 3, 4) == [0, 0],
        "ranks 3 and 4 fostered by rank 0",
    )
    assert tbon("exec", inst.uri, "-r", "0,2-14", "true").returncode == 0
    inst.stop()
    assert launcher_said(inst.stderr(), 1, before[1], "killed by signal SIGKILL")
    assert not NOT_AUTHORIZED.search(inst.stderr()), inst.stderr()


def test_heal_wait_times_out_on_time_at_an_idle_rank0(instance) -> None:
    """heal.wait's own deadline wakes the broker: rank 0, holding a rank adrift (stopped, so
    that it cannot reattach) and with nothing else due for an hour, answers ETIMEDOUT when the
    wait is over, not at its next heartbeat or the end of the reattach grace."""
    from tbon.overlay.connectors.client import NoAnswer, RequestError

    inst = instance(
        3,
        "tbon.fanout=1",  # a chain: 0 - 1 - 2
        "tbon.timeout=0",  # only the dropped connection tells
        "tbon.heartbeat=1h",
        "broker.reattach-timeout=1h",
    )
    before = pids(inst.status())
    os.kill(before[2], signal.SIGSTOP)
    try:
        os.kill(before[1], signal.SIGKILL)
        inst.wait_status(
            lambda s: s["ranks"][1]["state"] == "lost" and attached(s, 2) == [None],
            "rank 1 lost and rank 2 adrift",
        )
        with inst.client() as client:
            try:
                client.rpc("heal.wait", {"timeout": 0.5}, nodeid=0, timeout=30.0, quiet=True)
            except NoAnswer:
                raise AssertionError("heal.wait was not answered within 30 s") from None
            except RequestError as error:
                assert error.errnum == errno.ETIMEDOUT, error
            else:
                raise AssertionError("heal.wait said the tree is whole with rank 2 adrift")
    finally:
        os.kill(before[2], signal.SIGCONT)
    inst.wait_status(lambda s: attached(s, 2) == [0], "rank 2 fostered by rank 0")
