"""CLI latency: how long `tbon status --json`, `tbon exec -r 0 true` and `tbon --help` take
against a running instance, beside the interpreter floor, and where the start-up time goes.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/latency.py [--runs R] [--before DIR] [--markdown]
                                           [--sections latency,imports]

One `tbon start --test-size=4` instance (wait mode, every rank online before the clock starts)
is started with this checkout's `tbon` and stopped by PID at the end, pass or fail; every timed
command is reaped by PID (common.py). Progress goes to stderr, tables to stdout.

Sections (select with --sections):
  latency  medians of the real console script (stdin /dev/null, stdout a pipe):
           `tbon status URI --json`, `tbon exec URI -r 0 true`, `tbon --help`, and the floor
           `python -c "import zmq, nacl.public"` with the same interpreter. Target (issue 14):
           status and exec within 2x the floor. With `--before DIR` (an older copy of the tree
           with its own DIR/.venv/bin/tbon, e.g. from `git archive`), the same commands of that
           copy run in the same rounds, interleaved with these, against the same instance.
  imports  `python -X importtime` of `tbon status URI --json`: the import time per package,
           each module counted under the nearest of its importers (itself included) that
           belongs to a package named here (so `inspect`, imported by Typer, counts as Typer),
           medians over the runs.

Only the standard library and common.py (next to this script) are imported.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from common import (
    RUN_DEADLINE_S,
    TBON,
    Report,
    begin,
    median,
    ms,
    parse_args,
    progress,
    tbon_start,
    time_command,
    verdict,
)

SECTIONS = ("latency", "imports")
SIZE = 4
FLOOR = "import zmq, nacl.public"

PACKAGES = {
    "typer": "Typer",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "annotated_types": "pydantic",
    "typing_inspection": "pydantic",
    "typing_extensions": "pydantic",
    "rich": "Rich",
    "markdown_it": "Rich",
    "mdurl": "Rich",
    "pygments": "Rich",
    "zmq": "pyzmq",
    "nacl": "PyNaCl",
    "_cffi_backend": "PyNaCl",
    "cffi": "PyNaCl",
    "tbon": "tbon (with the standard modules it imports)",
    "site": "interpreter start-up (site, the editable install's finder)",
}
"""Top-level package -> the row its import time is counted in; anything else imported at the
top of the tree is the interpreter's own start-up (encodings, io...)."""


def commands(tbon: Path, uri: str) -> list[tuple[str, list[str]]]:
    return [
        ("`tbon status URI --json`", [str(tbon), "status", uri, "--json"]),
        ("`tbon exec URI -r 0 true`", [str(tbon), "exec", uri, "-r", "0", "true"]),
        ("`tbon --help`", [str(tbon), "--help"]),
    ]


def floor_argv(tbon: Path) -> list[str]:
    return [str(tbon.parent / "python"), "-c", FLOOR]


def bench_latency(report: Report, runs: int, uri: str, before: Path | None) -> None:
    sides = {"after": TBON}
    if before is not None:
        sides = {"before": before / ".venv" / "bin" / "tbon", **sides}
    cases: list[tuple[str, str, list[str]]] = []
    for side, tbon in sides.items():
        cases += [(label, side, argv) for label, argv in commands(tbon, uri)]
    cases.append((f'`python -c "{FLOOR}"` (floor)', "after", floor_argv(TBON)))
    for _label, _side, argv in cases:  # warm-up: page cache, .pyc
        time_command(argv)
    times: dict[tuple[str, str], list[float]] = {(label, side): [] for label, side, _ in cases}
    for run in range(runs):
        progress(f"latency: round {run + 1}/{runs}")
        for label, side, argv in cases:  # interleaved: a noisy minute hits every case alike
            times[label, side].append(time_command(argv))
    floor_label = cases[-1][0]
    floor = median(times[floor_label, "after"])
    rows = []
    for label in [label for label, _ in commands(TBON, uri)] + [floor_label]:
        after = median(times[label, "after"])
        target = ""
        if label != floor_label and "--help" not in label:
            target = f"<= {ms(2 * floor)} (2x floor): {verdict(after <= 2 * floor)}"
        row = [label]
        if before is not None:
            row.append(ms(median(times[label, "before"])) if (label, "before") in times else "")
        row += [ms(after), f"{after / floor:.2f}", target]
        rows.append(row)
    header = ["command", *(["before ms"] if before else []), "median ms", "x floor", "target"]
    report.heading(f"Command latency, {SIZE}-rank instance ({runs} interleaved rounds)")
    report.table(header, rows)
    report.note(
        "Wall time of the console script from Popen to exit, stdout a pipe; medians"
        + (f"; `before`: the copy in {before}, run in the same rounds." if before else ".")
    )


IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def import_rows(stderr: str) -> dict[str, float]:
    """Self import time (s) per PACKAGES row, from one `-X importtime` report."""
    lines = [m for m in map(IMPORT_LINE.match, stderr.splitlines()) if m]
    totals: dict[str, float] = {}
    stack: list[str] = []
    # The report lists a module after the modules it imported: reversed, importers come first.
    for match in reversed(lines):
        depth = len(match.group(3)) // 2
        name = match.group(4)
        del stack[depth:]
        stack.append(name)
        row = "interpreter start-up (encodings, io...)"
        for importer in reversed(stack):
            top = importer.split(".")[0]
            if top.startswith("__editable__"):
                top = "site"
            if top in PACKAGES:
                row = PACKAGES[top]
                break
        totals[row] = totals.get(row, 0.0) + int(match.group(1)) / 1e6
    return totals


def bench_imports(report: Report, runs: int, uri: str) -> None:
    python = str(TBON.parent / "python")
    argv = [python, "-X", "importtime", "-m", "tbon.cli", "status", uri, "--json"]
    samples: list[dict[str, float]] = []
    for run in range(runs):
        progress(f"imports: run {run + 1}/{runs}")
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=RUN_DEADLINE_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr[-2000:]}"
            )
        samples.append(import_rows(done.stderr))
    names = sorted(
        {n for s in samples for n in s}, key=lambda n: -median([s.get(n, 0) for s in samples])
    )
    rows = [[n, ms(median([s.get(n, 0.0) for s in samples]))] for n in names]
    rows.append(["all imports", ms(median([sum(s.values()) for s in samples]))])
    report.heading(f"Where `tbon status URI --json` spends its imports ({runs} runs)")
    report.table(["package", "median ms"], rows)
    report.note(
        "Self time of every import under `-X importtime` (which slows imports a little), each "
        "module counted under the nearest importer, itself included, that is one of these "
        "packages."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="rounds (default 21)")
    parser.add_argument(
        "--before", type=Path, help="an older copy of the tree, with DIR/.venv/bin/tbon"
    )
    args = parse_args(parser, argv, SECTIONS)
    if args.before is not None and not (args.before / ".venv" / "bin" / "tbon").exists():
        parser.error(f"no .venv/bin/tbon in {args.before}")
    report = begin("latency", args.markdown, bytecode_note=True)
    with tbon_start(SIZE) as instance:
        for name in args.sections:
            if name == "latency":
                bench_latency(report, args.runs, instance.uri, args.before)
            else:
                bench_imports(report, args.runs, instance.uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
