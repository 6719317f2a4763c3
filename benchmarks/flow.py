"""`tbon exec` flow control benchmarks: a reader that stops, and stdin against stdout.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/flow.py [--hold S] [--bytes B] [--rss-cap MB] [--runs R]
        [--markdown] [--sections slow,stdin,greedy] [--clients N] [--greedy-bytes B]

This script talks to tbon through its command line only (`tbon start`, `tbon status --json`,
`tbon exec`) and reads memory from /proc: it imports nothing but the standard library and
common.py, never tbon. So it also measures an OLDER checkout, one without flow control, when run
with that checkout's interpreter (common.TBON is the `tbon` next to sys.executable):

    /tmp/before/.venv/bin/python benchmarks/flow.py
    .venv/bin/python benchmarks/compare.py --before /tmp/before --same-script flow.py

Every measurement is taken against an instance that is already up (`tbon start --test-size=N` in
wait mode, and `tbon status URI --wait full` before anything is measured). Nothing here sleeps
and hopes: every wait has a deadline, and every process this script starts (the `tbon start`
launchers, the `tbon status` and `tbon exec` CLIs) is reaped by PID whether the benchmark passes
or fails. Processes it did not start (the brokers, their jobs) are only read about in /proc,
never signalled. Progress goes to stderr, tables to stdout (`--markdown` for GitHub tables).
MB = 10^6 bytes throughout; RSS is VmRSS from /proc/PID/status.

Sections (select with --sections):
  slow   16 brokers (kary:4: rank 0, 4 below it, 11 below those) each run `head -c BYTES
         /dev/zero` (--bytes, default 64000000) into a `tbon exec -r all` whose stdout the
         benchmark does not read for --hold seconds (default 30). Idle RSS: each broker after a
         warm-up `tbon exec -r all sleep 2`, and the CLI's largest sample during that run. Then
         every broker's and the CLI's RSS every 0.5 s while the output is unread, keeping the
         peaks; if a broker or the CLI passes --rss-cap MB (default 4000; a tbon without flow
         control buffers everything) the hold ends early. At the end of the hold, how much the
         jobs had written (wchar in /proc/PID/io of those still running, BYTES for each that
         had finished). Then the output is read to EOF and counted and the drain timed; the CLI
         must exit 0 and every byte (16 x BYTES) must arrive, or the run fails. Target (the
         issue): every broker and the CLI stay within 64 MB of their idle RSS, and the reader
         afterwards gets every byte.
  stdin  4 brokers (kary:32: ranks 1-3 below rank 0): 20 MB from a file into `tbon exec -r 3
         wc -c` (its output must be 20000000), against 20 MB out of `tbon exec -r 3 head -c
         20000000 /dev/zero` into /dev/null; --runs R (default 3) of each, interleaved, after
         one untimed run of the second whose output is counted. Wall time from Popen to exit.
         Target: stdin within 1.5x the time of stdout (medians).
  greedy 4 brokers (kary:32); --clients N (default 8) greedy clients of rank 0's socket, each
         a raw connection speaking the wire protocol (docs/protocol.md §1.2; framed here with
         struct, not tbon's code): it starts `head -c B /dev/zero` (--greedy-bytes, default
         64000000) on every rank with a 4 MiB window, sends every rank `exec.credit` for a whole
         window every 50 ms, and never reads. Rank 0's RSS: idle (after a warm-up `tbon exec -r
         all true`), the peak of samples every 0.1 s for --hold seconds (ended early past
         --rss-cap), and after the clients go (their sockets closed, every `head` gone, then one
         `tbon status`). Target (issue 24): growth under 128 MB; before issue 24 each client
         was held to its own 64 MiB alone, so eight took rank 0 up by about 500 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    RUN_DEADLINE_S,
    TBON,
    Report,
    begin,
    log_tail,
    median,
    ms,
    parse_args,
    positive,
    progress,
    spread,
    stop,
    tbon_start,
    time_command,
    verdict,
)

MB = 1_000_000
SECTIONS = ("slow", "stdin", "greedy")
ONLINE_DEADLINE_S = 60.0  # for `tbon status --wait full` to see every rank online

SLOW_SIZE = 16
SLOW_TOPOLOGY = "kary:4"
TARGET_GROWTH_MB = 64.0  # each broker's and the CLI's RSS above idle, output unread
SAMPLE_EVERY_S = 0.5  # RSS samples while the output is unread
IDLE_COMMAND = ("sleep", "2")  # the warm-up whose CLI gives the CLI's idle RSS

STDIN_SIZE = 4
STDIN_RANK = "3"  # one hop below rank 0 with kary:32
STDIN_BYTES = 20_000_000
TARGET_STDIN_RATIO = 1.5  # stdin time / stdout time, medians

GREEDY_SIZE = 4
GREEDY_WINDOW = 4 * 1024 * 1024  # the largest output window a target takes
GREEDY_EVERY_S = 0.05  # how often a greedy client grants itself credit
TARGET_GREEDY_GROWTH_MB = 128.0


# --- the CLIs we start --------------------------------------------------------------------------


@dataclass
class Cli:
    """A `tbon` CLI we started, and the log its stderr goes to."""

    process: subprocess.Popen[bytes]
    argv: list[str]
    stderr_path: str

    def fail(self, why: str) -> RuntimeError:
        """The error to raise about this CLI: what it was, why, and what it said last."""
        return RuntimeError(f"`{' '.join(self.argv)}` {why}: {log_tail(self.stderr_path)}")

    def finish(self, limit: float = RUN_DEADLINE_S) -> None:
        """Wait up to `limit` seconds for its exit, which must be 0 (a hang raises
        TimeoutExpired, and cli() then kills it)."""
        if self.process.wait(limit) != 0:
            raise self.fail(f"exited {self.process.returncode}")


@contextlib.contextmanager
def cli(
    argv: Sequence[str], *, stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.DEVNULL
) -> Iterator[Cli]:
    """Popen `argv` (stderr to a temporary log). On the way out, always: our end of its stdout
    pipe is closed (a CLI blocked writing to it gets EPIPE rather than waiting for us), then it is
    stopped by PID (common.stop: SIGTERM, SIGKILL after the grace) and reaped, and the log
    removed."""
    fd, stderr_path = tempfile.mkstemp(prefix="flow-cli-", suffix=".log")
    try:
        process = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=fd)
    except BaseException:
        os.unlink(stderr_path)
        raise
    finally:
        os.close(fd)
    try:
        yield Cli(process, list(argv), stderr_path)
    finally:
        try:
            if process.stdout is not None:
                process.stdout.close()
            stop(process)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(stderr_path)


def broker_pids(uri: str, size: int) -> dict[int, int]:
    """Rank -> broker PID, once `tbon status URI --wait full` says every rank is online."""
    argv = [str(TBON), "status", uri, "--wait", "full", "--timeout", f"{ONLINE_DEADLINE_S:g}s"]
    with cli([*argv, "--json"], stdout=subprocess.PIPE) as status:
        out, _ = status.process.communicate(timeout=ONLINE_DEADLINE_S + 30)
        status.finish()
    ranks = json.loads(out)["ranks"]
    if len(ranks) != size or any(r["state"] != "online" for r in ranks):
        raise RuntimeError(f"{uri}: expected {size} online ranks, got {ranks}")
    return {r["rank"]: r["pid"] for r in ranks}


def drain(cli_: Cli, limit: float = RUN_DEADLINE_S) -> int:
    """Read the CLI's stdout to EOF in chunks of up to 1 MiB, counting bytes; RuntimeError if
    nothing arrives, or EOF has not come, within `limit` seconds."""
    assert cli_.process.stdout is not None
    fd = cli_.process.stdout.fileno()
    deadline = time.monotonic() + limit
    count = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise cli_.fail(f"sent no EOF within {limit:g}s ({count} bytes read)")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return count
            count += len(chunk)


# --- /proc --------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    """The process's resident set in MB, or None if it is gone (or a zombie, which has none)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError):
        return None
    return None


def jobs_written(parents: set[int], name: str) -> tuple[int, int] | None:
    """(how many, bytes written) of the live processes called `name` whose parent is one of
    `parents`, from their /proc/PID/io wchar; None if some of it cannot be read."""
    running, written = 0, 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            if int(ppid) not in parents or state == "Z":
                continue
            if Path(entry.path, "comm").read_text().strip() != name:
                continue
            io = Path(entry.path, "io").read_text()
        except FileNotFoundError:  # it exited while we looked
            continue
        except (OSError, ValueError):
            return None
        running += 1
        written += next(int(x.split()[1]) for x in io.splitlines() if x.startswith("wchar:"))
    return running, written


@dataclass
class Peaks:
    """The largest RSS seen of each process (by name) and of their sum, sample after sample."""

    pids: dict[str, int]
    peak: dict[str, float]
    total: float = 0.0

    @classmethod
    def of(cls, pids: dict[str, int]) -> Peaks:
        return cls(pids, dict.fromkeys(pids, 0.0))

    def sample(self) -> dict[str, float]:
        """Read every RSS once; return this sample (the processes that are gone left out)."""
        now = {}
        for name, pid in self.pids.items():
            rss = rss_mb(pid)
            if rss is not None:
                now[name] = rss
                self.peak[name] = max(self.peak[name], rss)
        return now


# --- 1. slow reader -----------------------------------------------------------------------------


def cli_idle_rss(uri: str) -> float:
    """The CLI's RSS while it runs a quiet job: the largest of samples every 0.1 s from its start
    to its exit (which must be 0)."""
    with cli([str(TBON), "exec", "-r", "all", uri, *IDLE_COMMAND]) as idle:
        deadline = time.monotonic() + RUN_DEADLINE_S
        peak = 0.0
        while idle.process.poll() is None:
            if time.monotonic() > deadline:
                raise idle.fail(f"ran past {RUN_DEADLINE_S:g}s")
            peak = max(peak, rss_mb(idle.process.pid) or 0.0)
            time.sleep(0.1)
        idle.finish()
    return peak


def bench_slow(report: Report, nbytes: int, hold: float, cap: float) -> None:
    expected = SLOW_SIZE * nbytes
    with tbon_start(SLOW_SIZE, [f"tbon.topo={SLOW_TOPOLOGY}"]) as inst:
        pids = broker_pids(inst.uri, SLOW_SIZE)
        progress(f"slow: {SLOW_SIZE} brokers online; idle RSS (`tbon exec -r all sleep 2`)")
        cli_idle = cli_idle_rss(inst.uri)
        brokers = {f"rank {rank}": pid for rank, pid in sorted(pids.items())}
        idle = {name: rss_mb(pid) or 0.0 for name, pid in brokers.items()}
        idle["cli"] = cli_idle
        idle_sum = sum(v for k, v in idle.items() if k != "cli")
        argv = [str(TBON), "exec", "-r", "all", inst.uri, "head", "-c", str(nbytes), "/dev/zero"]
        progress(f"slow: {SLOW_SIZE} x `head -c {nbytes} /dev/zero`, output unread for {hold:g}s")
        with cli(argv, stdout=subprocess.PIPE) as writer:
            peaks = Peaks.of({**brokers, "cli": writer.process.pid})
            peak_sum = 0.0
            early = ""  # why the hold ended before --hold, if it did
            started = time.monotonic()
            while True:
                now = peaks.sample()
                peak_sum = max(peak_sum, sum(v for k, v in now.items() if k != "cli"))
                over = [(v, k) for k, v in now.items() if v > cap]
                if over:
                    rss, name = max(over)
                    early = f"RSS cap reached ({name} at {rss:.0f} MB > --rss-cap {cap:g})"
                    break
                if writer.process.poll() is not None:  # it cannot be done: nobody read it
                    early = f"the CLI exited ({writer.process.returncode})"
                    break
                left = started + hold - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(SAMPLE_EVERY_S, left))
            held = time.monotonic() - started
            written = jobs_written(set(pids.values()), "head")
            progress(f"slow: held {held:.1f}s{': ' + early if early else ''}; draining")
            drain_started = time.perf_counter()
            received = drain(writer)
            drained = time.perf_counter() - drain_started
            status = writer.process.wait(RUN_DEADLINE_S)
            failed = writer.fail(f"exited {status}") if status else None
    report_slow(report, nbytes, hold, held, early, idle, idle_sum, peaks, peak_sum)
    if written is None:
        jobs = "how much the jobs had written could not be read from /proc"
    else:
        running, wrote = written
        finished = SLOW_SIZE - running
        jobs = (
            f"{running} of {SLOW_SIZE} jobs were still running (not done writing) and the jobs "
            f"had written about {(wrote + finished * nbytes) / MB:.1f} MB of {expected / MB:g} MB"
        )
    report.note(
        f"Reader stopped for {held:.1f} s (--hold {hold:g})"
        + (f", ended early: {early}" if early else "")
        + f". When it resumed, {jobs}."
    )
    report.note(
        f"Received {received} bytes of {expected} expected "
        f"({'every byte' if received == expected else 'NOT every byte'}); drain "
        f"{ms(drained)} ms ({received / MB / drained:.0f} MB/s); the CLI exited {status}."
    )
    report.note(
        f"{SLOW_SIZE} ranks, {SLOW_TOPOLOGY}, each `head -c {nbytes} /dev/zero`. Idle: each "
        "broker after a warm-up `tbon exec -r all sleep 2`, the CLI its largest RSS during that "
        f"run; peak: the largest of samples every {SAMPLE_EVERY_S:g} s while unread (the sum row: "
        "the largest sum of one sample). Target (the issue): every broker and the CLI within "
        f"{TARGET_GROWTH_MB:g} MB of idle, and every byte arrives afterwards."
    )
    if failed is not None:
        raise failed
    if received != expected:
        raise RuntimeError(f"slow: received {received} bytes, expected {expected}")


def report_slow(
    report: Report,
    nbytes: int,
    hold: float,
    held: float,
    early: str,
    idle: dict[str, float],
    idle_sum: float,
    peaks: Peaks,
    peak_sum: float,
) -> None:
    def growth(name: str) -> float:
        return peaks.peak[name] - idle[name]

    def row(label: str, before: float, peak: float, target: str | None = None) -> list[str]:
        ok = peak - before <= TARGET_GROWTH_MB
        cells = [f"{before:.1f}", f"{peak:.1f}", f"{peak - before:.1f}"]
        return [label, *cells, verdict(ok) if target is None else target]

    others = [name for name in idle if name not in ("rank 0", "cli")]
    busiest = max(others, key=growth)
    every = all(growth(name) <= TARGET_GROWTH_MB for name in idle if name != "cli")
    rows = [
        row("rank 0", idle["rank 0"], peaks.peak["rank 0"]),
        row(f"busiest other broker ({busiest})", idle[busiest], peaks.peak[busiest]),
        row(f"all {len(others) + 1} brokers, sum", idle_sum, peak_sum, f"each: {verdict(every)}"),
        row("`tbon exec` CLI", idle["cli"], peaks.peak["cli"]),
    ]
    short = early.split(" (")[0]  # the reason without its figures
    report.heading(
        f"Slow reader: {SLOW_SIZE} ranks x {nbytes / MB:g} MB into a `tbon exec` whose output is "
        f"not read for {hold:g} s" + (f" (held only {held:.1f} s: {short})" if early else "")
    )
    report.table(
        [
            "process",
            "idle RSS MB",
            "peak RSS MB while unread",
            "growth MB",
            f"growth <= {TARGET_GROWTH_MB:g} MB",
        ],
        rows,
    )


# --- 2. stdin against stdout --------------------------------------------------------------------


def time_stdin(argv: Sequence[str], path: str, expect: bytes) -> float:
    """Wall time of one run of `argv` with stdin from `path`, from before its Popen to its exit
    (which must be 0), its output checked against `expect`."""
    with open(path, "rb") as source:
        started = time.perf_counter()
        with cli(argv, stdin=source, stdout=subprocess.PIPE) as reader:
            out, _ = reader.process.communicate(timeout=RUN_DEADLINE_S)
            elapsed = time.perf_counter() - started
            reader.finish()
    if out.strip() != expect:
        raise RuntimeError(f"`{' '.join(argv)}` printed {out[:200]!r}, expected {expect!r}")
    return elapsed


def bench_stdin(report: Report, runs: int) -> None:
    def mbps(seconds: float) -> str:
        return f"{STDIN_BYTES / MB / seconds:.1f}"

    with tbon_start(STDIN_SIZE) as inst, tempfile.TemporaryDirectory(prefix="flow-") as tmp:
        broker_pids(inst.uri, STDIN_SIZE)
        path = os.path.join(tmp, "input")
        with open(path, "wb") as data:
            data.write(bytes(STDIN_BYTES))
        exec_ = [str(TBON), "exec", "-r", STDIN_RANK, inst.uri]
        reader = [*exec_, "wc", "-c"]
        writer = [*exec_, "head", "-c", str(STDIN_BYTES), "/dev/zero"]
        progress("stdin: check run of the stdout case (output counted)")
        with cli(writer, stdout=subprocess.PIPE) as check:
            got = drain(check)
            check.finish()
        if got != STDIN_BYTES:
            raise RuntimeError(f"stdin: `{' '.join(writer)}` wrote {got}, not {STDIN_BYTES}")
        into, out_of = [], []
        for run in range(runs):
            into.append(time_stdin(reader, path, str(STDIN_BYTES).encode()))
            out_of.append(time_command(writer, stdout=subprocess.DEVNULL))
            progress(
                f"stdin: run {run + 1}/{runs}: stdin {ms(into[-1])} ms, stdout {ms(out_of[-1])} ms"
            )
    ratio = median(into) / median(out_of)
    report.heading(f"stdin against stdout: 20 MB through one hop ({runs} runs each)")
    report.table(
        ["measure", "median ms", "min ms", "max ms", "median MB/s", "x stdout", "target"],
        [
            [
                f"stdin: a 20 MB file into `wc -c` on rank {STDIN_RANK}",
                *spread(into),
                mbps(median(into)),
                f"{ratio:.2f}",
                f"<= {TARGET_STDIN_RATIO:g}x: {verdict(ratio <= TARGET_STDIN_RATIO)}",
            ],
            [
                f"stdout: `head -c {STDIN_BYTES}` on rank {STDIN_RANK} to /dev/null",
                *spread(out_of),
                mbps(median(out_of)),
                "1.00",
                "",
            ],
        ],
    )
    report.note(
        f"Size {STDIN_SIZE}, kary:32 (ranks 1-3 below rank 0). `tbon exec -r {STDIN_RANK} URI "
        f"wc -c` with stdin a file of {STDIN_BYTES} zero bytes (its output must be "
        f"{STDIN_BYTES}), and `tbon exec -r {STDIN_RANK} URI head -c {STDIN_BYTES} /dev/zero` "
        "with stdout on /dev/null, interleaved, each timed from Popen to exit; one untimed run "
        "of the second first, its output counted. Target: stdin within "
        f"{TARGET_STDIN_RATIO:g}x the time of stdout (medians)."
    )


# --- 3. greedy clients ---------------------------------------------------------------------------


class Greedy:
    """A client of a broker's socket that starts a job flooding stdout on `ranks`, gives every
    rank its whole window back every GREEDY_EVERY_S, and never reads: the client the issue
    found multiplied the per-client bound. Framing as docs/protocol.md §1.3 has it: a 4-byte
    count of frames, then each frame with its 4-byte length, big-endian."""

    def __init__(self, path: str, number: int, ranks: list[int], nbytes: int) -> None:
        self.id = f"greedy-{number}"
        self.ranks = ranks
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(RUN_DEADLINE_S)  # the broker always reads: a write never waits long
        self.sock.connect(path)
        self.alive = True
        argv = ["head", "-c", str(nbytes), "/dev/zero"]
        start = {"id": self.id, "argv": argv, "cwd": None, "env": None, "targets": ranks}
        self._send("exec.start", 0, {**start, "eof": True, "window": GREEDY_WINDOW}, tag=1)

    def _send(self, topic: str, rank: int, payload: dict[str, Any], tag: int = 0) -> None:
        frames = [
            json.dumps({"v": 1, "k": "request", "t": topic, "n": rank, "g": tag}).encode(),
            json.dumps(payload).encode(),
        ]
        data = struct.pack(">I", len(frames))
        for frame in frames:
            data += struct.pack(">I", len(frame)) + frame
        try:
            self.sock.sendall(data)
        except OSError:  # closed by the broker: it was dropped
            self.alive = False

    def credit(self) -> None:
        for rank in self.ranks:
            if self.alive:
                self._send("exec.credit", rank, {"id": self.id, "bytes": GREEDY_WINDOW})

    def close(self) -> None:
        self.sock.close()


def bench_greedy(report: Report, clients: int, nbytes: int, hold: float, cap: float) -> None:
    ranks = list(range(GREEDY_SIZE))
    with tbon_start(GREEDY_SIZE) as inst:
        pids = broker_pids(inst.uri, GREEDY_SIZE)
        rank0 = pids[0]
        time_command([str(TBON), "exec", "-r", "all", inst.uri, "true"], stdout=subprocess.DEVNULL)
        idle = rss_mb(rank0) or 0.0
        progress(f"greedy: rank 0 idle at {idle:.1f} MB; {clients} greedy clients for {hold:g}s")
        path = inst.uri.removeprefix("local://")
        greedy: list[Greedy] = []
        peak, early = idle, ""
        try:
            greedy = [Greedy(path, number, ranks, nbytes) for number in range(clients)]
            started = time.monotonic()
            while (left := started + hold - time.monotonic()) > 0:
                for client in greedy:
                    client.credit()
                peak = max(peak, rss_mb(rank0) or 0.0)
                if peak > cap:
                    early = f"RSS cap reached ({peak:.0f} MB > --rss-cap {cap:g})"
                    break
                time.sleep(min(GREEDY_EVERY_S, left))
            peak = max(peak, rss_mb(rank0) or 0.0)
        finally:
            for client in greedy:
                client.close()
        dropped = sum(not client.alive for client in greedy)
        deadline = time.monotonic() + RUN_DEADLINE_S
        while (running := jobs_written(set(pids.values()), "head")) is None or running[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"greedy: jobs still running {RUN_DEADLINE_S:g}s after: {running}"
                )
            time.sleep(0.1)
        time_command([str(TBON), "status", inst.uri], stdout=subprocess.DEVNULL)
        after = rss_mb(rank0) or 0.0
    growth = peak - idle
    report.heading(
        f"Greedy clients: {clients} clients of rank 0 that never read, each flooding from "
        f"{GREEDY_SIZE} ranks" + (f" (held less than {hold:g} s: {early})" if early else "")
    )
    report.table(
        ["process", "idle RSS MB", "peak RSS MB", "growth MB", "RSS MB after they went", "target"],
        [
            [
                f"rank 0, {clients} greedy clients",
                f"{idle:.1f}",
                f"{peak:.1f}",
                f"{growth:.1f}",
                f"{after:.1f}",
                f"< {TARGET_GREEDY_GROWTH_MB:g} MB: {verdict(growth < TARGET_GREEDY_GROWTH_MB)}",
            ]
        ],
    )
    report.note(
        f"{GREEDY_SIZE} ranks, kary:32, default bounds. Each client: `exec.start` of `head -c "
        f"{nbytes} /dev/zero` on every rank (window {GREEDY_WINDOW}), `exec.credit` of a whole "
        f"window to every rank every {GREEDY_EVERY_S * 1000:g} ms, nothing read; held "
        f"{hold:g} s; {dropped} of {clients} found their connection closed by the broker while "
        "writing. RSS sampled at every credit round; 'after': once the clients closed their "
        "sockets and every job was gone, after one `tbon status`."
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="stdin runs of each (default 3)")
    parser.add_argument(
        "--bytes", type=int, default=64_000_000, help="slow: bytes per rank (default 64000000)"
    )
    parser.add_argument(
        "--hold", type=positive, default=30.0, help="slow: seconds unread (default 30)"
    )
    parser.add_argument(
        "--rss-cap",
        type=positive,
        default=4000.0,
        help="slow: end the hold early once a broker or the CLI passes this RSS in MB "
        "(default 4000)",
    )
    parser.add_argument(
        "--clients", type=int, default=8, help="greedy: how many clients (default 8)"
    )
    parser.add_argument(
        "--greedy-bytes",
        type=int,
        default=64_000_000,
        help="greedy: bytes each job writes at most (default 64000000)",
    )
    args = parse_args(
        parser, argv, SECTIONS, counts=("--runs", "--bytes", "--clients", "--greedy-bytes")
    )
    report = begin("flow", args.markdown)
    steps: dict[str, Callable[[], object]] = {
        "slow": lambda: bench_slow(report, args.bytes, args.hold, args.rss_cap),
        "stdin": lambda: bench_stdin(report, args.runs),
        "greedy": lambda: bench_greedy(
            report, args.clients, args.greedy_bytes, args.hold, args.rss_cap
        ),
    }
    for name in args.sections:
        steps[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
