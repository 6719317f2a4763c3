"""Orders and requests after a takeover (docs/protocol.md §13.3, §13.4), with real brokers in a
chain (kary:1: the standbys reach each other below the root): the new root's orders are obeyed
(a retirement, a FLUB join), exec fans out from it, and a job started before the kill ends
normally with its output, once."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

from conftest import DEADLINE, TBON, child_env, tbon, wait_for
from test_takeover import CHAIN, all_uris, status_through, wait_taken_over


def lines_until(process: subprocess.Popen[str], text: str, count: int) -> list[str]:
    """Read `process`'s stdout until `count` lines hold `text` (within DEADLINE)."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + DEADLINE
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while sum(text in line for line in seen) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise AssertionError(f"{count} lines of {text!r} never came: {seen}")
            line = process.stdout.readline()
            if not line:
                raise AssertionError(f"stdout ended before {count} lines of {text!r}: {seen}")
            seen.append(line)
    return seen


def test_the_new_roots_orders_are_obeyed_a_join_and_a_retirement(instance, tmp_path) -> None:
    inst = instance(5, "size=6", *CHAIN)
    uris = all_uris(inst)
    env = {**child_env(), "TBON_URI": uris}
    os.kill(inst.pid(0), signal.SIGKILL)
    wait_taken_over(inst, uris)
    # a FLUB join: the new root grants rank 5 and orders its parent (rank 4) to admit it (asked
    # by name: the lowest free rank is the dead root's now, refilled under the root, §13.6)
    joiner = inst.join("broker.rank=5", boot=uris.split(","), log=tmp_path / "joiner.log")

    def joined() -> bool:
        status = status_through(uris)
        return status is not None and status["ranks"][5]["state"] == "online"

    try:
        wait_for(joined, "the joiner to be granted rank 5 by the new root")
    except AssertionError as error:
        said = (tmp_path / "joiner.log").read_text()
        raise AssertionError(
            f"{error}: joiner {joiner.poll()} said {said}; {inst.stderr()}"
        ) from None
    retired = tbon("retire", "5", env=env)  # the new root orders rank 4 to retire its child
    assert retired.returncode == 0, retired.stderr
    assert retired.stdout.startswith("rank 5: retired in"), retired.stdout
    assert joiner.wait(timeout=DEADLINE) == 0  # a retired broker leaves with 0
    status = status_through(uris)
    assert status is not None and status["ranks"][5]["retired"], status["ranks"][5]
    assert "not from the root" not in inst.stderr(), inst.stderr()


def test_a_job_started_before_the_kill_ends_with_its_output_once(instance) -> None:
    inst = instance(5, *CHAIN)
    uris = all_uris(inst)
    standby = uris.split(",")[1]  # rank 1's URI: its client outlives rank 0
    job = subprocess.Popen(
        [TBON, "exec", "-r", "1-4", standby, "sh", "-c", "echo started; sleep 3; echo done"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        seen = lines_until(job, "started", 4)
        os.kill(inst.pid(0), signal.SIGKILL)
        out, err = job.communicate(timeout=DEADLINE)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, (out, err)
    said = sorted([*seen, *out.splitlines(keepends=True)])
    assert said == ["done\n"] * 4 + ["started\n"] * 4, (seen, out, err)  # each line once
    wait_taken_over(inst, uris)
    # exec from the new root: -r all skips the dead root's rank and says so (exit 0)
    env = {**child_env(), "TBON_URI": uris}
    ran = tbon("exec", "-r", "all", "echo", "hi", env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hi\n" * 4 and "skipping lost ranks 0" in ran.stderr, ran
    # the dead root's rank named: a rank that is lost is 68, named on its own line
    named = tbon("exec", "-r", "0-4", "echo", "hi", env=env)
    assert named.returncode == 68, (named.stdout, named.stderr)
    assert named.stdout == "hi\n" * 4, named
    assert "tbon exec: rank 0: rank 0 is lost" in named.stderr, named
