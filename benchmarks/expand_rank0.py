"""Rank 0's own CPU while `tbon expand -n N` brings N brokers into an instance of rank 0 alone.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/expand_rank0.py [--sizes 256,1024]
        [--runs 1] [--markdown]

For each size: `tbon start --test-size=1 -S size=N+1` (wait mode), then `tbon expand URI -n N`;
rank 0's CPU (every thread's run time, /proc/PID/task/*/schedstat, in ns rather than utime's
10 ms ticks) is read just before expand starts and just after it exits, and expand's wall time
is kept. Every join goes through rank 0 (its allocation, its parent's order, its Online), so the
CPU per join is what rank 0 pays for one FLUB join, the joiners' own boot aside.
`profile_expand.py` shows where it goes. Each joiner's time queued for a CPU (schedstat's second
field) and the machine's idle share during the expand (/proc/stat) say whether expand waited
for cores or for something else (session 20: for cores; the machine had none idle). Drives
tbon through its CLI only (never `import tbon`), so that compare.py --same-script can run it
against an older checkout.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common import TBON, begin, median, parse_args, progress, sizes_arg, stop, tbon_start


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


def rank0_of(launcher: int, size: int) -> int:
    """The PID of rank 0 among the launcher's descendants, by the title a broker shows."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pending = [launcher]
        while pending:
            pid = pending.pop()
            pending += children_of(pid)
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if f"rank 0/{size}".encode() in title:
                return pid
        time.sleep(0.05)  # polled under a deadline: the title is set as the broker boots
    raise RuntimeError("no rank 0 among the launcher's descendants")


def cpu_ns(pid: int, field: int = 0) -> tuple[int, int]:
    """The run time so far, in ns (schedstat's first field; `field` 1: the time spent runnable
    but queued for a CPU), of every thread of `pid` and of its main thread alone (the event
    loop; the others are ZeroMQ's: I/O and CURVE)."""
    total = main = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            used = int(Path(path).read_text().split()[field])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the glob and the read
        total += used
        main += used if path == f"/proc/{pid}/task/{pid}/schedstat" else 0
    return total, main


def machine_ticks() -> tuple[int, int]:
    """(idle, all) clock ticks of the whole machine so far (/proc/stat's cpu line): whether the
    cores had time to spare during the expand, whoever else ran meanwhile."""
    fields = [int(word) for word in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def joiners_cpu(uri: str) -> tuple[float, float]:
    """The CPU so far (every thread's, schedstat) of the brokers other than rank 0, and their
    time queued for a CPU meanwhile, in s: what the joiners spent to boot and join, and what
    they waited for a core, read once all are online."""
    import json

    shown = subprocess.run(
        [str(TBON), "status", uri, "--json"], capture_output=True, text=True, check=True
    )
    ranks = json.loads(shown.stdout)["ranks"]
    entries = ranks.values() if isinstance(ranks, dict) else ranks
    pids = [e.get("pid") for e in entries if isinstance(e, dict) and e.get("rank") != 0]
    ours = [pid for pid in pids if isinstance(pid, int)]
    return sum(cpu_ns(pid)[0] for pid in ours) / 1e9, sum(cpu_ns(pid, 1)[0] for pid in ours) / 1e9


def one(size: int) -> tuple[float, float, float, float, float, float, float]:
    """(rank 0's CPU, its main thread's, expand's wall time, the CPU of expand and its forker,
    the joiners' CPU, their time queued for a CPU), in s, and the machine's idle share of the
    expand, for one expand of `size` joiners."""
    with tbon_start(1, [f"size={size + 1}"], options=["--test-exit-timeout=1m"]) as instance:
        rank0 = rank0_of(instance.process.pid, size + 1)
        argv = [str(TBON), "expand", instance.uri, "-n", str(size), "--timeout", "5m"]
        before = cpu_ns(rank0)
        ticks = machine_ticks()
        started = time.monotonic()
        expand = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            _, status, usage = os.wait4(expand.pid, 0)
            expand.returncode = code = os.waitstatus_to_exitcode(status)
        finally:
            stop(expand)
        took = time.monotonic() - started
        idle, every = (b - a for a, b in zip(ticks, machine_ticks(), strict=True))
        after = cpu_ns(rank0)
        itself = usage.ru_utime + usage.ru_stime  # with the forker, a child it reaped
        used, loop = (after[0] - before[0]) / 1e9, (after[1] - before[1]) / 1e9
        if code != 0:
            raise RuntimeError(f"tbon expand -n {size} exited {code}")
        joiners, queued = joiners_cpu(instance.uri)
        spare = idle / max(1, every)
        progress(
            f"expand -n {size}: {took:.2f} s, rank 0 {used:.3f} CPU-s, expand and forker "
            f"{itself:.2f}, joiners {joiners:.2f} (queued {queued:.2f}), machine idle {spare:.0%}"
        )
        return used, loop, took, itself, joiners, queued, spare


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[256, 1024], help="default 256,1024")
    parser.add_argument("--runs", type=int, default=1, help="runs of each size (default 1)")
    args = parse_args(parser, argv, ("expand",))
    report = begin("expand_rank0", args.markdown)
    rows = []
    for size in args.sizes:
        runs = [one(size) for _ in range(args.runs)]
        cpu = median([run[0] for run in runs])
        loop = median([run[1] for run in runs])
        wall = median([run[2] for run in runs])
        itself = median([run[3] for run in runs])
        joiners = median([run[4] for run in runs])
        queued = median([run[5] for run in runs])
        spare = median([run[6] for run in runs])
        per_join = f"{cpu / size * 1e6:.0f}"
        rows.append(
            [
                str(size),
                f"{cpu:.3f}",
                per_join,
                f"{loop:.3f}",
                f"{wall:.2f}",
                f"{itself:.2f}",
                f"{joiners / size * 1e3:.1f}",
                f"{queued / size * 1e3:.0f}",
                f"{spare * 100:.0f}",
            ]
        )
    report.heading("Rank 0 during `tbon expand -n N` (rank 0 alone before)")
    header = [
        "joiners",
        "rank 0 CPU s",
        "µs per join",
        "its loop's CPU s",
        "expand wall s",
        "expand+forker CPU s",
        "ms CPU per joiner",
        "ms queued per joiner",
        "machine idle %",
    ]
    report.table(header, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
