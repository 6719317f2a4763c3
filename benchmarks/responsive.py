"""Whether rank 0 stays responsive under load (issue 26): `tbon ping 0` and `tbon status
--summary` while N brokers wire up, against the same commands once the instance is idle.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/responsive.py [--size 1024] [--idle 8] [--settle 5] [--force]
        [--sections wireup,expand]

Sections:
  wireup  one `tbon start --test-size=N` (wait mode: it prints its URI once every broker is
          online), measured from when rank 0 listens on its local socket (its name, under the
          run directory `tbon start` makes in the fresh $TMPDIR this script gives it, appears
          once rank 0 accepts on it, after the PMI exchange) until the URI is printed
  expand  rank 0 alone (`tbon start --test-size=1 -S size=N+1`) while `tbon expand -n N` brings
          N brokers in: every join asks rank 0 for a rank and a key exchange

Over and over while the load lasts, this script runs:

  ping      `tbon ping URI 0`, its wall time (a command's start included: what a user waits)
  summary   `tbon status URI --summary`, its wall time
  rtt       the round trips of `tbon ping URI 0 --count 5 --json` (measured inside the command,
            so without its start-up: rank 0's own delay, and the machine's)

then, `--settle` seconds after every broker is online, `--idle` more rounds on the idle instance.
The table gives the medians of each phase and their ratio (target: at most 2). A command that
fails (rank 0 silent past the CLI's own 10 s) is counted as failed, and its wall time kept as a
sample: a lower bound of what its user waited. On 2 cores, N
Python brokers starting take the CPU from every command too, so `ping` and `summary` pay for the
machine as well as for rank 0; `rtt` is the part that is rank 0's.

Drives tbon through its CLI only (never `import tbon`), so that compare.py --same-script can run
it against an older checkout. Every process it starts is stopped and reaped by PID.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def rank0_socket(tmp: str) -> str | None:
    """rank 0's local URI once it listens: `tbon start` makes its run directory under $TMPDIR
    (this script gives it a fresh one), and rank 0 binds `.../0/local` under a temporary name
    and renames it, so that the name exists only once rank 0 accepts connections on it."""
    found = glob.glob(os.path.join(tmp, "tbon-start-*", "0", "local"))
    return "local://" + found[0] if found else None


def one_round(uri: str, samples: dict[str, list[float]], failed: dict[str, int]) -> None:
    """One of each measure against `uri`. A command that fails (rank 0 silent past the CLI's
    own timeout, or not serving its socket yet) counts as a failure, and its wall time as a
    sample too: a lower bound of what its user waited, not a gap in the table."""
    for name, argv in (
        ("ping", [str(TBON), "ping", uri, "0"]),
        ("summary", [str(TBON), "status", uri, "--summary"]),
    ):
        started = time.perf_counter()
        try:
            samples[name].append(time_command(argv))
        except RuntimeError as error:
            samples[name].append(time.perf_counter() - started)
            failed[name] += 1
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
    else:
        failed["rtt"] += 1


@dataclass
class Phase:
    """What one phase (under load, or idle) gave: each measure's samples, and its failures."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MEASURES})
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MEASURES, 0))

    def round(self, uri: str) -> None:
        one_round(uri, self.samples, self.failed)


def measure(size: int, idle_rounds: int, settle: float, force: bool) -> tuple[Phase, Phase, float]:
    """Samples during the wire-up and idle, and how long the wire-up took."""
    argv = [str(TBON), "start", f"--test-size={size}", *(["--force"] if force else [])]
    fd, log = tempfile.mkstemp(prefix="responsive-start-", suffix=".log")
    loaded, idle = Phase(), Phase()
    with tempfile.TemporaryDirectory(prefix="responsive-") as tmp:
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
                progress(f"rank 0 listens at {uri} after {time.monotonic() - started:.2f} s")
                while not select.select([launcher.stdout], [], [], 0)[0]:
                    if time.monotonic() > deadline or launcher.poll() is not None:
                        raise RuntimeError(f"no URI within the deadline: {log_tail(log)}")
                    loaded.round(uri)
                line = launcher.stdout.readline().decode().strip()
                online = time.monotonic() - started
                if not line.startswith("local://"):
                    raise RuntimeError(f"tbon start printed {line!r}: {log_tail(log)}")
                progress(f"all {size} online after {online:.1f} s; settling {settle:g} s")
                time.sleep(settle)  # not a wait for a condition: the quiet spell before idle
                for _ in range(idle_rounds):
                    idle.round(uri)
            finally:
                stop(launcher)
        finally:
            os.close(fd)
            os.unlink(log)
    return loaded, idle, online


def measure_expand(
    size: int, idle_rounds: int, settle: float, force: bool
) -> tuple[Phase, Phase, float]:
    """Samples while `tbon expand -n N` brings N brokers into an instance of rank 0 alone (every
    join goes through rank 0: its allocation and its key exchange), then idle."""
    loaded, idle = Phase(), Phase()
    options = ["--test-exit-timeout=1m"]
    with tbon_start(1, [f"size={size + 1}"], force=force, options=options) as instance:
        argv = [str(TBON), "expand", instance.uri, "-n", str(size), "--timeout", "5m"]
        started = time.monotonic()
        expand = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            while expand.poll() is None:
                loaded.round(instance.uri)
            took = time.monotonic() - started
        finally:
            stop(expand)
        if expand.returncode != 0:  # joiners rank 0 did not answer in time: a finding, kept
            assert expand.stderr is not None
            said = expand.stderr.read().decode(errors="replace").strip().splitlines()
            failures = sum("tbon expand: broker pid" in line for line in said)
            progress(
                f"tbon expand exited {expand.returncode}: {failures} of {size} brokers did "
                f"not join; the last said: {said[-1][:300] if said else ''}"
            )
        if expand.stderr is not None:
            expand.stderr.close()
        progress(f"expand ended after {took:.1f} s; settling {settle:g} s")
        time.sleep(settle)  # not a wait for a condition: the quiet spell before idle rounds
        for _ in range(idle_rounds):
            idle.round(instance.uri)
    return loaded, idle, took


def rows_of(loaded: Phase, idle: Phase) -> list[list[str]]:
    rows = []
    for name in MEASURES:
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
