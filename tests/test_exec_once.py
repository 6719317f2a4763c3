"""`tbon exec` output exactly once, in order, through a heal (issue 21, docs/protocol.md §7.1):
an interior broker killed while every rank streams numbered lines."""

from __future__ import annotations

import os
import selectors
import signal
import time

from conftest import DEADLINE, start_exec

from tbon.overlay.connectors.client import Client

SIZE = 15  # kary:2: rank 1 has children 3, 4 and grandchildren 7-10
LINES = 150  # one every 20 ms: about 3 s
KILL_AFTER = 50  # lines every rank has printed before rank 1 is killed: about 1 s in
ROUNDS = 4  # the line in flight at the kill was lost in about 3 runs of 10 before numbering
LIVENESS = ("tbon.heartbeat=100ms", "tbon.torpid=0", "tbon.timeout=3s")
"""conftest.HEAL_QUICK's, but for a timeout that a loaded machine does not reach by accident (rank
1's death is seen by its connection's drop, at once), and a reattach timeout to match."""
LOOP = f"i=0; while [ $i -lt {LINES} ]; do echo $i; i=$((i+1)); sleep 0.02; done"


def _lines_killing(job, victim: int, watched: int) -> dict[int, list[int]]:
    """Each rank's numbers as `-l` prints them, to EOF; `victim` SIGKILLed once rank `watched`
    has printed KILL_AFTER lines."""
    seen: dict[int, list[int]] = {}
    buffer, killed = b"", False
    deadline = time.monotonic() + 3 * DEADLINE
    fd = job.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"the exec did not end; lines so far: {seen}"
            if not selector.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *whole, buffer = (buffer + chunk).split(b"\n")
            for line in whole:
                rank, _, number = line.decode().partition(": ")
                seen.setdefault(int(rank), []).append(int(number))
            if len(seen.get(watched, [])) >= KILL_AFTER and not killed:
                os.kill(victim, signal.SIGKILL)
                killed = True
    assert killed, "the exec ended before the kill"
    return seen


def _run_killing(job, victim: int, watched: int) -> tuple[dict[int, list[int]], str]:
    """_lines_killing, then the exec's end and its standard error; the exec is reaped, pass or
    fail."""
    try:
        seen = _lines_killing(job, victim, watched)
        job.wait(timeout=DEADLINE)
        assert job.stderr is not None
        err = job.stderr.read()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        job.stdout.close()
        job.stderr.close()
    return seen, err


def test_every_line_arrives_once_in_order_when_an_interior_broker_dies(instance) -> None:
    for round_ in range(ROUNDS):
        inst = instance(SIZE, "tbon.fanout=2", *LIVENESS)
        job = start_exec(inst.uri, "-l", "-r", "all", "sh", "-c", LOOP)
        seen, err = _run_killing(job, inst.pid(1), 1)
        assert job.returncode == 68, f"round {round_}: {err}"
        assert "rank 1: output may be incomplete: its broker was lost" in err, err
        wrong = {
            rank: numbers
            for rank, numbers in seen.items()
            if rank != 1 and numbers != list(range(LINES))
        }
        assert not wrong, f"round {round_}: lines lost, repeated or out of order: {wrong}"
        assert sorted(seen) == list(range(SIZE)), f"round {round_}: ranks heard: {sorted(seen)}"
        others = [line for line in err.splitlines() if "rank 1:" not in line]
        assert not others, f"round {round_}: {others}"
        inst.stop()  # one instance at a time: 15 brokers, not 60


def test_lines_going_down_to_a_client_of_another_rank_survive_a_heal_on_their_way(
    instance,
) -> None:
    """The client talks to rank 7, whose parent (rank 3) dies: what was on its way down from
    rank 1 to rank 3 is lost, and only the client can see it."""
    targets = [2, 5, 6]  # rank 2's subtree: their answers go up to rank 0, then down 1, 3, 7
    for round_ in range(2):
        inst = instance(SIZE, "tbon.fanout=2", *LIVENESS)
        with Client(inst.uri) as client:
            uri = client.rpc("broker.info", nodeid=7)["uri"]
        ranks = ",".join(map(str, targets))
        job = start_exec(uri, "-l", "-r", ranks, "sh", "-c", LOOP)
        seen, err = _run_killing(job, inst.pid(3), 5)
        assert job.returncode == 0, f"round {round_}: {err}"
        wrong = {rank: numbers for rank, numbers in seen.items() if numbers != list(range(LINES))}
        assert not wrong, f"round {round_}: lines lost, repeated or out of order: {wrong}"
        assert sorted(seen) == targets
        inst.stop()


def test_last_answers_lost_in_a_heal_the_client_never_saw_are_asked_for_again(
    instance, tmp_path
) -> None:
    """The client talks to rank 7; the jobs of rank 2's subtree end the moment rank 3 (7's
    parent) is killed, so their exits die on the way down, and the status tables that would
    show the heal to the client die on the same way. Nothing after an exit shows a hole: only
    the silence of the ranks still running does (exec.resend after resend.QUIET_S)."""
    targets = [2, 5, 6]
    for round_ in range(3):
        inst = instance(SIZE, "tbon.fanout=2", *LIVENESS)
        with Client(inst.uri) as client:
            uri = client.rpc("broker.info", nodeid=7)["uri"]
        victim = inst.pid(3)
        flag = tmp_path / f"end{round_}"
        wait = f"echo up; while [ ! -e {flag} ]; do sleep 0.01; done"
        job = start_exec(uri, "-l", "-r", ",".join(map(str, targets)), "sh", "-c", wait)
        try:
            assert job.stdout is not None and job.stderr is not None
            up = sorted(int(job.stdout.readline().partition(":")[0]) for _ in targets)
            assert up == targets
            flag.touch()
            os.kill(victim, signal.SIGKILL)
            out, err = job.communicate(timeout=DEADLINE)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        assert job.returncode == 0, f"round {round_}: {err}"
        assert out == "" and err == "", f"round {round_}: {out!r} {err!r}"
        inst.stop()
