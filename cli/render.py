"""Drawing the rank table: as a tree, `RANK HOST: STATE` one line per rank as Flux does, or as
the list of ranks that are not online (`--errors`, `--down`).

`tbon status` draws the views rank 0 computes (status.summary, status.errors, status.tree: the
functions at the end, `summary_of`, `errors_of`, `tree_of`), so that no view needs the whole
table. The functions of the whole status object before them are the reference those views are
held to (tests/test_statusviews.py), and what a script that holds a table may draw it with.

Pure functions of the status object (docs/design.md §12) and of `age`, the seconds since rank 0
made it, so that a `--watch` view can keep its clocks running between tables. Fields a newer
rank 0 adds are used when present and never required, so this draws an older one's table too.

The tree is drawn as messages travel now, not as the topology says: a rank whose parent was lost
is *fostered* by a live ancestor (`attached_to` differs from `parent`) and is drawn, with its
subtree, under that foster parent; `--rank`, `--summary`, `--errors` and `--down` follow the same
tree. Where `attached_to` is absent or null (an older rank 0, a rank not connected, a rank still
reattaching), the topology's `parent` stands in.

What rank 0 cannot see is said, not presumed (Flux's status calls such ranks ghosts): a rank
still reattaching after its parent was lost is marked so, and every rank drawn below it is marked
`(behind rank R, reattaching: last known)`, since no message can reach it until R is back.
`--highlight` marks ranks and the ranks on their way to the root: in reverse video when colour
is on, with a trailing ` *` when it is off.

The rank that is the root now is marked `(root)`, and the standbys that keep a copy of its table
`(standby)` (`root` and `standbys` of the answer: docs/design.md §12), unless the instance has
no standbys and its root is rank 0, where the tree reads as it always has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

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

VIEWS = ("tree", "summary", "errors", "down")


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


def line(
    entry: dict[str, Any],
    verbose: bool,
    rtt: float | None = None,
    age: float = 0.0,
    path: list[int] | None = None,
    behind: int | None = None,
    role: str = "",
) -> Text:
    """`RANK HOST: STATE`, its marks (root or standby, a joiner's lease, retired, fostered,
    reattaching, torpid),
    what `verbose` adds (time in state, incarnation, rtt and, for a rank not online, why and its
    last pid) and, for `--down`, its path to the root."""
    state = shown_state(entry)
    text = Text(f"{entry['rank']} {entry['host']}: ")
    text.append(state, style=STYLE.get(state, ""))
    if role:
        text.append(f" ({role})", style="bold")
    if entry["state"] == "reserved" and "joiner" in entry:
        left = format_duration(max(0.0, entry["expires"] - age))
        text.append(f" (joiner {entry['joiner']}, {left} left)", style="bright_black")
    if entry.get("retired"):
        text.append(" (retired)", style="bright_black")
    if (home := fostered_from(entry)) is not None:
        text.append(f" (fostered, home is rank {home})", style="yellow")
    if entry.get("reattaching"):
        text.append(" (reattaching)", style="dark_orange")
    if behind is not None:
        text.append(f" (behind rank {behind}, reattaching: last known)", style="dark_orange")
    if entry["torpid"]:
        text.append(" (torpid)", style="bold red")
    if verbose:
        text.append(
            f" for {format_duration(shown_since(entry, age))} incarnation {entry['incarnation']}",
            style="bright_black",
        )
        if rtt is not None:
            text.append(f" rtt {rtt * 1000:.3f}ms", style="bright_black")
    if path is not None:
        text.append(f" (via {', '.join(map(str, path))})" if path else " (the root)")
    if path is not None or (verbose and entry["state"] != "online"):
        _append_why(text, entry, verbose, age)
    return text


def _append_why(text: Text, entry: dict[str, Any], last_pid: bool, age: float) -> None:
    if entry["state"] == "reserved":
        return  # its joiner and lease are on the line already
    if reason := why(entry, age):
        text.append(f": {reason}")
    if last_pid and entry.get("last_pid") is not None:
        text.append(f" (last pid {entry['last_pid']})", style="bright_black")


def fostered_from(entry: dict[str, Any]) -> int | None:
    """The topology parent of a rank attached elsewhere for now (its home), else None."""
    attached, parent = entry.get("attached_to"), entry["parent"]
    if attached is None or parent is None or attached == parent:
        return None
    return int(parent)


def attachments(status: dict[str, Any]) -> list[int | None]:
    """Each rank's parent in the tree as drawn: `attached_to` when it names another rank, else
    the topology's `parent`. A table caught mid-move could name attachments that loop (or a rank
    out of range); those ranks are drawn under their topology parent, so every rank is drawn
    once and every walk up ends at rank 0."""
    ranks = status["ranks"]
    size = len(ranks)
    up: list[int | None] = []
    for index, entry in enumerate(ranks):
        attached = entry.get("attached_to")
        usable = type(attached) is int and 0 <= attached < size and attached != index
        up.append(attached if usable else entry["parent"])
    rooted: set[int] = set()  # ranks whose walk up is known to end at the root
    for start in range(size):
        path: list[int] = []
        rank: int | None = start
        while rank is not None and rank not in rooted:
            if rank in path:  # a loop: put the ranks on it back where the topology has them
                for looped in path[path.index(rank) :]:
                    up[looped] = ranks[looped]["parent"]
                path, rank = [], start
                continue
            path.append(rank)
            rank = up[rank]
        rooted.update(path)
    return up


def drawn_children(status: dict[str, Any]) -> list[list[int]]:
    """Each rank's children in the tree as drawn, in rank order: its topology children still
    attached to it, and the ranks it fosters."""
    children: list[list[int]] = [[] for _ in status["ranks"]]
    for rank, parent in enumerate(attachments(status)):
        if parent is not None:
            children[parent].append(rank)
    return children


def tree(
    status: dict[str, Any],
    root: int = 0,
    pretty: bool = True,
    verbose: bool = False,
    rtts: dict[int, float] | None = None,
    age: float = 0.0,
    marks: Marks | None = None,
) -> list[Text]:
    """Lines for the subtree under `root`, with box-drawing connectors when `pretty`."""
    ranks = status["ranks"]
    below_of = drawn_children(status)
    rtts = rtts or {}
    lit = highlighted(status, marks.ranks) if marks else set()
    marked = roles(status)
    lines: list[Text] = []
    # rank, own prefix, children's prefix, the reattaching rank it is behind
    stack: list[tuple[int, str, str, int | None]] = [(root, "", "", cut_off_by(status, root))]
    while stack:
        rank, prefix, below, behind = stack.pop()
        text = Text(prefix)
        shown = line(
            ranks[rank], verbose, rtts.get(rank), age, behind=behind, role=marked.get(rank, "")
        )
        if rank in lit:
            shown.stylize("reverse")
            if marks is not None and marks.plain:
                shown.append(" *")
        text.append_text(shown)
        lines.append(text)
        if ranks[rank].get("reattaching"):
            behind = rank
        children = below_of[rank]
        for index in range(len(children) - 1, -1, -1):
            last = index == len(children) - 1
            if pretty:
                own = below + ("└─ " if last else "├─ ")
                deeper = below + ("   " if last else "│  ")
            else:
                own = deeper = below + "  "
            stack.append((children[index], own, deeper, behind))
    return lines


@dataclass(frozen=True)
class Marks:
    """`--highlight`: the ranks named, and whether to mark them in plain text (no colour)."""

    ranks: frozenset[int]
    plain: bool


def highlighted(status: dict[str, Any], ranks: frozenset[int]) -> set[int]:
    """The ranks named and every rank on their way to the root, as the tree is drawn."""
    up = attachments(status)
    lit = {rank for rank in ranks if rank < len(up)}  # ranks beyond the table: nothing to mark
    for rank in list(lit):
        lit.update(path_to_root(status, rank, up))
    return lit


def cut_off_by(status: dict[str, Any], rank: int) -> int | None:
    """The nearest rank above `rank`, as drawn, that is still reattaching; None if none is."""
    for above in path_to_root(status, rank):
        if status["ranks"][above].get("reattaching"):
            return above
    return None


def subtree(status: dict[str, Any], root: int) -> list[int]:
    """`root` and every rank below it in the tree as drawn."""
    below_of = drawn_children(status)
    found, stack = [], [root]
    while stack:
        rank = stack.pop()
        found.append(rank)
        stack.extend(below_of[rank])
    return sorted(found)


def path_to_root(
    status: dict[str, Any], rank: int, up: list[int | None] | None = None
) -> list[int]:
    """The ranks a message from `rank` passes on its way up, as the tree is drawn: ..., 0.
    `up` is attachments(status), for a caller that asks for many paths."""
    up = attachments(status) if up is None else up
    path: list[int] = []
    parent = up[rank]
    while parent is not None:
        path.append(parent)
        parent = up[parent]
    return path


def summary(status: dict[str, Any], root: int = 0) -> Text:
    """The root line and how many ranks of its subtree are in each state."""
    counts: dict[str, int] = {}
    ranks = subtree(status, root)
    for rank in ranks:
        state = status["ranks"][rank]["state"]
        counts[state] = counts.get(state, 0) + 1
    text = line(status["ranks"][root], False, None, role=roles(status).get(root, ""))
    parts = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    note = f"; {roles_note(status)}" if roles_note(status) else ""
    text.append(f" ({len(ranks)} ranks: {parts}{note})")
    return text


def not_online(
    status: dict[str, Any],
    root: int = 0,
    paths: bool = False,
    verbose: bool = False,
    age: float = 0.0,
) -> list[Text]:
    """`--errors` (`paths` False) and `--down` (True): a line for each rank under `root` that is
    not online, with why; spares never held, vacant by design, share one last line. `--errors`
    without `verbose` groups the ranks by what happened to them, as `flux overlay errors` does
    (grouped_errors)."""
    lines: list[Text] = []
    spares: list[int] = []
    up = attachments(status) if paths else None
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rank in subtree(status, root):
        entry = status["ranks"][rank]
        if entry["state"] == "online":
            continue
        if never_held(entry) and "reason" not in entry:
            spares.append(rank)
        elif paths:
            lines.append(line(entry, verbose, None, age, path_to_root(status, rank, up)))
        elif verbose:
            lines.append(error_line(entry, age))
        else:
            groups.setdefault((entry["state"], why(entry, age)), []).append(entry)
    lines += [grouped_error(state, reason, entries) for (state, reason), entries in groups.items()]
    if spares:
        text = Text(f"{format_idset(spares)}: ")
        text.append("vacant", style=STYLE["vacant"])
        text.append(": spare never held" if len(spares) == 1 else ": spares never held")
        lines.append(text)
    return lines


def grouped_error(state: str, reason: str, entries: list[dict[str, Any]]) -> Text:
    """`RANKS HOSTS: STATE: REASON`, one line for the ranks that went the same way, their hosts
    as a host list: `3-5 node[3-5]: lost: connection dropped`."""
    from tbon.overlay.parse.hostlist import encode_hostlist

    ranks = format_idset([e["rank"] for e in entries])
    text = Text(f"{ranks} {encode_hostlist([str(e['host']) for e in entries])}: ")
    text.append(state, style=STYLE.get(state, ""))
    if reason:
        text.append(f": {reason}")
    return text


def error_line(entry: dict[str, Any], age: float = 0.0) -> Text:
    """`RANK HOST: STATE for TIME: REASON (last pid PID)`, as `flux overlay errors` words it."""
    text = Text(f"{entry['rank']} {entry['host']}: ")
    state = entry["state"]
    text.append(state, style=STYLE.get(state, ""))
    text.append(f" for {format_duration(shown_since(entry, age))}", style="bright_black")
    if reason := why(entry, age):
        text.append(f": {reason}")
    if entry.get("last_pid") is not None:
        text.append(f" (last pid {entry['last_pid']})", style="bright_black")
    return text


def view(
    status: dict[str, Any],
    root: int,
    kind: str,
    pretty: bool = True,
    verbose: bool = False,
    rtts: dict[int, float] | None = None,
    age: float = 0.0,
    marks: Marks | None = None,
) -> list[Text]:
    """The lines of one view of the table (`kind` is one of VIEWS); `marks` highlights ranks
    of the tree."""
    if kind == "summary":
        return [summary(status, root)]
    if kind in ("errors", "down"):
        return not_online(status, root, paths=kind == "down", verbose=verbose, age=age)
    return tree(status, root, pretty, verbose, rtts, age, marks)


# --- the views rank 0 computes (status.summary, status.errors, status.tree) ---------------------
#
# At 262,144 ranks the table is not fetched to draw a view: rank 0 sends the view's own object
# (overlay/state/statusviews.py), drawn here by the same line functions as above.


def summary_of(answer: dict[str, Any]) -> Text:
    """`--summary` from rank 0's status.summary: the root line, and its ranks by state."""
    text = line(answer["entry"], False, None, role=roles(answer).get(answer["entry"]["rank"], ""))
    parts = ", ".join(f"{count} {state}" for state, count in answer["counts"].items())
    note = f"; {roles_note(answer)}" if roles_note(answer) else ""
    text.append(f" ({answer['ranks']} ranks: {parts}{note})")
    return text


def errors_of(
    answer: dict[str, Any], paths: bool = False, verbose: bool = False, age: float = 0.0
) -> list[Text]:
    """`--errors` and `--down` from rank 0's status.errors (with `each` for `-v` and `--down`)."""
    lines: list[Text] = []
    if "entries" in answer:
        for entry in answer["entries"]:
            if paths:
                lines.append(line(entry, verbose, None, age, entry["via"]))
            else:
                lines.append(error_line(entry, age))
    for group in answer.get("groups", []):
        entry = group["entry"]
        text = Text(f"{group['ranks']} {group['hosts']}: ")
        text.append(group["state"], style=STYLE.get(group["state"], ""))
        if reason := why(entry, age):
            text.append(f": {reason}")
        lines.append(text)
    if cut := answer.get("cut"):
        lines.append(Text(f"... {cut} more not shown: use --rank", style="bright_black"))
    if spares := answer.get("spares"):
        text = Text(f"{spares}: ")
        text.append("vacant", style=STYLE["vacant"])
        single = spares.isdigit()
        text.append(": spare never held" if single else ": spares never held")
        lines.append(text)
    return lines


def tree_of(
    answer: dict[str, Any],
    pretty: bool = True,
    verbose: bool = False,
    rtts: dict[int, float] | None = None,
    age: float = 0.0,
    marks: Marks | None = None,
) -> list[Text]:
    """The tree from rank 0's status.tree: one line per item, a run of ranks that read the
    same as one line (`├─ 16-262143 extra: vacant`, the hosts of spares never held as
    `extra`), ` ...` after a rank whose ranks below are hidden by `--depth`."""
    rtts = rtts or {}
    lit = _lit_items(answer, marks.ranks) if marks else set()
    marked = roles(answer)
    lines: list[Text] = []
    open_levels: list[bool] = []  # per depth: whether more siblings follow at that depth
    behind_at: list[int | None] = [None]  # per depth: the reattaching rank its ranks are behind
    for item in answer["items"]:
        depth, entry = item["depth"], item["entry"]
        del open_levels[depth:]
        del behind_at[depth + 1 :]
        behind = behind_at[depth]
        prefix = ""
        if depth > 0:
            if pretty:
                prefix = "".join("│  " if more else "   " for more in open_levels[1:depth])
                prefix += "└─ " if item["last"] else "├─ "
            else:
                prefix = "  " * depth
        open_levels.append(not item["last"])
        text = Text(prefix)
        if "ranks" in item:
            shown = line(entry, verbose, None, age, behind=behind)
            host = "extra" if never_held(entry) else entry["host"]
            first = f"{entry['rank']} {entry['host']}: "
            shown = Text(f"{item['ranks']} {host}: ") + shown[len(first) :]
            ranks = _item_ranks(item)
        else:
            role = marked.get(entry["rank"], "")
            shown = line(entry, verbose, rtts.get(entry["rank"]), age, behind=behind, role=role)
            ranks = {entry["rank"]}
        if item.get("more"):
            shown.append(" ...", style="bright_black")
        if ranks & lit:
            shown.stylize("reverse")
            if marks is not None and marks.plain:
                shown.append(" *")
        text.append_text(shown)
        lines.append(text)
        below = entry["rank"] if entry.get("reattaching") else behind
        behind_at.append(below)
    if answer.get("cut"):
        lines.append(Text("... more ranks: use --depth or --rank", style="bright_black"))
    return lines


def _item_ranks(item: dict[str, Any]) -> set[int]:
    from tbon.overlay.parse.idset import parse_idset

    if item["count"] > 4096:  # a run of spares: only its first rank can be named cheaply
        return {item["entry"]["rank"]}
    return set(parse_idset(item["ranks"]))


def _lit_items(answer: dict[str, Any], ranks: frozenset[int]) -> set[int]:
    """The ranks named and those on their way up, among the ranks drawn (`-H`)."""
    up: dict[int, int | None] = {}
    for item in answer["items"]:
        entry = item["entry"]
        attached = entry.get("attached_to")
        up[entry["rank"]] = attached if type(attached) is int else entry["parent"]
    lit = set(ranks)
    for rank in ranks:
        parent = up.get(rank)
        while parent is not None and parent not in lit:
            lit.add(parent)
            parent = up.get(parent)
    return lit
