"""`tbon status` on a large, mostly vacant instance (issue 26): how long each view takes, how
much rank 0 holds, and how much the `--json` CLI holds while it writes the table.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/status.py [--test-size N] [--size S] [--runs R] [--markdown]

One `tbon start --test-size=N -S size=S` instance (wait mode: N brokers online, the other S-N
ranks spares) is started and stopped by PID at the end, pass or fail; every timed command is
reaped. Each round runs, against it, `tbon status --summary`, `--errors`, the tree (`tbon
status`, collapsed where ranks read the same) and `--json` (its output to /dev/null), and the
table gives the medians of the wall times, with the largest resident set of the `--json`
process; then rank 0's resident set (VmRSS, and its peak VmHWM, from /proc) once every command
ran. `tbon ping 0` shows the floor, what any command costs on this machine now. Each round
then runs `tbon expand --ranks S-1` (which starts brokers for the vacant ranks above it too) and
times its joiner, from the process's start (/proc/PID/stat, to 10 ms) to expand's exit once rank
0 showed it online, and retires what it started, deepest first. Targets (issue 26) at S =
262,144, N = 64: rank 0 ≤ 128 MB, `--summary` ≤ 0.2 s, the tree ≤ 1 s, `--json` ≤ 3 s, the
joiner online ≤ 0.5 s after it starts.

Drives tbon through its CLI only (never `import tbon`), so that compare.py --same-script can run
it against an older checkout, whose `tbon start` refuses a size above its limit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence

from common import TBON, begin, median, parse_args, positive, proc_kb, progress, tbon_start

SECTIONS = ("status",)
VIEWS = (
    ("`tbon ping 0` (the floor: a CLI, one round trip)", ["ping"], None),
    ("`tbon status --summary`", ["--summary"], 0.2),
    ("`tbon status --errors`", ["--errors"], None),
    ("`tbon status` (the tree)", [], 1.0),
    ("`tbon status --json` > /dev/null", ["--json"], 3.0),
)


def run(argv: list[str], deadline: float = 300.0) -> tuple[float, int, bytes]:
    """Wall time of `argv`, its peak resident set (kB, from wait4), the start of its output
    (up to 4 kB: the rest goes to /dev/null)."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert process.stdout is not None
    head = process.stdout.read(4096)
    with open(os.devnull, "wb") as null:
        while chunk := process.stdout.read(1 << 20):
            null.write(chunk)
    process.stdout.close()
    try:
        _pid, status, usage = os.wait4(process.pid, 0)
    except ChildProcessError:  # already reaped
        status, usage = 0, None
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {process.returncode}")
    if elapsed > deadline:
        raise RuntimeError(f"`{' '.join(argv)}` took {elapsed:.1f}s")
    return elapsed, usage.ru_maxrss if usage is not None else 0, head


def rank0_pid(uri: str) -> int:
    """Rank 0's broker pid: the first entry of the JSON table."""
    _elapsed, _rss, head = run([str(TBON), "status", uri, "--json"])
    found = re.search(rb'"rank":0,"state":"\w+","host":"[^"]*","pid":(\d+)', head)
    if found is None:
        raise RuntimeError(f"no rank 0 pid in {head[:200]!r}")
    return int(found.group(1))


def started_at(pid: int) -> float:
    """When process `pid` started, in seconds since boot (CLOCK_BOOTTIME)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def expand_highest(uri: str, size: int) -> tuple[float, float]:
    """`tbon expand --ranks size-1`: its wall time, and its joiner's time from its start to
    expand's exit (online); then every rank it joined retired, deepest first."""
    import json

    began = time.perf_counter()
    process = subprocess.run(
        [str(TBON), "expand", uri, "--ranks", str(size - 1), "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    done = time.clock_gettime(time.CLOCK_BOOTTIME)
    elapsed = time.perf_counter() - began
    if process.returncode != 0:
        raise RuntimeError(f"tbon expand exited {process.returncode}: {process.stderr[-400:]!r}")
    joined = json.loads(process.stdout)["joined"]
    highest = next(j for j in joined if j["rank"] == size - 1)
    online = done - started_at(highest["pid"])
    for rank in sorted((j["rank"] for j in joined), reverse=True):
        run([str(TBON), "retire", uri, str(rank)])
    return elapsed, online


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--test-size", type=int, default=64, help="brokers (default 64)")
    parser.add_argument("--size", type=int, default=262144, help="ranks (default 262144)")
    parser.add_argument("--topo", default="kary:32", help="tbon.topo (default kary:32)")
    parser.add_argument(
        "--deadline", type=positive, default=300.0, help="seconds a command may take"
    )
    args = parse_args(parser, argv, SECTIONS)
    report = begin("status", args.markdown)
    attributes = [f"size={args.size}", f"tbon.topo={args.topo}"]
    progress(f"tbon start --test-size={args.test_size} -S {' -S '.join(attributes)}")
    times: dict[str, list[float]] = {label: [] for label, _flags, _target in VIEWS}
    json_rss: list[int] = []
    expands: list[float] = []
    onlines: list[float] = []
    with tbon_start(args.test_size, attributes, options=["--test-exit-timeout=1m"]) as instance:
        pid = rank0_pid(instance.uri)
        for round_ in range(args.runs):
            progress(f"round {round_ + 1} of {args.runs}")
            for label, flags, _target in VIEWS:
                command = (
                    ["ping", instance.uri, "0"]
                    if flags == ["ping"]
                    else ["status", instance.uri, *flags]
                )
                elapsed, rss, _head = run([str(TBON), *command])
                times[label].append(elapsed)
                if "--json" in flags:
                    json_rss.append(rss)
            elapsed, online = expand_highest(instance.uri, args.size)
            expands.append(elapsed)
            onlines.append(online)
        memory = proc_kb(pid, ["VmRSS", "VmHWM"])
    report.heading(
        f"tbon status, {args.size} ranks ({args.test_size} online, {args.topo}), "
        f"medians of {args.runs}"
    )
    rows = []
    for label, _flags, target in VIEWS:
        goal = f"≤ {target:g} s" if target is not None and args.size == 262144 else ""
        rows.append([label, f"{median(times[label]):.3f} s", goal])
    rows.append(["`--json` CLI, peak RSS, MB", f"{median(json_rss) / 1024:.1f}", ""])
    rows.append([f"`tbon expand --ranks {args.size - 1}`", f"{median(expands):.3f} s", ""])
    goal = "≤ 0.5 s" if args.size == 262144 else ""
    rows.append(["its joiner: started -> online", f"{median(onlines):.3f} s", goal])
    goal = "≤ 128" if args.size == 262144 else ""
    rows.append(["rank 0 RSS after the rounds, MB", f"{memory.get('VmRSS', 0) / 1024:.1f}", goal])
    rows.append(["rank 0 peak RSS (VmHWM), MB", f"{memory.get('VmHWM', 0) / 1024:.1f}", ""])
    report.table(["measure", "value", "target"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
