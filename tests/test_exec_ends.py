"""How `tbon exec` jobs end, through real instances: each is reaped whole (its process group),
however it ends and whatever its output window; every failed rank is named; Ctrl-C escalates.

Jobs print their own pids, so that what must not outlive them is found by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading

import pytest
from conftest import DEADLINE, TBON, child_env, process_gone, wait_for

SLOW = 120.0  # a bound for what waits on a drain or a retire on a loaded 2-core machine


def env(inst) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return child_env(TBON_URI=inst.uri)


def run(inst, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [TBON, "exec", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SLOW,
        env=env(inst),
    )


def retire(inst, rank: int, *options: str) -> dict:  # type: ignore[no-untyped-def]
    """`tbon retire RANK --json OPTIONS`: its one rank's report."""
    done = subprocess.run(
        [TBON, "retire", str(rank), "--json", *options],
        capture_output=True,
        text=True,
        timeout=SLOW,
        env=env(inst),
    )
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["ranks"]
    return report


def vacant(inst, rank: int) -> bool:  # type: ignore[no-untyped-def]
    return inst.status()["ranks"][rank]["state"] == "vacant"


def children_named(parent: int, name: str) -> list[int]:
    """The pids of `parent`'s children whose command is `name` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                comm, rest = stat.read().rsplit(")", 1)
        except OSError:
            continue
        if int(rest.split()[1]) == parent and comm.split("(", 1)[1] == name:
            found.append(int(entry))
    return found


def delivered(pid: int, signum: int) -> bool:
    """Whether no `signum` waits to be delivered to `pid`: a second one sent while the first
    is pending would merge with it, as a human's Ctrl-C never does."""
    try:
        with open(f"/proc/{pid}/status") as status:
            masks = [
                int(line.split()[1], 16)
                for line in status
                if line.startswith(("SigPnd:", "ShdPnd:"))
            ]
    except FileNotFoundError:
        return True
    return not any(mask & (1 << (signum - 1)) for mask in masks)


def ctrl_c(process: subprocess.Popen[bytes]) -> None:
    """One Ctrl-C to `process`, as a terminal sends it, taken before this returns."""
    process.send_signal(signal.SIGINT)
    wait_for(lambda: delivered(process.pid, signal.SIGINT), "the Ctrl-C to be taken")


def kill_leftovers(pids: list[int]) -> list[int]:
    """Kill, by pid, the processes of a job that are still there; the pids that were."""
    alive = [pid for pid in pids if not process_gone(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


class Exec:
    """`tbon exec` in the background: stdout and stderr read by threads into lists of lines
    (unless stdout is left unread, to stall it)."""

    def __init__(self, inst, *args: str, read_stdout: bool = True) -> None:  # type: ignore[no-untyped-def]
        self.process = subprocess.Popen(
            [TBON, "exec", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(inst),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(self.process.stderr, self.err))]
        self.stdout_read = False
        if read_stdout:
            self.read_stdout()
        self.readers[0].start()

    def read_stdout(self) -> None:
        self.stdout_read = True
        reader = threading.Thread(target=self._read, args=(self.process.stdout, self.out))
        self.readers.append(reader)
        reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            into.append(line.decode(errors="replace").rstrip("\n"))

    def pids(self, count: int) -> list[int]:
        """The first `count` numbers the job printed on stdout (its pids)."""
        wait_for(lambda: len(self.out) >= count, f"{count} pids from the job")
        return [int(line.split()[-1]) for line in self.out[:count]]

    def finish(self) -> int:
        code = self.process.wait(timeout=SLOW)
        for reader in self.readers:
            reader.join(timeout=DEADLINE)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=DEADLINE)
        for reader in self.readers:
            reader.join(timeout=DEADLINE)
        if not self.stdout_read and self.process.stdout is not None:
            self.process.stdout.close()


# --- reaped whole ------------------------------------------------------------------------------


def blocked_writing(pid: int) -> bool:
    """Whether `pid` waits to write to a full pipe: nobody reads its output."""
    try:
        with open(f"/proc/{pid}/wchan") as wchan:
            return "pipe_write" in wchan.read()
    except FileNotFoundError:
        return False


def test_jobs_stalled_for_a_reader_that_went_away_never_hold_up_retire(instance) -> None:
    """The issue's recipe, `exec -r all seq ... | head -1`, made certain: every rank's job has
    spent its window (its reader stopped) when the reader goes away, so its output can never be
    credited. Each job must still end once killed, so that no rank has a job left to kill when
    it is retired (before: it stayed, stalled, until retire's timeout killed it again)."""
    inst = instance(8, "tbon.fanout=2")
    brokers = {rank: inst.pid(rank) for rank in range(8)}
    for rank in (7, 6, 5, 4):  # leaves: a rank with children cannot be retired
        job = subprocess.Popen(
            [TBON, "exec", "-r", "all", "seq", "1", "1000000000"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env(inst),
        )
        try:
            assert job.stdout is not None
            assert job.stdout.readline() == b"1\n"

            def stalled() -> bool:
                jobs = [children_named(brokers[r], "seq") for r in range(8) if r in brokers]
                return all(len(pids) == 1 and blocked_writing(pids[0]) for pids in jobs)

            wait_for(stalled, "every rank's job to be stalled for credit")
            job.stdout.close()  # as head does: tbon exec dies of SIGPIPE at its next write
            assert job.wait(timeout=SLOW) == 128 + signal.SIGPIPE
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        # A timeout far longer than a killed job takes to end: one left stalled is `killed`.
        report = retire(inst, rank, "--timeout", "60s")
        assert report["result"] == "retired", report
        assert report["killed"] == 0, f"rank {rank} still had a job: {report}"
        assert vacant(inst, rank)
        del brokers[rank]
    assert "did not end" not in inst.stderr()


def test_retire_kills_a_job_stalled_by_its_reader_and_the_reader_hears_why(instance) -> None:
    """A reader that stops reading stalls its job (no credit); retire's timeout kills it, and it
    is done at once, its exit (with why) told to the reader once it reads again."""
    inst = instance(4, "tbon.fanout=2")
    job = Exec(inst, "-r", "3", "seq", "1", "100000000", read_stdout=False)
    try:
        broker = inst.pid(3)
        wait_for(lambda: children_named(broker, "seq"), "the job to run on rank 3")
        report = retire(inst, 3, "--timeout", "1s")
        assert report["result"] == "retired" and report["killed"] == 1, report
        assert vacant(inst, 3)
        job.read_stdout()
        assert job.finish() == 128 + signal.SIGKILL, job.err
        assert "tbon exec: rank 3: killed: rank 3 retired (the drain timeout passed)" in job.err
        assert job.out[:2] == ["1", "2"]
    finally:
        job.close()
    assert "did not end" not in inst.stderr()


def test_what_a_job_started_in_the_background_dies_with_it(instance) -> None:
    """A background child holding the job's stdout would keep the job (and tbon exec) waiting
    for as long as it runs: the group is killed when the main process ends."""
    inst = instance(2)
    result = run(inst, "-r", "1", "sh", "-c", "sleep 1000 & echo $!")
    assert result.returncode == 0, result.stderr
    (pid,) = map(int, result.stdout.split())
    wait_for(lambda: process_gone(pid), f"the background sleep (pid {pid}) to be gone")


# --- Ctrl-C --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ignored", ["INT", "INT TERM"])
def test_three_ctrl_c_leave_a_job_that_ignores_sigint_and_nothing_of_it_survives(
    instance, ignored: str
) -> None:
    """Each press sends a harder signal: a job that ignores SIGINT ends at the second (SIGTERM),
    one that ignores SIGTERM too at the third (SIGKILL), which ends tbon exec with 130. Its
    background child, which holds its output, dies with it either way."""
    inst = instance(2)
    script = f'trap "" {ignored}; echo $$; sleep 100 & echo $!; wait'
    job = Exec(inst, "-r", "0-1", "sh", "-c", script)
    pids: list[int] = []
    try:
        pids = job.pids(4)
        # Presses each within a second of the one before (on a machine so loaded that they
        # were not, the ladder starts again: press on, a few times at most).
        for _ in range(9):
            if job.process.poll() is not None or any("still running" in e for e in job.err):
                break
            ctrl_c(job.process)
        code = job.finish()
        for pid in pids:
            wait_for(lambda pid=pid: process_gone(pid), f"the job's process {pid} to be gone")
        if ignored == "INT":
            assert code in (128 + signal.SIGTERM, 128 + signal.SIGINT), job.err
        else:
            assert code == 128 + signal.SIGINT, job.err
            assert job.err[-1] == "tbon exec: ranks 0-1: still running, killed", job.err
    finally:
        job.close()
        assert not kill_leftovers(pids)


def test_one_ctrl_c_is_passed_on_and_tbon_exec_waits_for_the_jobs(instance) -> None:
    inst = instance(2)
    script = 'trap "echo got INT; exit 3" INT; echo ready $$; sleep 100 & wait'
    job = Exec(inst, "-r", "1", "sh", "-c", script)
    pids: list[int] = []
    try:
        pids = job.pids(1)
        ctrl_c(job.process)
        assert job.finish() == 3, job.err  # the job's own status: it ended as it chose
        assert job.out[-1] == "got INT"
        assert job.err == ["tbon exec: rank 1: exit 3"]
        wait_for(lambda: process_gone(pids[0]), "the job to be gone")
    finally:
        job.close()
        kill_leftovers(pids)


# --- every failure named -------------------------------------------------------------------------

MIXED = "case $TBON_RANK in 0) exit 0;; 3) kill -KILL $$;; 4) exit 2;; *) exit 1;; esac"


def test_each_failure_is_named_with_its_ranks_alike_on_one_line(instance) -> None:
    inst = instance(5)
    result = run(inst, "sh", "-c", MIXED)
    assert result.returncode == 128 + signal.SIGKILL
    assert result.stderr.splitlines() == [
        "tbon exec: ranks 1-2: exit 1",
        "tbon exec: rank 3: killed by SIGKILL",
        "tbon exec: rank 4: exit 2",
    ]
    quiet = run(inst, "-q", "sh", "-c", MIXED)
    assert (quiet.returncode, quiet.stderr) == (128 + signal.SIGKILL, "")
    report = json.loads(run(inst, "--json", "sh", "-c", MIXED).stdout)
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert [ranks[r]["failure"] for r in range(5)] == [
        None,
        "exit 1",
        "exit 1",
        "killed by SIGKILL",
        "exit 2",
    ]
    assert [ranks[r]["signal"] for r in range(5)] == [None, None, None, "SIGKILL", None]
    assert ranks[3]["status"] == 128 + signal.SIGKILL


def test_commands_that_cannot_start_are_named_once_for_all_their_ranks(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "1-3", "tbon-test-no-such-command")
    assert result.returncode == 127
    assert result.stderr.splitlines() == [
        "tbon exec: ranks 1-3: tbon-test-no-such-command: command not found"
    ]
    assert run(inst, "-q", "-r", "1-3", "tbon-test-no-such-command").stderr == ""
