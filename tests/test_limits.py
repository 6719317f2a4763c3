"""Huge numbers: the largest instance (tbon/limits.py), what this machine can hold
(overlay/launch/capacity.py), and what a user sees when either refuses.

Every process that could fork brokers if a guard regressed runs under `guarded()`: its
descriptors are capped (the launcher needs a socketpair per broker, so it cannot fork more than
a few dozen, and RLIMIT_NOFILE binds root too, unlike RLIMIT_NPROC), so are its tasks (for
users other than root) and each process's address space, in a session of its own that is killed
whole if it outlives its deadline. No test ever asks for a huge instance without those caps.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import DEADLINE, TBON, child_env
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon import exitcodes
from tbon.errors import UsageError
from tbon.limits import (
    MAX_DURATION,
    MAX_SIZE,
    PAGE_BYTES,
    WHOLE_TABLE_MAX,
    check_duration,
    check_size,
    parse_rank,
    parse_size,
)
from tbon.overlay.launch import capacity
from tbon.overlay.launch.capacity import FORKED, Machine, MiB, check_room, refusal
from tbon.overlay.state import statusviews
from tbon.overlay.state.ranktable import Lost, Online, RankTable
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import MAX_MESSAGE_BYTES, Kind, Message, encode

FAST = settings(max_examples=150, deadline=None)
HUGE = "99999999999999999999"
GiB = 1 << 30


# --- the maximum size ---------------------------------------------------------------------------


def test_max_size_is_a_power_of_two() -> None:
    assert MAX_SIZE & (MAX_SIZE - 1) == 0


WORST_FIELDS: dict[str, dict[str, object]] = {
    "reserved": {"state": "reserved", "joiner": "SHA256:0123456789abcdef", "expires": 29.999},
    "retiring": {"state": "retiring", "subtree": "degraded", "subtree_since": 123456.789},
    "lost": {"state": "lost", "reason": "r" * 64, "last_pid": 4_194_303},  # reasons: 64 at most
}


def status_response(size: int, spec: str, host: str, worst: str = "") -> list[bytes]:
    """Rank 0's `status.get` answer for `size` ranks, as it goes on the wire. `worst` (a key of
    WORST_FIELDS) makes each entry as long as that kind gets, with a large pid and incarnation."""
    topology = Topology(spec, size)
    status = snapshot(RankTable(topology, [host] * size, now=0.0), now=123456.789)
    if worst:
        for entry in status["ranks"]:
            # The longest entry each kind of rank can have: the fields of one state at a time,
            # a pending reservation's, a retiring rank's, or a lost one's with its reason.
            entry.update(
                pid=4_194_303,  # the largest pid_max
                incarnation=999_999,
                since=123456.789,
                **WORST_FIELDS[worst],
            )
    reply = Message(
        Kind.RESPONSE, "status.get", status, nodeid=0, tag=2**48 - 1, route=["l" + "ab" * 5]
    )
    return encode(reply)


@pytest.mark.parametrize("kind", sorted(WORST_FIELDS))
@pytest.mark.parametrize("spec", ["kary:32", "kary:0", "binomial"])
def test_the_largest_whole_answer_fits_in_one_message_with_room_to_spare(
    spec: str, kind: str
) -> None:
    frames = status_response(WHOLE_TABLE_MAX, spec, "h" * 64, worst=kind)  # HOST_NAME_MAX
    assert sum(map(len, frames)) < 0.7 * MAX_MESSAGE_BYTES  # 30% to spare


def test_twice_the_largest_whole_table_would_not_fit() -> None:
    """The whole table goes in one message up to the largest power of two that fits."""
    frames = status_response(2 * WHOLE_TABLE_MAX, "kary:32", "h" * 64, worst="lost")
    assert sum(map(len, frames)) > MAX_MESSAGE_BYTES


def worst_table(spec: str, launched: int, gone: range) -> RankTable:
    """MAX_SIZE ranks, the first `launched` on 64-character hosts; those in `gone` came online
    with the largest pid and were then lost, each with a 64-character reason of its own (so
    that no two group together), the ranks below them cut off with a reason naming them."""
    table = RankTable(Topology(spec, MAX_SIZE), ["h" * 64] * launched, now=0.0)
    table.apply(Online(0, 1, "h" * 64, 4_194_303), 1.0)
    for rank in gone:
        table.apply(Online(rank, 1, "h" * 64, 4_194_303), 1.0)
    for rank in reversed(gone):
        table.apply(Lost(rank, 1, f"{rank:07d}" + "r" * 57), 2.0)
    return table


def answer_bytes(payload: dict[str, object], data: bytes = b"") -> int:
    reply = Message(Kind.RESPONSE, "status.x", payload, nodeid=0, tag=2**48 - 1, data=data)
    reply.route = ["l" + "ab" * 5]
    return sum(map(len, encode(reply)))


@pytest.mark.parametrize("spec", ["kary:32", "kary:0"])
def test_no_status_answer_exceeds_a_message_at_the_largest_size(spec: str) -> None:
    """Every answer rank 0 gives at 262,144 ranks: each page of the table, and each view, with
    entries as long as they get (a flat tree's rank 0 has 262,143 children, in its page), and
    more distinct errors than one answer holds. (Fewer ranks launched than the size keep the
    test short: the pages hold as much whatever the entries, and the views are cut by bytes.)"""
    table = worst_table(spec, 30000, range(1, 20001))
    now = 123456.789
    start, pages = 0, 0
    while start < MAX_SIZE:
        data, start = statusviews.page(table, now, start)
        assert answer_bytes({"size": MAX_SIZE, "topo": spec, "start": 0, "next": start}, data) < (
            MAX_MESSAGE_BYTES
        )
        pages += 1
    assert pages > 16  # bounded pages: many of them
    for root in (0, 1):
        assert answer_bytes(statusviews.summary(table, now, root)) < MAX_MESSAGE_BYTES
        for each in (False, True):
            errors = statusviews.errors(table, now, root, each)
            assert answer_bytes(errors) < MAX_MESSAGE_BYTES
        for merge in (False, True):
            tree = statusviews.tree(table, now, root, None, merge)
            assert answer_bytes(tree) < MAX_MESSAGE_BYTES
    assert statusviews.errors(table, now, 0)["cut"] > 0  # 20,000 distinct reasons: cut
    start: int | None = 0  # 30,000 ranks launched: the held view in pages
    held_pages = 0
    while start is not None:
        page = statusviews.held(table, now, start)
        assert answer_bytes(page) < MAX_MESSAGE_BYTES
        start, held_pages = page["next"], held_pages + 1
    assert held_pages > 4


def test_each_page_of_the_online_view_is_bounded_without_encoding_it() -> None:
    """expand's `online` view: a page is cut by ONLINE_BYTES an item, an upper bound (a pid
    past 19 digits, which no real broker has, by its digits), so that at 262,144 ranks online
    each page fits a message whatever the pids and incarnations."""
    launched = 40_000
    table = RankTable(Topology("kary:32", MAX_SIZE), ["h" * 64] * launched, now=0.0)
    for rank in range(launched):
        pid = 10**40 + rank if rank % 2 else 4_194_303  # the largest Linux pid, and larger
        assert table.apply(Online(rank, 1, "h" * 64, pid), 1.0).applied
    start: int | None = 0
    pages = 0
    while start is not None:
        page = statusviews.online(table, start)
        text = json.dumps(page["online"], separators=(",", ":"))
        assert len(text) <= PAGE_BYTES + statusviews.ONLINE_BYTES + 41
        assert answer_bytes(page) < MAX_MESSAGE_BYTES
        start, pages = page["next"], pages + 1
    assert pages > 1


@pytest.mark.parametrize("text", ["1", "2", "007", str(MAX_SIZE)])
def test_sizes_in_range(text: str) -> None:
    assert parse_size(text, "size") == int(text)
    assert check_size(int(text), "--test-size") == int(text)


@pytest.mark.parametrize(
    "text", ["0", str(MAX_SIZE + 1), "524288", HUGE, "9" * 5000, "0" * 30 + "1" + "0" * 30]
)
def test_sizes_out_of_range_are_usage_errors_on_one_short_line(text: str) -> None:
    with pytest.raises(UsageError, match=r"^invalid size '.*': out of range") as caught:
        parse_size(text, "size")
    assert caught.value.exit_code == exitcodes.USAGE
    assert f"1 to {MAX_SIZE}" in str(caught.value)
    assert len(str(caught.value)) < 120  # a 5000-digit number is cut short


@pytest.mark.parametrize("text", ["", "x", "-1", "+3", " 3", "1.5", "1e3", "²", "٣"])
def test_sizes_that_are_not_numbers(text: str) -> None:
    with pytest.raises(UsageError, match=r"^invalid size .*: use a whole number from 1 to"):
        parse_size(text, "size")


@pytest.mark.parametrize(
    "value", [0, -1, MAX_SIZE + 1, 10**20, pytest.param(10**5000, id="10**5000")]
)
def test_check_size_refuses(value: int) -> None:
    with pytest.raises(UsageError, match=r"^invalid -N .*: out of range") as caught:
        check_size(value, "-N")
    assert len(str(caught.value)) < 120


def test_ranks_go_up_to_one_below_the_maximum_size() -> None:
    assert parse_rank("0", "broker.rank") == 0
    assert parse_rank(str(MAX_SIZE - 1), "broker.rank") == MAX_SIZE - 1
    for text in (str(MAX_SIZE), HUGE, "9" * 5000):
        with pytest.raises(UsageError, match=r"^invalid broker\.rank '.*': out of range"):
            parse_rank(text, "broker.rank")


@given(st.text(max_size=30))
@FAST
def test_parse_size_gives_a_size_or_a_usage_error(text: str) -> None:
    try:
        value = parse_size(text, "size")
    except UsageError as error:
        assert "\n" not in str(error)
        return
    assert 1 <= value <= MAX_SIZE and text.isascii() and text.isdigit()


def test_durations_are_bounded() -> None:
    assert check_duration(MAX_DURATION, "x") == MAX_DURATION
    assert check_duration(0.0, "x") == 0.0
    for bad in (MAX_DURATION * 1.001, float("inf"), float("nan"), 1e30):
        with pytest.raises(UsageError, match=r"^tbon\.heartbeat is out of range: at most 24d"):
            check_duration(bad, "tbon.heartbeat")


# --- what the machine can hold: the pure rule ---------------------------------------------------

ROOMY = Machine(
    memory=256 * GiB, nproc=100_000, user_tasks=10, task_max=4_000_000, tasks=500, nofile=65536
)


def test_a_roomy_machine_holds_thousands_of_brokers() -> None:
    """Not the largest instance's 262,144: its ranks are mostly spares, which fork nothing."""
    assert refusal(8192, ROOMY) is None


def test_a_machine_that_tells_nothing_refuses_nothing() -> None:
    assert refusal(MAX_SIZE, Machine()) is None


def test_memory_bounds_the_brokers() -> None:
    machine = replace(ROOMY, memory=GiB)  # (1 GiB - 64 MiB) / 16 MiB = 60 brokers
    assert refusal(60, machine) is None
    why = refusal(61, machine)
    assert why is not None
    assert "61 brokers need about 1040 MiB of memory (16 MiB each)" in why
    assert "1024 MiB is available (MemAvailable)" in why
    assert why.endswith("at most 60 fit here")


def test_a_cgroup_memory_limit_counts_when_it_is_tighter() -> None:
    machine = replace(ROOMY, cgroup_memory=512 * MiB)  # (512 - 64) / 16 = 28
    assert refusal(28, machine) is None
    why = refusal(29, machine)
    assert why is not None and "cgroup's memory limit" in why and "at most 28" in why


def test_rlimit_nproc_counts_the_tasks_the_user_already_runs() -> None:
    machine = replace(ROOMY, nproc=1000, user_tasks=400)  # (600 - 8) / 3 = 197
    assert refusal(197, machine) is None
    why = refusal(198, machine)
    assert why is not None
    assert "198 brokers need 602 tasks (3 threads each)" in why
    assert "RLIMIT_NPROC leaves room for 600" in why


def test_the_kernel_task_limit_counts_every_task_on_the_machine() -> None:
    machine = replace(ROOMY, task_max=32768, tasks=32000)  # (768 - 8) / 3 = 253
    assert refusal(253, machine) is None
    why = refusal(254, machine)
    assert why is not None and "kernel" in why and "at most 253" in why


def test_a_cgroup_pids_limit() -> None:
    machine = replace(ROOMY, cgroup_tasks=100)  # (100 - 8) / 3 = 30
    assert refusal(30, machine) is None
    assert "pids.max" in (refusal(31, machine) or "")


def test_file_descriptors_bound_one_process() -> None:
    machine = replace(ROOMY, nofile=1024)  # 1024 - 32 = 992
    assert refusal(992, machine) is None
    why = refusal(993, machine)
    assert why is not None
    assert "993 brokers need 1025 file descriptors in one process" in why
    assert "RLIMIT_NOFILE is 1024 (ulimit -n)" in why


def test_the_tightest_limit_is_the_one_named() -> None:
    machine = replace(ROOMY, memory=GiB, nofile=64)  # memory: 60, descriptors: 32
    why = refusal(100, machine)
    assert why is not None and "RLIMIT_NOFILE" in why and why.endswith("at most 32 fit here")


def test_a_machine_already_over_a_limit_holds_none() -> None:
    machine = replace(ROOMY, nproc=100, user_tasks=500)
    why = refusal(1, machine)
    assert why is not None and why.endswith("at most 0 fit here")
    assert "leaves room for 0" in why


machines = st.builds(
    Machine,
    memory=st.none() | st.integers(0, 256 * GiB),
    cgroup_memory=st.none() | st.integers(-GiB, 256 * GiB),
    nproc=st.none() | st.integers(0, 10**6),
    user_tasks=st.integers(0, 10**5),
    task_max=st.none() | st.integers(0, 4 * 10**6),
    tasks=st.integers(0, 10**5),
    cgroup_tasks=st.none() | st.integers(-100, 10**6),
    nofile=st.none() | st.integers(0, 10**6),
)


def oracle(size: int, machine: Machine) -> bool:
    """Whether `size` forked brokers fit, written out resource by resource."""
    need_memory = size * 16 * MiB + 64 * MiB
    need_tasks = 3 * size + 8
    fits = [
        machine.memory is None or need_memory <= machine.memory,
        machine.cgroup_memory is None or need_memory <= machine.cgroup_memory,
        machine.nproc is None or need_tasks <= machine.nproc - machine.user_tasks,
        machine.task_max is None or need_tasks <= machine.task_max - machine.tasks,
        machine.cgroup_tasks is None or need_tasks <= machine.cgroup_tasks,
        machine.nofile is None or size + 32 <= machine.nofile,
    ]
    return all(fits)


@given(st.integers(1, MAX_SIZE), machines)
@FAST
def test_refusal_agrees_with_the_oracle_and_is_one_line(size: int, machine: Machine) -> None:
    why = refusal(size, machine)
    assert (why is None) == oracle(size, machine)
    if why is not None:
        assert "\n" not in why
        assert refusal(size + 1, machine) is not None  # more never fits where fewer did not


def test_check_room_is_a_usage_error_that_says_why_and_how_to_override() -> None:
    with pytest.raises(UsageError) as caught:
        check_room(100, "--test-size", replace(ROOMY, nofile=64))
    message = str(caught.value)
    assert message.startswith("--test-size 100 is more than this machine can hold: ")
    assert message.endswith("(--force starts them anyway)")
    assert caught.value.exit_code == exitcodes.USAGE


def test_the_measured_cost_of_a_forked_broker() -> None:
    assert (FORKED.memory, FORKED.tasks, FORKED.files) == (16 * MiB, 3, 1)


# --- what the machine can hold: the reader ------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_this_machine_reads_linux() -> None:
    machine = capacity.this_machine()
    assert machine.memory is not None and machine.memory > 0
    assert machine.task_max is not None and machine.tasks > 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert machine.nofile == (None if soft == resource.RLIM_INFINITY else soft)
    if os.getuid() == 0:
        assert machine.nproc is None  # RLIMIT_NPROC does not hold root
    elif machine.nproc is not None:
        assert machine.user_tasks >= 1  # this process, at least


def cgroup_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_cgroup_v2_takes_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    cgroup_tree(
        tmp_path,
        {
            "self": "0::/job/step\n",
            "fs/memory.max": "max\n",
            "fs/job/memory.max": f"{4 * GiB}\n",
            "fs/job/memory.current": f"{3 * GiB}\n",
            "fs/job/step/memory.max": f"{8 * GiB}\n",
            "fs/job/step/memory.current": f"{1 * GiB}\n",
            "fs/job/step/pids.max": "max\n",
            "fs/job/step/pids.current": "12\n",
        },
    )
    root, table = str(tmp_path / "fs"), str(tmp_path / "self")
    assert capacity._cgroup_memory(root, table) == GiB
    assert capacity._cgroup_room("pids", ("pids.max", "pids.current"), root, table) is None


def test_cgroup_v1_reads_each_controller_in_its_own_hierarchy(tmp_path: Path) -> None:
    cgroup_tree(
        tmp_path,
        {
            "self": "5:pids:/slurm/job1\n4:memory:/slurm/job1\n0::/\n",
            "fs/memory/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
            "fs/memory/memory.usage_in_bytes": "1\n",
            "fs/memory/slurm/job1/memory.limit_in_bytes": f"{2 * GiB}\n",
            "fs/memory/slurm/job1/memory.usage_in_bytes": f"{GiB // 2}\n",
            "fs/pids/slurm/job1/pids.max": "500\n",
            "fs/pids/slurm/job1/pids.current": "20\n",
        },
    )
    root, table = str(tmp_path / "fs"), str(tmp_path / "self")
    assert capacity._cgroup_memory(root, table) == 2 * GiB - GiB // 2
    assert capacity._cgroup_room("pids", ("pids.max", "pids.current"), root, table) == 480


def test_no_cgroup_files_no_limit(tmp_path: Path) -> None:
    assert capacity._cgroup_memory(str(tmp_path), str(tmp_path / "missing")) is None


# --- tbon start refuses before it starts anything (in this process) ----------------------------


@pytest.fixture
def nothing_may_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any attempt to start a process in this test is recorded and fails."""
    attempts: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(repr(args)[:80])
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    return attempts


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    from tbon.cli.app import run

    code = run(args)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "args",
    [
        ["start", f"--test-size={HUGE}", "true"],
        ["start", f"--test-size={MAX_SIZE + 1}", "true"],
        ["start", "--test-size=2", "-S", f"size={HUGE}", "true"],
        ["start", "--test-size=2", "-S", "size", "true"],
        ["alloc", "-N", HUGE, "true"],
        ["alloc", "-N", "1", "--size", str(MAX_SIZE + 1), "true"],
        ["alloc", "-N", "1", "-S", f"size={HUGE}", "true"],
        ["alloc", "-N", "1", "-S", "size", "true"],
        ["expand", "local:///nowhere", "-n", HUGE],
        ["expand", "local:///nowhere", "-n", "1", "-S", "size"],
    ],
)
def test_out_of_range_numbers_start_nothing(
    args: list[str], nothing_may_start: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run_cli(args, capsys)
    assert code == exitcodes.USAGE, lines
    assert len(lines) == 1, lines
    assert not nothing_may_start


def test_more_than_the_machine_holds_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
    nothing_may_start: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = Machine(memory=GiB)  # 60 brokers
    monkeypatch.setattr(capacity, "this_machine", lambda: small)
    code, lines = run_cli(["start", "--test-size=61", "true"], capsys)
    assert code == exitcodes.USAGE
    assert lines == [
        "tbon start: --test-size 61 is more than this machine can hold: 61 brokers need about "
        "1040 MiB of memory (16 MiB each) and 1024 MiB is available (MemAvailable); at most 60 "
        "fit here (--force starts them anyway)"
    ]
    assert not nothing_may_start


# --- what a user sees, process by process (guarded) ---------------------------------------------


def guarded(
    *argv: str, files: int = 64, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `argv` with forks capped (see the module's text); its result and the CPU seconds it
    and its reaped descendants used."""
    tasks = capacity._user_tasks() + 256 if os.getuid() != 0 else None

    def caps() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
        resource.setrlimit(resource.RLIMIT_AS, (2 * GiB, 2 * GiB))
        if tasks is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env() if env is None else env,
        preexec_fn=caps,  # safe: this test process runs no threads of its own
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: ours alone
        process.communicate()
        raise AssertionError(f"{argv[:4]} still ran after {DEADLINE}s") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return subprocess.CompletedProcess(argv, process.returncode, out, err), cpu


def refused_at_once(result: subprocess.CompletedProcess[str], cpu: float, pattern: str) -> None:
    """Exit 2, one line on stderr and nothing on stdout, and too little CPU for any broker to
    have been started (a CLI alone takes ~0.3 s; one broker's start ~0.1 s more)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == exitcodes.USAGE, (result.returncode, result.stderr[-500:])
    assert len(lines) == 1, result.stderr[-2000:]
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert cpu < 2.0, f"{cpu:.2f}s of CPU: something was started"


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ([f"--test-size={HUGE}"], f"tbon start: invalid --test-size {HUGE}: out of range"),
        ([f"--test-size={MAX_SIZE + 1}"], f"(an instance has 1 to {MAX_SIZE} ranks)"),
        (["--test-size=2", "-S", f"size={HUGE}"], f"tbon start: invalid size '{HUGE}'"),
        (["--test-size=2", "-S", "size"], "tbon start: invalid attribute 'size'"),
        (["--test-size=2", "-S", "tbon.heartbeat=" + "9" * 30], "tbon.heartbeat is out of range"),
    ],
)
def test_tbon_start_refuses_out_of_range_numbers_at_once(args: list[str], pattern: str) -> None:
    refused_at_once(*guarded(TBON, "start", *args, "true"), pattern)


def test_the_launcher_itself_refuses_a_huge_size() -> None:
    """The process that forks checks too, whoever started it."""
    result, cpu = guarded(
        sys.executable, "-m", "tbon.overlay.launch.local", "--size", HUGE, "--rundir", "/x", "true"
    )
    refused_at_once(result, cpu, f"tbon start: invalid --test-size {HUGE}: out of range")


def test_more_brokers_than_descriptors_is_refused_and_force_overrides() -> None:
    """Nine brokers need 9 + 32 descriptors in one process: 40 is too few. With --force they
    start all the same (and fit: rank 0 and the launcher need fewer than 32 of their own)."""
    result, cpu = guarded(TBON, "start", "--test-size=9", "true", files=40)
    refused_at_once(
        result,
        cpu,
        "tbon start: --test-size 9 is more than this machine can hold: 9 brokers need 41 file "
        "descriptors in one process and RLIMIT_NOFILE is 40 (ulimit -n); at most 8 fit here "
        "(--force starts them anyway)",
    )
    forced, _cpu = guarded(TBON, "start", "--test-size=9", "--force", "true", files=40)
    assert forced.returncode == 0, forced.stderr[-2000:]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["broker", "-S", f"size={HUGE}", "true"], f"tbon broker: invalid size '{HUGE}'"),
        (["broker", "-S", "broker.rank=" + "9" * 5000], "invalid broker.rank '999999999999..."),
        (["broker", "-S", "broker.boot-server=ssh://h:99999/x"], "invalid broker.boot-server"),
        (["alloc", "-N", HUGE, "true"], f"tbon alloc: invalid -N {HUGE}: out of range"),
        (["alloc", "-N", "1", "--size", HUGE, "true"], f"invalid --size {HUGE}: out of range"),
        (["alloc", "-N", "1", "-S", f"size={HUGE}", "true"], f"tbon alloc: invalid size '{HUGE}'"),
        (["alloc", "-N", "1", "-S", "size", "true"], "tbon alloc: invalid attribute 'size'"),
        (["alloc", "-N", "1", "-S", "nonsense=1", "true"], "tbon alloc: unknown attribute"),
        (["expand", "local:///nowhere", "-n", HUGE], f"tbon expand: invalid -n {HUGE}"),
        (["expand", "local:///nowhere", "-n", "1", "-S", "size"], "invalid attribute 'size'"),
        (["expand", "local:///nowhere", "-n", "1", "-S", "tbon.heartbeat=fast"], "heartbeat"),
    ],
)
def test_other_commands_refuse_out_of_range_numbers_and_bare_names(
    args: list[str], pattern: str
) -> None:
    refused_at_once(*guarded(TBON, *args), pattern)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "ssh://h:99999/x"],
        ["exec", "ssh://h:99999/x", "true"],
        ["exec", "-r", "0", "ssh://h:0/x", "true"],
        ["ping", "ssh://h:65536/x", "0"],
        ["shutdown", "ssh://u@h:" + "9" * 5000 + "/x"],
    ],
)
def test_a_port_out_of_range_is_a_usage_error(args: list[str]) -> None:
    refused_at_once(*guarded(TBON, *args), "the port must be 1 to 65535")


@pytest.mark.parametrize(
    "args", [["exec", "bogus://x", "true"], ["exec", "-r", "0", "-l", "bogus://x", "true"]]
)
def test_an_unknown_uri_scheme_is_one_usage_error_even_inside_an_instance(
    args: list[str],
) -> None:
    """Not run as COMMAND on every rank (one error line each), nor TBON_URI used instead."""
    env = child_env(TBON_URI="local:///nonexistent/tbon/local")
    refused_at_once(*guarded(TBON, *args, env=env), "tbon exec: invalid URI 'bogus://x'")


def test_other_commands_treat_an_unknown_scheme_the_same() -> None:
    for args in (
        ["status", "bogus://x"],
        ["ping", "bogus://x", "0"],
        ["uri", "bogus://x"],
        ["retire", "bogus://x", "1"],
        ["shutdown", "bogus://x"],
        ["expand", "bogus://x", "-n", "1"],
    ):
        refused_at_once(*guarded(TBON, *args), f"tbon {args[0]}: invalid URI 'bogus://x'")


def test_a_real_command_is_still_run_after_a_real_uri(instance) -> None:
    inst = instance(1)
    result = subprocess.run(
        [TBON, "exec", inst.uri, "echo", "ok://not-a-uri"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok://not-a-uri\n"
