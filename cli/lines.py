"""The words of a rank's status line, `RANK HOST: STATE` and its marks, each with the name of
its colour: no Rich here, so that `tbon status --summary` on a pipe prints without loading Rich
(about 40 ms of a command's start; issue 26). cli/render.py colours the same parts.
"""

from __future__ import annotations

from typing import Any

from tbon.overlay.parse.duration import format_duration
from tbon.overlay.parse.idset import format_idset

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


def shown_since(entry: dict[str, Any], age: float = 0.0) -> float:
    """Seconds in the state shown: for an online rank, its subtree status's own clock, which
    restarts when a rank below changes it (`since` restarts only when the rank's own does)."""
    if entry["state"] == "online":
        return entry.get("subtree_since", entry["since"]) + age
    return entry["since"] + age


def never_held(entry: dict[str, Any]) -> bool:
    """A spare that no broker has held yet: vacant by design, nothing went wrong."""
    return entry["state"] == "vacant" and entry["incarnation"] == 0


def why(entry: dict[str, Any], age: float = 0.0) -> str:
    """Why a rank is not online, in words; "" for an online rank."""
    state = entry["state"]
    if "reason" in entry:
        return str(entry["reason"])
    if state == "offline":
        return "not online yet"
    if state == "reserved" and "joiner" in entry:
        left = format_duration(max(0.0, entry["expires"] - age))
        return f"awaiting joiner {entry['joiner']}, {left} left"
    if state == "retiring":
        return "being drained by tbon retire"
    if never_held(entry):
        return "spare, never held"
    return ""


def parts(
    entry: dict[str, Any],
    verbose: bool,
    rtt: float | None = None,
    age: float = 0.0,
    path: list[int] | None = None,
    behind: int | None = None,
    role: str = "",
) -> list[tuple[str, str]]:
    """`RANK HOST: STATE`, its marks (root or standby, a joiner's lease, retired, fostered,
    reattaching, torpid),
    what `verbose` adds (time in state, incarnation, rtt and, for a rank not online, why and its
    last pid) and, for `--down`, its path to the root: (words, style) in order, "" unstyled."""
    state = shown_state(entry)
    out = [(f"{entry['rank']} {entry['host']}: ", ""), (state, STYLE.get(state, ""))]
    if role:
        out.append((f" ({role})", "bold"))
    if entry["state"] == "reserved" and "joiner" in entry:
        left = format_duration(max(0.0, entry["expires"] - age))
        out.append((f" (joiner {entry['joiner']}, {left} left)", "bright_black"))
    if entry.get("retired"):
        out.append((" (retired)", "bright_black"))
    if (home := fostered_from(entry)) is not None:
        out.append((f" (fostered, home is rank {home})", "yellow"))
    if entry.get("reattaching"):
        out.append((" (reattaching)", "dark_orange"))
    if behind is not None:
        out.append((f" (behind rank {behind}, reattaching: last known)", "dark_orange"))
    if entry["torpid"]:
        out.append((" (torpid)", "bold red"))
    if verbose:
        since = format_duration(shown_since(entry, age))
        out.append((f" for {since} incarnation {entry['incarnation']}", "bright_black"))
        if rtt is not None:
            out.append((f" rtt {rtt * 1000:.3f}ms", "bright_black"))
    if path is not None:
        out.append((f" (via {', '.join(map(str, path))})" if path else " (the root)", ""))
    if (path is not None or (verbose and entry["state"] != "online")) and entry[
        "state"
    ] != "reserved":  # a reserved rank's joiner and lease are on the line already
        if reason := why(entry, age):
            out.append((f": {reason}", ""))
        if verbose and entry.get("last_pid") is not None:
            out.append((f" (last pid {entry['last_pid']})", "bright_black"))
    return out


def summary_parts(answer: dict[str, Any]) -> list[tuple[str, str]]:
    """`--summary` from the root's status.summary: the root's line, its ranks by state and,
    if there are standbys or the root moved, who is root and who stands by."""
    counts = ", ".join(f"{count} {state}" for state, count in answer["counts"].items())
    note = f"; {roles_note(answer)}" if roles_note(answer) else ""
    role = roles(answer).get(answer["entry"]["rank"], "")
    return [
        *parts(answer["entry"], False, role=role),
        (f" ({answer['ranks']} ranks: {counts}{note})", ""),
    ]


def roles(answer: dict[str, Any]) -> dict[int, str]:
    """The marks of the root and its standbys, by rank (`root`, `standby`); none for an
    instance without standbys whose root is rank 0, or from a rank 0 that does not say."""
    root, standbys = answer.get("root", 0), answer.get("standbys") or []
    if root == 0 and not standbys:
        return {}
    return {**{rank: "standby" for rank in standbys}, root: "root"}


def roles_note(answer: dict[str, Any]) -> str:
    """`root 0, standbys 1-2` for a summary; "" when roles() marks nothing."""
    if not roles(answer):
        return ""
    standbys = answer.get("standbys") or []
    listed = f"standbys {format_idset(standbys)}" if standbys else "no standbys"
    group = answer.get("group") or {}
    paused = "; grants paused: no majority of the root group answers" if group.get("paused") else ""
    return f"root {answer['root']}, {listed}{paused}"


def fostered_from(entry: dict[str, Any]) -> int | None:
    """The topology parent of a rank attached elsewhere for now (its home), else None."""
    attached, parent = entry.get("attached_to"), entry["parent"]
    if attached is None or parent is None or attached == parent:
        return None
    return int(parent)
