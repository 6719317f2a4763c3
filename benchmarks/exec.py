"""`tbon exec` benchmarks: latency of `tbon exec -r all true` and output throughput.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/exec.py [--runs R] [--markdown] [--sections latency,...]

Every measurement is taken against an instance that is already up (`tbon start --test-size=N` in
wait mode, every rank online before the clock starts) and the real `tbon` console script next to
sys.executable. Nothing here sleeps and hopes: every wait has a deadline, and every process this
script starts (the `tbon start` launchers, the `tbon exec` CLIs, `flux start`) is reaped by PID
whether the benchmark passes or fails. Progress goes to stderr, tables to stdout (`--markdown` for
GitHub tables, e.g. for the README).

Sections (select with --sections):
  latency     for N = 1, 4, 16, 64 (kary:32, the default) and 16, 64 in kary:2 (to show depth):
              wall time of the real CLI `tbon exec -r all URI true` (stdin /dev/null), and the
              same fan-out timed in-process with tbon's Client (exec.start to rank 0, clock
              stops at the last rank's exit), so that CLI start-up and fan-out can be told apart;
              plus the CLI floor (`tbon --version`, `tbon exec --help`, and `tbon exec` parsing
              its arguments then failing to connect to a URI nobody serves). Target: 64 ranks
              in under 0.3 s.
  throughput  100 MB of output in 100-byte lines (`yes LINE | head -c BYTES`): 4 ranks x 25 MB,
              1 rank x 100 MB on rank 0 (no hop) and on rank 3 (one hop), through the CLI with
              its stdout on /dev/null (runs: --throughput-runs) and through an in-process Client
              that discards what it receives; the floor is the same 100 MB through a local pipe.
  flux        `flux exec -r all true` in `flux start --test-size=N` for the same N and topologies,
              if `flux` is on PATH; otherwise one line saying no comparison was made.
  scale       large instances (kary:32), each command beside its target: `tbon exec -r all URI
              true` at N=64 (Flux's 0.124 s on this machine) and N=1024 (1.5 s), and `tbon status
              --json URI` at N=2048 (0.2 s); wall time, and the CPU (user+sys) of the whole
              instance and the CLI while it ran, which says more than wall time on a shared
              machine. One instance at a time (2048 brokers take about 4 GB).

Only the standard library, tbon itself and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from common import (
    RUN_DEADLINE_S,
    STOP_GRACE_S,
    TBON,
    Instance,
    Report,
    Watch,
    all_online,
    begin,
    median,
    ms,
    parse_args,
    progress,
    spread,
    tbon_start,
    time_command,
    verdict,
)

TARGET_64_S = 0.3  # `tbon exec -r all true` on 64 ranks, instance already up

# (size, topology) pairs for the latency section: the default kary:32 is flat up to 33 ranks,
# kary:2 makes the same sizes deep (16 ranks: 4 levels below rank 0 ... 64 ranks: 6).
LATENCY_CASES = [
    (1, "kary:32"),
    (4, "kary:32"),
    (16, "kary:32"),
    (64, "kary:32"),
    (16, "kary:2"),
    (64, "kary:2"),
]

LINE_BYTES = 100  # every output line is 99 'x' and a newline, so every line is whole
TOTAL_BYTES = 100_000_000  # "100 MB": decimal megabytes throughout
# (label, instance size, -r RANKS, bytes per rank)
THROUGHPUT_CASES = [
    ("4 ranks x 25 MB", 4, "all", TOTAL_BYTES // 4),
    ("1 rank x 100 MB (rank 0, no hop)", 4, "0", TOTAL_BYTES),
    ("1 rank x 100 MB (rank 3, one hop)", 4, "3", TOTAL_BYTES),
]

ONLINE_DEADLINE_S = 120.0  # for every rank to show online (2048 brokers take ~20 s)
SECTIONS = ("latency", "throughput", "flux", "scale")

# (what, instance size, the command after `tbon`, with URI for the instance's, target in s)
SCALE_CASES = [
    ("`tbon exec -r all URI true`", 64, ["exec", "-r", "all", "URI", "true"], 0.124),
    # between the two, to see how the cost grows (the 1024 target, as a bound)
    ("`tbon exec -r all URI true`", 256, ["exec", "-r", "all", "URI", "true"], 1.5),
    ("`tbon exec -r all URI true`", 1024, ["exec", "-r", "all", "URI", "true"], 1.5),
    ("`tbon status --json URI`", 2048, ["status", "--json", "URI"], 0.2),
]


# --- an instance in wait mode, every rank online ------------------------------------------------


@dataclass
class Tree:
    """An instance whose ranks are all online, and how deep each rank sits in its tree."""

    uri: str
    rank_depth: dict[int, int]  # rank -> hops from rank 0

    @property
    def depth(self) -> int:
        """Levels below rank 0."""
        return max(self.rank_depth.values())


@contextlib.contextmanager
def instance(size: int, topology: str) -> Iterator[Tree]:
    """`tbon start --test-size=N -S tbon.topo=T` in wait mode, every rank online, so that no
    measurement includes wire-up; stopped (by PID) on the way out, always."""
    with tbon_start(size, [f"tbon.topo={topology}"]) as launched:
        yield Tree(launched.uri, _wait_online(launched, size))


def _wait_online(inst: Instance, size: int) -> dict[int, int]:
    """Wait (status.watch, no polling) until all ranks are online; return each rank's depth."""
    from tbon.overlay.connectors.client import Client

    def up(snapshot: dict[str, Any]) -> bool:
        return len(snapshot["ranks"]) == size and all_online(snapshot)

    with Client(inst.uri) as client:
        try:
            _, snapshot = Watch(client).until(time.monotonic() + ONLINE_DEADLINE_S, up)
        except TimeoutError:
            raise RuntimeError(
                f"size {size}: not all ranks online within {ONLINE_DEADLINE_S:g}s; "
                f"launcher said: {inst.stderr_tail()}"
            ) from None
    return _depths(snapshot["ranks"])


def _depths(ranks: Sequence[dict[str, Any]]) -> dict[int, int]:
    parent = {r["rank"]: r["parent"] for r in ranks}
    depths = {}
    for start in parent:
        rank, hops = start, 0
        while parent.get(rank) is not None and hops <= len(parent):
            rank, hops = parent[rank], hops + 1
        depths[start] = hops
    return depths


# --- the fan-out, in-process --------------------------------------------------------------------


@dataclass
class Fanout:
    total: float  # exec.start sent -> last rank's exit received
    first: float  # exec.start sent -> first rank's exit received
    received: int  # bytes of output received (all ranks, both streams)
    exits: dict[int, float]  # rank -> exec.start sent -> its exit received


try:
    from tbon.overlay.wire.flow import MESSAGE_COST as _MESSAGE_COST
    from tbon.overlay.wire.flow import output_window as _window
except ImportError:  # a tbon from before flow control (benchmarks/compare.py)
    _MESSAGE_COST = 0

    def _window(targets: int) -> int:
        return 0


def online_ranks(client: Any) -> list[int]:
    status = client.rpc("status.get", nodeid=0)
    return [e["rank"] for e in status["ranks"] if e["state"] == "online"]


def fan_out(client: Any, argv: Sequence[str], targets: Sequence[int]) -> Fanout:
    """exec.start as cli/exec.py sends it; wait for every target's exit (each must be 0).
    Output is discarded, and credited back as the CLI does once it has written it."""
    clock = time.perf_counter
    pending = set(targets)
    received = 0
    exits: dict[int, float] = {}
    window, owed = _window(len(targets)), dict.fromkeys(targets, 0)
    job = uuid.uuid4().hex
    started = clock()
    tag = client.send(
        "exec.start",
        {"id": job, "argv": list(argv), "cwd": None, "targets": list(targets), "window": window},
        nodeid=0,
    )
    deadline = time.monotonic() + RUN_DEADLINE_S
    while pending:
        left = deadline - time.monotonic()
        reply = client.receive(left) if left > 0 else None
        if reply is None:
            raise RuntimeError(f"exec.start: no exit from ranks {sorted(pending)} in time")
        if reply.tag != tag:
            continue
        if reply.errnum:
            raise RuntimeError(f"exec.start failed: {reply.errstr}")
        payload = reply.payload
        if "data" in payload:  # a tbon from before the data frame (benchmarks/compare.py)
            received += len(payload["data"])
        elif "stream" in payload:
            received += len(reply.data)
            rank = payload["rank"]
            owed[rank] += len(reply.data) + _MESSAGE_COST
            if owed[rank] * 4 >= window:
                client.send("exec.credit", {"id": job, "bytes": owed[rank]}, nodeid=rank)
                owed[rank] = 0
        elif "exit" in payload:
            if payload["exit"] != 0:
                raise RuntimeError(f"rank {payload['rank']} exited {payload['exit']}")
            pending.discard(payload["rank"])
            exits[payload["rank"]] = clock() - started
        elif "error" in payload:
            raise RuntimeError(f"rank {payload['rank']}: {payload['error']}")
    total = clock() - started
    return Fanout(total, min(exits.values(), default=total), received, exits)


def by_depth(runs: Sequence[Fanout], rank_depth: dict[int, int]) -> str:
    """For each level of the tree: the median over runs of that level's last exit, in ms."""
    levels = sorted(set(rank_depth.values()))
    cells = []
    for level in levels:
        ranks = [r for r, d in rank_depth.items() if d == level]
        last = [max(run.exits[r] for r in ranks) for run in runs]
        cells.append(f"d{level}: {ms(median(last))}")
    return " · ".join(cells)


# --- 1. latency of `tbon exec -r all true` ------------------------------------------------------


def bench_latency(report: Report, runs: int) -> dict[tuple[int, str], float]:
    """Returns the CLI median per (size, topology), for the flux comparison."""
    from tbon.overlay.connectors.client import Client

    progress("latency: CLI floor")
    floor: dict[str, list[float]] = {}
    nowhere = f"local://{tempfile.gettempdir()}/tbon-bench-no-such-instance/local"
    for label, argv, expect in (
        ("`tbon --version`", [str(TBON), "--version"], 0),
        ("`tbon exec --help`", [str(TBON), "exec", "--help"], 0),
        (
            "`tbon exec -r all NO-SUCH-URI true` (parses, then fails to connect)",
            [str(TBON), "exec", "-r", "all", nowhere, "true"],
            1,
        ),
    ):
        time_command(argv, expect=expect)  # warm-up: page cache, .pyc
        floor[label] = [time_command(argv, expect=expect) for _ in range(runs)]
    floor_labels = list(floor)

    rows = []
    cli_medians: dict[tuple[int, str], float] = {}
    judged: list[str] = []
    for size, topology in LATENCY_CASES:
        progress(f"latency: size {size} {topology}")
        with instance(size, topology) as inst:
            cli_argv = [str(TBON), "exec", "-r", "all", inst.uri, "true"]
            time_command(cli_argv)  # warm-up
            cli = []
            for run in range(runs):
                cli.append(time_command(cli_argv))
                progress(
                    f"latency: size {size} {topology} CLI run {run + 1}/{runs}: {ms(cli[-1])} ms"
                )
            with Client(inst.uri) as client:
                targets = online_ranks(client)
                if len(targets) != size:
                    raise RuntimeError(f"size {size}: {len(targets)} ranks online")
                fan_out(client, ["true"], targets)  # warm-up
                inproc = [fan_out(client, ["true"], targets) for _ in range(runs)]
            # What the CLI does after its imports: connect, status.get, exec.start, wait.
            full = []
            for _ in range(runs):
                started = time.perf_counter()
                with Client(inst.uri) as client:
                    fan_out(client, ["true"], online_ranks(client))
                full.append(time.perf_counter() - started)
            depth = inst.depth
            levels = by_depth(inproc, inst.rank_depth)
        totals = [f.total for f in inproc]
        firsts = [f.first for f in inproc]
        cli_medians[(size, topology)] = median(cli)
        target = ""
        if size == 64:
            cli_ok = median(cli) < TARGET_64_S
            in_ok = median(totals) < TARGET_64_S
            target = f"CLI {verdict(cli_ok)}, in-process {verdict(in_ok)}"
            judged.append(
                f"{topology}: CLI median {ms(median(cli))} ms "
                f"{'meets' if cli_ok else 'misses'} it; in-process median "
                f"{ms(median(totals))} ms {'meets' if in_ok else 'misses'} it"
            )
        rows.append(
            [
                str(size),
                topology,
                str(depth),
                *spread(cli),
                *spread(totals),
                ms(median(firsts)),
                ms(median(full)),
                levels,
                target,
            ]
        )
    report.heading(f"`tbon exec -r all true`, instance already up ({runs} runs each; times in ms)")
    report.table(
        [
            "N",
            "topology",
            "depth",
            "CLI median",
            "CLI min",
            "CLI max",
            "in-process median",
            "in-process min",
            "in-process max",
            "first exit",
            "connect+status+exec",
            "last exit per level",
            f"< {TARGET_64_S * 1000:g} ms at N=64",
        ],
        rows,
    )
    report.note(
        "CLI floor (interpreter, imports, Typer; nothing reaches an instance): "
        + "; ".join(
            f"{label} median {ms(median(t))} ms, min {ms(min(t))} ms" for label, t in floor.items()
        )
        + "."
    )
    report.note(
        "CLI: the real `tbon exec -r all URI true`, stdin /dev/null, from Popen to exit. "
        "In-process: one connected Client sends exec.start (targets: every online rank) to "
        "rank 0; the clock stops at the last rank's exit (`first exit`: at the first). "
        "connect+status+exec: a new Client, status.get, then the same, i.e. the CLI's work "
        "without interpreter start-up. `last exit per level`: in-process, the median over runs of "
        "the time the last exit of the ranks dN hops below rank 0 arrived."
    )
    parse_floor = median(floor[floor_labels[-1]])
    report.note(
        f"Target: 64 ranks in under {TARGET_64_S * 1000:g} ms. "
        + "; ".join(judged)
        + f". Of the CLI's time, {ms(parse_floor)} ms (median) is spent before it sends anything "
        "(the last floor above): the CLI alone leaves "
        f"{ms(max(0.0, TARGET_64_S - parse_floor))} ms of the budget for the fan-out."
    )
    return cli_medians


# --- 2. throughput ------------------------------------------------------------------------------


def _emitter(nbytes: int) -> list[str]:
    """A command printing exactly `nbytes` of whole 100-byte lines."""
    if nbytes % LINE_BYTES:
        raise ValueError(f"{nbytes} is not a whole number of {LINE_BYTES}-byte lines")
    return ["sh", "-c", 'exec yes "$1" | head -c "$2"', "sh", "x" * (LINE_BYTES - 1), str(nbytes)]


def _count_cli_output(argv: Sequence[str]) -> int:
    """Bytes the CLI writes to its stdout (a pipe we drain), to check nothing is lost."""
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    count = 0
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + RUN_DEADLINE_S
        while chunk := process.stdout.read1(1 << 20):
            count += len(chunk)
            if time.monotonic() > deadline:
                raise RuntimeError(f"`{' '.join(argv)}` ran past {RUN_DEADLINE_S:g}s")
        assert process.stderr is not None
        error = process.stderr.read()
        if process.wait(RUN_DEADLINE_S) != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited {process.returncode}: {error!r}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    return count


def bench_throughput(report: Report, runs: int) -> None:
    from tbon.overlay.connectors.client import Client

    def mbps(seconds: float) -> str:
        return f"{TOTAL_BYTES / 1e6 / seconds:.0f}"

    def row(measure: str, times: Sequence[float]) -> list[str]:
        """Median time, then rates: the best rate is the shortest time, the worst the longest."""
        return [measure, ms(median(times)), mbps(median(times)), mbps(min(times)), mbps(max(times))]

    rows = []
    progress("throughput: local pipe floor")
    floor_cmd = ["sh", "-c", f'yes "$1" | head -c {TOTAL_BYTES} > /dev/null', "sh"]
    floor_cmd.append("x" * (LINE_BYTES - 1))
    time_command(floor_cmd)
    floor = [time_command(floor_cmd) for _ in range(runs)]
    rows.append(row("local pipe `yes | head -c 100000000 > /dev/null`", floor))
    for label, size, ranks, per_rank in THROUGHPUT_CASES:
        with instance(size, "kary:32") as inst:
            command = _emitter(per_rank)
            argv = [str(TBON), "exec", "-r", ranks, inst.uri, *command]
            progress(f"throughput: {label}: check run (stdout counted)")
            got = _count_cli_output(argv)
            if got != TOTAL_BYTES:
                raise RuntimeError(f"{label}: the CLI wrote {got} bytes, expected {TOTAL_BYTES}")
            cli = []
            for run in range(runs):
                cli.append(time_command(argv, stdout=subprocess.DEVNULL))
                progress(f"throughput: {label} CLI run {run + 1}/{runs}: {ms(cli[-1])} ms")
            with Client(inst.uri) as client:
                online = online_ranks(client)
                targets = online if ranks == "all" else [int(ranks)]
                inproc = []
                for _ in range(runs):
                    result = fan_out(client, command, targets)
                    if result.received != TOTAL_BYTES:
                        raise RuntimeError(
                            f"{label}: in-process received {result.received} bytes, "
                            f"expected {TOTAL_BYTES}"
                        )
                    inproc.append(result.total)
        rows.append(row(f"`tbon exec` CLI, {label}", cli))
        rows.append(row(f"in-process Client, {label}", inproc))
    report.heading(f"Throughput: 100 MB of 100-byte lines ({runs} runs each)")
    report.table(["measure", "median ms", "median MB/s", "best MB/s", "worst MB/s"], rows)
    report.note(
        "MB = 10^6 bytes. Each rank runs `sh -c 'exec yes LINE | head -c BYTES'` (99 'x' and a "
        "newline per line, so lines are whole). CLI: `tbon exec -r RANKS URI ...` with its "
        "stdout on /dev/null, timed from Popen to exit; one extra run with stdout on a pipe "
        "first checks that exactly 100000000 bytes arrive. In-process: a connected Client "
        "receives and discards the data messages; the clock stops at the last exit. Size 4, "
        "kary:32: ranks 1-3 are children of rank 0."
    )


# --- 3. scale: the commands at N=64, 1024 and 2048, beside their targets -------------------------


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user+sys) of `pid` and every process below it, each with the children it
    has reaped (the jobs of `tbon exec`)."""
    total, stack = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while stack:
        current = stack.pop()
        with contextlib.suppress(OSError):
            stat = open(f"/proc/{current}/stat").read()  # noqa: SIM115 (read at once)
            fields = stat[stat.rfind(")") + 2 :].split()
            total += sum(int(f) for f in fields[11:15]) / tick
            for tid in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{tid}/children") as children:
                    stack.extend(int(c) for c in children.read().split())
    return total


def _cli_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_scale(report: Report, runs: int, sizes: set[int] | None = None) -> None:
    rows = []
    for what, size, words, target in SCALE_CASES:
        if sizes is not None and size not in sizes:
            continue
        progress(f"scale: size {size}: {what}")
        with tbon_start(size, ["tbon.topo=kary:32"], force=size > 1024) as launched:
            _wait_online(launched, size)
            argv = [str(TBON), *(launched.uri if w == "URI" else w for w in words)]
            time_command(argv)  # warm-up: page cache, and each broker's first job
            walls, cpus = [], []
            for run in range(runs):
                tree, cli = _tree_cpu(launched.process.pid), _cli_cpu()
                walls.append(time_command(argv))
                cpus.append(_tree_cpu(launched.process.pid) - tree + _cli_cpu() - cli)
                progress(f"scale: size {size} run {run + 1}/{runs}: {ms(walls[-1])} ms")
        rows.append(
            [
                f"{what}, N={size}",
                *spread(walls),
                ms(median(cpus)),
                f"≤ {ms(target)}",
                verdict(median(walls) <= target),
            ]
        )
    report.heading(f"At scale, instance up (kary:32; {runs} runs each; times in ms)")
    report.table(["command", "median", "min", "max", "CPU median", "target", "met?"], rows)
    report.note(
        "Wall: from Popen to exit of the real CLI (stdin /dev/null), after one warm-up run. "
        "CPU: user+sys of the whole instance (launcher, brokers and the jobs they reaped) and of "
        "the CLI during the run. What idle brokers spend meanwhile is in it too, and the window is "
        "longer than the run by one walk of /proc (0.5 s at 2048 brokers, which idle burn about "
        "1 CPU-s per second here): compare CPU across sides, not with wall time."
    )


# --- 4. flux --------------------------------------------------------------------------------------

FLUX_INNER = r"""
import json, subprocess, sys, time
runs = int(sys.argv[1])
argv = ["flux", "exec", "-r", "all", "true"]
subprocess.run(argv, stdin=subprocess.DEVNULL, check=True, timeout=120)
times = []
for _ in range(runs):
    started = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, check=True, timeout=120)
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""


def _flux_times(flux: str, size: int, topology: str, runs: int) -> list[float]:
    """R runs of `flux exec -r all true`, timed inside `flux start --test-size=N` (so the
    instance is already up). `flux start` runs in its own session; on the way out, if it is still
    there, that session (which holds only what it started) gets SIGTERM, then SIGKILL."""
    argv = [
        flux,
        "start",
        f"--test-size={size}",
        f"--broker-opts=-Stbon.topo={topology}",
        sys.executable,
        "-c",
        FLUX_INNER,
        str(runs),
    ]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=RUN_DEADLINE_S * 2)
    finally:
        if process.poll() is None:
            for signum in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)
                try:
                    process.wait(STOP_GRACE_S)
                    break
                except subprocess.TimeoutExpired:
                    continue
    if process.returncode != 0:
        raise RuntimeError(
            f"`flux start --test-size={size}` exited {process.returncode}: "
            f"{err.decode(errors='replace')[-1000:]}"
        )
    return [float(t) for t in json.loads(out.decode().strip().splitlines()[-1])]


def bench_flux(report: Report, runs: int, tbon: dict[tuple[int, str], float]) -> None:
    flux = shutil.which("flux")
    report.heading("Comparison with `flux exec -r all true`")
    if flux is None:
        report.note("flux is not installed (`flux` is not on PATH), so no comparison was made.")
        return
    rows = []
    for size, topology in LATENCY_CASES:
        progress(f"flux: size {size} {topology}")
        try:
            times = _flux_times(flux, size, topology, runs)
        except (RuntimeError, ValueError, OSError, subprocess.SubprocessError) as error:
            rows.append([str(size), topology, "failed", "", "", str(error).splitlines()[0][:80]])
            continue
        mine = tbon.get((size, topology))
        rows.append(
            [
                str(size),
                topology,
                *spread(times),
                ms(mine) if mine is not None else "n/a (latency section not run)",
            ]
        )
    report.table(
        ["N", "topology", "flux median ms", "flux min ms", "flux max ms", "tbon CLI median ms"],
        rows,
    )
    report.note(
        f"flux: {flux}; timed inside `flux start --test-size=N "
        "--broker-opts=-Stbon.topo=T` (instance up), one warm-up run, then the same CLI-level "
        "measurement as tbon's (fork/exec of `flux exec` to exit)."
    )


def _sizes(text: str | None) -> set[int] | None:
    return None if text is None else {int(word) for word in text.split(",")}


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="latency runs (default 10)")
    parser.add_argument(
        "--throughput-runs", type=int, default=3, help="throughput runs (default 3)"
    )
    parser.add_argument("--scale-runs", type=int, default=5, help="scale runs (default 5)")
    parser.add_argument(
        "--scale-sizes",
        default=None,
        help="only these sizes of the scale section, comma-separated (e.g. 1024)",
    )
    args = parse_args(
        parser, argv, SECTIONS, counts=("--runs", "--throughput-runs", "--scale-runs")
    )
    report = begin("exec", args.markdown, bytecode_note=True)
    cli_medians: dict[tuple[int, str], float] = {}
    steps: dict[str, Callable[[], object]] = {
        "latency": lambda: cli_medians.update(bench_latency(report, args.runs)),
        "throughput": lambda: bench_throughput(report, args.throughput_runs),
        "flux": lambda: bench_flux(report, args.runs, cli_medians),
        "scale": lambda: bench_scale(report, args.scale_runs, _sizes(args.scale_sizes)),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
