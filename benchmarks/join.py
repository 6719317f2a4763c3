"""FLUB join benchmarks for tbon: leaf, interior, 16 at once, and replacing a killed leaf.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/join.py [--runs R] [--markdown] [--sections leaf,interior,...]

Every join is timed from the Popen of `tbon broker -S broker.boot-server=URI ...` to the first
status snapshot that rank 0 pushes (a client subscribed with status.watch BEFORE the Popen; no
polling) showing the rank online. Every measurement uses a fresh `tbon start` instance in wait
mode. Nothing here sleeps and hopes: every wait has a deadline, and every process this script
starts (the `tbon start` launchers and the joining brokers) is reaped by PID whether the benchmark
passes or fails: the launcher gets SIGTERM (the instance shuts down and the joined brokers exit with
it), and a joiner still running after that is SIGKILLed. Progress goes to stderr, tables to stdout
(`--markdown` for GitHub tables, e.g. for the README).

Sections (select with --sections):
  leaf         size 4 (fanout 2), ranks 0-2 launched; join vacant leaf rank 3 (parent 1)
  interior     size 4 (fanout 2), rank 0 launched; join rank 1 (its child 3 stays vacant)
  many         size 17 (fanout 4), rank 0 launched; 16 joiners (no rank asked) started at once
  replace      size 4 (fanout 2), all launched; SIGKILL rank 3's broker, start a replacement for
               rank 3 as soon as rank 0 pushes it `lost`; the replacement must be incarnation 2
  startup      for context: interpreter start-up, `import zmq, nacl.public`, `tbon broker --help`

Only the standard library, tbon itself and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    STAT_HEADER,
    STOP_GRACE_S,
    TBON,
    Instance,
    Report,
    Watch,
    all_online,
    begin,
    log_tail,
    median,
    ms,
    parse_args,
    progress,
    stat_row,
    tbon_start,
    time_command,
    usable_cpus,
    verdict,
)

TARGET_LEAF_S = 0.3  # Popen of a leaf joiner -> that rank online

JOIN_DEADLINE_S = 30.0  # for joiners to show online (and for the first snapshot, lost, ...)
MANY = 16
SECTIONS = ("leaf", "interior", "many", "replace", "startup")
JOIN_ENDPOINT = "tbon.endpoint=tcp://127.0.0.1:*"


# --- an instance in wait mode, and the brokers that join it -------------------------------------


@dataclass
class Joiner:
    process: subprocess.Popen[bytes]
    started: float  # time.perf_counter() just before the Popen
    log_path: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 10) -> str:
        return log_tail(self.log_path, lines)


@dataclass
class Joinable:
    """A `tbon start` in wait mode, and the brokers this script started to join it."""

    launcher: Instance
    joiners: list[Joiner] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return self.launcher.uri

    def join(self, *attributes: str) -> Joiner:
        """Popen `tbon broker -S broker.boot-server=URI -S ATTR...`; the clock starts at Popen."""
        argv = [str(TBON), "broker", "-S", f"broker.boot-server={self.uri}", "-S", JOIN_ENDPOINT]
        for attribute in attributes:
            argv += ["-S", attribute]
        fd, log_path = tempfile.mkstemp(prefix="join-broker-", suffix=".log")
        try:
            started = time.perf_counter()
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, close_fds=True
            )
        except BaseException:
            os.unlink(log_path)
            raise
        finally:
            os.close(fd)
        joiner = Joiner(process, started, log_path)
        self.joiners.append(joiner)
        return joiner

    def check_joiners(self) -> None:
        """Fail at once if a joiner exited while we wait for it to be online."""
        for joiner in self.joiners:
            code = joiner.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"joiner pid {joiner.pid} exited {code} before the benchmark ended:\n"
                    f"{joiner.log_tail()}\nlauncher said:\n{self.launcher.stderr_tail()}"
                )


STANDBYS = [0]
"""tbon.standbys of every instance (--standbys): a grant waits for the root group's commit."""


@contextlib.contextmanager
def instance(test_size: int, attributes: Sequence[str] = ()) -> Iterator[Joinable]:
    """common.tbon_start, plus: on the way out, always, once the launcher is stopped (and with it
    the instance, which the joined brokers leave by themselves), every joiner started through the
    Joinable is waited for, SIGKILLed if still there, and reaped."""
    joiners: list[Joiner] = []
    attributes = [*attributes, f"tbon.standbys={STANDBYS[0]}"]
    try:
        with tbon_start(test_size, attributes) as launcher:
            yield Joinable(launcher, joiners)
    finally:
        reap_joiners(joiners)


def reap_joiners(joiners: Sequence[Joiner]) -> None:
    """The instance is down: its joined brokers exit by themselves. Wait for each (one shared
    deadline), SIGKILL any still running, and reap them all; remove their logs."""
    deadline = time.monotonic() + STOP_GRACE_S
    for joiner in joiners:
        try:
            try:
                code = joiner.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                progress(f"joiner pid {joiner.pid} still running after shutdown: SIGKILL")
                joiner.process.kill()
                code = joiner.process.wait()
            if code not in (0, -signal.SIGKILL):
                progress(f"joiner pid {joiner.pid} exited {code}: {joiner.log_tail(3)}")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(joiner.log_path)


# --- 1 and 2. one joiner for one rank -------------------------------------------------------------


@dataclass
class JoinTimes:
    reserved: float | None  # Popen -> first snapshot showing the rank reserved (None: not seen)
    online: float  # Popen -> first snapshot showing the rank online


def join_one(test_size: int, size: int, fanout: int, rank: int) -> JoinTimes:
    """A fresh instance; watch; Popen a joiner for `rank`; time until rank 0 pushes it online."""
    from tbon.overlay.connectors.client import Client

    attributes = [f"size={size}", f"tbon.fanout={fanout}"]
    with instance(test_size, attributes) as inst, Client(inst.uri) as client:
        watch = Watch(client)
        deadline = time.monotonic() + JOIN_DEADLINE_S
        _, snapshot = watch.until(deadline, lambda s: all_online(s, test_size))
        if snapshot["ranks"][rank]["state"] != "vacant":
            raise RuntimeError(f"rank {rank} is not vacant: {snapshot['ranks'][rank]}")
        joiner = inst.join(f"broker.rank={rank}")
        reserved_at = None
        while True:
            arrived, snapshot = watch.next(deadline, inst.check_joiners)
            state = snapshot["ranks"][rank]
            if reserved_at is None and state["state"] == "reserved":
                reserved_at = arrived
            if state["state"] == "online":
                if state["pid"] not in (None, joiner.pid):
                    raise RuntimeError(f"rank {rank} online with pid {state['pid']}, not ours")
                return JoinTimes(
                    None if reserved_at is None else reserved_at - joiner.started,
                    arrived - joiner.started,
                )


def bench_single(
    report: Report, runs: int, *, name: str, test_size: int, rank: int, what: str
) -> float:
    size, fanout = 4, 2
    results = []
    for run in range(runs):
        times = join_one(test_size, size, fanout, rank)
        results.append(times)
        progress(f"{name}: run {run + 1}/{runs}: {ms(times.online)} ms")
    online = [t.online for t in results]
    reserved = [t.reserved for t in results if t.reserved is not None]
    after = [t.online - t.reserved for t in results if t.reserved is not None]
    target = ""
    if name == "leaf":
        target = (
            f"< {TARGET_LEAF_S * 1000:g} ms (most of it interpreter start-up) "
            f"{verdict(median(online) < TARGET_LEAF_S)}"
        )
    rows = [stat_row(f"Popen → rank {rank} online", online, target)]
    if reserved:
        rows.append(stat_row(f"  Popen → rank {rank} reserved", reserved))
        rows.append(stat_row("  reserved → online (kex, connect, hello)", after))
    report.heading(
        f"{name.capitalize()} join: {what} (size {size}, fanout {fanout}, "
        f"--test-size={test_size}), {runs} runs"
    )
    report.table(STAT_HEADER, rows)
    if len(reserved) < len(results):
        report.note(
            f"`reserved` was pushed in {len(reserved)} of {len(results)} runs (a snapshot is "
            "one per batch of changes, so a short-lived reservation may not be seen)."
        )
    return median(online)


# --- 3. many joiners at once ----------------------------------------------------------------------


@dataclass
class ManyTimes:
    total: float  # first Popen -> all online
    first_reserved: float  # first Popen -> first snapshot showing any rank reserved
    each: list[float]  # each joiner's Popen -> its rank online
    cpu: list[float]  # each joiner's CPU seconds (user + system) when all were online


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a running process (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def join_many(count: int) -> ManyTimes:
    """Size count+1 (fanout 4), rank 0 only; Popen `count` joiners back to back (no rank asked)
    and time until rank 0 pushes all of them online."""
    from tbon.overlay.connectors.client import Client

    attributes = [f"size={count + 1}", "tbon.fanout=4"]
    with instance(1, attributes) as inst, Client(inst.uri) as client:
        watch = Watch(client)
        deadline = time.monotonic() + JOIN_DEADLINE_S
        watch.next(deadline)
        joiners = [inst.join() for _ in range(count)]
        by_pid = {j.pid: j for j in joiners}
        online_at: dict[int, float] = {}  # pid -> first snapshot showing its rank online
        first_reserved = None
        while len(online_at) < count:
            arrived, snapshot = watch.next(deadline, inst.check_joiners)
            for entry in snapshot["ranks"][1:]:
                pid = entry["pid"]
                if first_reserved is None and entry["state"] in ("reserved", "online"):
                    first_reserved = arrived
                if entry["state"] == "online" and pid not in online_at:
                    if pid not in by_pid:
                        raise RuntimeError(f"rank {entry['rank']} online with unknown pid {pid}")
                    online_at[pid] = arrived
        cpu = [c for c in (cpu_seconds(j.pid) for j in joiners) if c is not None]
        first = joiners[0].started
        assert first_reserved is not None
        return ManyTimes(
            total=max(online_at.values()) - first,
            first_reserved=first_reserved - first,
            each=[online_at[j.pid] - j.started for j in joiners],
            cpu=cpu,
        )


def bench_many(report: Report, runs: int) -> None:
    results = []
    for run in range(runs):
        times = join_many(MANY)
        results.append(times)
        progress(f"many: run {run + 1}/{runs}: all {MANY} online in {ms(times.total)} ms")
    each = [t for r in results for t in r.each]
    cpu = [c for r in results for c in r.cpu]
    report.heading(
        f"{MANY} joiners at once (size {MANY + 1}, fanout 4, --test-size=1, no rank asked), "
        f"{runs} runs"
    )
    rows = [
        stat_row(f"first Popen → all {MANY} online", [r.total for r in results]),
        stat_row("  first Popen → first rank reserved", [r.first_reserved for r in results]),
        stat_row(
            f"  first reserved → all {MANY} online", [r.total - r.first_reserved for r in results]
        ),
        stat_row(f"each joiner: its Popen → its rank online ({len(each)} joins)", each),
    ]
    if cpu:
        rows.append(stat_row("CPU per joiner (user+sys) when all are online", cpu))
    report.table(STAT_HEADER, rows)
    usable = usable_cpus() or 1
    report.note(
        f"Ranks 5-{MANY} are children of ranks 1-4, so some joiners wait for their parent. All "
        f"{MANY} start together on {usable} CPUs: start-up is CPU-bound, so the floor for the "
        f"total is about {MANY} times the CPU per joiner over {usable} CPUs, plus other load."
    )


# --- 4. replacing a killed leaf -------------------------------------------------------------------


@dataclass
class ReplaceTimes:
    lost: float  # SIGKILL -> rank 3 lost pushed
    online: float  # SIGKILL -> rank 3 online again (incarnation 2)
    join: float  # joiner's Popen -> rank 3 online again


def replace_once() -> ReplaceTimes:
    from tbon.overlay.connectors.client import Client

    rank = 3
    with instance(4, ["tbon.fanout=2"]) as inst, Client(inst.uri) as client:
        watch = Watch(client)
        deadline = time.monotonic() + JOIN_DEADLINE_S
        _, snapshot = watch.until(deadline, all_online)
        old = snapshot["ranks"][rank]
        if old["parent"] != 1 or old["children"] or not old["pid"]:
            raise RuntimeError(f"rank {rank} is not an online leaf under rank 1: {old}")
        killed = time.perf_counter()
        os.kill(old["pid"], signal.SIGKILL)  # a broker of the `tbon start` we started
        lost_at, _ = watch.until(
            deadline, lambda s: s["ranks"][rank]["state"] == "lost", inst.check_joiners
        )
        joiner = inst.join(f"broker.rank={rank}")
        online_at, snapshot = watch.until(
            deadline, lambda s: s["ranks"][rank]["state"] == "online", inst.check_joiners
        )
        entry = snapshot["ranks"][rank]
        if entry["incarnation"] != old["incarnation"] + 1 or entry["pid"] != joiner.pid:
            raise RuntimeError(
                f"replacement of rank {rank}: incarnation {entry['incarnation']} pid "
                f"{entry['pid']}, expected incarnation {old['incarnation'] + 1} pid {joiner.pid}"
            )
        if entry["incarnation"] != 2:
            raise RuntimeError(f"replacement has incarnation {entry['incarnation']}, not 2")
        return ReplaceTimes(lost_at - killed, online_at - killed, online_at - joiner.started)


def bench_replace(report: Report, runs: int) -> None:
    results = []
    for run in range(runs):
        times = replace_once()
        results.append(times)
        progress(
            f"replace: run {run + 1}/{runs}: lost {ms(times.lost)} ms, "
            f"online again {ms(times.online)} ms"
        )
    report.heading(
        f"Replace a killed leaf: SIGKILL rank 3 (size 4, fanout 2), rejoin by FLUB, {runs} runs"
    )
    report.table(
        STAT_HEADER,
        [
            stat_row("kill → rank 3 `lost` pushed", [t.lost for t in results]),
            stat_row("kill → replacement online (incarnation 2)", [t.online for t in results]),
            stat_row("  replacement's Popen → online", [t.join for t in results]),
        ],
    )
    report.note(
        "The replacement `tbon broker -S broker.rank=3` is started as soon as the `lost` snapshot "
        "arrives; every run checks that rank 3 came back with incarnation 2 and the new pid."
    )


# --- 5. start-up floor --------------------------------------------------------------------------


def bench_startup(report: Report, runs: int) -> None:
    python = sys.executable
    commands = [
        ("interpreter: `python -c pass`", [python, "-c", "pass"]),
        ("`python -c 'import zmq, nacl.public'`", [python, "-c", "import zmq, nacl.public"]),
        ("`tbon broker --help`", [str(TBON), "broker", "--help"]),
    ]
    rows = []
    for label, argv in commands:
        progress(f"startup: {label}")
        time_command(argv)  # warm-up
        rows.append(stat_row(label, [time_command(argv) for _ in range(runs)]))
    report.heading(f"For context: process start-up ({runs} runs each)")
    report.table(STAT_HEADER, rows)
    report.note(
        "Each is a full fork/exec/exit, timed like a join (from before Popen). A joiner pays the "
        "interpreter, its imports (pyzmq, PyNaCl, tbon.overlay), a key pair, and the FLUB round "
        "trips."
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    parser.add_argument(
        "--standbys", type=int, default=0, help="tbon.standbys of each instance (default 0)"
    )
    args = parse_args(parser, argv, SECTIONS)
    STANDBYS[0] = args.standbys
    report = begin("join", args.markdown)
    progress("warm-up: one leaf join (page cache, .pyc)")
    join_one(3, 4, 2, 3)
    steps: dict[str, Callable[[], object]] = {
        "leaf": lambda: bench_single(
            report, args.runs, name="leaf", test_size=3, rank=3, what="vacant rank 3 under rank 1"
        ),
        "interior": lambda: bench_single(
            report,
            args.runs,
            name="interior",
            test_size=1,
            rank=1,
            what="rank 1 (child 3 in the topology, vacant)",
        ),
        "many": lambda: bench_many(report, args.runs),
        "replace": lambda: bench_replace(report, args.runs),
        "startup": lambda: bench_startup(report, max(args.runs, 10)),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
