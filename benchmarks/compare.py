"""Before and after, in one run: a benchmark of this checkout against the same benchmark of
another checkout (an older commit in a git worktree, with its own .venv), interleaved round by
round so that both sides see the same machine load. Prints each table once, every number cell
as `before → after (xRATIO)`, the medians over the rounds.

    git worktree add /tmp/before HEAD~3 && (cd /tmp/before && python3 -m venv .venv &&
        .venv/bin/pip install -q -e .)
    .venv/bin/python benchmarks/compare.py --before /tmp/before --rounds 3 join.py --runs 5

The arguments after the script's name go to the benchmark on both sides (--markdown is added).

Each side runs its own checkout's copy of the script, with its own interpreter. With
--same-script, both sides run THIS checkout's copy (the one next to compare.py), each with its own
checkout's interpreter (and so its own `tbon`), for a benchmark the older checkout does not have;
the script must then drive tbon through its CLI only, never `import tbon` (as flow.py does):

    .venv/bin/python benchmarks/compare.py --before /tmp/before --same-script flow.py --hold 10
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"^(?P<pre>[^0-9.-]*)(?P<num>-?\d+(?:\.\d+)?)(?P<post>\s*[a-zµ%]*)$")


def run_side(checkout: Path, script: str, args: list[str], same_script: bool) -> list[str]:
    """The markdown lines one benchmark run printed on one side: the checkout's interpreter runs
    the checkout's copy of the script, or this checkout's with `same_script`."""
    python = checkout / ".venv" / "bin" / "python"
    source = HERE if same_script else checkout
    argv = [str(python), str(source / "benchmarks" / script), *args, "--markdown"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=checkout, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"{checkout}: {script} failed:\n{result.stderr[-2000:]}")
    return result.stdout.splitlines()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def merge(rounds: list[tuple[list[str], list[str]]]) -> list[str]:
    """Table rows with every number cell replaced by the median before → after (xRATIO)."""
    first_before, _ = rounds[0]
    out = []
    for index, line in enumerate(first_before):
        if not line.startswith("|") or set(line) <= set("|-: "):
            out.append(line)
            continue
        row = []
        for column, cell in enumerate(cells(line)):
            if column == 0:  # the first column names the row
                row.append(cell)
                continue
            before, after = [], []
            words: tuple[list[str], list[str]] = ([], [])
            for before_lines, after_lines in rounds:
                for side, said, lines in (
                    (before, words[0], before_lines),
                    (after, words[1], after_lines),
                ):
                    theirs = cells(lines[index]) if index < len(lines) else []
                    mine = theirs[column] if column < len(theirs) else ""
                    found = NUMBER.match(mine)
                    if found:
                        side.append(float(found["num"]))
                    else:
                        said.append(mine)
            if not before or not after:  # no number on one side (or either)
                row.append(_words(cell, before, after, words))
                continue
            b, a = statistics.median(before), statistics.median(after)
            ratio = f" (x{a / b:.2f})" if b else ""
            match = NUMBER.match(cell)
            pre, post = (match["pre"], match["post"]) if match else ("", "")
            row.append(f"{pre}{b:g} → {a:g}{post}{ratio}")
        out.append("| " + " | ".join(row) + " |")
    return out


def _words(
    cell: str, before: list[float], after: list[float], words: tuple[list[str], list[str]]
) -> str:
    """A cell with a number on one side at most: `before → after`, each side its median number
    or else what it said most often (a measure one side never reached, a target met on one side
    only); the cell itself where both sides said the same."""
    said = [
        f"{statistics.median(numbers):g}" if numbers else max(set(texts), key=texts.count)
        for numbers, texts in ((before, words[0]), (after, words[1]))
        if numbers or texts
    ]
    if len(said) < 2 or said[0] == said[1]:
        return cell
    return f"{said[0]} → {said[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--same-script",
        action="store_true",
        help="run this checkout's copy of the script on both sides (each with its own "
        "interpreter), for a benchmark the older checkout does not have",
    )
    parser.add_argument("script", help="a benchmark in benchmarks/, e.g. join.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    options = parser.parse_args()
    rounds = []
    for number in range(options.rounds):
        print(f"round {number + 1} of {options.rounds}", file=sys.stderr)
        before = run_side(
            options.before.resolve(), options.script, options.args, options.same_script
        )
        after = run_side(HERE, options.script, options.args, options.same_script)
        rounds.append((before, after))
    which = f", both running {HERE / 'benchmarks' / options.script}" if options.same_script else ""
    print(
        f"{options.script}: before ({options.before}) → after ({HERE}){which}, "
        f"medians of {options.rounds} interleaved rounds"
    )
    print("\n".join(merge(rounds)))


if __name__ == "__main__":
    main()
