"""Whether rank 0 stays responsive under load (issue 26): `tbon ping 0` and `tbon status
--summary` while N brokers wire up, against the same commands once the instance is idle.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/responsive.py [--size 1024] [--idle 8] [--settle 5] [--force]
        [--sections wireup,expand] [--sessions]

Sections:
  wireup  one `tbon start --test-size=N` (wait mode: it prints its URI once every broker is
          online), measured from when rank 0 listens on its local socket (its name, under the
          run directory `tbon start` makes in the fresh $TMPDIR this script gives it, appears
          once rank 0 accepts on it, after the PMI exchange) until the URI is printed
  expand  rank 0 alone (`tbon start --test-size=1 -S size=N+1`) while `tbon expand -n N` brings
          N brokers in: every join asks rank 0 for a rank and a key exchange

While the load lasts, this script measures these at once (ping and summary each a thread
running its command over and over, so that one command slowed by the load holds back only its
own samples):

  ping      `tbon ping URI 0`, its wall time (a command's start included: what a user waits)
  summary   `tbon status URI --summary`, its wall time
  rtt       the round trips of one `tbon ping URI 0 --interval 10ms` started before the load
            (its CLI imported, then waiting for rank 0's socket) and pinging through both
            phases, each stamped when read: rank 0's own delay, and the machine's, without the
            start-up of a command (which N starting brokers slow by seconds on 2 cores)

then, `--settle` seconds after every broker is online, `--idle` runs of each (again at once) on
the idle instance. The table gives the medians of each phase and their ratio (target: at most
2). A ping or summary that fails (rank 0 silent past the CLI's own 10 s) is counted as failed,
and its wall time kept as a sample: a lower bound of what its user waited. On 2 cores, N Python
brokers starting take the CPU from every command too, so `ping` and `summary` pay for the
machine as well as for rank 0; `rtt` is the part that is rank 0's.

Drives tbon through its CLI only (never `import tbon`; the pinger runs the checkout's own CLI
entry point in a process of its interpreter), so that compare.py --same-script can run it
against an older checkout. Every process it starts is stopped and reaped by PID.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from common import (
    STOP_GRACE_S,
    TBON,
    URI_DEADLINE_S,
    begin,
    log_tail,
    median,
    parse_args,
    positive,
    progress,
    read_line,
    stop,
    tbon_start,
    verdict,
)

SECTIONS = ("wireup", "expand")
MEASURES = ("ping", "summary", "rtt")
PARTS = ("ping cpu", "ping queued", "summary cpu", "summary queued")
"""Of each command's wall time, its main thread's time on a CPU and waiting for one (schedstat):
what is left is its wait for rank 0 (and its other threads)."""
COMMANDS = ("ping", "summary")  # each a command of its own, timed whole
TARGET_RATIO = 2.0
RTT_INTERVAL = "10ms"  # spread over a fifth of a second, not one burst


def rank0_socket(tmp: str) -> str | None:
    """rank 0's local URI once it listens: `tbon start` makes its run directory under $TMPDIR
    (this script gives it a fresh one), and rank 0 binds `.../0/local` under a temporary name
    and renames it, so that the name exists only once rank 0 accepts connections on it."""
    found = glob.glob(os.path.join(tmp, "tbon-start-*", "0", "local"))
    return "local://" + found[0] if found else None


PINGER = """
import glob, sys, time
from tbon.cli.main import _entry  # the CLI's imports done before the load, not under it
while not (found := glob.glob(sys.argv[1])):
    time.sleep(0.005)
sys.argv = ["tbon", "ping", "local://" + found[0], "0", "--count", "100000000",
            "--interval", sys.argv[2], "--timeout", "0"]
sys.exit(_entry())
"""
"""`tbon ping` in a process started before the load: it waits for rank 0's socket, then pings
until stopped, one line a ping (`... time=X ms ...`), flushed as it goes."""


class Pinger:
    """One `tbon ping URI 0 --interval 10ms` through both phases, its CLI started before the
    load: each round trip it prints is stamped when read, so that a phase takes those that came
    in its time. Rank 0's own delay, without any command's start-up (which N starting brokers
    slow by seconds on 2 cores)."""

    def __init__(self, socket_pattern: str, session: bool = False) -> None:
        argv = [sys.executable, "-c", PINGER, socket_pattern, RTT_INTERVAL]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=session,
        )
        self.samples: list[tuple[float, float]] = []  # (when read, round trip in seconds)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            found = re.search(rb"time=([0-9.]+) ms", line)
            if found:
                self.samples.append((time.monotonic(), float(found[1]) / 1000))

    def first(self, limit: float) -> None:
        """Wait (at most `limit` seconds) for its first round trip: it is up and pinging."""
        deadline = time.monotonic() + limit
        while not self.samples and time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.01)  # a list filled by the reader thread: no event to wait on

    def between(self, start: float, end: float) -> list[float]:
        return [rtt for when, rtt in self.samples[1:] if start <= when <= end]  # the first: cold

    def stop(self) -> None:
        stop(self.process)
        self.thread.join(STOP_GRACE_S)


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds on a CPU and seconds runnable but waiting for one (the run queue), summed over
    the threads of `pid` (/proc/PID/task/*/schedstat); (0, 0) once it is gone."""
    run = delay = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as stats:
                fields = stats.read().split()
        except OSError:
            continue
        run, delay = run + int(fields[0]), delay + int(fields[1])
    return run / 1e9, delay / 1e9


def timed_run(argv: Sequence[str], session: bool = False) -> tuple[float, float, float]:
    """Wall time of one run of `argv` (stdin and stdout /dev/null, exit 0 expected), and its
    main thread's time on a CPU and waiting for one, read from the exited process before it is
    reaped (waitid WNOWAIT), so that what the command waited for rank 0 is the rest.
    `session`: in a session of its own, as a command typed at a terminal of its own."""
    started = time.perf_counter()
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=session,
    )
    try:
        assert process.stderr is not None
        said = process.stderr.read()  # to its end: the command has exited, or closed it
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - started
        try:
            with open(f"/proc/{process.pid}/schedstat") as stats:
                fields = stats.read().split()
            run, delay = int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except OSError:
            run = delay = float("nan")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {process.returncode}: {said[-2000:]!r}")
    return wall, run, delay


def rank0_pid(root: int) -> int | None:
    """The PID of rank 0 among `root`'s descendants (its title: `tbon broker rank 0/N`)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read().startswith(b"tbon broker rank 0/"):
                    return pid
            for path in glob.glob(f"/proc/{pid}/task/*/children"):
                with open(path) as children:
                    todo += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return None


class Rank0Clock:
    """Rank 0's time on a CPU and waiting for one (run queue) over a phase, from schedstat."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.start = (time.monotonic(), *schedstat(pid)) if pid else None

    def end(self) -> tuple[float, float, float] | None:
        if self.pid is None or self.start is None:
            return None
        now, run, delay = time.monotonic(), *schedstat(self.pid)
        return now - self.start[0], run - self.start[1], delay - self.start[2]


def one_sample(name: str, uri: str, phase: Phase) -> None:
    """One run of measure `name` (ping or summary) against `uri`. One that fails (rank 0
    silent past the CLI's own timeout, or not serving its socket yet) counts as a failure, and
    its wall time as a sample too: a lower bound of what its user waited, not a gap."""
    argv = [str(TBON), "ping", uri, "0"] if name == "ping" else [str(TBON), "status", uri]
    argv += ["--summary"] if name == "summary" else []
    started = time.perf_counter()
    try:
        wall, run, delay = timed_run(argv, phase.sessions)
        phase.samples[name].append(wall)
        phase.samples[f"{name} cpu"].append(run)
        phase.samples[f"{name} queued"].append(delay)
    except RuntimeError as error:
        phase.samples[name].append(time.perf_counter() - started)
        phase.failed[name] += 1
        progress(f"{name}: {str(error)[:200]}")


@dataclass
class Phase:
    """What one phase (under load, or idle) gave: each measure's samples, and its failures.
    Each measure runs in a thread of its own, one command after another, so that a command
    slowed by the load does not hold the others' samples back."""

    samples: dict[str, list[float]] = field(
        default_factory=lambda: {m: [] for m in MEASURES + PARTS}
    )
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MEASURES + PARTS, 0))
    rank0: tuple[float, float, float] | None = None  # seconds: wall, on a CPU, queued
    sessions: bool = False  # each command in a session of its own (a terminal of its own)

    def rounds(self, uri: str, count: int) -> None:
        """`count` runs of each measure, the measures at once (idle)."""

        def loop(name: str) -> None:
            for _ in range(count):
                one_sample(name, uri, self)

        self._threads(loop)

    def during(self, uri: str, over: threading.Event) -> list[threading.Thread]:
        """Each measure over and over until `over` is set (the load ended); the threads, to
        join once it is."""

        def loop(name: str) -> None:
            while not over.is_set():
                one_sample(name, uri, self)

        return self._threads(loop, wait=False)

    def _threads(self, loop: Callable[[str], None], wait: bool = True) -> list[threading.Thread]:
        threads = [threading.Thread(target=loop, args=(name,)) for name in COMMANDS]
        for thread in threads:
            thread.start()
        if wait:
            for thread in threads:
                thread.join()
        return threads


def measure(size: int, idle_rounds: int, settle: float, force: bool) -> tuple[Phase, Phase, float]:
    """Samples during the wire-up and idle, and how long the wire-up took."""
    argv = [str(TBON), "start", f"--test-size={size}", *(["--force"] if force else [])]
    fd, log = tempfile.mkstemp(prefix="responsive-start-", suffix=".log")
    loaded, idle = Phase(), Phase()
    with tempfile.TemporaryDirectory(prefix="responsive-") as tmp:
        pinger = Pinger(os.path.join(tmp, "tbon-start-*", "0", "local"))
        try:
            started = time.monotonic()
            launcher = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=fd,
                env={**os.environ, "TMPDIR": tmp},
            )
            try:
                assert launcher.stdout is not None
                deadline = started + URI_DEADLINE_S * 4
                uri = None
                while uri is None:
                    if time.monotonic() > deadline or launcher.poll() is not None:
                        raise RuntimeError(f"rank 0 never listened: {log_tail(log)}")
                    uri = rank0_socket(tmp)
                    time.sleep(0.005)  # a file's name has no event to wait on
                listening = time.monotonic()
                progress(f"rank 0 listens at {uri} after {listening - started:.2f} s")
                over = threading.Event()
                threads = loaded.during(uri, over)
                try:
                    left = deadline - time.monotonic()
                    line = read_line(launcher, max(0.0, left))  # the URI, once all are online
                    up = time.monotonic()
                    online = up - started
                finally:
                    over.set()
                    for thread in threads:
                        thread.join()
                if not line.startswith("local://"):
                    raise RuntimeError(f"tbon start printed {line!r}: {log_tail(log)}")
                progress(f"all {size} online after {online:.1f} s; settling {settle:g} s")
                time.sleep(settle)  # not a wait for a condition: the quiet spell before idle
                quiet = time.monotonic()
                idle.rounds(uri, idle_rounds)
                loaded.samples["rtt"] = pinger.between(listening, up)
                idle.samples["rtt"] = pinger.between(quiet, time.monotonic())
            finally:
                stop(launcher)
        finally:
            pinger.stop()
            os.close(fd)
            os.unlink(log)
    return loaded, idle, online


def measure_expand(
    size: int,
    idle_rounds: int,
    settle: float,
    force: bool,
    sessions: bool = False,
    one_terminal: bool = False,
) -> tuple[Phase, Phase, float]:
    """Samples while `tbon expand -n N` brings N brokers into an instance of rank 0 alone (every
    join goes through rank 0: its allocation and its key exchange), then idle. `sessions`: the
    instance and expand each in a session of its own, as if started from other terminals than
    the commands measured (where Linux shares CPU time between sessions, autogroup, that is
    what a user of several terminals sees), and so is each command measured (ping, summary,
    and the pinger: one terminal each, where a user runs one command at a time), unless
    `one_terminal` (session 19's --sessions: the commands measured all in this script's)."""
    apart = sessions and not one_terminal
    loaded, idle = Phase(sessions=apart), Phase(sessions=apart)
    options = ["--test-exit-timeout=1m"]
    with (
        tbon_start(
            1, [f"size={size + 1}"], force=force, options=options, session=sessions
        ) as instance,
        tempfile.TemporaryFile() as said,
    ):
        pinger = Pinger(instance.uri[len("local://") :], apart)
        pinger.first(URI_DEADLINE_S)
        rank0 = rank0_pid(instance.process.pid)
        clock = Rank0Clock(rank0)
        argv = [str(TBON), "expand", instance.uri, "-n", str(size), "--timeout", "5m"]
        started = time.monotonic()
        expand = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=said,
            start_new_session=sessions,
        )
        over = threading.Event()
        threads = loaded.during(instance.uri, over)
        try:
            expand.wait()
            took = time.monotonic() - started
            loaded.rank0 = clock.end()
        finally:
            over.set()
            stop(expand)
            for thread in threads:
                thread.join()
        if expand.returncode != 0:  # joiners rank 0 did not answer in time: a finding, kept
            said.seek(0)
            lines = said.read().decode(errors="replace").strip().splitlines()
            failures = sum("tbon expand: broker pid" in line for line in lines)
            progress(
                f"tbon expand exited {expand.returncode}: {failures} of {size} brokers did "
                f"not join; the last said: {lines[-1][:300] if lines else ''}"
            )
        progress(f"expand ended after {took:.1f} s; settling {settle:g} s")
        time.sleep(settle)  # not a wait for a condition: the quiet spell before idle rounds
        quiet = time.monotonic()
        clock = Rank0Clock(rank0)
        idle.rounds(instance.uri, idle_rounds)
        idle.rank0 = clock.end()
        loaded.samples["rtt"] = pinger.between(started, started + took)
        idle.samples["rtt"] = pinger.between(quiet, time.monotonic())
        pinger.stop()
    return loaded, idle, took


def rows_of(loaded: Phase, idle: Phase) -> list[list[str]]:
    rows = []
    for name in MEASURES + PARTS:
        if name in PARTS and not (loaded.samples[name] and idle.samples[name]):
            continue
        during_samples, idle_samples = loaded.samples[name], idle.samples[name]
        failed = f"{loaded.failed[name]}/{idle.failed[name]}"
        if not during_samples or not idle_samples:
            rows.append([name, str(len(during_samples)), failed, "-", "-", "-", "no samples"])
            continue
        during, quiet = median(during_samples), median(idle_samples)
        ratio = during / quiet
        rows.append(
            [
                name,
                str(len(during_samples)),
                failed,
                f"{during * 1000:.1f}",
                f"{quiet * 1000:.1f}",
                f"{ratio:.2f}",
                "of the above"
                if name in PARTS
                else f"≤ {TARGET_RATIO:g} {verdict(ratio <= TARGET_RATIO)}",
            ]
        )
    if loaded.rank0 and idle.rank0:
        for index, what in ((1, "rank 0 on a CPU"), (2, "rank 0 queued")):
            during, quiet = (p.rank0[index] / p.rank0[0] for p in (loaded, idle))  # type: ignore[index]
            rows.append([what, "-", "-", f"{during:.1%}", f"{quiet:.1%}", "-", "share of wall"])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="brokers (default 1024)")
    parser.add_argument("--idle", type=int, default=8, help="idle rounds (default 8)")
    parser.add_argument(
        "--settle", type=positive, default=5.0, help="idle before measuring (default 5)"
    )
    parser.add_argument("--force", action="store_true", help="pass --force to `tbon start`")
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="expand: the instance, expand and each command measured in a session of its own "
        "(a terminal each)",
    )
    parser.add_argument(
        "--one-terminal",
        action="store_true",
        help="with --sessions: the commands measured share this script's session (session 19)",
    )
    args = parse_args(parser, argv, SECTIONS, counts=("--idle",))
    report = begin("responsive", args.markdown)
    header = [
        "measure",
        "samples during",
        "failed during/idle",
        "during ms",
        "idle ms",
        "ratio",
        "target",
    ]
    note = (
        "ping and summary: wall time of `tbon ping URI 0` and `tbon status URI --summary`; rtt: "
        f"round trips of one `tbon ping URI 0 --interval {RTT_INTERVAL}` running through both "
        "phases, started before the load."
    )
    if "wireup" in args.sections:
        loaded, idle, online = measure(args.size, args.idle, args.settle, args.force)
        report.heading(
            f"Rank 0 while {args.size} brokers wire up (`tbon start`, all online after "
            f"{online:.1f} s), against idle: medians"
        )
        report.table(header, rows_of(loaded, idle))
        report.note(f"{note} From when rank 0 listens (after the PMI exchange) to all online.")
    if "expand" in args.sections:
        loaded, idle, took = measure_expand(
            args.size, args.idle, args.settle, args.force, args.sessions, args.one_terminal
        )
        report.heading(
            f"Rank 0 while {args.size} brokers join (`tbon expand -n {args.size}`, "
            f"{took:.1f} s), against idle: medians"
        )
        rows = rows_of(loaded, idle)
        rows.append(["expand itself", "1", "-", f"{took * 1000:.0f}", "-", "-", "its wall time"])
        report.table(header, rows)
        report.note(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
