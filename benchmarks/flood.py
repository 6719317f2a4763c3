"""A connection flood on rank 0's tree port: local `tbon status` latency and rank 0's CPU.

    .venv/bin/python benchmarks/flood.py [--nofile N] [--flood C] [--runs R]

Standard library only (and tests/flooder.py, which is too), so an older checkout is measured
with its own interpreter: `/work/wt/fds24-before/.venv/bin/python benchmarks/flood.py`.

`tbon start --test-size=2` under `prlimit --nofile=N:N` (default 256), rank 0 on 127.0.0.1.
Idle: R (default 10) `tbon status` runs, timed from Popen to exit. Flood: C (default 400)
connections from 127.0.0.2, half silent, half greeting-only, each one closed opened again; after
the flood has hit (rank 0 closed one, or holds N-1 descriptors), R more `tbon status` runs and one
`tbon exec -r all true`, while the flood is pumped. Rank 0's CPU (utime+stime from /proc) per
second of flood. Targets (issue 24): status under flood within 2x idle (medians), CPU bounded.
Every process started is reaped; the flood's sockets are closed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from flooder import Flooder

TBON = str(Path(sys.executable).parent / "tbon")


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(flood: Flooder | None, *argv: str) -> tuple[float, int]:
    start = time.monotonic()
    process = subprocess.Popen([TBON, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while process.poll() is None:
            if time.monotonic() - start > 120:
                raise RuntimeError(f"tbon {argv[0]} took over 120 s")
            if flood is not None:
                flood.pump(0.005)
            else:
                time.sleep(0.005)
        return time.monotonic() - start, process.returncode
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nofile", type=int, default=256)
    parser.add_argument("--flood", type=int, default=400)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    argv = ["prlimit", f"--nofile={args.nofile}:{args.nofile}", "--", TBON, "start"]
    argv += ["--test-size=2", "-S", "tbon.endpoint=tcp://127.0.0.1:*"]
    start = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert start.stdout is not None
        uri = start.stdout.readline().strip()
        endpoint = subprocess.run(
            [TBON, "attr", uri, "get", "tbon.endpoint"], capture_output=True, text=True
        ).stdout
        port = int(endpoint.strip().rsplit(":", 1)[1])
        status = subprocess.run([TBON, "status", "--json", uri], capture_output=True, text=True)
        rank0 = json.loads(status.stdout)["ranks"][0]["pid"]
        idle = [timed(None, "status", uri) for _ in range(args.runs)]
        with Flooder(("127.0.0.1", port), args.flood, source="127.0.0.2") as flood:
            deadline = time.monotonic() + 60
            while flood.closed_by_peer == 0 and len(os.listdir(f"/proc/{rank0}/fd")) < (
                args.nofile - 1
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the flood never hit")
                flood.pump(0.01)
            cpu0, t0 = cpu(rank0), time.monotonic()
            flooded = [timed(flood, "status", uri) for _ in range(args.runs)]
            exec_all = timed(flood, "exec", "-r", "all", uri, "true")
            load = (cpu(rank0) - cpu0) / (time.monotonic() - t0)
            opened = flood.opened
    finally:
        start.terminate()
        try:
            start.wait(timeout=30)
        except subprocess.TimeoutExpired:
            start.kill()
            start.wait()

    def row(name: str, runs: list[tuple[float, int]]) -> str:
        ok = sum(code == 0 for _, code in runs)
        median = statistics.median(seconds for seconds, _ in runs)
        return f"| {name} | {median * 1000:.0f} ms | {ok}/{len(runs)} |"

    print(f"RLIMIT_NOFILE {args.nofile}, flood of {args.flood} from 127.0.0.2 ({opened} opened)")
    print("| what | median | exit 0 |\n|---|---|---|")
    print(row("`tbon status`, idle", idle))
    print(row("`tbon status`, flood", flooded))
    print(row("`tbon exec -r all true`, flood", [exec_all]))
    print(f"| rank 0 CPU during the flood | {load * 100:.1f}% of a core | |")


if __name__ == "__main__":
    main()
