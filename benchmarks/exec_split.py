"""Where the CPU of one `tbon exec -r all true` goes, by kind of process, without a profiler.

    flock /work/wt/heavy.lock .venv/bin/python benchmarks/exec_split.py --size 1024 [--runs 3]

Starts `tbon start --test-size=N` (kary:32) in wait mode, maps each broker's PID to its rank
(`tbon status --json`), runs the CLI once to warm up, then R times, each time reading every
broker's CPU (all its threads' schedstat, in ns) and cutime+cstime (the jobs it reaped, in
ticks) from /proc before and after. Prints the medians: rank 0's own CPU, the interior
brokers', the leaves', the jobs' (their children's), the launcher's, the orphan guards' (one shell
per broker that ran a job, overlay/broker/guard.py, told of each job's start and end; not reaped,
so in no broker's cutime) and the CLI's (RUSAGE_CHILDREN). Idle brokers' burn over the run is
in it too: `--idle S` measures that alone, over S seconds without a run. `--settle S` reads the
CPU S seconds after the CLI ends, so that what the brokers do for the job after its client has
its answers (exec.taken) is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from common import TBON, median, ms, progress, tbon_start, time_command

TICK = os.sysconf("SC_CLK_TCK")


def _times(pid: int) -> tuple[float, float, float]:
    """(own CPU, own stime, reaped children's cutime+cstime) of `pid`, in seconds. Its own CPU
    is every thread's /proc schedstat, in nanoseconds: utime and stime come in ticks (10 ms),
    which a leaf's 1-2 ms per run falls between. Its stime and its children's come in ticks."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return 0.0, 0.0, 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    reaped = int(fields[13]) + int(fields[14])
    return _schedstat(pid), int(fields[12]) / TICK, reaped / TICK


def _schedstat(pid: int) -> float:
    """The CPU time of every thread of `pid`, in seconds (0 if it is gone)."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _guards(brokers: set[int]) -> list[int]:
    """The orphan guards of these brokers: their children that run the guard's script."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        if parent in brokers and b"tbon-job-guard" in cmdline:
            found.append(int(name))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--idle", type=float, default=0.0, help="instead of a run, wait this many seconds"
    )
    parser.add_argument(
        "--settle", type=float, default=0.0, help="read the CPU this long after each run ends"
    )
    args = parser.parse_args()
    with tbon_start(args.size, ["tbon.topo=kary:32"], force=args.size > 1024) as launched:
        argv = [str(TBON), "exec", "-r", "all", launched.uri, "true"]
        status = [str(TBON), "status", "--json", launched.uri]
        progress(f"split: {args.size} brokers up, warming up")
        time_command(argv)
        table = json.loads(subprocess.run(status, capture_output=True, check=True).stdout)
        role = {}
        for entry in table["ranks"]:
            if entry["rank"] == 0:
                role[entry["pid"]] = "rank 0"
            else:
                role[entry["pid"]] = "interior" if entry["children"] else "leaf"
        role.update({pid: "guards" for pid in _guards(set(role))})
        parts: dict[str, list[float]] = {}
        walls = []
        for run in range(args.runs):
            before = {pid: _times(pid) for pid in [*role, launched.process.pid]}
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            if args.idle:
                time.sleep(args.idle)  # what idle brokers burn over as long a window
                walls.append(args.idle)
            else:
                walls.append(time_command(argv))
                time.sleep(args.settle)  # what the brokers do after the client has it all
            after_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            sums: dict[str, float] = {}
            for pid, (cpu, system, reaped) in before.items():
                cpu2, system2, reaped2 = _times(pid)
                kind = role.get(pid, "launcher")
                sums[kind] = sums.get(kind, 0.0) + cpu2 - cpu
                sums[kind + " sys"] = sums.get(kind + " sys", 0.0) + system2 - system
                if kind not in ("launcher", "guards"):
                    sums["jobs"] = sums.get("jobs", 0.0) + reaped2 - reaped
            sums["cli"] = (after_usage.ru_utime + after_usage.ru_stime) - (
                usage.ru_utime + usage.ru_stime
            )
            for kind, value in sums.items():
                parts.setdefault(kind, []).append(value)
            progress(f"split: run {run + 1}: {ms(walls[-1])} ms wall")
    counts = {k: list(role.values()).count(k) for k in ("rank 0", "interior", "leaf", "guards")}
    print(f"size {args.size}: wall median {ms(median(walls))} ms")
    total = 0.0
    for kind in ("rank 0", "interior", "leaf", "jobs", "guards", "launcher", "cli"):
        value = median(parts.get(kind, [0.0]))
        total += value
        each = f" ({value / counts[kind] * 1000:.2f} ms each)" if counts.get(kind) else ""
        system = f", {ms(median(parts[kind + ' sys']))} sys" if kind + " sys" in parts else ""
        print(f"  {kind:9} {ms(value):>8} ms CPU{system}{each}")
    print(f"  {'total':9} {ms(total):>8} ms CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
