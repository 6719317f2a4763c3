"""`tbon alloc --launcher local` benchmark: a whole short-lived instance, started three ways.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/alloc.py [--runs R] [--sizes 1,4,16] [--markdown]
        [--sections alloc,mpiexec]

Timed: the wall time, from before the Popen to the exit (which must be 0), of a whole instance of
N brokers (N = 1, 4, 16 by default) that starts, runs `true` and shuts down:

  start    `tbon start --test-size=N true`, the reference: one launcher that forks the brokers
           after its imports
  alloc    `tbon alloc -N N --launcher local true`: one `tbon relay --pmi` and one `tbon broker`
           process per rank, each a fresh interpreter, PMI served by `tbon alloc`: the path of
           --launcher ssh, minus ssh
  mpiexec  `mpiexec -n N tbon broker true`: MPICH Hydra serves PMI and starts one broker process
           per rank; when `mpiexec` is not on PATH this column is left out, and the report says so

All three are measured in the same run, interleaved (for each N and each run, one of each, in an
order that rotates from run to run), so that a machine getting busier or quieter weighs on them
alike and the ratios are fair; after one warm-up of each at N = 1 (page cache, .pyc). Reported:
the median and min over --runs, and each one divided by `tbon start`'s (median by median, min by
min). Every command runs with stdin /dev/null, stdout and stderr to a log, in a session of its
own. Nothing here sleeps and hopes: a command still running after RUN_TIMEOUT_S gets SIGTERM (to
its session, which holds only what it started; by PID, as the session's id is the command's),
then SIGKILL after STOP_GRACE_S, and is reaped whether the benchmark passes or fails; a command
that exits non-zero, or exits 0 but leaves processes behind in its session, fails the benchmark
at once with the end of its log. (The relays of `tbon alloc` run in sessions of their own, as they
would under ssh; `tbon alloc` ends them itself before it exits.) Progress goes to stderr, tables
to stdout (`--markdown` for GitHub tables, e.g. for the README).

Sections (select with --sections; `tbon start` is always measured, as the reference):
  alloc    compare `tbon alloc -N N --launcher local true`
  mpiexec  compare `mpiexec -n N tbon broker true`, if `mpiexec` is on PATH

Only the standard library, tbon itself and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from common import (
    STOP_GRACE_S,
    TBON,
    Report,
    begin,
    log_tail,
    median,
    parse_args,
    progress,
    sizes_arg,
)

RUN_TIMEOUT_S = 60.0  # for any one instance to start, run `true` and exit
SECTIONS = ("alloc", "mpiexec")


def seconds(value: float) -> str:
    """Seconds to the millisecond, as in wireup.py's start-up table."""
    return f"{value:.3f}"


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}"


# --- the commands -------------------------------------------------------------------------------


def commands(size: int, chosen: Sequence[str], mpiexec: str | None) -> dict[str, list[str]]:
    """name -> argv of the instances to time at this size, `start` first."""
    found = {"start": [str(TBON), "start", f"--test-size={size}", "true"]}
    if "alloc" in chosen:
        found["alloc"] = [str(TBON), "alloc", "-N", str(size), "--launcher", "local", "true"]
    if "mpiexec" in chosen and mpiexec is not None:
        found["mpiexec"] = [mpiexec, "-n", str(size), str(TBON), "broker", "true"]
    return found


def session_alive(pgid: int) -> bool:
    """Whether anything is left in the session (process group) of the command we started."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_session(process: subprocess.Popen[bytes]) -> None:
    """If the command or anything in its session is still there: SIGTERM to the session, wait
    STOP_GRACE_S for the command, then SIGKILL what is left. Always reap the command."""
    if process.poll() is None or session_alive(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            progress(f"pid {process.pid} ignored SIGTERM for {STOP_GRACE_S:g}s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def time_instance(argv: Sequence[str]) -> float:
    """Wall time of one whole instance: from before the Popen of `argv` to its exit, which must
    be 0 with nothing of it left behind; the error carries the end of its log otherwise."""
    shown = " ".join(argv)
    fd, log_path = tempfile.mkstemp(prefix="alloc-cmd-", suffix=".log")
    try:
        started = time.perf_counter()
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True
        )
    except BaseException:
        os.unlink(log_path)
        raise
    finally:
        os.close(fd)
    try:
        try:
            process.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"`{shown}` still running after {RUN_TIMEOUT_S:g}s:\n{log_tail(log_path)}"
            ) from None
        elapsed = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"`{shown}` exited {process.returncode}:\n{log_tail(log_path)}")
        if session_alive(process.pid):
            raise RuntimeError(f"`{shown}` exited 0 but left processes in its session")
        return elapsed
    finally:
        end_session(process)
        with contextlib.suppress(OSError):
            os.unlink(log_path)


# --- the measurement ----------------------------------------------------------------------------


def bench(
    report: Report, sizes: Sequence[int], runs: int, chosen: Sequence[str], mpiexec: str | None
) -> None:
    progress("warm-up: one instance of each at N = 1 (page cache, .pyc)")
    for argv in commands(1, chosen, mpiexec).values():
        time_instance(argv)
    names = list(commands(1, chosen, mpiexec))
    rows = []
    for size in sizes:
        argvs = commands(size, chosen, mpiexec)
        times: dict[str, list[float]] = {name: [] for name in names}
        for run in range(runs):
            turn = run % len(names)
            for name in names[turn:] + names[:turn]:
                times[name].append(time_instance(argvs[name]))
            said = ", ".join(f"{name} {seconds(times[name][-1])} s" for name in names)
            progress(f"N={size} run {run + 1}/{runs}: {said}")
        start = times["start"]
        row = [str(size), seconds(median(start)), seconds(min(start))]
        for name in names[1:]:
            mine = times[name]
            row += [
                seconds(median(mine)),
                seconds(min(mine)),
                f"{ratio(median(mine), median(start))} ({ratio(min(mine), min(start))})",
            ]
        rows.append(row)
    header = ["N", "start median s", "start min s"]
    for name in names[1:]:
        header += [f"{name} median s", f"{name} min s", f"{name} ÷ start, median (min)"]
    report.heading(
        f"A whole instance running `true`: `tbon start` vs `tbon alloc --launcher local`"
        f"{' vs `mpiexec`' if 'mpiexec' in names else ''} ({runs} runs each, interleaved)"
    )
    report.table(header, rows)
    report.note(
        "start: `tbon start --test-size=N true` (one launcher forks the N brokers after its "
        "imports); alloc: `tbon alloc -N N --launcher local true` (one `tbon relay --pmi` and "
        "one `tbon broker` per rank, two fresh interpreters per rank, PMI served by `tbon "
        "alloc`: --launcher ssh minus ssh)"
        + (
            f"; mpiexec: `{mpiexec} -n N tbon broker true` (Hydra serves PMI, one broker per rank)"
            if "mpiexec" in names
            else ""
        )
        + ". Wall time from Popen to exit 0; the ratios divide medians by `tbon start`'s median "
        "and, in brackets, mins by its min."
    )
    if "mpiexec" in chosen and mpiexec is None:
        report.note("`mpiexec` is not on PATH, so no comparison with it was made.")


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--sizes", type=sizes_arg, default=[1, 4, 16], help="default 1,4,16")
    args = parse_args(parser, argv, SECTIONS)
    report = begin("alloc", args.markdown, bytecode_note=True)
    mpiexec = shutil.which("mpiexec")
    if "mpiexec" in args.sections and mpiexec is None:
        progress("`mpiexec` is not on PATH: its column is left out")
    bench(report, args.sizes, args.runs, args.sections, mpiexec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
