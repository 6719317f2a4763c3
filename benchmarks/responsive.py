"""Whether rank 0 stays responsive under load (issue 26): `tbon ping 0` and `tbon status
--summary` while N brokers wire up, against the same commands once the instance is idle.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/responsive.py [--size 1024] [--idle 8] [--settle 5] [--force]
        [--sections wireup,expand]

Sections:
  wireup  one `tbon start --test-size=N` (wait mode: it prints its URI once every broker is
          online), measured from when rank 0 listens on its local socket (found in /proc: the
          Unix socket `.../0/local` of a broker the launcher forked; rank 0 listens after the
          PMI exchange) until the URI is printed
  expand  rank 0 alone (`tbon start --test-size=1 -S size=N+1`) while `tbon expand -n N` brings
          N brokers in: every join asks rank 0 for a rank and a key exchange

Over and over while the load lasts, this script runs:

  ping      `tbon ping URI 0`, its wall time (a command's start included: what a user waits)
  summary   `tbon status URI --summary`, its wall time
  rtt       the round trips of `tbon ping URI 0 --count 5 --json` (measured inside the command,
            so without its start-up: rank 0's own delay, and the machine's)

then, `--settle` seconds after every broker is online, `--idle` more rounds on the idle instance.
The table gives the medians of each phase and their ratio (target: at most 2). On 2 cores, N
Python brokers starting take the CPU from every command too, so `ping` and `summary` pay for the
machine as well as for rank 0; `rtt` is the part that is rank 0's.

Drives tbon through its CLI only (never `import tbon`), so that compare.py --same-script can run
it against an older checkout. Every process it starts is stopped and reaped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from common import (
    TBON,
    URI_DEADLINE_S,
    begin,
    log_tail,
    median,
    parse_args,
    positive,
    progress,
    stop,
    tbon_start,
    time_command,
    verdict,
)

SECTIONS = ("wireup", "expand")
MEASURES = ("ping", "summary", "rtt")
TARGET_RATIO = 2.0
RTT_COUNT = 5


def descendants(pid: int) -> list[int]:
    """The processes `pid` forked, and theirs (the launcher forks a helper that forks brokers)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets `pid` holds open."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def rank0_uri(launcher: int) -> str | None:
    """rank 0's local URI once one of the launcher's brokers listens on `.../0/local` (bound
    under a temporary name, `local.PID`, then renamed: /proc/net/unix shows the first)."""
    held: set[str] = set()
    for child in descendants(launcher):
        held |= socket_inodes(child)
    for row in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = row.split()
        if len(fields) < 8 or fields[6] not in held:
            continue
        path = re.sub(r"\.\d+$", "", fields[7])
        if path.endswith("/0/local") and os.path.exists(path):
            return "local://" + path
    return None


def one_round(uri: str, samples: dict[str, list[float]]) -> None:
    """One of each measure against `uri`; a failed command is skipped (rank 0 may not serve
    its socket yet), not counted."""
    for name, argv in (
        ("ping", [str(TBON), "ping", uri, "0"]),
        ("summary", [str(TBON), "status", uri, "--summary"]),
    ):
        try:
            samples[name].append(time_command(argv))
        except RuntimeError as error:
            progress(f"{name}: {str(error)[:200]}")
    done = subprocess.run(
        [str(TBON), "ping", uri, "0", "--count", str(RTT_COUNT), "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    if done.returncode == 0:
        samples["rtt"] += [ms / 1000 for ms in json.loads(done.stdout)["rtt_ms"][1:]]  # warm


def measure(
    size: int, idle_rounds: int, settle: float, force: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """Samples during the wire-up and idle, and how long the wire-up took."""
    argv = [str(TBON), "start", f"--test-size={size}", *(["--force"] if force else [])]
    fd, log = tempfile.mkstemp(prefix="responsive-start-", suffix=".log")
    loaded: dict[str, list[float]] = {name: [] for name in MEASURES}
    idle: dict[str, list[float]] = {name: [] for name in MEASURES}
    try:
        started = time.monotonic()
        launcher = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fd
        )
        try:
            assert launcher.stdout is not None
            deadline = started + URI_DEADLINE_S * 4
            uri = None
            while uri is None:
                if time.monotonic() > deadline or launcher.poll() is not None:
                    raise RuntimeError(f"rank 0 never listened: {log_tail(log)}")
                uri = rank0_uri(launcher.pid)
                time.sleep(0.01)  # polling /proc: the socket has no event to wait on
            progress(f"rank 0 listens at {uri} after {time.monotonic() - started:.2f} s")
            while not select.select([launcher.stdout], [], [], 0)[0]:
                if time.monotonic() > deadline or launcher.poll() is not None:
                    raise RuntimeError(f"no URI within the deadline: {log_tail(log)}")
                one_round(uri, loaded)
            line = launcher.stdout.readline().decode().strip()
            online = time.monotonic() - started
            if not line.startswith("local://"):
                raise RuntimeError(f"tbon start printed {line!r}: {log_tail(log)}")
            progress(f"all {size} online after {online:.1f} s; settling {settle:g} s")
            time.sleep(settle)  # not a wait for a condition: the quiet spell before idle rounds
            for _ in range(idle_rounds):
                one_round(uri, idle)
        finally:
            stop(launcher)
    finally:
        os.close(fd)
        os.unlink(log)
    return loaded, idle, online


def measure_expand(
    size: int, idle_rounds: int, settle: float, force: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """Samples while `tbon expand -n N` brings N brokers into an instance of rank 0 alone (every
    join goes through rank 0: its allocation and its key exchange), then idle."""
    loaded: dict[str, list[float]] = {name: [] for name in MEASURES}
    idle: dict[str, list[float]] = {name: [] for name in MEASURES}
    options = ["--test-exit-timeout=1m"]
    with tbon_start(1, [f"size={size + 1}"], force=force, options=options) as instance:
        argv = [str(TBON), "expand", instance.uri, "-n", str(size), "--timeout", "5m"]
        started = time.monotonic()
        expand = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            while expand.poll() is None:
                one_round(instance.uri, loaded)
            took = time.monotonic() - started
        finally:
            stop(expand)
        if expand.returncode != 0:  # joiners rank 0 did not answer in time: a finding, kept
            progress(f"tbon expand exited {expand.returncode}: not every broker joined")
        progress(f"expand ended after {took:.1f} s; settling {settle:g} s")
        time.sleep(settle)  # not a wait for a condition: the quiet spell before idle rounds
        for _ in range(idle_rounds):
            one_round(instance.uri, idle)
    return loaded, idle, took


def rows_of(loaded: dict[str, list[float]], idle: dict[str, list[float]]) -> list[list[str]]:
    rows = []
    for name in MEASURES:
        if not loaded[name] or not idle[name]:
            rows.append([name, str(len(loaded[name])), "-", "-", "-", "no samples"])
            continue
        during, quiet = median(loaded[name]), median(idle[name])
        ratio = during / quiet
        rows.append(
            [
                name,
                str(len(loaded[name])),
                f"{during * 1000:.1f}",
                f"{quiet * 1000:.1f}",
                f"{ratio:.2f}",
                f"≤ {TARGET_RATIO:g} {verdict(ratio <= TARGET_RATIO)}",
            ]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="brokers (default 1024)")
    parser.add_argument("--idle", type=int, default=8, help="idle rounds (default 8)")
    parser.add_argument(
        "--settle", type=positive, default=5.0, help="idle before measuring (default 5)"
    )
    parser.add_argument("--force", action="store_true", help="pass --force to `tbon start`")
    args = parse_args(parser, argv, SECTIONS, counts=("--idle",))
    report = begin("responsive", args.markdown)
    header = ["measure", "samples during", "during ms", "idle ms", "ratio", "target"]
    note = (
        "ping and summary: wall time of `tbon ping URI 0` and `tbon status URI --summary`; rtt: "
        f"round trips 2-{RTT_COUNT} of `tbon ping URI 0 --count {RTT_COUNT}`, inside the command."
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
        loaded, idle, took = measure_expand(args.size, args.idle, args.settle, args.force)
        report.heading(
            f"Rank 0 while {args.size} brokers join (`tbon expand -n {args.size}`, "
            f"{took:.1f} s), against idle: medians"
        )
        report.table(header, rows_of(loaded, idle))
        report.note(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
