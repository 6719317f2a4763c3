"""What the benchmark scripts (wireup.py, join.py, exec.py) share.

Each script measures something else, but all of them start `tbon start` instances in wait mode
and must never leave one behind, wait on rank 0's status stream rather than poll, and print the
same kind of report: a machine line, then tables (plain, or GitHub markdown for the README) with
medians, so that runs on a shared, noisy machine can be read and compared. Keeping those pieces
here keeps the scripts about what they measure, and their output alike.

Only the standard library is imported: the scripts hand in tbon's Client where one is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import platform
import pstats
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The console script of the interpreter running the benchmark, so that what is measured is the
# project's own `tbon` in its virtualenv, not whatever `tbon` happens to be first on PATH.
TBON = Path(sys.executable).parent / "tbon"

URI_DEADLINE_S = 60.0  # for `tbon start` (wait mode) to print its URI
STOP_GRACE_S = 15.0  # after SIGTERM to a process we started, before we SIGKILL it
RUN_DEADLINE_S = 120.0  # for any one timed command

# --- progress -----------------------------------------------------------------------------------

# The script's name in progress lines and temporary files, so that interleaved stderr and
# leftover logs say which benchmark they came from; set by begin().
_label = "bench"


def progress(text: str) -> None:
    """Progress goes to stderr, so that stdout holds nothing but the report."""
    print(f"[{_label}] {text}", file=sys.stderr, flush=True)


# --- processes we start -------------------------------------------------------------------------


def read_line(process: subprocess.Popen[bytes], limit: float) -> str:
    """The first line of `process`'s stdout, or "" at EOF or once `limit` seconds pass: a plain
    readline() would hang the benchmark forever on a launcher that never prints."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + limit
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process we started, wait STOP_GRACE_S, then SIGKILL it; always reap it. By
    PID, never by name: other instances on the machine are not ours to stop."""
    try:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                progress(f"pid {process.pid} ignored SIGTERM for {STOP_GRACE_S:g}s: SIGKILL")
                process.kill()
                process.wait()
    finally:
        if process.stdout is not None:
            process.stdout.close()


def log_tail(path: str, lines: int = 10) -> str:
    """The end of a log we redirected a process to, for error messages ("" if it is gone)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Instance:
    """A running `tbon start` in wait mode: the launcher process, its URI and its stderr log."""

    process: subprocess.Popen[bytes]
    uri: str
    stderr_path: str

    def stderr_tail(self, lines: int = 10) -> str:
        """What the launcher said last: the first thing to read when a measurement fails."""
        return log_tail(self.stderr_path, lines)


@contextlib.contextmanager
def tbon_start(
    test_size: int,
    attributes: Sequence[str] = (),
    *,
    force: bool = False,
    options: Sequence[str] = (),
    session: bool = False,
) -> Iterator[Instance]:
    """`tbon start --test-size=N -S ATTR...` in wait mode, once it has printed its URI. On the way
    out, always (a failed measurement included), it is stopped by PID and its log removed.
    `force`: past `tbon start`'s estimate of what the machine holds (2048 brokers, here).
    `options`: more of `tbon start`'s own, such as `--test-exit-timeout=2m`. `session`: in a
    session of its own, as if started from another terminal."""
    argv = [str(TBON), "start", f"--test-size={test_size}", *(["--force"] if force else [])]
    argv += list(options)
    for attribute in attributes:
        argv += ["-S", attribute]
    fd, stderr_path = tempfile.mkstemp(prefix=f"{_label}-start-", suffix=".log")
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=fd,
            start_new_session=session,
        )
    except BaseException:
        os.unlink(stderr_path)
        raise
    finally:
        os.close(fd)
    try:
        uri = read_line(process, URI_DEADLINE_S)
        if not uri.startswith("local://"):
            tail = Path(stderr_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"`{' '.join(argv)}` printed no URI within {URI_DEADLINE_S:g}s "
                f"(exit {process.poll()}): {tail}"
            )
        yield Instance(process, uri, stderr_path)
    finally:
        stop(process)
        with contextlib.suppress(OSError):
            os.unlink(stderr_path)


def save_profile(profiler: Any, path: str) -> None:
    """In a profiled broker: stop `profiler`, dump it to `path`, and write the process's CPU
    (utime + stime, from times(2)) beside it (`path`.cpu), for show_profile."""
    profiler.disable()
    times = os.times()
    profiler.dump_stats(path)
    with open(path + ".cpu", "w") as cpu:
        cpu.write(f"{times.user + times.system:.3f}\n")


def show_profile(path: str, when: str, sort: str, top: int) -> None:
    """Print what save_profile left at `path`: rank 0's CPU `when` and its top functions."""
    with open(path + ".cpu") as cpu:
        print(f"rank 0 CPU {when} (profiled): {cpu.read().strip()} s; profile {path}")
    shown = io.StringIO()
    pstats.Stats(path, stream=shown).sort_stats(sort).print_stats(top)
    print(shown.getvalue())


def show_sampled(out: str, ranks: set[int], split: bool, sort: str, top: int) -> None:
    """Print what the sampled brokers left in `out`: each one's --split timings, or their
    profiles (RANK.prof) as rank 0, rank 1 and the leaves' summed (ranks above 32)."""
    if split:
        for name in sorted(os.listdir(out), key=lambda n: int(n.split(".")[0])):
            with open(os.path.join(out, name)) as report:
                print(f"=== rank {name.split('.')[0]}\n{report.read()}")
        return
    for label, chosen in (
        ("rank 0", [0]),
        ("rank 1 (interior)", [1]),
        ("leaves", sorted(r for r in ranks if r > 32)),
    ):
        paths = [os.path.join(out, f"{r}.prof") for r in chosen]
        paths = [p for p in paths if os.path.exists(p)]
        if not paths:
            continue
        shown = io.StringIO()
        stats = pstats.Stats(*paths, stream=shown)
        print(f"=== {label}: {len(paths)} profile(s), {stats.total_tt * 1000:.1f} ms CPU in all")
        stats.sort_stats(sort).print_stats(top)
        print(shown.getvalue())


def wrap_each(parts: Sequence[tuple[str, str]], wrap: Callable[[str, Any], Any]) -> None:
    """Replace each (module, dotted attribute) of `parts` by `wrap(attribute, original)`: how a
    benchmark that runs the launcher in its own process times parts of the brokers it forks.
    A part the checkout does not have (an older or newer one, compared by compare.py) is left
    out: its row reads 0. A module's function is also replaced wherever a loaded module of tbon
    imported it by name (`from ... import decode_frames`): those calls go through that module's
    own binding, which replacing the original's alone would not reach."""
    for module_name, path in parts:
        owner: Any = importlib.import_module(module_name)
        *outer, last = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, last):
            continue
        original = getattr(owner, last)
        wrapped = wrap(path, original)
        setattr(owner, last, wrapped)
        if outer:
            continue  # a class's attribute: every caller finds it through the class
        for name, module in list(sys.modules.items()):
            if name.startswith("tbon.") and module is not None and module is not owner:
                for attribute, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, attribute, wrapped)


def start_here(
    main: Callable[[list[str]], int],
    size: int,
    command: Sequence[str],
    assignments: Sequence[str] = (),
) -> int:
    """`tbon start --size SIZE [-S ASSIGNMENT ...] COMMAND` run in this process by the
    launcher's `main` (tbon.overlay.launch.local), in a fresh run directory removed after it, so
    that what this process patched reaches every broker it forks; its exit code."""
    rundir = tempfile.mkdtemp(prefix="tbon-start-")
    argv = ["--size", str(size), "--rundir", rundir, "--force"]
    for assignment in assignments:
        argv += ["-S", assignment]
    try:
        return main([*argv, *command])
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


def time_command(argv: Sequence[str], *, stdout: int = subprocess.PIPE, expect: int = 0) -> float:
    """Wall time of one run of `argv` (stdin /dev/null), from before its Popen to its exit, which
    must be `expect`. Killed (by PID) and reaped if it outlives RUN_DEADLINE_S or we are
    interrupted; on failure the error carries the end of its stderr."""
    fd, err_path = tempfile.mkstemp(prefix=f"{_label}-cmd-", suffix=".log")
    try:
        started = time.perf_counter()
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=fd)
        try:
            if stdout == subprocess.PIPE:
                process.communicate(timeout=RUN_DEADLINE_S)
            else:
                process.wait(RUN_DEADLINE_S)
            elapsed = time.perf_counter() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode != expect:
            tail = Path(err_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"`{' '.join(argv)}` exited {process.returncode}: {tail}")
        return elapsed
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(err_path)


# --- rank 0's status stream ---------------------------------------------------------------------


class Watch:
    """A status.watch stream from rank 0: rank 0 pushes a snapshot whenever something changes, so
    a benchmark waits for the change itself and times it when it arrives, without polling."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tag = client.send("status.watch", {}, nodeid=0)

    def next(
        self, deadline: float, check: Callable[[], None] | None = None
    ) -> tuple[float, dict[str, Any]]:
        """The next snapshot and the perf_counter() when it arrived; TimeoutError once the
        monotonic `deadline` passes. `check` runs at least every half second while we wait, so
        that a process we depend on dying fails the benchmark at once, not at the deadline."""
        while True:
            if check is not None:
                check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no status snapshot before the deadline")
            reply = self.client.receive(min(left, 0.5))
            if reply is None or reply.tag != self.tag:
                continue
            arrived = time.perf_counter()
            if reply.errnum:
                raise RuntimeError(f"status.watch failed: {reply.errstr}")
            return arrived, reply.payload

    def until(
        self,
        deadline: float,
        wanted: Callable[[dict[str, Any]], bool],
        check: Callable[[], None] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        """The first snapshot for which `wanted` is true, and when it arrived (as next())."""
        while True:
            arrived, snapshot = self.next(deadline, check)
            if wanted(snapshot):
                return arrived, snapshot


def all_online(snapshot: dict[str, Any], first: int | None = None) -> bool:
    """Whether ranks 0 to first-1 (default: every rank) are online: measuring against an
    instance that is still wiring up would time the wire-up too."""
    ranks = snapshot["ranks"] if first is None else snapshot["ranks"][:first]
    return all(r["state"] == "online" for r in ranks)


# --- statistics ---------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """The figure to read on a shared machine: one slow run (another job) does not move it."""
    return statistics.median(values)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value `fraction` of the way up the sorted values (no interpolation): a tail that the
    median hides, without the single worst outlier that max() reports."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(seconds: float) -> str:
    """Seconds as whole milliseconds, the unit of most tables."""
    return f"{seconds * 1000:.0f}"


def verdict(ok: bool) -> str:
    """How a table says whether a target was met; MISSED in capitals so that it stands out."""
    return "ok" if ok else "MISSED"


def spread(values: Sequence[float], unit: Callable[[float], str] = ms) -> list[str]:
    """The median, min and max cells of a row, in that order, each formatted by `unit`."""
    return [unit(median(values)), unit(min(values)), unit(max(values))]


STAT_HEADER = ["measure", "median ms", "min ms", "max ms", "target"]


def stat_row(
    label: str, values: Sequence[float], target: str = "", unit: Callable[[float], str] = ms
) -> list[str]:
    """A row under STAT_HEADER: what was measured, its median/min/max, and the target if any."""
    return [label, *spread(values, unit), target]


# --- the report ---------------------------------------------------------------------------------


class Report:
    """Headings, tables and notes on stdout: aligned plain text to read in a terminal, or GitHub
    markdown (`--markdown`) to paste into the README. Flushed as it goes, so that a long run shows
    its tables as soon as each section is done."""

    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown

    def comment(self, text: str) -> None:
        """A line before the first heading (the machine line): `# ` in plain text, so that it
        reads as a comment, and as a paragraph in markdown."""
        print(("" if self.markdown else "# ") + text, flush=True)

    def heading(self, text: str) -> None:
        """One a section: `###` in markdown, to sit under a section heading of the README."""
        print(f"\n### {text}\n" if self.markdown else f"\n== {text} ==", flush=True)

    def note(self, text: str) -> None:
        """A paragraph under a table: how it was measured, and how to read it."""
        print(text if self.markdown else f"  {text}", flush=True)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """The first column (labels) left-aligned, the rest (numbers) right-aligned."""
        if self.markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
            for row in rows:
                print("| " + " | ".join(row) + " |")
            print(flush=True)
            return
        widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
        for i, row in enumerate([header, *rows]):
            cells = [
                str(c).ljust(w) if j == 0 else str(c).rjust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            print("  " + "  ".join(cells).rstrip())
            if i == 0:
                print("  " + "  ".join("-" * w for w in widths))
        sys.stdout.flush()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), not all the machine has: the brokers and
    CLIs we start inherit it, and it bounds how much of their start-up runs in parallel."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def machine_line(*, bytecode_note: bool = False) -> str:
    """Where the numbers come from, printed first so that a table pasted elsewhere keeps it.
    `bytecode_note`: say when PYTHONDONTWRITEBYTECODE is set, as every CLI start then pays for
    compiling modules that have no .pyc."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bytecode = ""
    if bytecode_note and os.environ.get("PYTHONDONTWRITEBYTECODE"):
        bytecode = " PYTHONDONTWRITEBYTECODE is set: modules without a .pyc compile at every start."
    return (
        f"machine: {platform.node()} {platform.system()} {platform.release()} "
        f"{platform.machine()}, "
        f"nproc {usable_cpus()}, Python {platform.python_version()} ({sys.executable}), "
        f"load average {load}. Shared, noisy machine: read medians, not single runs.{bytecode}"
    )


# --- the command line ---------------------------------------------------------------------------


def positive(text: str) -> float:
    """An argument that is a number greater than zero (seconds, MB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def sizes_arg(text: str) -> list[int]:
    """`--sizes 1,4,16`: instance sizes, positive integers."""
    try:
        sizes = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --sizes {text!r}: use e.g. 1,4,16") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--sizes needs positive integers")
    return sizes


def parse_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    sections: Sequence[str],
    *,
    counts: Sequence[str] = ("--runs",),
) -> argparse.Namespace:
    """Add --markdown and --sections, parse, and check what every script checks: the `counts`
    options (numbers of runs) are at least 1, and the project's `tbon` is next to the interpreter
    (see TBON), so that a bad command line fails now rather than in the middle of a measurement."""

    def chosen_sections(text: str) -> list[str]:
        chosen = [word.strip() for word in text.split(",") if word.strip()]
        unknown = [word for word in chosen if word not in sections]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"--sections: choose from {','.join(sections)}")
        return chosen

    parser.add_argument("--markdown", action="store_true", help="print GitHub tables")
    parser.add_argument(
        "--sections",
        type=chosen_sections,
        default=list(sections),
        help=f"default {','.join(sections)}",
    )
    args = parser.parse_args(argv)
    if any(getattr(args, option.lstrip("-").replace("-", "_")) < 1 for option in counts):
        parser.error(f"{' and '.join(counts)} must be at least 1")
    if not TBON.exists():
        parser.error(f"no tbon console script at {TBON}: run with the project's .venv/bin/python")
    return args


def begin(label: str, markdown: bool, *, bytecode_note: bool = False) -> Report:
    """Start a script's output: its label for progress lines and temporary files (see _label),
    and the report, which opens with the machine line."""
    global _label
    _label = label
    report = Report(markdown)
    report.comment(machine_line(bytecode_note=bytecode_note))
    return report


def proc_kb(pid: int, names: Sequence[str]) -> dict[str, int]:
    """VmHWM/VmRSS from /proc/PID/status and Pss from smaps_rollup, in kB (missing: absent)."""
    found: dict[str, int] = {}
    for path in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in names and key not in found:
                found[key] = int(value.split()[0])
    return found


def in_tree(pid: int, root: int) -> bool:
    """Whether `pid` descends from `root` (parent links in /proc): the only brokers a
    benchmark may signal."""
    for _ in range(64):
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if pid <= 1:
            return False
    return False
