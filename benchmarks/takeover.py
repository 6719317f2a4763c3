"""Root takeover benchmark for tbon (issue 23): kill -9 rank 0 and time how a standby takes over.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/takeover.py [--rounds R] [--size N] [--topo kary:K]
        [--standbys K] [--sleep S] [--markdown | --json]

`benchmarks/heal.py --sections takeover` runs the same rounds. Each round is a fresh
`tbon start --test-size=N -S tbon.topo=TOPO -S tbon.standbys=K` in wait mode (defaults: 64
ranks, kary:4, 2 standbys). Once every rank is online, the round:

  1. reads `tbon uri --all` (the root's URI, then each standby's) and every rank's pid;
  2. starts `tbon exec -r G sh -c 'echo started; sleep S; echo done'` through the URI list
     without rank 0's (G: the first leaf of rank 1's subtree), and waits for "started";
  3. SIGKILLs rank 0's broker (checked to be a descendant of our `tbon start`), then runs
     `tbon status --json` through the URI of a broker that is no member of the root group (rank
     K+1) again and again, each after the last one exits, until one answers with a root other
     than 0: the clock stops at that CLI's exit (target: 1 s);
  4. then `tbon exec -r 1-(N-1) true` through the same URI, again and again, until one exits 0
     (target: 2 s after the kill: every other rank attached under the new tree);
  5. waits for the job of step 2 (it must exit 0 having printed "started" then "done"), and
     reads the table again: ranks 1 to N-1 must have kept their pids.

Then, once per run, the steady cost: rank 0's and rank 1's memory (VmRSS) on an idle instance
with K standbys against one with none, started one after the other.

Every wait has a deadline, nothing sleeps and hopes, and every process started is stopped by
PID and reaped, pass or fail; the only broker signalled is rank 0, checked to be ours. Progress
goes to stderr, tables to stdout. No assertion is timed: a missed target is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from common import (
    TBON,
    Instance,
    Report,
    begin,
    in_tree,
    log_tail,
    machine_line,
    median,
    positive,
    proc_kb,
    progress,
    read_line,
    stop,
    tbon_start,
    verdict,
)

TARGET_ANSWER_S = 1.0  # kill -> a new root answers `tbon status` through another broker
TARGET_ATTACHED_S = 2.0  # kill -> `tbon exec -r 1-(N-1) true` exits 0
ONLINE_DEADLINE_S = 60.0
AFTER_KILL_DEADLINE_S = 30.0
CLI_DEADLINE_S = 20.0


@dataclass
class Round:
    """What one round measured; seconds after the kill, None where it was not seen."""

    answered: float | None = None  # a status with a new root, through a non-member's URI
    new_root: int | None = None
    status_attempts: int = 0
    attached: float | None = None  # `tbon exec -r 1-(N-1) true` exits 0
    exec_attempts: int = 0
    last_failure: str = ""
    pids_kept: bool = False
    changed: list[int] = field(default_factory=list)
    job_ok: bool = False
    job_exit: int | None = None
    job_output: str = ""


def run_cli(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """One CLI run with a deadline (killed and reaped past it)."""
    return subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_DEADLINE_S,
        check=False,
        env=env,
    )


def status_of(uri: str) -> dict[str, Any] | None:
    """`tbon status URI --json`, or None while it fails."""
    try:
        done = run_cli([str(TBON), "status", uri, "--json"])
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def wait_online(inst: Instance, size: int) -> dict[str, Any]:
    deadline = time.monotonic() + ONLINE_DEADLINE_S
    while time.monotonic() < deadline:
        status = status_of(inst.uri)
        if status is not None and all(r["state"] == "online" for r in status["ranks"][:size]):
            return status
        if inst.process.poll() is not None:
            raise RuntimeError(f"tbon start exited {inst.process.returncode}: {inst.stderr_tail()}")
    raise RuntimeError(f"not every rank online within {ONLINE_DEADLINE_S:g}s")


def rank_uri(uri: str, rank: int) -> str:
    """The local URI of another broker of the same instance (its socket in the run directory)."""
    head, _, _ = uri.rpartition("/0/local")
    return f"{head}/{rank}/local"


def first_leaf_below(rank: int, size: int, fanout: int) -> int:
    """The first rank of `rank`'s subtree with no children (kary:FANOUT)."""
    while fanout * rank + 1 < size:
        rank = fanout * rank + 1
    return rank


@contextlib.contextmanager
def job(argv: Sequence[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A long exec we started, stopped by PID and reaped on the way out."""
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        yield process
    finally:
        stop(process)
        if process.stderr is not None:
            process.stderr.close()


def one_round(size: int, topo: str, standbys: int, sleep: float, number: int) -> Round:
    result = Round()
    fanout = int(topo.partition(":")[2] or 2)
    attributes = (f"tbon.topo={topo}", f"tbon.standbys={standbys}")
    with tbon_start(size, attributes) as inst:
        before = {r["rank"]: r["pid"] for r in wait_online(inst, size)["ranks"]}
        listed = run_cli([str(TBON), "uri", "--all", inst.uri])
        if listed.returncode != 0:
            raise RuntimeError(f"tbon uri --all exited {listed.returncode}: {listed.stderr}")
        others = ",".join(listed.stdout.strip().split(",")[1:])
        elsewhere = rank_uri(inst.uri, standbys + 1)
        leaf = first_leaf_below(1, size, fanout)
        env = {**os.environ, "TBON_URI": others}
        script = f"echo started; sleep {sleep:g}; echo done"
        with job([str(TBON), "exec", "-r", str(leaf), "sh", "-c", script], env) as running:
            if read_line(running, CLI_DEADLINE_S) != "started":
                raise RuntimeError(f"round {number}: the job printed no 'started'")
            if not in_tree(before[0], inst.process.pid):
                raise RuntimeError(f"rank 0's pid {before[0]} is not one of our brokers")
            killed = time.perf_counter()
            os.kill(before[0], signal.SIGKILL)
            deadline = time.monotonic() + AFTER_KILL_DEADLINE_S
            while time.monotonic() < deadline:
                result.status_attempts += 1
                status = status_of(elsewhere)
                if status is not None and status.get("root", 0) != 0:
                    result.answered = time.perf_counter() - killed
                    result.new_root = status["root"]
                    break
            everyone = f"1-{size - 1}"
            while result.answered is not None and time.monotonic() < deadline:
                result.exec_attempts += 1
                try:
                    done = run_cli([str(TBON), "exec", "-r", everyone, elsewhere, "true"])
                except subprocess.TimeoutExpired:
                    result.last_failure = "timed out"
                    continue
                if done.returncode == 0:
                    result.attached = time.perf_counter() - killed
                    break
                result.last_failure = f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
            try:
                out, _ = running.communicate(timeout=sleep + CLI_DEADLINE_S)
            except subprocess.TimeoutExpired:
                out = b""
            result.job_exit = running.returncode
            result.job_output = out.decode(errors="replace")
            result.job_ok = running.returncode == 0 and result.job_output.split() == ["done"]
        after = status_of(elsewhere)
        if after is not None:
            now = {r["rank"]: r["pid"] for r in after["ranks"]}
            result.changed = [r for r in range(1, size) if now.get(r) != before[r]]
            result.pids_kept = not result.changed
        if result.attached is None:
            tail = log_tail(inst.stderr_path, 5)
            progress(f"round {number}: last failure {result.last_failure}; {tail}")
    return result


def memory_of(size: int, topo: str, standbys: int) -> dict[str, int]:
    """VmRSS of rank 0 and rank 1 (kB) on an idle instance, every rank online."""
    with tbon_start(size, (f"tbon.topo={topo}", f"tbon.standbys={standbys}")) as inst:
        status = wait_online(inst, size)
        pids = {r["rank"]: r["pid"] for r in status["ranks"]}
        return {f"rank {rank}": proc_kb(pids[rank], ("VmRSS",)).get("VmRSS", 0) for rank in (0, 1)}


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def report_tables(
    report: Report,
    rounds: Sequence[Round],
    args: argparse.Namespace,
    memory: dict[str, dict[str, int]],
) -> None:
    report.heading(
        f"Takeover: kill -9 of rank 0, {args.size} ranks, {args.topo}, "
        f"tbon.standbys={args.standbys} (ms after the kill)"
    )
    rows = []
    for number, r in enumerate(rounds, 1):
        rows.append(
            [
                str(number),
                cell(r.answered),
                str(r.new_root),
                cell(r.attached),
                "yes" if r.pids_kept else f"no {r.changed[:8]}",
                "yes" if r.job_ok else f"no ({r.job_exit})",
            ]
        )
    answered = [r.answered for r in rounds if r.answered is not None]
    attached = [r.attached for r in rounds if r.attached is not None]
    rows.append(
        [
            "median",
            cell(median(answered)) if answered else "-",
            "",
            cell(median(attached)) if attached else "-",
            "",
            "",
        ]
    )
    report.table(
        ["round", "new root answers", "root", "exec 1-N true", "pids kept", "sleep's output"], rows
    )
    ok_answer = len(answered) == len(rounds) and max(answered) <= TARGET_ANSWER_S
    ok_attached = len(attached) == len(rounds) and max(attached) <= TARGET_ATTACHED_S
    report.note(
        f"Targets: a new root answers within {TARGET_ANSWER_S * 1000:.0f} ms "
        f"({verdict(ok_answer)}); every rank attached and exec exits 0 within "
        f"{TARGET_ATTACHED_S * 1000:.0f} ms ({verdict(ok_attached)}); pids kept "
        f"({verdict(all(r.pids_kept for r in rounds))}); the sleep's output "
        f"({verdict(all(r.job_ok for r in rounds))})."
    )
    if memory:
        report.heading(f"Steady cost: VmRSS on an idle instance of {args.size} ranks (kB)")
        report.table(
            ["standbys", "rank 0", "rank 1"],
            [[k, str(v["rank 0"]), str(v["rank 1"])] for k, v in memory.items()],
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh instances (default 3)")
    parser.add_argument("--size", type=int, default=64, help="ranks (default 64)")
    parser.add_argument("--topo", default="kary:4", help="tbon.topo (default kary:4)")
    parser.add_argument("--standbys", type=int, default=2, help="tbon.standbys (default 2)")
    parser.add_argument("--sleep", type=positive, default=2.0, help="the job's sleep (default 2)")
    parser.add_argument("--no-memory", action="store_true", help="skip the steady-cost table")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="print GitHub tables")
    output.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.standbys not in (2, 4) or args.size < args.standbys + 3:
        parser.error("--standbys must be 2 or 4, and --size at least standbys + 3")
    if not TBON.exists():
        parser.error(f"no tbon console script at {TBON}: run with the project's .venv/bin/python")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """The rounds and the memory table, reported (heal.py's `takeover` section calls this)."""
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            begin("takeover", markdown=False)
        report = None
    else:
        report = begin("takeover", args.markdown)
    rounds = []
    for number in range(1, args.rounds + 1):
        progress(f"round {number}/{args.rounds}: {args.size} ranks, {args.topo}")
        rounds.append(one_round(args.size, args.topo, args.standbys, args.sleep, number))
        progress(f"round {number}: {asdict(rounds[-1])}")
    memory: dict[str, dict[str, int]] = {}
    if not getattr(args, "no_memory", False):
        for standbys in (0, args.standbys):
            memory[str(standbys)] = memory_of(args.size, args.topo, standbys)
    if report is None:
        found = {
            "machine": machine_line(),
            "size": args.size,
            "topo": args.topo,
            "standbys": args.standbys,
            "units": "seconds after the kill; memory in kB",
            "targets": {"answered": TARGET_ANSWER_S, "attached": TARGET_ATTACHED_S},
            "rounds": [asdict(r) for r in rounds],
            "memory": memory,
        }
        print(json.dumps(found, indent=2), flush=True)
        return 0
    report_tables(report, rounds, args, memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
