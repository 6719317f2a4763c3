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

Only the standard library and tbon itself are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TBON = Path(sys.executable).parent / "tbon"

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

URI_DEADLINE_S = 60.0  # for `tbon start` (wait mode) to print its URI
ONLINE_DEADLINE_S = 60.0  # for every rank to show online
RUN_DEADLINE_S = 120.0  # for any one measured command
STOP_GRACE_S = 15.0  # after SIGTERM, before SIGKILL of a process we started
SECTIONS = ("latency", "throughput", "flux")


def progress(text: str) -> None:
    print(f"[exec] {text}", file=sys.stderr, flush=True)


# --- an instance in wait mode -------------------------------------------------------------------


@dataclass
class Instance:
    process: subprocess.Popen[bytes]
    uri: str
    stderr_path: str
    size: int
    topology: str
    depth: int = 0  # levels below rank 0
    rank_depth: dict[int, int] = field(default_factory=dict)  # rank -> hops from rank 0

    def stderr_tail(self, lines: int = 10) -> str:
        try:
            text = Path(self.stderr_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def instance(size: int, topology: str) -> Iterator[Instance]:
    """`tbon start --test-size=N -S tbon.topo=T` in wait mode, every rank online; SIGTERM it (by
    PID) on the way out, always."""
    argv = [str(TBON), "start", f"--test-size={size}", "-S", f"tbon.topo={topology}"]
    fd, stderr_path = tempfile.mkstemp(prefix="exec-start-", suffix=".log")
    try:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fd
        )
    except BaseException:
        os.unlink(stderr_path)
        raise
    finally:
        os.close(fd)
    try:
        uri = _read_line(process, URI_DEADLINE_S)
        if not uri.startswith("local://"):
            tail = Path(stderr_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(
                f"`{' '.join(argv)}` printed no URI within {URI_DEADLINE_S:g}s "
                f"(exit {process.poll()}): {tail}"
            )
        inst = Instance(process, uri, stderr_path, size, topology)
        inst.rank_depth = _wait_online(inst)
        inst.depth = max(inst.rank_depth.values())
        yield inst
    finally:
        stop(process)
        with contextlib.suppress(OSError):
            os.unlink(stderr_path)


def _wait_online(inst: Instance) -> dict[int, int]:
    """Wait (status.watch, no polling) until all ranks are online; return each rank's depth."""
    from tbon.overlay.client import Client

    with Client(inst.uri) as client:
        tag = client.send("status.watch", {}, nodeid=0)
        deadline = time.monotonic() + ONLINE_DEADLINE_S
        while True:
            left = deadline - time.monotonic()
            reply = client.receive(left) if left > 0 else None
            if reply is None:
                raise RuntimeError(
                    f"size {inst.size}: not all ranks online within {ONLINE_DEADLINE_S:g}s; "
                    f"launcher said: {inst.stderr_tail()}"
                )
            if reply.tag != tag:
                continue
            if reply.errnum:
                raise RuntimeError(f"status.watch failed: {reply.errstr}")
            ranks = reply.payload["ranks"]
            if len(ranks) == inst.size and all(r["state"] == "online" for r in ranks):
                return _depths(ranks)


def _depths(ranks: Sequence[dict[str, Any]]) -> dict[int, int]:
    parent = {r["rank"]: r["parent"] for r in ranks}
    depths = {}
    for start in parent:
        rank, hops = start, 0
        while parent.get(rank) is not None and hops <= len(parent):
            rank, hops = parent[rank], hops + 1
        depths[start] = hops
    return depths


def _read_line(process: subprocess.Popen[bytes], limit: float) -> str:
    """The first line of `process`'s stdout, or "" at EOF or once `limit` seconds pass."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + limit
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process we started, wait STOP_GRACE_S, then SIGKILL it; always reap it."""
    try:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                progress(f"pid {process.pid} ignored SIGTERM for {STOP_GRACE_S:g}s: SIGKILL")
                process.kill()
                process.wait()
    finally:
        if process.stdout is not None:
            process.stdout.close()


def run_timed(argv: Sequence[str], *, stdout: int = subprocess.PIPE, expect: int = 0) -> float:
    """Wall time of one run of `argv` (stdin /dev/null); it must exit `expect`. Killed (by PID)
    and reaped if it outlives RUN_DEADLINE_S or we are interrupted."""
    fd, err_path = tempfile.mkstemp(prefix="exec-cli-", suffix=".log")
    try:
        started = time.perf_counter()
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=fd)
        try:
            if stdout == subprocess.PIPE:
                process.communicate(timeout=RUN_DEADLINE_S)
            else:
                process.wait(RUN_DEADLINE_S)
            elapsed = time.perf_counter() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode != expect:
            tail = Path(err_path).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"`{' '.join(argv)}` exited {process.returncode}: {tail}")
        return elapsed
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(err_path)


# --- statistics and tables ----------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


class Report:
    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown

    def heading(self, text: str) -> None:
        print(f"\n### {text}\n" if self.markdown else f"\n== {text} ==", flush=True)

    def note(self, text: str) -> None:
        print(text if self.markdown else f"  {text}", flush=True)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if self.markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
            for row in rows:
                print("| " + " | ".join(row) + " |")
            print(flush=True)
            return
        widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
        for i, row in enumerate([header, *rows]):
            cells = [
                str(c).ljust(w) if j == 0 else str(c).rjust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            print("  " + "  ".join(cells).rstrip())
            if i == 0:
                print("  " + "  ".join("-" * w for w in widths))
        sys.stdout.flush()


def machine_line() -> str:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bytecode = ""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        bytecode = " PYTHONDONTWRITEBYTECODE is set: modules without a .pyc compile at every start."
    return (
        f"machine: {platform.node()} {platform.system()} {platform.release()} "
        f"{platform.machine()}, "
        f"nproc {usable}, Python {platform.python_version()} ({sys.executable}), "
        f"load average {load}. Shared, noisy machine: read medians, not single runs.{bytecode}"
    )


# --- the fan-out, in-process --------------------------------------------------------------------


@dataclass
class Fanout:
    total: float  # exec.start sent -> last rank's exit received
    first: float  # exec.start sent -> first rank's exit received
    received: int  # bytes of output received (all ranks, both streams)
    exits: dict[int, float]  # rank -> exec.start sent -> its exit received


def online_ranks(client: Any) -> list[int]:
    status = client.rpc("status.get", nodeid=0)
    return [e["rank"] for e in status["ranks"] if e["state"] == "online"]


def fan_out(client: Any, argv: Sequence[str], targets: Sequence[int]) -> Fanout:
    """exec.start as cli/exec.py sends it; wait for every target's exit (each must be 0)."""
    clock = time.perf_counter
    pending = set(targets)
    received = 0
    exits: dict[int, float] = {}
    started = clock()
    tag = client.send(
        "exec.start",
        {"id": uuid.uuid4().hex, "argv": list(argv), "cwd": None, "targets": list(targets)},
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
        if "data" in payload:
            received += len(payload["data"])
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
    from tbon.overlay.client import Client

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
        run_timed(argv, expect=expect)  # warm-up: page cache, .pyc
        floor[label] = [run_timed(argv, expect=expect) for _ in range(runs)]
    floor_labels = list(floor)

    rows = []
    cli_medians: dict[tuple[int, str], float] = {}
    judged: list[str] = []
    for size, topology in LATENCY_CASES:
        progress(f"latency: size {size} {topology}")
        with instance(size, topology) as inst:
            cli_argv = [str(TBON), "exec", "-r", "all", inst.uri, "true"]
            run_timed(cli_argv)  # warm-up
            cli = []
            for run in range(runs):
                cli.append(run_timed(cli_argv))
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
                ms(median(cli)),
                ms(min(cli)),
                ms(max(cli)),
                ms(median(totals)),
                ms(min(totals)),
                ms(max(totals)),
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
    from tbon.overlay.client import Client

    def mbps(seconds: float) -> str:
        return f"{TOTAL_BYTES / 1e6 / seconds:.0f}"

    rows = []
    progress("throughput: local pipe floor")
    floor_cmd = ["sh", "-c", f'yes "$1" | head -c {TOTAL_BYTES} > /dev/null', "sh"]
    floor_cmd.append("x" * (LINE_BYTES - 1))
    run_timed(floor_cmd)
    floor = [run_timed(floor_cmd) for _ in range(runs)]
    rows.append(
        [
            "local pipe `yes | head -c 100000000 > /dev/null`",
            ms(median(floor)),
            mbps(median(floor)),
            mbps(min(floor)),
            mbps(max(floor)),
        ]
    )
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
                cli.append(run_timed(argv, stdout=subprocess.DEVNULL))
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
        rows.append(
            [
                f"`tbon exec` CLI, {label}",
                ms(median(cli)),
                mbps(median(cli)),
                mbps(min(cli)),
                mbps(max(cli)),
            ]
        )
        rows.append(
            [
                f"in-process Client, {label}",
                ms(median(inproc)),
                mbps(median(inproc)),
                mbps(min(inproc)),
                mbps(max(inproc)),
            ]
        )
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


# --- 3. flux --------------------------------------------------------------------------------------

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
                ms(median(times)),
                ms(min(times)),
                ms(max(times)),
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


# --- main ---------------------------------------------------------------------------------------


def _sections(text: str) -> list[str]:
    chosen = [word.strip() for word in text.split(",") if word.strip()]
    unknown = [word for word in chosen if word not in SECTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--sections: choose from {','.join(SECTIONS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="latency runs (default 10)")
    parser.add_argument(
        "--throughput-runs", type=int, default=3, help="throughput runs (default 3)"
    )
    parser.add_argument("--markdown", action="store_true", help="print GitHub tables")
    parser.add_argument(
        "--sections", type=_sections, default=list(SECTIONS), help=f"default {','.join(SECTIONS)}"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.throughput_runs < 1:
        parser.error("--runs and --throughput-runs must be at least 1")
    if not TBON.exists():
        parser.error(f"no tbon console script at {TBON}: run with the project's .venv/bin/python")

    report = Report(args.markdown)
    print(("" if args.markdown else "# ") + machine_line(), flush=True)
    cli_medians: dict[tuple[int, str], float] = {}
    steps: dict[str, Callable[[], object]] = {
        "latency": lambda: cli_medians.update(bench_latency(report, args.runs)),
        "throughput": lambda: bench_throughput(report, args.throughput_runs),
        "flux": lambda: bench_flux(report, args.runs, cli_medians),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
