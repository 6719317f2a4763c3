"""The orphan guard (overlay/broker/guard.py): the jobs it was told of die when the broker's end
of its pipe closes, however the broker ended; the jobs it was told to forget do not.

Each test starts real processes (`sleep` in a session of its own, as a job runs), waits for
conditions with deadlines, and reaps everything it started, by PID."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator

import pytest
from conftest import DEADLINE, wait_for

from tbon.overlay.broker.guard import OrphanGuard


@pytest.fixture
def jobs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started like exec jobs (a session each); killed and reaped, by PID, whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for job in started:
        if job.poll() is None:
            job.kill()
        job.wait(timeout=DEADLINE)


@pytest.fixture
def guard() -> Iterator[OrphanGuard]:
    made = OrphanGuard()
    yield made
    made.close()


def job(jobs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    started = subprocess.Popen(["sleep", "60"], start_new_session=True)
    jobs.append(started)
    return started


def killed(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() == -signal.SIGKILL


def test_when_the_pipe_ends_every_job_listed_is_killed(jobs, guard) -> None:
    first, second = job(jobs), job(jobs)
    guard.watch(first.pid)
    guard.watch(second.pid)
    guard.close()  # as the kernel closes it when the broker dies
    wait_for(lambda: killed(first) and killed(second), "the guard to kill both jobs")


def test_a_job_forgotten_before_its_reaping_is_left_alone(jobs, guard) -> None:
    kept, ended = job(jobs), job(jobs)
    guard.watch(kept.pid)
    guard.watch(ended.pid)
    guard.forget(kept.pid)
    guard.close()
    wait_for(lambda: killed(ended), "the guard to kill the job still listed")
    assert kept.poll() is None  # the guard exited (closed and reaped) without touching it


def test_a_guard_that_died_is_replaced_and_told_of_every_job(jobs, guard) -> None:
    before, after = job(jobs), job(jobs)
    guard.watch(before.pid)
    assert guard._process is not None
    first = guard._process
    first.kill()  # our own child, by PID
    first.wait(timeout=DEADLINE)
    guard.watch(after.pid)
    assert guard._process is not first
    guard.close()
    wait_for(lambda: killed(before) and killed(after), "the new guard to kill both jobs")


def ignored_signals(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return int(line.split()[1], 16)
    return 0


def test_only_the_end_of_its_pipe_ends_the_guard(jobs, guard) -> None:
    """Signals that a terminal or a launcher sends around are ignored: the guard outlives them
    to do its work."""
    guard.watch(job(jobs).pid)
    assert guard._process is not None
    pid = guard._process.pid
    wanted = [signal.SIGHUP, signal.SIGINT, signal.SIGTERM]
    mask = sum(1 << (s - 1) for s in wanted)
    wait_for(lambda: ignored_signals(pid) & mask == mask, "the guard to set its traps")
    for signum in wanted:
        with contextlib.suppress(ProcessLookupError):
            guard._process.send_signal(signum)
    listed = job(jobs)
    guard.watch(listed.pid)
    assert guard._process.pid == pid  # the same guard, told of the new job
    guard.close()
    wait_for(lambda: killed(listed), "the guard to kill the job")
