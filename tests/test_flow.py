"""Flow control, end to end: a reader that stops stops the jobs, a job that does not read its
input stops the reading of it, and nothing in between buffers more than its window.

The jobs are dd, which moves data with read(2) and write(2), so that its /proc/PID/io counts
every byte it wrote, and whose blocked write shows in /proc/PID/wchan. Each wait is for a
positive condition with a deadline: "every job is blocked on its pipe", not "a while passed".
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from conftest import DEADLINE, TBON, child_env, wait_for

from tbon.overlay.services.flow import CHUNK, STDIN_WINDOW, output_window

MiB = 1024 * 1024


def processes_reading(path: Path) -> list[int]:
    """Pids of processes whose command line names `path` (ours: the jobs of this test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(path).encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def blocked_writing_a_pipe(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as wchan:
            return "pipe_write" in wchan.read()
    except OSError:
        return False


def bytes_written(pid: int) -> int:
    with open(f"/proc/{pid}/io") as io:
        return int(next(line for line in io if line.startswith("wchar:")).split()[1])


def file_offset(pid: int, fd: int) -> int:
    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
        return int(next(line for line in info if line.startswith("pos:")).split()[1])


def cksum(path: Path) -> bytes:
    with open(path, "rb") as stdin:
        return subprocess.run(["cksum"], stdin=stdin, capture_output=True, check=True).stdout


def test_a_reader_that_stops_blocks_the_jobs_then_gets_every_byte(instance, tmp_path) -> None:
    """Four ranks (three of them through the tree) each write 24 MiB into a `tbon exec` whose
    stdout nobody reads: each job blocks once its window is spent, instead of the brokers and
    the CLI taking it all in; then the reader reads, and every byte arrives."""
    inst = instance(4)
    zeros = tmp_path / "zeros"
    size = 24 * MiB
    with open(zeros, "wb") as f:
        f.truncate(size)
    cli = subprocess.Popen(
        [TBON, "exec", "-r", "all", "dd", f"if={zeros}", "bs=64k", "status=none"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(TBON_URI=inst.uri),
    )
    try:
        jobs: list[int] = []

        def every_job_blocked() -> bool:
            jobs[:] = [pid for pid in processes_reading(zeros) if pid != cli.pid]
            return len(jobs) == 4 and all(blocked_writing_a_pipe(pid) for pid in jobs)

        wait_for(every_job_blocked, "every job blocked on its output pipe", timeout=60)
        # What a job got out: its window, the pipe to its broker, and what the CLI holds or
        # has written to its own pipe; far from the 24 MiB it has to say.
        bound = output_window(4) + CHUNK + 2 * MiB
        assert all(bytes_written(pid) <= bound for pid in jobs), [
            bytes_written(pid) for pid in jobs
        ]
        assert cli.stdout is not None
        received = 0
        while chunk := cli.stdout.read1(MiB):
            received += len(chunk)
        assert cli.wait(timeout=DEADLINE) == 0
        assert received == 4 * size
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait(timeout=DEADLINE)
        for stream in (cli.stdout, cli.stderr):
            assert stream is not None
            stream.close()


def test_stdin_reaches_every_rank_whole(instance, tmp_path) -> None:
    inst = instance(4)
    data = tmp_path / "input"
    data.write_bytes(os.urandom(MiB) * 6)
    with open(data, "rb") as stdin:
        done = subprocess.run(
            [TBON, "exec", "-r", "all", "-l", "sh", "-c", "cksum"],
            stdin=stdin,
            capture_output=True,
            timeout=120,
            env=child_env(TBON_URI=inst.uri),
        )
    expected = cksum(data).decode()
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.decode().splitlines()) == [
        f"{r}: {expected.strip()}" for r in range(4)
    ]


def test_a_job_that_does_not_read_its_input_stops_the_reading_of_it(instance, tmp_path) -> None:
    """The CLI reads its stdin only as far as every rank has room: a job that never reads makes
    it stop after one window (plus the job's pipe), not swallow the file into the brokers."""
    inst = instance(2)
    data = tmp_path / "input"
    with open(data, "wb") as f:
        f.truncate(64 * MiB)
    ready = tmp_path / "ready"
    with open(data, "rb") as stdin:
        cli = subprocess.Popen(
            [TBON, "exec", "-r", "1", "sh", "-c", f"touch {ready}; exec sleep 600"],
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(TBON_URI=inst.uri),
        )
        try:
            wait_for(ready.exists, "the job started")
            wait_for(
                lambda: file_offset(cli.pid, 0) >= STDIN_WINDOW,
                "the CLI sent the job one window of input",
            )
            # A round trip through the same brokers, to give a CLI that did not stop time to
            # show it: reading on would take it past the bound within this.
            assert (
                subprocess.run(
                    [TBON, "exec", "-r", "1", "true"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=DEADLINE,
                    env=child_env(TBON_URI=inst.uri),
                ).returncode
                == 0
            )
            read = file_offset(cli.pid, 0)
            assert read <= STDIN_WINDOW + CHUNK + MiB, read
        finally:
            cli.terminate()  # passed on to the job as SIGTERM: it ends, and so does the CLI
            code = cli.wait(timeout=DEADLINE)
            assert cli.stderr is not None
            cli.stderr.close()
    assert code == 128 + 15


def test_stdin_is_credited_back_as_the_job_reads(instance, tmp_path) -> None:
    """A job that reads slowly, a megabyte at a time, still gets every byte: the window keeps
    moving as it reads."""
    inst = instance(2)
    data = tmp_path / "input"
    data.write_bytes(os.urandom(5 * MiB))
    started = time.monotonic()
    with open(data, "rb") as stdin:
        done = subprocess.run(
            [TBON, "exec", "-r", "1", "sh", "-c", "dd bs=1M iflag=fullblock status=none | cksum"],
            stdin=stdin,
            capture_output=True,
            timeout=120,
            env=child_env(TBON_URI=inst.uri),
        )
    assert done.returncode == 0, (done.stderr, time.monotonic() - started)
    assert done.stdout == cksum(data)
