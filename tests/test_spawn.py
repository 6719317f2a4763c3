"""How a broker starts a job (overlay/broker/spawn.py): real processes, started from this one as a
broker would, each checked for what a job must see: its directory, its environment, no
descriptor of the broker's, signals at their default, and its exit told as Popen told it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tbon.overlay.broker.spawn import Spawned, seal, spawn

SH = "/bin/sh"
DEADLINE = 60.0


def finished(job: Spawned) -> tuple[int, str, str]:
    """The job's exit code and all it wrote, once it has ended."""
    out, err = job.stdout.read(), job.stderr.read()  # blocking: to the end of each
    job.stdout.close()
    job.stderr.close()
    return job.wait(timeout=DEADLINE), out.decode(), err.decode()


def test_a_job_runs_in_its_directory_with_its_environment(tmp_path: Path) -> None:
    where = os.path.realpath(tmp_path)
    before = os.getcwd()
    job = spawn(SH, [SH, "-c", 'pwd; echo "$ONLY"; echo err >&2'], where, {"ONLY": "x"}, True)
    assert os.getcwd() == before  # the broker is back where it was
    assert finished(job) == (0, f"{where}\nx\n", "err\n")


def test_a_job_inherits_no_descriptor_of_the_broker_and_no_ignored_sigpipe() -> None:
    """This process leaves a descriptor inheritable, as a broker's launcher might, and ignores
    SIGPIPE, as Python does: the job sees neither."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        seal()
        script = "ls /proc/$$/fd; grep SigIgn /proc/$$/status"
        code, out, _ = finished(spawn(SH, [SH, "-c", script], None, {}, True))
    finally:
        os.close(read_end)
        os.close(write_end)
    lines = out.split()
    assert code == 0
    assert str(write_end) not in lines[: lines.index("SigIgn:")]
    ignored = int(lines[lines.index("SigIgn:") + 1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_a_job_reads_its_stdin_pipe_or_dev_null() -> None:
    job = spawn(SH, [SH, "-c", "cat"], None, {}, False)
    assert job.stdin is not None
    job.stdin.write(b"hello\n")
    job.stdin.close()
    assert finished(job) == (0, "hello\n", "")
    job = spawn(SH, [SH, "-c", "cat"], None, {}, True)
    assert job.stdin is None
    assert finished(job) == (0, "", "")


def test_a_killed_job_returns_minus_the_signal_and_a_wait_may_time_out() -> None:
    job = spawn(SH, [SH, "-c", "exec sleep 60"], None, {}, True)
    with pytest.raises(TimeoutError):
        job.wait(timeout=0)
    os.kill(job.pid, signal.SIGKILL)
    assert finished(job)[0] == -signal.SIGKILL
    assert job.wait() == -signal.SIGKILL  # reaped once, told again


def test_what_cannot_start_raises_naming_the_file_or_the_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn(str(tmp_path / "nothing"), ["nothing"], None, {}, True)
    missing = str(tmp_path / "no-such-dir")
    with pytest.raises(FileNotFoundError) as raised:
        spawn(SH, [SH, "-c", "true"], missing, {}, True)
    assert raised.value.filename == missing
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        spawn(SH, [SH], missing, {}, False)
    assert set(os.listdir("/proc/self/fd")) == before  # no pipe left open by a failed start
