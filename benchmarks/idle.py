"""What an idle instance costs (issue 26, "idle is free"): the CPU its brokers use while nothing
happens but heartbeats and the brokers' own clocks.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/idle.py [--sizes 256,2048] [--seconds 30] [--settle 5] [--force]
        [-S tbon.heartbeat=5s ...]

For each size, one `tbon start --test-size=N` instance (wait mode, so its URI is printed once
every broker is online) is left alone for `--settle` seconds (the tail of the wire-up), then the
CPU of every broker (utime + stime of all its threads, ZeroMQ's I/O thread included, from
/proc/PID/stat) is read at the start and the end of `--seconds` seconds. The table gives the
CPU-seconds per second of the whole instance and the milliseconds per second of one broker. The
instance is stopped by PID at the end, pass or fail. Target (issue 26): an idle 2048-rank
instance ≤ 0.1 CPU-s per second in all.

Drives tbon through its CLI only (never `import tbon`), so that compare.py --same-script can run
it against an older checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from common import TBON, begin, parse_args, positive, progress, sizes_arg, tbon_start, verdict

SECTIONS = ("idle",)
TARGET_SIZE = 2048
TARGET_CPU_PER_S = 0.1  # CPU-seconds per second, the whole instance at TARGET_SIZE
TICK = os.sysconf("SC_CLK_TCK")


def broker_pids(uri: str) -> list[int]:
    """Every broker's pid, from `tbon status --json`."""
    done = subprocess.run(
        [str(TBON), "status", uri, "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tbon status failed ({done.returncode}): {done.stderr[-500:]!r}")
    return [r["pid"] for r in json.loads(done.stdout)["ranks"] if r.get("pid")]


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads), in seconds; a broker gone is an error."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of proc(5)


def measure(
    size: int, seconds: float, settle: float, force: bool, attributes: Sequence[str]
) -> tuple[float, int]:
    """CPU-seconds per second of the instance's brokers, idle, and how many brokers there were."""
    progress(f"tbon start --test-size={size} {' '.join(f'-S {a}' for a in attributes)}")
    options = ["--test-exit-timeout=1m"]
    with tbon_start(size, attributes, force=force, options=options) as instance:
        pids = broker_pids(instance.uri)
        if len(pids) != size:
            raise RuntimeError(f"size {size}: status shows {len(pids)} broker pids")
        progress(f"size {size}: all online; settling {settle:g} s")
        time.sleep(settle)  # not a wait for a condition: the quiet spell before we measure
        started, first = time.monotonic(), sum(cpu_seconds(pid) for pid in pids)
        progress(f"size {size}: measuring {seconds:g} s")
        time.sleep(seconds)
        last, ended = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
        if instance.process.poll() is not None:
            raise RuntimeError(f"the instance ended while measured: {instance.stderr_tail()}")
    return (last - first) / (ended - started), len(pids)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[256], help="default 256")
    parser.add_argument("--seconds", type=positive, default=30.0, help="measured (default 30)")
    parser.add_argument(
        "--settle", type=positive, default=5.0, help="idle before measuring (default 5)"
    )
    parser.add_argument("--force", action="store_true", help="pass --force to `tbon start`")
    parser.add_argument(
        "-S",
        "--setattr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a broker attribute for `tbon start`, e.g. -S tbon.heartbeat=5s (repeatable)",
    )
    args = parse_args(parser, argv, SECTIONS, counts=())
    report = begin("idle", args.markdown)
    rows = []
    for size in args.sizes:
        rate, count = measure(size, args.seconds, args.settle, args.force, args.setattr)
        goal = ""
        if size == TARGET_SIZE:
            goal = f"≤ {TARGET_CPU_PER_S:g} {verdict(rate <= TARGET_CPU_PER_S)}"
        rows.append([str(size), f"{rate:.3f}", f"{rate / count * 1000:.3f}", goal])
    given = f" (-S {' -S '.join(args.setattr)})" if args.setattr else ""
    report.heading(f"Idle instance{given}: CPU of every broker over {args.seconds:g} s")
    report.table(["N", "CPU-s per s, all", "ms per s, per broker", "target"], rows)
    report.note(
        f"utime + stime of each broker from /proc/PID/stat (in {1000 // TICK} ms ticks), read "
        f"{args.settle:g} s after every broker is online and again {args.seconds:g} s later."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
