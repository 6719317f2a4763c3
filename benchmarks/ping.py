"""Round trips and a standalone broker's memory (issue 14, sections 2 and 3).

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/ping.py [--count N] [--markdown] [--sections rtt,memory]

Sections (select with --sections):
  rtt     broker.ping round trips from an in-process tbon Client (Client.rpc) to rank 0 and to
          rank 3 of a size-7 kary:2 instance (two hops down: 0 -> 1 -> 3), paced at 10 ms, paced
          at 1 ms and back to back: median and p90 of each, in milliseconds
  memory  VmRSS and VmHWM of a broker started on its own (`tbon broker`, a singleton: what one
          broker per node started by srun, mpiexec, ssh or a config file holds, sharing nothing),
          next to a bare Python with pyzmq and PyNaCl imported and one socket open; both as
          `pip install .` leaves tbon (a wheel of this checkout, in a throwaway environment that
          sees this one's dependencies) and as this checkout's editable install, whose import
          finder loads pathlib, urllib.parse and ipaddress into every process

Pacing sleeps between pings (the time a user's `tbon ping` spends idle): a round trip that grows
with the gap before it is paying for a wake-up, not for work. Every process this script starts is
stopped and reaped by PID, pass or fail; every wait has a deadline. Progress goes to stderr, tables
to stdout (`--markdown` for GitHub tables, e.g. for the README).

Only the standard library, tbon itself and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from common import (
    TBON,
    Report,
    Watch,
    all_online,
    begin,
    log_tail,
    median,
    parse_args,
    percentile,
    proc_kb,
    progress,
    stop,
    tbon_start,
    verdict,
)

SECTIONS = ("rtt", "memory")
SIZE, TOPO, FAR = 7, "kary:2", 3  # rank 3 is two hops down: 0 -> 1 -> 3
TARGET_PACED_MS = 0.91  # Flux's median, paced at 10 ms, two hops down (issue 14)
TARGET_RSS_MB = 20.0
PACES = (("paced 10 ms", 0.010), ("paced 1 ms", 0.001), ("back to back", 0.0))
WARMUP = 50
ONLINE_DEADLINE_S = 30.0
SOCKET_DEADLINE_S = 30.0
SETTLE_S = 1.0  # after the broker's socket appears, before reading its memory


# --- round trips --------------------------------------------------------------------------------


def round_trips(client: Any, rank: int, count: int, gap: float) -> list[float]:
    """`count` broker.ping round trips to `rank`, `gap` seconds apart (0: back to back)."""
    for _ in range(WARMUP):  # connection set-up, first-call paths
        client.rpc("broker.ping", {}, nodeid=rank, timeout=10.0)
    clock = time.perf_counter
    times = []
    for _ in range(count):
        if gap:
            time.sleep(gap)
        started = clock()
        client.rpc("broker.ping", {}, nodeid=rank, timeout=10.0)
        times.append(clock() - started)
    return times


def bench_rtt(report: Report, count: int) -> None:
    from tbon.overlay.connectors.client import Client

    rows = []
    progress(f"rtt: size {SIZE}, {TOPO}")
    with tbon_start(SIZE, [f"tbon.topo={TOPO}"]) as inst, Client(inst.uri) as client:
        watch = Watch(client)
        watch.until(time.monotonic() + ONLINE_DEADLINE_S, all_online)
        hops = client.rpc("broker.ping", {}, nodeid=FAR, timeout=10.0)["hops"]
        if hops != 2:
            raise RuntimeError(f"rank {FAR} is {hops} hops down, not 2")
        for label, gap in PACES:
            for rank in (0, FAR):
                progress(f"rtt: rank {rank}, {label}, {count} pings")
                times = round_trips(client, rank, count, gap)
                target = ""
                if rank == FAR and gap == 0.010:
                    ok = median(times) * 1000 <= TARGET_PACED_MS
                    target = f"≤ {TARGET_PACED_MS} {verdict(ok)}"
                rows.append(
                    [
                        label,
                        f"rank {rank} ({0 if rank == 0 else 2} hops)",
                        f"{median(times) * 1000:.3f}",
                        f"{percentile(times, 0.9) * 1000:.3f}",
                        target,
                    ]
                )
    report.heading(f"Round trips (size {SIZE}, {TOPO}; ms)")
    report.table(["pace", "to", "median", "p90", "target"], rows)
    report.note(
        f'Client.rpc("broker.ping") from this process, {count} pings per row after '
        f"{WARMUP} unmeasured; the target is Flux's paced median two hops down."
    )


# --- memory -------------------------------------------------------------------------------------


@contextlib.contextmanager
def started(argv: Sequence[str], ready: Callable[[], bool], what: str) -> Iterator[int]:
    """Start `argv`, wait (with a deadline) until `ready()`, yield its pid; always stopped and
    reaped by PID on the way out."""
    fd, err_path = tempfile.mkstemp(prefix="ping-proc-", suffix=".log")
    try:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fd
        )
    finally:
        os.close(fd)
    try:
        deadline = time.monotonic() + SOCKET_DEADLINE_S
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{what} not ready (exit {process.poll()}): {log_tail(err_path)}"
                )
            time.sleep(0.02)
        time.sleep(SETTLE_S)
        yield process.pid
    finally:
        stop(process)
        with contextlib.suppress(OSError):
            os.unlink(err_path)


BARE = """\
import signal, sys, zmq, nacl.public
context = zmq.Context()
socket = context.socket(zmq.ROUTER)
socket.bind("ipc://" + sys.argv[1])
signal.pause()
"""


@contextlib.contextmanager
def wheel_install() -> Iterator[tuple[str, str]]:
    """(python, tbon script) that run tbon as `pip install .` would leave it: the checkout whose
    .venv runs this script (whose tbon TBON is) built and installed into a directory, its .pyc
    written, and a venv without pip whose one .pth names that directory, then this venv's
    site-packages for pyzmq, PyNaCl and the rest (their .pth files are not run there, so the
    editable tbon is not seen). Removed afterwards."""
    top = tempfile.mkdtemp(prefix="ping-wheel-")
    try:
        target, env = os.path.join(top, "tbon"), os.path.join(top, "venv")
        source = str(Path(sys.executable).parent.parent.parent)  # the checkout of .venv
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--target", target, source],
            check=True, stdout=subprocess.DEVNULL, timeout=600,
        )  # fmt: skip
        compiled = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, "-m", "compileall", "-q", target], check=True, env=compiled)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
        python = os.path.join(env, "bin", "python")
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        Path(site, "deps.pth").write_text(f"{target}\n{sysconfig.get_path('purelib')}\n")
        yield python, os.path.join(target, "bin", "tbon")
    finally:
        shutil.rmtree(top, ignore_errors=True)


def memory_once(python: str, script: str, rundir: str) -> tuple[dict[str, int], dict[str, int]]:
    """A singleton broker's memory, and a bare socket's, each run by `python` (the broker by
    its console script `script`, as a user's `tbon broker` runs)."""
    argv = [python, script, "broker", "-S", f"broker.rundir={rundir}"]
    with started(argv, lambda d=rundir: any(Path(d).iterdir()), "tbon broker") as pid:
        broker = proc_kb(pid, ("VmRSS", "VmHWM", "Pss"))
    path = os.path.join(rundir, "bare")
    with started([python, "-c", BARE, path], lambda: os.path.exists(path), "bare python") as pid:
        bare = proc_kb(pid, ("VmRSS", "VmHWM", "Pss"))
    return broker, bare


def bench_memory(report: Report, runs: int) -> None:
    rows = []
    samples: dict[str, list[dict[str, int]]] = {}
    progress("memory: building and installing a wheel of this checkout")
    with wheel_install() as (wheel_python, wheel_script):
        installs = (("wheel", wheel_python, wheel_script), ("editable", sys.executable, str(TBON)))
        for run in range(runs):
            for install, python, script in installs:
                progress(f"memory: standalone broker and bare socket, {install}, run {run + 1}")
                rundir = tempfile.mkdtemp(prefix="ping-rundir-")
                try:
                    broker, bare = memory_once(python, script, rundir)
                finally:
                    shutil.rmtree(rundir, ignore_errors=True)
                samples.setdefault(f"broker {install}", []).append(broker)
                samples.setdefault(f"bare {install}", []).append(bare)
    for label, key, target in (
        ("`tbon broker` (singleton), installed from a wheel", "broker wheel", True),
        ("python + zmq + nacl, one socket, the same", "bare wheel", False),
        ("`tbon broker` (singleton), this editable install", "broker editable", False),
        ("python + zmq + nacl, one socket, the same", "bare editable", False),
    ):
        taken = samples[key]
        rss = [s["VmRSS"] / 1024 for s in taken]
        hwm = [s["VmHWM"] / 1024 for s in taken]
        pss = [s["Pss"] / 1024 for s in taken if "Pss" in s]
        rows.append(
            [
                label,
                f"{median(rss):.1f}",
                f"{median(hwm):.1f}",
                f"{median(pss):.1f}" if pss else "n/a",
                f"≤ {TARGET_RSS_MB:g} {verdict(median(rss) <= TARGET_RSS_MB)}" if target else "",
            ]
        )
    report.heading("Memory of one broker started on its own (MB)")
    report.table(["process", "VmRSS", "VmHWM", "PSS", "target"], rows)
    report.note(
        f"Medians of {runs} runs, read {SETTLE_S:g} s after the broker's local socket appears. "
        "A broker alone shares no pages with a launcher, so its RSS is what one broker per node "
        "costs; forked brokers' PSS is in benchmarks/wireup.py (section rss)."
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500, help="pings per row (default 500)")
    parser.add_argument("--runs", type=int, default=3, help="memory runs (default 3)")
    args = parse_args(parser, argv, SECTIONS, counts=("--count", "--runs"))
    report = begin("ping", args.markdown, bytecode_note=True)
    steps: dict[str, Callable[[], None]] = {
        "rtt": lambda: bench_rtt(report, args.count),
        "memory": lambda: bench_memory(report, args.runs),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
