"""`tbon retire` benchmarks: retiring one leaf, and 16 leaves at once.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/retire.py [--runs R] [--markdown] [--sections leaf,many]

Every retire is timed from the Popen of the real `tbon retire URI RANKS` CLI (the console script
next to sys.executable, stdin /dev/null) to the first status snapshot that rank 0 pushes (a client
subscribed with status.watch BEFORE the Popen; no polling) showing every rank asked for `vacant`
with `"retired": true`; the CLI's own wall time, from Popen to its exit (which must be 0), is
reported too. Its exit is timed when it happens, by a thread blocked in Popen.wait(), not when
the benchmark next looks. Every run uses a fresh `tbon start` instance in wait mode, every rank
online before the clock starts. Nothing here sleeps and hopes: every wait has a deadline, and
every process this script starts (the `tbon start` launchers, the `tbon retire` and `tbon status`
CLIs) is reaped by PID whether the benchmark passes or fails: a CLI still running at its deadline
is SIGKILLed, and the launcher gets SIGTERM (the instance shuts down with it). Progress goes to
stderr, tables to stdout (`--markdown` for GitHub tables, e.g. for the README).

Sections (select with --sections):
  leaf  size 4 (fanout 2), all launched: `tbon retire URI 3` (rank 3, a leaf under rank 1)
  many  size 17 (fanout 16), all launched: `tbon retire URI 1-16` (every leaf under rank 0)

For context, each section also times `tbon status URI` (the same instance, before the retire):
a CLI that starts, asks rank 0 one question and exits, i.e. the process start-up a retire pays.

Only the standard library, tbon itself and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from common import (
    STAT_HEADER,
    TBON,
    Instance,
    Report,
    Watch,
    all_online,
    begin,
    log_tail,
    median,
    ms,
    parse_args,
    progress,
    stat_row,
    tbon_start,
    time_command,
)

RETIRE_DEADLINE_S = 30.0  # for the instance to be online, and for a retire to show and exit
SECTIONS = ("leaf", "many")

# name -> (test size, fanout, ranks to retire, as the CLI is given them)
CASES = {
    "leaf": (4, 2, [3], "3"),
    "many": (17, 16, list(range(1, 17)), "1-16"),
}


# --- the `tbon retire` CLI, its exit timed as it happens ----------------------------------------


@dataclass
class Retirer:
    """A `tbon retire` we started. A thread blocks in Popen.wait() (no timeout, so no polling
    loop) and notes perf_counter() the moment it returns: the CLI may exit before or after rank 0's
    snapshot arrives, and either way its wall time is exact."""

    process: subprocess.Popen[bytes]
    started: float  # time.perf_counter() just before the Popen
    log_path: str  # its stdout and stderr
    exited: float | None = None  # time.perf_counter() when it exited
    waiter: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _wait(self) -> None:
        self.process.wait()
        self.exited = time.perf_counter()

    def log_tail(self, lines: int = 10) -> str:
        return log_tail(self.log_path, lines)

    def check(self) -> None:
        """Fail at once if the CLI exited non-zero while we wait for rank 0's snapshot."""
        if self.exited is not None and self.process.returncode != 0:
            raise RuntimeError(
                f"`tbon retire` exited {self.process.returncode}:\n{self.log_tail()}"
            )

    def wall(self, deadline: float) -> float:
        """Its wall time, once it has exited 0 (waiting for that until `deadline`)."""
        self.waiter.join(max(0.0, deadline - time.monotonic()))
        if self.waiter.is_alive():
            raise RuntimeError(f"`tbon retire` still running at the deadline:\n{self.log_tail()}")
        self.check()
        assert self.exited is not None
        return self.exited - self.started


@contextlib.contextmanager
def retire_cli(uri: str, ranks: str) -> Iterator[Retirer]:
    """Popen `tbon retire URI RANKS`; the clock starts at Popen. On the way out, always, a CLI
    still running is SIGKILLed (by PID) and reaped, and its log removed."""
    argv = [str(TBON), "retire", uri, ranks]
    fd, log_path = tempfile.mkstemp(prefix="retire-cli-", suffix=".log")
    try:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
    except BaseException:
        os.unlink(log_path)
        raise
    finally:
        os.close(fd)
    cli = Retirer(process, started, log_path)
    try:
        yield cli
    finally:
        if cli.waiter.is_alive():
            process.kill()
        cli.waiter.join()  # returns as soon as the process is reaped
        with contextlib.suppress(OSError):
            os.unlink(log_path)


# --- one run ------------------------------------------------------------------------------------


@dataclass
class RetireTimes:
    first: float  # Popen -> first snapshot showing any of the ranks vacant (retired)
    retired: float  # Popen -> first snapshot showing all of them vacant (retired)
    cli: float  # Popen -> the CLI's exit (0)
    status: float  # `tbon status URI` wall time on the same instance, before the retire


def is_retired(entry: dict[str, Any]) -> bool:
    return entry["state"] == "vacant" and entry.get("retired") is True


def wait_online(inst: Instance, watch: Watch, size: int, deadline: float) -> dict[str, Any]:
    """The first snapshot with every rank online (or a clear error with the launcher's log)."""

    def up(snapshot: dict[str, Any]) -> bool:
        return len(snapshot["ranks"]) == size and all_online(snapshot)

    try:
        _, snapshot = watch.until(deadline, up)
    except TimeoutError:
        raise RuntimeError(
            f"size {size}: not all ranks online within {RETIRE_DEADLINE_S:g}s; "
            f"launcher said: {inst.stderr_tail()}"
        ) from None
    return snapshot


def retire_once(name: str) -> RetireTimes:
    """A fresh instance, every rank online; `tbon status` once; then watch, Popen `tbon retire`,
    and time until rank 0 pushes every rank asked for vacant and retired, and until the CLI
    exits 0."""
    from tbon.overlay.connectors.client import Client

    size, fanout, ranks, idset = CASES[name]
    with tbon_start(size, [f"tbon.fanout={fanout}"]) as inst, Client(inst.uri) as client:
        watch = Watch(client)
        deadline = time.monotonic() + RETIRE_DEADLINE_S
        snapshot = wait_online(inst, watch, size, deadline)
        for rank in ranks:
            entry = snapshot["ranks"][rank]
            if entry["children"] or not entry["pid"]:
                raise RuntimeError(f"rank {rank} is not an online leaf: {entry}")
        status = time_command([str(TBON), "status", inst.uri])
        deadline = time.monotonic() + RETIRE_DEADLINE_S
        with retire_cli(inst.uri, idset) as cli:
            first = None
            while True:
                arrived, snapshot = watch.next(deadline, cli.check)
                done = [is_retired(snapshot["ranks"][rank]) for rank in ranks]
                if first is None and any(done):
                    first = arrived
                if all(done):
                    break
            wall = cli.wall(deadline)
        assert first is not None
        return RetireTimes(first - cli.started, arrived - cli.started, wall, status)


# --- the sections -------------------------------------------------------------------------------


def bench(report: Report, runs: int, name: str) -> None:
    size, fanout, ranks, idset = CASES[name]
    results = []
    for run in range(runs):
        times = retire_once(name)
        results.append(times)
        progress(
            f"{name}: run {run + 1}/{runs}: retired {ms(times.retired)} ms, "
            f"CLI exit {ms(times.cli)} ms, `tbon status` {ms(times.status)} ms"
        )
    retired = [t.retired for t in results]
    cli = [t.cli for t in results]
    status = [t.status for t in results]
    which = f"rank {idset}" if len(ranks) == 1 else f"ranks {idset}"
    every = "" if len(ranks) == 1 else "all of "
    rows = [stat_row(f"Popen → {every}{which} vacant (retired) pushed", retired)]
    if len(ranks) > 1:
        rows.append(stat_row("  Popen → first rank vacant (retired)", [t.first for t in results]))
    rows += [
        stat_row(f"`tbon retire URI {idset}`: Popen → exit 0", cli),
        stat_row("  snapshot pushed → CLI exit", [t.cli - t.retired for t in results]),
        stat_row("for context: `tbon status URI`: Popen → exit 0", status),
    ]
    leaves = "a leaf of rank 1" if name == "leaf" else "every leaf of rank 0, at once"
    report.heading(f"Retire {which}: {leaves} (size {size}, fanout {fanout}), {runs} runs")
    report.table(STAT_HEADER, rows)
    report.note(
        f"Ratios of medians: `tbon retire` / `tbon status` {median(cli) / median(status):.2f}; "
        f"rank 0's snapshot / `tbon status` {median(retired) / median(status):.2f}. Both CLIs "
        "start an interpreter and import tbon before they send anything, so most of either is "
        "start-up; the difference is what retiring costs (the order down the tree, the brokers "
        "leaving, rank 0 settling the table). `snapshot pushed → CLI exit` is the CLI's exit "
        "after rank 0's snapshot (negative: it exited first)."
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    args = parse_args(parser, argv, SECTIONS)
    report = begin("retire", args.markdown, bytecode_note=True)
    progress("warm-up: one leaf retire (page cache, .pyc)")
    retire_once("leaf")
    for name in args.sections:
        bench(report, args.runs, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
