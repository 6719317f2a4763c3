"""`tbon exec` output through heals: lines lost or duplicated across interior kills (issue 21).

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/exec_heal.py [--kills N] [--lines L] [--markdown]

Each kill is a fresh `tbon start --test-size=15 -S tbon.topo=kary:2` in wait mode with short
liveness settings (heartbeat 100 ms, timeout 3 s, reattach timeout 10 s), so that rank 1 has
children (3, 4) and grandchildren (7-10). Once rank 0 pushes every rank online,
`tbon exec -l -r all` runs a shell loop on every rank that prints a numbered line every 20 ms
(L lines, default 150: about 3 s).
Once rank 1 has printed 50 lines (about 1 s in), rank 1's broker is SIGKILLed (its pid
checked to descend from our `tbon start`). When the exec exits, each surviving rank's lines are
checked against 0 .. L-1: a number missing is a line lost, one seen twice a duplicate, one seen
before a smaller one out of order; and rank 1 must be named on stderr. A line lost by a rank that
exec names on stderr (its broker was lost too: on a loaded machine a heal can fail) was lost
with a word; one lost by a rank not named was lost silently. A run is counted bad if a line was
lost silently, duplicated or reordered, or rank 1 went unnamed.

Like flow.py, this script talks to tbon only through its command line and imports nothing of
tbon, so it measures an older checkout too, run with that checkout's interpreter:

    .venv/bin/python benchmarks/compare.py --before /tmp/before --same-script exec_heal.py

Nothing sleeps and hopes: every wait has a deadline; every process started here is reaped by
PID whether the run passes or fails; the only broker signalled is rank 1, checked to be ours.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import TBON, begin, in_tree, parse_args, progress, stop, tbon_start

SIZE = 15
VICTIM = 1
ATTRIBUTES = (
    "tbon.topo=kary:2",
    "tbon.heartbeat=100ms",
    "tbon.torpid=0",
    "tbon.timeout=3s",
    "broker.reattach-timeout=10s",  # a loaded machine's heal still ends in time
)
OPTIONS = ("--test-exit-timeout=2m",)  # the launcher must not end the instance at the kill
KILL_AFTER = 50  # lines every rank has printed before the kill
DEADLINE_S = 60.0  # for the instance to come online, and for the exec to end


def loop(lines: int) -> str:
    return f"i=0; while [ $i -lt {lines} ]; do echo $i; i=$((i+1)); sleep 0.02; done"


@dataclass
class Run:
    lost: int = 0  # silently: by a rank exec did not name
    lost_said: int = 0  # by a rank exec named (its broker was lost)
    duplicated: int = 0
    reordered: int = 0
    victim_named: bool = False
    status: int | None = None
    ranks_hit: list[int] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        return bool(self.lost or self.duplicated or self.reordered or not self.victim_named)


def wait_online(uri: str) -> dict[int, int]:
    """Rank -> pid once every rank is online."""
    argv = [str(TBON), "status", uri, "--wait", "full", "--timeout", f"{DEADLINE_S:g}s", "--json"]
    done = subprocess.run(argv, capture_output=True, timeout=DEADLINE_S + 30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tbon status --wait full exited {done.returncode}: {done.stderr!r}")
    return {r["rank"]: r["pid"] for r in json.loads(done.stdout)["ranks"]}


def one_run(lines: int, number: int) -> Run:
    run = Run()
    with tbon_start(SIZE, ATTRIBUTES, options=OPTIONS) as inst:
        pids = wait_online(inst.uri)
        if not in_tree(pids[VICTIM], inst.process.pid):
            raise RuntimeError(f"rank {VICTIM}'s pid {pids[VICTIM]} is not one of our brokers")
        fd, err_path = tempfile.mkstemp(prefix="exec-heal-", suffix=".log")
        argv = [str(TBON), "exec", inst.uri, "-l", "-r", "all", "sh", "-c", loop(lines)]
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fd
            )
        finally:
            os.close(fd)
        try:
            seen = read_and_kill(process, pids[VICTIM], lines)
            run.status = process.wait(DEADLINE_S)
            stderr = Path(err_path).read_text(errors="replace")
        finally:
            stop(process)
            os.unlink(err_path)
    run.victim_named = f"rank {VICTIM}:" in stderr
    for rank in range(SIZE):
        if rank == VICTIM:
            continue
        got = seen.get(rank, [])
        missing = set(range(lines)) - set(got)
        if f"rank {rank}:" in stderr:
            run.lost_said += len(missing)
            missing = set()
        run.lost += len(missing)
        run.duplicated += len(got) - len(set(got))
        run.reordered += sum(1 for a, b in itertools.pairwise(got) if b < a)
        if missing or len(got) != len(set(got)) or got != sorted(got):
            run.ranks_hit.append(rank)
    progress(
        f"kill {number}: exit {run.status}, lost {run.lost} (and {run.lost_said} by ranks "
        f"named), duplicated {run.duplicated}, "
        f"reordered {run.reordered}, ranks hit {run.ranks_hit}, rank {VICTIM} "
        f"{'named' if run.victim_named else 'NOT named'}"
        + (f"; stderr: {stderr.strip()!r}" if run.bad else "")
    )
    return run


def read_and_kill(
    process: subprocess.Popen[bytes], victim: int, lines: int
) -> dict[int, list[int]]:
    """Every `RANK: N` line of the exec, to EOF; rank `victim` killed once every rank has
    printed KILL_AFTER lines."""
    assert process.stdout is not None
    seen: dict[int, list[int]] = {}
    killed = False
    buffer = b""
    deadline = time.monotonic() + DEADLINE_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("the exec did not end within its deadline")
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            for line in whole:
                rank, _, number = line.decode().partition(": ")
                seen.setdefault(int(rank), []).append(int(number))
            if not killed and len(seen.get(VICTIM, [])) >= KILL_AFTER:
                os.kill(victim, signal.SIGKILL)
                killed = True
    if not killed:
        raise RuntimeError("the exec ended before the kill")
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="interior kills (default 10)")
    parser.add_argument("--lines", type=int, default=150, help="lines per rank (default 150)")
    args = parse_args(parser, argv, ("kill",), counts=("--kills", "--lines"))
    report = begin("exec_heal", args.markdown)
    runs = [one_run(args.lines, n + 1) for n in range(args.kills)]
    report.heading(f"exec output across {args.kills} interior kills (15 ranks kary:2, kill rank 1)")
    report.table(
        ["measure", "value"],
        [
            ["kills", str(len(runs))],
            ["runs: a line lost silently, repeated or reordered", str(sum(r.bad for r in runs))],
            ["lines lost silently", str(sum(r.lost for r in runs))],
            ["lines lost by ranks named lost", str(sum(r.lost_said for r in runs))],
            ["lines duplicated", str(sum(r.duplicated for r in runs))],
            ["lines out of order", str(sum(r.reordered for r in runs))],
            ["runs where rank 1 went unnamed", str(sum(not r.victim_named for r in runs))],
        ],
    )
    report.note(
        f"{SIZE - 1} surviving ranks x {args.lines} lines per kill; target (issue 21): 0 lost, "
        "0 duplicated, rank 1 always named."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
