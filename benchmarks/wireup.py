"""Wire-up benchmarks for tbon: start-up/shutdown time, memory per broker, lost detection, ping.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/wireup.py [--runs R] [--sizes 1,4,16,64] [--markdown]

Everything is measured against the real `tbon` console script next to sys.executable and real
brokers; nothing here sleeps and hopes: every wait has a deadline, and every process this script
starts is reaped (by PID) whether the benchmark passes or fails. Progress goes to stderr, tables
to stdout (`--markdown` for GitHub tables, e.g. for the README).

Sections (select with --sections):
  wall  median/min/max wall time of `tbon start --test-size=N true` (start, run, shut down)
  rss   peak (VmHWM) and current (VmRSS) resident memory per broker, plus PSS (fork-shared pages
        counted fairly), for an idle instance of each size
  lost  SIGKILL a leaf broker (rank 3 of size 4, fanout 2) and time until rank 0 pushes a status
        snapshot showing it `lost` (client subscribed with status.watch; no polling)
  ping  `tbon ping` round trips to rank 3 (two hops: 0 -> 1 -> 3) and rank 0 (zero hops), and
        in-process Client.rpc("broker.ping") round trips, which is what the < 1 ms target means

Only the standard library and tbon itself are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TBON = Path(sys.executable).parent / "tbon"

# The targets from the issue, each next to its measurement.
TARGET_WALL_64_S = 1.5  # size 64 up + down
TARGET_RSS_MB = 30.0  # per broker
TARGET_LOST_S = 0.5  # leaf SIGKILL -> rank 0 shows it lost
TARGET_PING_MS = 1.0  # round trip to a rank two hops down

URI_DEADLINE_S = 60.0  # for `tbon start` (wait mode) to print its URI
STOP_GRACE_S = 15.0  # after SIGTERM, before we SIGKILL the `tbon start` we started
LOST_DEADLINE_S = 10.0  # for the lost snapshot to arrive
SECTIONS = ("wall", "rss", "lost", "ping")


def progress(text: str) -> None:
    print(f"[wireup] {text}", file=sys.stderr, flush=True)


# --- an instance in wait mode -------------------------------------------------------------------


@dataclass
class Instance:
    process: subprocess.Popen[bytes]
    uri: str
    stderr_path: str

    def status(self) -> dict[str, Any]:
        done = subprocess.run(
            [str(TBON), "status", self.uri, "--json"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tbon status failed ({done.returncode}): {done.stderr.decode()}")
        return json.loads(done.stdout)

    def stderr_tail(self, lines: int = 10) -> str:
        try:
            text = Path(self.stderr_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def instance(size: int, attributes: Sequence[str] = ()) -> Iterator[Instance]:
    """`tbon start --test-size=N` in wait mode; SIGTERM it (by PID) on the way out, always."""
    argv = [str(TBON), "start", f"--test-size={size}"]
    for attribute in attributes:
        argv += ["-S", attribute]
    fd, stderr_path = tempfile.mkstemp(prefix="wireup-stderr-", suffix=".log")
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
        yield Instance(process, uri, stderr_path)
    finally:
        stop(process)
        with contextlib.suppress(OSError):
            os.unlink(stderr_path)


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


# --- statistics and tables ----------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


class Report:
    def __init__(self, markdown: bool) -> None:
        self.markdown = markdown

    def heading(self, text: str) -> None:
        print(f"\n### {text}\n" if self.markdown else f"\n== {text} ==")

    def note(self, text: str) -> None:
        print(text if self.markdown else f"  {text}")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if self.markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
            for row in rows:
                print("| " + " | ".join(row) + " |")
            print()
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


def machine_line() -> str:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {platform.node()} {platform.system()} {platform.release()} "
        f"{platform.machine()}, "
        f"nproc {usable}, Python {platform.python_version()} ({sys.executable}), "
        f"load average {load}. Shared, noisy machine: read medians, not single runs."
    )


# --- 1. wall time of `tbon start --test-size=N true` --------------------------------------------


def bench_wall(report: Report, sizes: Sequence[int], runs: int) -> None:
    progress("wall: warm-up run (page cache, .pyc)")
    _run_start(1)
    floor = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [str(TBON), "--help"], stdin=subprocess.DEVNULL, capture_output=True, check=True
        )
        floor.append(time.perf_counter() - started)
    rows = []
    for size in sizes:
        times = []
        for run in range(runs):
            times.append(_run_start(size))
            progress(f"wall: size {size} run {run + 1}/{runs}: {times[-1]:.3f} s")
        target = verdict(median(times) <= TARGET_WALL_64_S) if size == 64 else ""
        rows.append(
            [
                str(size),
                f"{median(times):.3f}",
                f"{min(times):.3f}",
                f"{max(times):.3f}",
                f"≤ {TARGET_WALL_64_S:g} s {target}" if size == 64 else "",
            ]
        )
    report.heading(f"Start-up + shutdown: `tbon start --test-size=N true` ({runs} runs)")
    report.table(["N", "median s", "min s", "max s", "target"], rows)
    report.note(
        f"CLI floor (`tbon --help`, interpreter + Typer import): median {median(floor):.3f} s, "
        f"min {min(floor):.3f} s."
    )


def _run_start(size: int) -> float:
    argv = [str(TBON), "start", f"--test-size={size}", "true"]
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return elapsed


# --- 2. memory per broker -----------------------------------------------------------------------


def _proc_kb(pid: int, names: Sequence[str]) -> dict[str, int]:
    """VmHWM/VmRSS from /proc/PID/status and Pss from smaps_rollup, in kB (missing: absent)."""
    found: dict[str, int] = {}
    for path in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in names and key not in found:
                found[key] = int(value.split()[0])
    return found


def bench_rss(report: Report, sizes: Sequence[int]) -> None:
    rows = []
    worst_mb = 0.0
    for size in sizes:
        progress(f"rss: size {size}")
        with instance(size) as inst:
            table = inst.status()
            pids = [r["pid"] for r in table["ranks"] if r["pid"]]
            if len(pids) != size:
                raise RuntimeError(f"size {size}: status shows {len(pids)} broker pids")
            samples = [_proc_kb(pid, ("VmHWM", "VmRSS", "Pss")) for pid in pids]
        hwm = [s["VmHWM"] / 1024 for s in samples]
        rss = [s["VmRSS"] / 1024 for s in samples]
        pss = [s["Pss"] / 1024 for s in samples if "Pss" in s]
        worst_mb = max(worst_mb, max(hwm))
        rows.append(
            [
                str(size),
                f"{max(hwm):.1f}",
                f"{median(hwm):.1f}",
                f"{max(rss):.1f}",
                f"{median(rss):.1f}",
                f"{median(pss):.1f}" if pss else "n/a",
                verdict(max(hwm) <= TARGET_RSS_MB),
            ]
        )
    report.heading("Memory per broker (idle instance, MB)")
    report.table(
        [
            "N",
            "VmHWM max",
            "VmHWM median",
            "VmRSS max",
            "VmRSS median",
            "PSS median",
            f"≤ {TARGET_RSS_MB:g} MB",
        ],
        rows,
    )
    report.note(
        "Brokers are forked from one launcher, so VmRSS/VmHWM count the pages they share with it "
        "(interpreter, imported modules); PSS divides shared pages among the sharers and is the "
        "fair cost of one more broker on this node. The target is judged on VmHWM max."
    )


# --- 3. lost detection --------------------------------------------------------------------------


def bench_lost(report: Report, runs: int) -> None:
    from tbon.overlay.client import Client

    lost_times: list[float] = []
    degraded_times: list[float] = []
    for run in range(runs):
        with instance(4, ["tbon.fanout=2"]) as inst, Client(inst.uri) as client:
            tag = client.send("status.watch", {}, nodeid=0)
            snapshot = _next_snapshot(client, tag, time.monotonic() + 10.0)
            if snapshot is None:
                raise RuntimeError("no status snapshot from rank 0 within 10s")
            leaf = snapshot["ranks"][3]
            if leaf["parent"] != 1 or leaf["children"] or leaf["state"] != "online":
                raise RuntimeError(f"rank 3 is not an online leaf under rank 1: {leaf}")
            pid = leaf["pid"] or inst.status()["ranks"][3]["pid"]
            killed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + LOST_DEADLINE_S
            lost_at = degraded_at = None
            while lost_at is None:
                snapshot = _next_snapshot(client, tag, deadline)
                if snapshot is None:
                    raise RuntimeError(
                        f"rank 3 not shown lost within {LOST_DEADLINE_S:g}s of SIGKILL; "
                        f"launcher said: {inst.stderr_tail()}"
                    )
                now = time.perf_counter()
                ranks = snapshot["ranks"]
                if degraded_at is None and ranks[0]["subtree"] == "degraded":
                    degraded_at = now
                if ranks[3]["state"] == "lost":
                    lost_at = now
            lost_times.append(lost_at - killed)
            degraded_times.append((degraded_at or lost_at) - killed)
            progress(f"lost: run {run + 1}/{runs}: {lost_times[-1] * 1000:.1f} ms")
    report.heading(f"Lost detection: SIGKILL leaf rank 3 (size 4, fanout 2), {runs} runs")
    report.table(
        ["measure", "median ms", "min ms", "max ms", "target"],
        [
            [
                "kill → rank 3 `lost` pushed to client",
                f"{median(lost_times) * 1000:.1f}",
                f"{min(lost_times) * 1000:.1f}",
                f"{max(lost_times) * 1000:.1f}",
                f"< {TARGET_LOST_S * 1000:g} ms {verdict(median(lost_times) < TARGET_LOST_S)}",
            ],
            [
                "kill → rank 0 subtree `degraded`",
                f"{median(degraded_times) * 1000:.1f}",
                f"{min(degraded_times) * 1000:.1f}",
                f"{max(degraded_times) * 1000:.1f}",
                "",
            ],
        ],
    )
    report.note(
        "Timed in-process: Client.send('status.watch') to rank 0, then Client.receive() of each "
        "pushed snapshot; the clock stops at the first snapshot showing rank 3 lost."
    )


def _next_snapshot(client: Any, tag: int, deadline: float) -> dict[str, Any] | None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        reply = client.receive(left)
        if reply is None:
            return None
        if reply.tag != tag:
            continue
        if reply.errnum:
            raise RuntimeError(f"status.watch failed: {reply.errstr}")
        return reply.payload


# --- 4. ping ------------------------------------------------------------------------------------


def bench_ping(report: Report, count_cli: int = 200, count_rpc: int = 1000) -> None:
    from tbon.overlay.client import Client

    progress("ping: size 16, fanout 2")
    rows = []
    with instance(16, ["tbon.fanout=2"]) as inst:
        ranks = inst.status()["ranks"]
        if ranks[3]["parent"] != 1 or ranks[1]["parent"] != 0:
            raise RuntimeError("rank 3 is not two hops down (0 -> 1 -> 3)")
        for rank in (3, 0):
            done = subprocess.run(
                [str(TBON), "ping", inst.uri, str(rank), "--count", str(count_cli), "--json"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"tbon ping failed: {done.stderr.decode(errors='replace')}")
            result = json.loads(done.stdout)
            rtt = result["rtt_ms"]
            rows.append(
                [
                    f"`tbon ping` rank {rank} x{count_cli}",
                    str(result["hops"]),
                    f"{median(rtt) * 1000:.0f}",
                    f"{min(rtt) * 1000:.0f}",
                    f"{percentile(rtt, 0.9) * 1000:.0f}",
                    "",
                ]
            )
        with Client(inst.uri) as client:
            for rank in (3, 0):
                hops, times = _rpc_pings(client, rank, count_rpc)
                target = ""
                if rank == 3:
                    ok = median(times) < TARGET_PING_MS / 1000
                    target = f"< {TARGET_PING_MS * 1000:g} µs {verdict(ok)}"
                rows.append(
                    [
                        f"Client.rpc rank {rank} x{count_rpc}",
                        str(hops),
                        f"{median(times) * 1e6:.0f}",
                        f"{min(times) * 1e6:.0f}",
                        f"{percentile(times, 0.9) * 1e6:.0f}",
                        target,
                    ]
                )
    report.heading("Ping round trip (size 16, fanout 2: rank 3 is 0 → 1 → 3)")
    report.table(["measure", "hops", "median µs", "min µs", "p90 µs", "target"], rows)
    report.note(
        "`tbon ping` times each rpc inside the CLI (its start-up is not included); rank 0 is the "
        "floor of client ↔ rank 0 over the local socket. The target is the in-process 2-hop median."
    )


def _rpc_pings(client: Any, rank: int, count: int) -> tuple[int, list[float]]:
    hops = 0
    for _ in range(50):  # warm-up: connection set-up, first-call paths
        hops = client.rpc("broker.ping", {}, nodeid=rank, timeout=10.0)["hops"]
    times = []
    clock = time.perf_counter
    for _ in range(count):
        started = clock()
        client.rpc("broker.ping", {}, nodeid=rank, timeout=10.0)
        times.append(clock() - started)
    return hops, times


# --- main ---------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --sizes {text!r}: use e.g. 1,4,16,64") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("--sizes needs positive integers")
    return sizes


def _sections(text: str) -> list[str]:
    chosen = [word.strip() for word in text.split(",") if word.strip()]
    unknown = [word for word in chosen if word not in SECTIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--sections: choose from {','.join(SECTIONS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--sizes", type=_sizes, default=[1, 4, 16, 64], help="default 1,4,16,64")
    parser.add_argument("--markdown", action="store_true", help="print GitHub tables")
    parser.add_argument(
        "--sections", type=_sections, default=list(SECTIONS), help=f"default {','.join(SECTIONS)}"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not TBON.exists():
        parser.error(f"no tbon console script at {TBON}: run with the project's .venv/bin/python")

    report = Report(args.markdown)
    print(("" if args.markdown else "# ") + machine_line())
    steps: dict[str, Callable[[], None]] = {
        "wall": lambda: bench_wall(report, args.sizes, args.runs),
        "rss": lambda: bench_rss(report, args.sizes),
        "lost": lambda: bench_lost(report, args.runs),
        "ping": lambda: bench_ping(report),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
