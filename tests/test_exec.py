"""`tbon exec` through real instances: what a user sees on stdout, stderr and in the exit status.

Every command is the real console script. Commands that must be caught while running are
started with Popen and watched through their output (with deadlines); each is waited for, and
any remote process a test made is killed by PID if it outlived the test.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import DEADLINE, TBON, child_env, process_gone, start_exec, wait_for

SLOW = 180.0  # a bound for commands that move many megabytes on a loaded 2-core machine
READY = "echo ready $$; exec sleep 60"  # `exec` keeps the pid the shell printed


def env(inst) -> dict[str, str]:
    """A user's environment inside the instance: tbon exec finds it through $TBON_URI."""
    return child_env(TBON_URI=inst.uri)


def run(
    inst, *args: str, input: bytes | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """`tbon exec ARGS...` to completion; stdin is /dev/null unless `input` is given."""
    return subprocess.run(
        [TBON, "exec", *args],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        timeout=timeout,
        env=env(inst),
    )


def text(data: bytes) -> list[str]:
    return data.decode().splitlines()


def by_rank(lines: list[str]) -> dict[int, list[str]]:
    """Labelled lines grouped by rank, in the order they came; every line must be labelled."""
    ranks: dict[int, list[str]] = {}
    for line in lines:
        match = re.fullmatch(r"(\d+): (.*)", line)
        assert match, f"an unlabelled or broken line: {line[:200]!r}"
        ranks.setdefault(int(match[1]), []).append(match[2])
    return ranks


class Pipe:
    """The lines a running process writes to one pipe, read as they come."""

    def __init__(self, stream) -> None:
        self.fd = stream.fileno()
        os.set_blocking(self.fd, False)
        self.partial = b""
        self.lines: list[str] = []
        self.eof = False

    def _read(self, timeout: float) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            if not selector.select(timeout):
                return
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
            return
        *whole, self.partial = (self.partial + data).split(b"\n")
        self.lines += [line.decode() for line in whole]

    def wait(
        self, predicate: Callable[[list[str]], bool], what: str, timeout: float = DEADLINE
    ) -> list[str]:
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                why = "end of output" if self.eof else f"{timeout}s"
                raise AssertionError(f"{why} before {what}; lines so far: {self.lines}")
            self._read(left)
        return self.lines

    def rest(self, timeout: float = DEADLINE) -> list[str]:
        """Everything up to the end of the output."""
        self.wait(lambda _lines: self.eof, "the end of output", timeout)
        return self.lines


class Running:
    """A `tbon exec` started with Popen, and the remote pids it reported."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.stdout = Pipe(process.stdout)
        self.stderr = Pipe(process.stderr)
        self.remote: dict[int, int] = {}  # rank -> pid of its remote process

    def wait_ready(self, ranks: list[int]) -> dict[int, int]:
        """Wait for `RANK: ready PID` from every rank in `ranks`; their pids by rank."""

        def seen(lines: list[str]) -> bool:
            for line in lines:
                if match := re.fullmatch(r"(\d+): ready (\d+)", line):
                    self.remote[int(match[1])] = int(match[2])
            return set(self.remote) >= set(ranks)

        self.stdout.wait(seen, f"ranks {ranks} to be ready")
        return dict(self.remote)

    def finish(self, timeout: float = DEADLINE) -> int:
        """Read both pipes to their end and wait for the exit status, with a deadline."""
        self.stdout.rest(timeout)
        self.stderr.rest(timeout)
        return self.process.wait(timeout=timeout)


@contextlib.contextmanager
def running(inst, *args: str, stdin: int = subprocess.DEVNULL) -> Iterator[Running]:
    """`tbon exec ARGS...` in the background; always waited for, remote processes cleaned up."""
    process = subprocess.Popen(
        [TBON, "exec", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(inst),
    )
    job = Running(process)
    try:
        yield job
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=DEADLINE)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        for pid in job.remote.values():
            kill_leftover(pid)


def kill_leftover(pid: int) -> None:
    """Kill a remote `sleep` a test started if it is still there (e.g. its broker was killed)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            mine = cmdline.read().startswith(b"sleep\0")
    except (FileNotFoundError, ProcessLookupError):
        return
    if mine and not process_gone(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- output ----------------------------------------------------------------------------------


def test_lines_of_each_rank_come_whole_complete_and_in_order(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "0-3", "--label", "seq", "1", "2000")
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    lines = text(result.stdout)
    assert all(re.fullmatch(r"[0-3]: \d+", line) for line in lines), lines
    numbers = {rank: [int(n) for n in got] for rank, got in by_rank(lines).items()}
    assert numbers == {rank: list(range(1, 2001)) for rank in range(4)}


@pytest.mark.parametrize("flag", ["-l", "--label", "--label-io"])
def test_labels_on_stdout_and_stderr(instance, flag: str) -> None:
    inst = instance(4)
    result = run(inst, flag, "sh", "-c", "echo out $TBON_RANK; echo err $TBON_RANK >&2")
    assert result.returncode == 0
    assert sorted(text(result.stdout)) == [f"{r}: out {r}" for r in range(4)]
    assert sorted(text(result.stderr)) == [f"{r}: err {r}" for r in range(4)]


def test_without_label_output_is_as_written(instance) -> None:
    inst = instance(2)
    result = run(inst, "-r", "1", "sh", "-c", "printf 'no newline'; echo oops >&2")
    assert result.returncode == 0
    assert result.stdout == b"no newline"
    assert result.stderr == b"oops\n"


def test_a_label_goes_only_at_the_start_of_a_line(instance) -> None:
    inst = instance(2)
    result = run(inst, "-r", "1", "-l", "printf", "50%%\\r100%%\\n\\f\\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"1: 50%\r100%\n1: \f\n"


def test_binary_output_and_input_pass_unchanged(instance, tmp_path: Path) -> None:
    inst = instance(2)
    data = bytes(range(256)) * 1000 + "é€\n".encode() * 1000 + b"\xff\xfe\x00\r\n" * 1000
    blob = tmp_path / "blob"
    blob.write_bytes(data)
    out = run(inst, "-r", "1", "cat", str(blob))
    assert out.returncode == 0, out.stderr
    assert out.stdout == data
    back = run(inst, "-r", "1", "sh", "-c", "cat >&2", input=data)
    assert back.returncode == 0
    assert back.stderr == data


def test_several_megabytes_per_rank_arrive_exactly(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    size = 3_000_000
    command = f"head -c {size} /dev/zero | tr '\\0' x; echo"
    result = run(inst, "-r", "0-3", "sh", "-c", command, timeout=SLOW)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == b""
    # One 3 MB line per rank, sent in pieces: unlabelled pieces of ranks may interleave.
    assert len(result.stdout) == 4 * (size + 1)
    assert result.stdout.count(b"x") == 4 * size
    assert result.stdout.count(b"\n") == 4


def test_megabytes_of_labelled_lines_keep_every_line_whole_and_in_order(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    count = 65536  # 65 bytes a line: over 4 MB per rank
    program = (
        f"import sys; sys.stdout.writelines(f'{{i:07d}} {{\"y\" * 56}}\\n' for i in range({count}))"
    )
    result = run(inst, "-r", "0-3", "-l", sys.executable, "-c", program, timeout=SLOW)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == b""
    assert len(result.stdout) == 4 * count * len(b"R: 0000000 " + b"y" * 56 + b"\n")
    expected = [f"{i:07d} {'y' * 56}" for i in range(count)]
    got = by_rank(text(result.stdout))
    assert sorted(got) == [0, 1, 2, 3]
    for rank in range(4):
        assert got[rank] == expected, f"rank {rank}'s lines are out of order or incomplete"


def test_floods_on_stdout_and_stderr_together_neither_lose_nor_deadlock(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    count = 20000  # about 1.8 MB on each stream of each rank, written alternately
    program = (
        "import sys\n"
        f"for i in range({count}):\n"
        f"    sys.stdout.write(f'out {{i:06d}} {{\"o\" * 80}}\\n')\n"
        f"    sys.stderr.write(f'err {{i:06d}} {{\"e\" * 80}}\\n')\n"
    )
    result = run(inst, "-l", sys.executable, "-c", program, timeout=SLOW)
    assert result.returncode == 0, result.stderr[-2000:]
    out, err = by_rank(text(result.stdout)), by_rank(text(result.stderr))
    for rank in range(4):
        assert out[rank] == [f"out {i:06d} {'o' * 80}" for i in range(count)], rank
        assert err[rank] == [f"err {i:06d} {'e' * 80}" for i in range(count)], rank


# --- stdin -----------------------------------------------------------------------------------


def test_stdin_goes_to_every_rank(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "0-3", "-l", "cat", input=b"a\nb\n")
    assert result.returncode == 0, result.stderr
    assert by_rank(text(result.stdout)) == {rank: ["a", "b"] for rank in range(4)}


def test_empty_stdin_ends_every_rank_s_input(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "0-3", "cat", input=b"")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    devnull = run(inst, "-r", "0-3", "-l", "wc", "-c")
    assert by_rank(text(devnull.stdout)) == {rank: ["0"] for rank in range(4)}


def test_an_open_but_silent_stdin_does_not_hold_tbon_exec(instance) -> None:
    """A batch script's pipe that nobody writes to: the commands end, so tbon exec does."""
    inst = instance(2)
    with running(inst, "-l", "echo", "hi", stdin=subprocess.PIPE) as job:
        assert job.finish() == 0
        assert sorted(job.stdout.lines) == ["0: hi", "1: hi"]


def test_a_megabyte_of_stdin_reaches_each_rank_exactly(instance) -> None:
    inst = instance(2)
    data = b"".join(b"%07d\n" % i for i in range(131072))  # 1 MiB of known lines
    assert len(data) == 1 << 20
    result = run(inst, "-r", "0-1", "-l", "wc", "-c", input=data, timeout=SLOW)
    assert result.returncode == 0, result.stderr
    assert by_rank(text(result.stdout)) == {0: ["1048576"], 1: ["1048576"]}
    checked = run(inst, "-r", "1", "md5sum", input=data, timeout=SLOW)
    assert checked.stdout.split()[0].decode() == hashlib.md5(data).hexdigest()


def test_a_command_that_never_reads_stdin_does_not_hang(instance) -> None:
    inst = instance(2)
    result = run(inst, "-r", "0-1", "true", input=b"z" * (2 << 20))
    assert result.returncode == 0, result.stderr
    assert result.stdout == b""
    assert result.stderr == b""


# --- exit status -----------------------------------------------------------------------------


def test_exit_status_is_the_largest(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "0-3", "sh", "-c", "exit $TBON_RANK")
    assert result.returncode == 3
    assert text(result.stderr) == [f"tbon exec: rank {r}: exit {r}" for r in (1, 2, 3)]
    assert run(inst, "-r", "0,2", "sh", "-c", "exit $TBON_RANK").returncode == 2
    assert run(inst, "true").returncode == 0


def test_a_command_killed_by_a_signal_counts_as_128_plus_the_signal(instance) -> None:
    inst = instance(2)
    assert run(inst, "sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM
    result = run(inst, "sh", "-c", 'if [ "$TBON_RANK" = 1 ]; then kill -KILL $$; fi; exit 3')
    assert result.returncode == 128 + signal.SIGKILL


def test_a_command_not_found_is_127_and_named_by_rank_as_a_shell_would(instance) -> None:
    inst = instance(2)
    result = run(inst, "-r", "0-1", "-l", "tbon-test-no-such-command", "arg")
    assert result.returncode == 127
    assert text(result.stderr) == [
        "tbon exec: ranks 0-1: tbon-test-no-such-command: command not found"
    ]
    assert result.stdout == b""


# --- signals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_reach_every_remote_process(instance, signum: int) -> None:
    inst = instance(4, "tbon.fanout=2")
    with running(inst, "-l", "sh", "-c", READY) as job:
        pids = job.wait_ready([0, 1, 2, 3])
        assert all(not process_gone(pid) for pid in pids.values())
        job.process.send_signal(signum)
        assert job.finish() == 128 + signum
        for rank, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), f"rank {rank}'s sleep (pid {pid}) to end")
        assert job.stderr.lines == []


# --- which ranks -----------------------------------------------------------------------------


def test_a_rank_that_does_not_exist_is_named_and_the_others_still_run(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "0,99", "-l", "sh", "-c", "echo hi $TBON_RANK")
    assert result.returncode == 68
    assert text(result.stdout) == ["0: hi 0"]
    message = result.stderr.decode()
    assert "99" in message and "no such rank" in message, message
    assert len(text(result.stderr)) == 1


def test_only_ranks_that_do_not_exist(instance) -> None:
    inst = instance(2)
    result = run(inst, "-r", "5,9", "true")
    assert result.returncode == 68
    lines = text(result.stderr)
    assert len(lines) == 2 and "5" in lines[0] and "9" in lines[1], lines


def test_flux_bracketed_rank_sets_name_the_same_ranks(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "[0,2-3]", "-x", "[3]", "-l", "sh", "-c", "echo $TBON_RANK")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == ["0: 0", "2: 2"]


def test_bad_rank_sets_and_a_missing_command_are_usage_errors(instance) -> None:
    inst = instance(1)
    bad = (["-r", "foo", "true"], ["-x", "1-", "true"], ["-r", "0"], ["-r", "[0-1", "true"])
    for args in bad:
        result = run(inst, *args)
        assert result.returncode == 2, (args, result.stderr)
        lines = text(result.stderr)
        assert len(lines) == 1 and lines[0].startswith("tbon exec: "), (args, lines)


def test_a_rank_lost_before_the_command_is_named_and_skipped_by_all(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    os.kill(inst.pid(3), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")
    named = run(inst, "-r", "2-3", "-l", "sh", "-c", "echo $TBON_RANK")
    assert named.returncode == 68
    assert text(named.stdout) == ["2: 2"]
    assert "rank 3 is lost" in named.stderr.decode()
    every = run(inst, "-l", "sh", "-c", "echo $TBON_RANK")
    assert every.returncode == 0, every.stderr  # rank 3 was not asked for by name
    assert sorted(text(every.stdout)) == ["0: 0", "1: 1", "2: 2"]
    assert text(every.stderr) == ["tbon exec: skipping lost ranks 3"]
    quiet = run(inst, "-x", "3", "true")  # left out on purpose: nothing to say
    assert (quiet.returncode, quiet.stderr) == (0, b"")


def test_a_rank_that_is_not_online_is_named_and_the_others_still_run(instance) -> None:
    inst = instance(2, "size=4")
    result = run(inst, "-r", "3", "true")
    assert result.returncode == 68
    assert "rank 3 is vacant" in result.stderr.decode()
    both = run(inst, "-r", "1,3", "-l", "sh", "-c", "echo hi $TBON_RANK")
    assert both.returncode == 68
    assert text(both.stdout) == ["1: hi 1"]
    assert "rank 3 is vacant" in both.stderr.decode()


def test_all_is_every_online_rank_and_skips_vacant_ones_silently(instance) -> None:
    inst = instance(2, "size=4")
    result = run(inst, "-l", "sh", "-c", "echo $TBON_RANK")
    assert result.returncode == 0
    assert sorted(text(result.stdout)) == ["0: 0", "1: 1"]
    assert result.stderr == b""


def test_all_on_a_healthy_instance_skips_nothing(instance) -> None:
    inst = instance(4)
    result = run(inst, "-r", "all", "-l", "sh", "-c", "echo $TBON_RANK")
    assert result.returncode == 0
    assert sorted(text(result.stdout)) == [f"{r}: {r}" for r in range(4)]
    assert result.stderr == b""


def test_exclude_leaves_ranks_out(instance) -> None:
    inst = instance(4)
    result = run(inst, "-x", "1,2", "-l", "sh", "-c", "echo $TBON_RANK")
    assert result.returncode == 0
    assert sorted(text(result.stdout)) == ["0: 0", "3: 3"]
    some = run(inst, "-r", "0-2", "-x", "0", "-l", "sh", "-c", "echo $TBON_RANK")
    assert sorted(text(some.stdout)) == ["1: 1", "2: 2"]


@pytest.mark.parametrize("where", ["after options", "before options"])
def test_the_uri_may_be_given_on_the_command_line(instance, where: str) -> None:
    inst = instance(2)
    options = ["-r", "1", "-l"]
    words = [*options, inst.uri] if where == "after options" else [inst.uri, *options]
    result = subprocess.run(
        [TBON, "exec", *words, "sh", "-c", "echo $TBON_RANK -r 0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        env=child_env(),  # no TBON_URI
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"1: 1 -r 0\n"


def test_without_a_uri_outside_an_instance_is_a_clear_error() -> None:
    result = subprocess.run(
        [TBON, "exec", "true"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        env=child_env(),
    )
    assert result.returncode == 2
    assert b"TBON_URI" in result.stderr
    assert len(text(result.stderr)) == 1


def test_json_reports_each_rank(instance) -> None:
    inst = instance(4)
    result = run(
        inst,
        "--json",
        "-r",
        "0-2,7",
        "sh",
        "-c",
        "echo out $TBON_RANK; echo err $TBON_RANK >&2; exit $TBON_RANK",
    )
    assert result.returncode == 68
    report = json.loads(result.stdout)
    assert report["status"] == 68
    ranks = {entry["rank"]: entry for entry in report["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 7]
    for rank in range(3):
        assert ranks[rank]["status"] == rank
        assert ranks[rank]["error"] is None
        assert ranks[rank]["stdout"] == f"out {rank}\n"
        assert ranks[rank]["stderr"] == f"err {rank}\n"
    assert ranks[7]["status"] is None
    assert "no such rank" in ranks[7]["error"]
    fine = json.loads(run(inst, "--json", "-r", "1", "true").stdout)
    assert fine == {
        "status": 0,
        "ranks": [
            {
                "rank": 1,
                "status": 0,
                "signal": None,
                "failure": None,
                "error": None,
                "stdout": "",
                "stderr": "",
            }
        ],
    }


# --- failures --------------------------------------------------------------------------------


def test_a_broker_killed_mid_command_is_reported_and_nothing_hangs(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    victim = inst.pid(3)
    with running(inst, "-l", "sh", "-c", READY) as job:
        pids = job.wait_ready([0, 1, 2, 3])
        os.kill(victim, signal.SIGKILL)
        errors = job.stderr.wait(
            lambda lines: any(line.startswith("tbon exec: rank 3:") for line in lines),
            "tbon exec to report rank 3",
        )
        assert any(re.fullmatch(r"tbon exec: rank 3: .*\blost\b.*", line) for line in errors)
        # Ranks 0-2 are still running: tbon exec rightly waits for them. End them.
        assert job.process.poll() is None
        job.process.send_signal(signal.SIGTERM)
        assert job.finish() == 128 + signal.SIGTERM  # the largest of 143 and 68
        for rank in (0, 1, 2):
            wait_for(lambda r=rank: process_gone(pids[r]), f"rank {rank}'s sleep to end")
    assert inst.status()["ranks"][3]["state"] == "lost"


def test_a_broker_killed_mid_command_alone_gives_68(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    victim = inst.pid(3)
    with running(inst, "-r", "3", "-l", "sh", "-c", READY) as job:
        job.wait_ready([3])
        os.kill(victim, signal.SIGKILL)
        assert job.finish() == 68
        assert any(line.startswith("tbon exec: rank 3:") for line in job.stderr.lines)


def test_the_instance_shutting_down_mid_command_ends_tbon_exec(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    with running(inst, "-l", "sh", "-c", READY) as job:
        pids = job.wait_ready([0, 1, 2, 3])
        down = subprocess.run(
            [TBON, "shutdown"], capture_output=True, timeout=60, env=env(inst), text=True
        )
        assert down.returncode == 0, down.stderr
        assert job.finish() != 0  # by itself: nobody signals it
        assert "Traceback" not in "\n".join(job.stderr.lines)
        for rank, pid in pids.items():
            wait_for(lambda pid=pid: process_gone(pid), f"rank {rank}'s sleep to end")


# --- a deeper tree ---------------------------------------------------------------------------


def test_sixteen_ranks_in_a_binary_tree_each_answer_once(instance) -> None:
    inst = instance(16, "tbon.topo=kary:2")  # ranks 7-14 are two levels below 1 and 2; 15 three
    assert inst.status()["ranks"][15]["parent"] == 7
    result = run(inst, "-l", "sh", "-c", "echo $TBON_RANK")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout), key=lambda s: int(s.split(":")[0])) == [
        f"{r}: {r}" for r in range(16)
    ]
    uris = run(inst, "-l", "sh", "-c", "echo $TBON_URI")
    assert uris.returncode == 0, uris.stderr
    got = {rank: lines for rank, lines in by_rank(text(uris.stdout)).items()}
    assert sorted(got) == list(range(16))
    assert all(len(lines) == 1 for lines in got.values())
    assert len({lines[0] for lines in got.values()}) == 16
    for rank, (uri,) in got.items():
        assert uri.startswith("local://") and uri.endswith(f"/{rank}/local"), uri
    assert got[0] == [inst.uri]
    some = run(inst, "-r", "15,8,0", "-l", "sh", "-c", "echo $TBON_RANK", input=b"")
    assert sorted(text(some.stdout)) == ["0: 0", "15: 15", "8: 8"]


# --- directory -------------------------------------------------------------------------------


def test_dir_sets_the_working_directory(instance, tmp_path: Path) -> None:
    inst = instance(2)
    where = os.path.realpath(tmp_path)
    result = run(inst, "-d", where, "-l", "pwd")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == [f"0: {where}", f"1: {where}"]


def test_a_bad_dir_is_a_clear_error(instance, tmp_path: Path) -> None:
    inst = instance(2)
    missing = str(tmp_path / "no-such-dir")
    result = run(inst, "-d", missing, "-r", "1", "pwd")
    assert result.returncode == 126  # not 127: the command may well exist
    assert result.stdout == b""
    assert text(result.stderr) == [f"tbon exec: rank 1: {missing}: no such directory"]


# --- the client going away -------------------------------------------------------------------


def test_a_killed_client_has_its_talking_command_killed(instance) -> None:
    """A remote command that keeps writing: the broker's failed send notices the client left."""
    inst = instance(2)
    with running(
        inst, "-r", "1", "-l", "sh", "-c", "echo ready $$; while :; do echo tick; sleep 0.2; done"
    ) as job:
        (pid,) = job.wait_ready([1]).values()
        job.process.kill()
        job.process.wait(timeout=DEADLINE)
        wait_for(lambda: process_gone(pid), f"the remote shell (pid {pid}) to be killed")


def test_a_killed_client_has_its_silent_command_killed(instance) -> None:
    inst = instance(2)
    with running(inst, "-r", "1", "-l", "sh", "-c", READY) as job:
        (pid,) = job.wait_ready([1]).values()
        job.process.kill()  # it cannot forward anything
        job.process.wait(timeout=DEADLINE)
        wait_for(lambda: process_gone(pid), f"the remote sleep (pid {pid}) to be killed")


def test_input_that_is_over_before_it_starts_is_dev_null_for_the_jobs(instance) -> None:
    """stdin /dev/null, or -n: the jobs are told with the command, and read /dev/null."""
    inst = instance(3, "tbon.fanout=1")
    where = ["-l", "sh", "-c", "readlink /proc/$$/fd/0; cat"]
    for options in ([], ["-n"]):
        result = run(inst, *options, *where)
        assert result.returncode == 0, result.stderr
        assert sorted(text(result.stdout)) == [f"{r}: /dev/null" for r in range(3)]
    piped = run(inst, "-r", "2", "cat", input=b"hi\n")
    assert (piped.returncode, piped.stdout) == (0, b"hi\n")


def test_a_broker_killed_outright_takes_its_jobs_with_it(instance) -> None:
    """Even SIGKILL, which gives a broker no chance to clean up, leaves no job behind."""
    inst = instance(2)
    job = start_exec(inst.uri, "-r", "1", "sh", "-c", "echo $$; exec sleep 60")
    try:
        assert job.stdout is not None
        pid = int(job.stdout.readline())
        os.kill(inst.pid(1), signal.SIGKILL)
        wait_for(lambda: process_gone(pid), "the job of the killed broker to end")
        _, err = job.communicate(timeout=DEADLINE)
        assert job.returncode == 68, err
        assert "rank 1: output may be incomplete: its broker was lost" in err, err
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


# --- the caller's directory and environment --------------------------------------------------


def in_dir(inst, cwd: str, *args: str, **variables: str) -> subprocess.CompletedProcess[bytes]:
    """`cd CWD && VARIABLES... tbon exec ARGS...`, as a user types it."""
    return subprocess.run(
        [TBON, "exec", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        cwd=cwd,
        env={**env(inst), "PWD": cwd, **variables},
    )


def test_jobs_run_in_the_callers_directory_with_its_environment(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    result = in_dir(inst, "/usr/share", "-r", "all", "-l", "sh", "-c", "echo $PWD $FOO", FOO="bar")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == [f"{rank}: /usr/share bar" for rank in range(4)]
    assert result.stderr == b""


def test_dir_overrides_the_directory_and_a_relative_one_is_from_the_callers(
    instance, tmp_path: Path
) -> None:
    inst = instance(2)
    where = os.path.realpath(tmp_path)
    (tmp_path / "sub").mkdir()
    result = in_dir(inst, where, "-d", "sub", "-l", "sh", "-c", "pwd; printenv PWD")
    assert result.returncode == 0, result.stderr
    assert by_rank(text(result.stdout)) == {r: [f"{where}/sub"] * 2 for r in (0, 1)}


def test_env_minus_star_passes_no_environment_but_tbons_own(instance) -> None:
    inst = instance(2)
    result = in_dir(inst, "/", "--env=-*", "-r", "1", "env", FOO="bar")
    assert result.returncode == 0, result.stderr  # `env` found in the default path: no PATH
    assert sorted(text(result.stdout)) == [
        "TBON_RANK=1",
        "TBON_SIZE=2",
        f"TBON_URI={inst.uri.removesuffix('/0/local')}/1/local",
    ]
    empty = in_dir(inst, "/", "--env", "-*", "-r", "1", "sh", "-c", 'echo "[$FOO]"', FOO="bar")
    assert (empty.returncode, empty.stdout) == (0, b"[]\n")


def test_env_rules_pass_chosen_variables_in_order(instance) -> None:
    inst = instance(2)
    rules = ["--env=-*", "--env=FOO", "--env=BAR=$FOO-x", "--env=PATH=/bin:/usr/bin"]
    command = 'echo "$FOO $BAR $PATH [$HOME]"'
    result = in_dir(inst, "/", *rules, "-l", "sh", "-c", command, FOO="bar", HOME="/home/u")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == [f"{r}: bar bar-x /bin:/usr/bin []" for r in (0, 1)]
    bad = in_dir(inst, "/", "--env=X=$NOT_SET_ANYWHERE", "true")
    assert bad.returncode == 2
    assert text(bad.stderr) == [
        "tbon exec: --env=X=$NOT_SET_ANYWHERE: $NOT_SET_ANYWHERE is not set"
    ]


def test_tbon_sets_its_own_variables_over_the_callers(instance) -> None:
    inst = instance(2, "size=4")  # TBON_SIZE is the instance's size, not the ranks online
    caller = {"TBON_RANK": "99", "TBON_SIZE": "99", "TBON_URI": "local:///nowhere", "PMI_RANK": "7"}
    command = 'echo "$TBON_RANK/$TBON_SIZE [$PMI_RANK] $TBON_URI"'
    result = in_dir(inst, "/", inst.uri, "-l", "sh", "-c", command, **caller)  # URI: not $TBON_URI
    assert result.returncode == 0, result.stderr
    rank1 = inst.uri.removesuffix("/0/local") + "/1/local"
    assert sorted(text(result.stdout)) == [f"0: 0/4 [] {inst.uri}", f"1: 1/4 [] {rank1}"]


def test_the_command_is_looked_up_in_the_jobs_path(instance, tmp_path: Path) -> None:
    inst = instance(2)
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "tbon-test-tool"
    tool.write_text("#!/bin/sh\necho tool $TBON_RANK\n")
    tool.chmod(0o755)
    path = f"{tools}:{os.environ['PATH']}"
    result = in_dir(inst, "/", "-l", "tbon-test-tool", PATH=path)
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == ["0: tool 0", "1: tool 1"]
    without = in_dir(inst, "/", "--env=-PATH", "-r", "1", "tbon-test-tool", PATH=path)
    assert without.returncode == 127
    assert text(without.stderr) == ["tbon exec: rank 1: tbon-test-tool: command not found"]


def test_an_environment_over_a_mebibyte_is_refused_before_anything_runs(instance) -> None:
    inst = instance(1)
    chunk = "x" * 120_000  # each under the 128 KiB Linux allows a variable
    big = {f"TBON_TEST_BIG{i}": chunk for i in range(9)}
    result = in_dir(inst, "/", "-l", "echo", "ran", **big)
    assert result.returncode == 2
    assert result.stdout == b""
    [line] = text(result.stderr)
    assert line.startswith("tbon exec: the environment takes ") and "over the limit" in line
    trimmed = in_dir(
        inst, "/", "--env=-TBON_TEST_BIG0", "sh", "-c", "echo ${#TBON_TEST_BIG8}", **big
    )
    assert (trimmed.returncode, trimmed.stdout) == (0, b"120000\n")


# --- -n ------------------------------------------------------------------------------------


def test_noinput_reads_no_stdin_and_the_jobs_get_eof_at_once(instance) -> None:
    inst = instance(2)
    given = run(inst, "-n", "-l", "wc", "-c", input=b"not for them\n")
    assert given.returncode == 0, given.stderr
    assert by_rank(text(given.stdout)) == {0: ["0"], 1: ["0"]}
    with running(inst, "--noinput", "-l", "cat", stdin=subprocess.PIPE) as job:
        assert job.finish() == 0  # its stdin is open and silent: cat ends anyway
        assert job.stdout.lines == [] and job.stderr.lines == []


# --- commands that cannot start ----------------------------------------------------------------


def make(path: Path, content: bytes, mode: int = 0o755) -> None:
    path.write_bytes(content)
    path.chmod(mode)


@pytest.fixture
def oddities(tmp_path: Path) -> Path:
    """Files that a shell would refuse to run, each for its own reason."""
    (tmp_path / "adir").mkdir()
    make(tmp_path / "plain", b"echo plain $TBON_RANK\n")  # no #!: sh runs it
    make(tmp_path / "noexec", b"#!/bin/sh\necho hi\n", mode=0o644)
    make(tmp_path / "badinterp", b"#!/no/such/interpreter\necho hi\n")
    native = Path(shutil.which("true") or "/bin/true").read_bytes()
    foreign = bytearray(native)
    foreign[18:20] = (40).to_bytes(2, "little")  # another machine's binary
    make(tmp_path / "foreign", bytes(foreign))
    make(tmp_path / "busy", native)  # to be held open for writing: exec says ETXTBSY
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "said", "code"),
    [
        (["tbon-test-nosuchcmd"], "tbon-test-nosuchcmd: command not found", 127),
        ([""], ": command not found", 127),  # as bash says it, and no broker hurt
        (["./nope"], "./nope: No such file or directory", 127),
        (["./adir"], "./adir: Permission denied", 126),
        (["./noexec"], "./noexec: Permission denied", 126),
        (
            ["./badinterp"],
            "./badinterp: /no/such/interpreter: bad interpreter: No such file or directory",
            127,
        ),
        (["./foreign"], "./foreign: cannot execute binary file: Exec format error", 126),
    ],
)
def test_a_command_that_cannot_start_is_told_by_rank_as_a_shell_would(
    instance, oddities: Path, argv: list[str], said: str, code: int
) -> None:
    inst = instance(2)
    result = in_dir(inst, str(oddities), "-l", *argv, "arg")
    assert result.returncode == code, result.stderr
    assert result.stdout == b""
    assert text(result.stderr) == [f"tbon exec: ranks 0-1: {said}"]  # alike: one line
    report = json.loads(in_dir(inst, str(oddities), "--json", "-r", "1", *argv).stdout)
    assert report["ranks"] == [
        {
            "rank": 1,
            "status": code,
            "signal": None,
            "failure": said,
            "error": said,
            "stdout": "",
            "stderr": "",
        }
    ]


def test_a_script_without_hash_bang_runs_with_sh(instance, oddities: Path) -> None:
    inst = instance(2)
    result = in_dir(inst, str(oddities), "-l", "./plain")
    assert result.returncode == 0, result.stderr
    assert sorted(text(result.stdout)) == ["0: plain 0", "1: plain 1"]


def test_when_exec_fails_after_the_checks_the_wrapper_is_never_named(
    instance, oddities: Path
) -> None:
    """A file the checks pass that exec refuses all the same (here: open for writing, so
    ETXTBSY; as with a file removed in between): the orphan guard's own words are rewritten."""
    inst = instance(2)
    busy = str(oddities / "busy")
    fd = os.open(busy, os.O_WRONLY)
    try:
        result = in_dir(inst, str(oddities), "-l", "./busy")
    finally:
        os.close(fd)
    assert result.returncode == 126, result.stderr
    reason = os.strerror(errno.ETXTBSY)
    assert text(result.stderr) == [f"tbon exec: ranks 0-1: ./busy: {reason}"]
    assert b"setpriv" not in result.stderr


def test_a_command_that_says_what_the_wrapper_would_is_still_heard(instance) -> None:
    inst = instance(2)
    line = "setpriv: failed to execute sh: a line of its own"
    result = run(inst, "-r", "1", "sh", "-c", f"echo '{line}' >&2; echo out; exit 3")
    assert (result.returncode, result.stdout) == (3, b"out\n")
    assert text(result.stderr) == [line, "tbon exec: rank 1: exit 3"]
    alone = run(inst, "-r", "1", "sh", "-c", f"echo '{line}' >&2; exit 4")
    assert (alone.returncode, text(alone.stderr)) == (4, [line, "tbon exec: rank 1: exit 4"])
