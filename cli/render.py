"""Drawing the rank table as a tree: `RANK HOST: STATE`, one line per rank, as Flux does."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from tbon.overlay.parse.duration import format_duration

STYLE = {
    "full": "green",
    "partial": "yellow",
    "degraded": "dark_orange",
    "lost": "bold red",
    "offline": "red",
    "vacant": "bright_black",
    "reserved": "cyan",
    "retiring": "magenta",
}


def shown_state(entry: dict[str, Any]) -> str:
    """An online broker shows how its subtree is; any other rank shows its own state."""
    return entry["subtree"] if entry["state"] == "online" else entry["state"]


def line(entry: dict[str, Any], verbose: bool, rtt: float | None) -> Text:
    state = shown_state(entry)
    text = Text(f"{entry['rank']} {entry['host']}: ")
    text.append(state, style=STYLE.get(state, ""))
    if entry["state"] == "reserved" and "joiner" in entry:
        text.append(
            f" (joiner {entry['joiner']}, {format_duration(entry['expires'])} left)",
            style="bright_black",
        )
    if entry.get("retired"):
        text.append(" (retired)", style="bright_black")
    if entry["torpid"]:
        text.append(" (torpid)", style="bold red")
    if verbose:
        text.append(
            f" for {format_duration(entry['since'])} incarnation {entry['incarnation']}",
            style="bright_black",
        )
        if rtt is not None:
            text.append(f" rtt {rtt * 1000:.3f}ms", style="bright_black")
    return text


def tree(
    status: dict[str, Any],
    root: int = 0,
    pretty: bool = True,
    verbose: bool = False,
    rtts: dict[int, float] | None = None,
) -> list[Text]:
    """Lines for the subtree under `root`, with box-drawing connectors when `pretty`."""
    ranks = status["ranks"]
    rtts = rtts or {}
    lines: list[Text] = []
    stack: list[tuple[int, str, str]] = [(root, "", "")]  # rank, own prefix, children's prefix
    while stack:
        rank, prefix, below = stack.pop()
        text = Text(prefix)
        text.append_text(line(ranks[rank], verbose, rtts.get(rank)))
        lines.append(text)
        children = ranks[rank]["children"]
        for index in range(len(children) - 1, -1, -1):
            last = index == len(children) - 1
            if pretty:
                own = below + ("└─ " if last else "├─ ")
                deeper = below + ("   " if last else "│  ")
            else:
                own = deeper = below + "  "
            stack.append((children[index], own, deeper))
    return lines


def subtree(status: dict[str, Any], root: int) -> list[int]:
    """`root` and every rank below it."""
    found, stack = [], [root]
    while stack:
        rank = stack.pop()
        found.append(rank)
        stack.extend(status["ranks"][rank]["children"])
    return sorted(found)


def summary(status: dict[str, Any], root: int = 0) -> Text:
    """The root line and how many ranks of its subtree are in each state."""
    counts: dict[str, int] = {}
    ranks = subtree(status, root)
    for rank in ranks:
        state = status["ranks"][rank]["state"]
        counts[state] = counts.get(state, 0) + 1
    text = line(status["ranks"][root], False, None)
    parts = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    text.append(f" ({len(ranks)} ranks: {parts})")
    return text
