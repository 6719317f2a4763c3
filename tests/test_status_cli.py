"""`tbon status` as a user sees it (issue 13): why a rank went, --errors, --down, --color, the
`-v` clock of the state shown, --watch piped, and --wait up for an instance with spare ranks.

Real instances of `tbon start` on 127.0.0.1; every wait has a deadline, every process is reaped.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from typing import Any

from conftest import DEADLINE, child_env, process_gone, start_tbon, tbon, wait_for

from tbon.overlay.parse.duration import parse_duration

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d")


def kill_rank(inst: Any, rank: int) -> int:
    """SIGKILL the broker of `rank` and wait until rank 0 shows it lost; its pid."""
    pid = inst.pid(rank)
    os.kill(pid, signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][rank]["state"] == "lost", f"rank {rank} lost")
    return pid


def status_json(uri: str) -> dict[str, Any]:
    """`tbon status --json`, read; a failure says what the command said and how it ended (an
    empty stdout was once seen under load, with nothing else to tell why)."""
    shown = tbon("status", uri, "--json")
    said = f"exit {shown.returncode}; stderr: {shown.stderr!r}; stdout: {shown.stdout[:200]!r}"
    assert shown.returncode == 0 and shown.stdout.endswith("}\n"), said
    table: dict[str, Any] = json.loads(shown.stdout)
    return table


def shown_time(text: str, rank: int) -> float:
    """The `for TIME` of `rank`'s line in `tbon status -v`, in seconds."""
    match = re.search(rf"(?m)^[ │├└─]*{rank} \S+: \S+ for (\S+) ", text)
    assert match, text
    return parse_duration(match.group(1))


# --- why a rank went ----------------------------------------------------------------------------


def test_a_killed_leaf_is_lost_because_its_connection_dropped(instance) -> None:
    inst = instance(5, "tbon.fanout=2")  # 0 - {1 - {3, 4}, 2}
    pid = kill_rank(inst, 3)

    entry = status_json(inst.uri)["ranks"][3]
    assert (entry["state"], entry["reason"], entry["last_pid"]) == (
        "lost",
        "connection dropped",
        pid,
    )
    assert entry["pid"] is None and entry["host"] and entry["since"] >= 0

    errors = tbon("status", inst.uri, "--errors")
    assert errors.returncode == 0, errors.stderr
    assert re.fullmatch(r"3 \S+: lost: connection dropped\n", errors.stdout)
    each = tbon("status", inst.uri, "--errors", "-v")
    assert re.fullmatch(
        rf"3 \S+: lost for \S+: connection dropped \(last pid {pid}\)\n", each.stdout
    )

    down = tbon("status", inst.uri, "--down")
    assert re.fullmatch(r"3 \S+: lost \(via 1, 0\): connection dropped\n", down.stdout)

    verbose = tbon("status", inst.uri, "-v").stdout
    assert re.search(
        rf"(?m)^│  ├─ 3 \S+: lost for \S+ incarnation 1: connection dropped \(last pid {pid}\)$",
        verbose,
    ), verbose
    assert "(last pid" not in tbon("status", inst.uri).stdout  # only -v says why


def test_ranks_that_never_reattach_below_a_lost_one_say_so_and_show_their_path(instance) -> None:
    """Rank 1 and both its children die together: the children are lost once the time to
    reattach is over, and say so."""
    inst = instance(
        7, "tbon.fanout=2", "tbon.heartbeat=100ms", "tbon.timeout=1s", "broker.reattach-timeout=1s"
    )
    below = {rank: inst.pid(rank) for rank in (3, 4)}
    for pid in below.values():
        os.kill(pid, signal.SIGSTOP)  # they cannot seek a parent, and rank 1 sees no drop
    try:
        kill_rank(inst, 1)
        inst.wait_status(
            lambda s: [s["ranks"][r]["state"] for r in (1, 3, 4)] == ["lost"] * 3, "1, 3, 4 lost"
        )
    finally:
        for pid in below.values():
            os.kill(pid, signal.SIGKILL)
    down = tbon("status", inst.uri, "--down").stdout.splitlines()
    assert re.fullmatch(r"1 \S+: lost \(via 0\): connection dropped", down[0])
    assert re.fullmatch(r"3 \S+: lost \(via 1, 0\): did not reattach in time", down[1])
    assert re.fullmatch(r"4 \S+: lost \(via 1, 0\): did not reattach in time", down[2])
    assert len(down) == 3
    status = status_json(inst.uri)
    assert [status["ranks"][r].get("last_pid") for r in (3, 4)] == [below[3], below[4]]
    # --rank narrows the list to a subtree
    assert tbon("status", inst.uri, "--errors", "--rank", "2").stdout == ""


def test_errors_group_ranks_that_went_the_same_way(instance) -> None:
    inst = instance(5, "tbon.fanout=2")  # 0 - {1 - {3, 4}, 2}
    for rank in (3, 4):
        kill_rank(inst, rank)
    host = status_json(inst.uri)["ranks"][3]["host"]
    grouped = tbon("status", inst.uri, "--errors")
    assert grouped.returncode == 0, grouped.stderr
    assert grouped.stdout == f"3-4 {host}: lost: connection dropped\n"  # one host: this one
    each = tbon("status", inst.uri, "--errors", "--verbose").stdout.splitlines()
    assert [line.split(":")[0] for line in each] == [f"3 {host}", f"4 {host}"]


def test_highlight_in_a_pipe_and_in_colour(instance) -> None:
    inst = instance(5, "tbon.fanout=2")  # 0 - {1 - {3, 4}, 2}
    shown = tbon("status", inst.uri, "-H", "[3]")
    assert shown.returncode == 0, shown.stderr
    marked = [line.split(":")[0] for line in shown.stdout.splitlines() if line.endswith(" *")]
    assert [re.sub(r"^[│├└─ ]*", "", m).split()[0] for m in marked] == ["0", "1", "3"]
    coloured = tbon("status", inst.uri, "--highlight", "3", "--color=always")
    assert "\x1b[7m" in coloured.stdout and " *" not in coloured.stdout  # reverse video
    for args, words in (
        (["-H", "7"], "--highlight 7: no such rank in this instance of size 5"),
        (["-H", "x"], "invalid rank set 'x'"),
        (["-H", "1", "--errors"], "--highlight and --errors do not go together"),
        (["-H", "1", "--json"], "--highlight and --json do not go together"),
    ):
        bad = tbon("status", inst.uri, *args)
        assert bad.returncode == 2 and bad.stdout == "", (args, bad.stderr)
        assert bad.stderr.startswith(f"tbon status: {words}") and bad.stderr.count("\n") == 1


def test_a_retired_rank_says_so(instance) -> None:
    inst = instance(3)
    pid = inst.pid(2)
    assert tbon("retire", inst.uri, "2").returncode == 0
    wait_for(lambda: process_gone(pid), "the retired broker to exit")
    errors = tbon("status", inst.uri, "--errors", "-v").stdout
    assert re.fullmatch(rf"2 \S+: vacant for \S+: retired \(last pid {pid}\)\n", errors)


def test_spares_never_held_share_one_line(instance) -> None:
    inst = instance(2, "size=5")
    assert tbon("status", inst.uri, "--errors").stdout == "2-4: vacant: spares never held\n"
    assert tbon("status", inst.uri, "--down").stdout == "2-4: vacant: spares never held\n"
    assert "└─ 2-4 extra: vacant for" in tbon("status", inst.uri, "-v").stdout


# --- options ------------------------------------------------------------------------------------


def test_color_always_never_and_auto_in_a_pipe(instance) -> None:
    inst = instance(2)
    always = tbon("status", inst.uri, "--color=always")
    assert always.returncode == 0 and "\x1b[" in always.stdout
    assert ANSI.sub("", always.stdout) == tbon("status", inst.uri).stdout
    for argv in (["--color=never"], ["--color=auto"], []):
        assert "\x1b" not in tbon("status", inst.uri, *argv, "-v").stdout, argv
    # an explicit `always` wins over NO_COLOR
    forced = tbon("status", inst.uri, "--color", "always", env=child_env(NO_COLOR="1"))
    assert "\x1b[" in forced.stdout
    # and `auto` is not talked into colour by FORCE_COLOR in a pipe
    assert "\x1b" not in tbon("status", inst.uri, env=child_env(FORCE_COLOR="1")).stdout


def test_bad_options_are_usage_errors() -> None:
    cases = [
        (["--color=sometimes"], "invalid --color 'sometimes': use auto, always or never"),
        (["--errors", "--down"], "--errors and --down do not go together"),
        (["--summary", "--errors"], "--summary and --errors do not go together"),
        (["--wait", "bogus"], "use one of full, partial, degraded, lost, offline, up"),
    ]
    for argv, message in cases:
        result = tbon("status", *argv, "local:///nonexistent/socket")
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.startswith("tbon status: ") and message in result.stderr, argv
        assert len(result.stderr.splitlines()) == 1


def test_the_v_time_is_that_of_the_subtree_status_shown(instance) -> None:
    """Issue 13: the root said `full for 49.5s` just after recovering from a failure."""
    inst = instance(3)
    kill_rank(inst, 2)
    inst.join("broker.rank=2")
    inst.wait_status(
        lambda s: s["ranks"][2]["state"] == "online" and s["ranks"][0]["subtree"] == "full",
        "rank 2 back online, incarnation 2",
    )
    status = status_json(inst.uri)
    root, one, two = status["ranks"][:3]
    assert root["subtree_since"] <= two["since"] + 0.005  # full again when rank 2 came back
    assert root["subtree_since"] < one["since"] and root["since"] >= one["since"]

    text = tbon("status", inst.uri, "-v").stdout
    assert re.search(r"(?m)^0 \S+: full for ", text), text
    assert shown_time(text, 0) <= shown_time(text, 2) + 0.01
    assert shown_time(text, 0) < shown_time(text, 1)


# --- --wait up ----------------------------------------------------------------------------------


def test_wait_up_returns_for_an_instance_with_spares(instance) -> None:
    inst = instance(3, "size=5")  # ranks 3, 4 are spares
    up = tbon("status", inst.uri, "--wait", "up", "--timeout", "20s", "--json")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["ranks"][0]["subtree"] == "partial"
    full = tbon("status", inst.uri, "--wait", "full", "--timeout", "300ms")
    assert full.returncode == 1 and "(it is partial)" in full.stderr

    kill_rank(inst, 2)  # a lost rank is expected back: not up
    down = tbon("status", inst.uri, "--wait", "up", "--timeout", "300ms")
    assert down.returncode == 1
    assert "to be up (it is degraded; not online: 2 lost)" in down.stderr
    waiting = start_tbon("status", inst.uri, "--wait", "up", "--timeout", "20s")
    try:
        inst.join()  # the lowest rank FLUB may give: lost rank 2, before spares 3 and 4
        assert waiting.wait(timeout=DEADLINE) == 0, waiting.stderr.read()  # type: ignore[union-attr]
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        waiting.stdout.close()  # type: ignore[union-attr]
        waiting.stderr.close()  # type: ignore[union-attr]
    assert inst.status()["ranks"][2]["incarnation"] == 2


# --- --watch in a pipe --------------------------------------------------------------------------


class Reader:
    """Lines of a piped process, read from its raw descriptor with a deadline (a buffered
    readline would hide lines it has read ahead from the next select)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.process = process
        self.fd = process.stdout.fileno()
        self.buffer = b""

    def line(self, deadline: float) -> str:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"no line in time; have {self.buffer!r}")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise AssertionError(f"the watcher ended; have {self.buffer!r}")
            self.buffer += chunk
        text, self.buffer = self.buffer.split(b"\n", 1)
        return text.decode()

    def block(self, timeout: float = DEADLINE) -> list[str]:
        """The next snapshot: the lines up to an empty one."""
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while text := self.line(deadline):
            lines.append(text)
        return lines


def test_watch_in_a_pipe_prints_each_snapshot_after_a_timestamp(instance) -> None:
    inst = instance(3)
    watcher = start_tbon("status", inst.uri, "--watch", "--no-pretty")
    try:
        reader = Reader(watcher)
        first = reader.block()
        assert ISO_TIME.fullmatch(first[0]), first
        assert [re.sub(r"\S+:", "H:", line) for line in first[1:]] == [
            "0 H: full",
            "  1 H: full",
            "  2 H: full",
        ]
        kill_rank(inst, 2)
        block = reader.block()
        while "  2 H: lost" not in [re.sub(r"\S+:", "H:", line) for line in block]:
            block = reader.block()
        assert ISO_TIME.fullmatch(block[0]) and block[0] >= first[0]
        assert "\x1b" not in "".join(first + block)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=DEADLINE) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        watcher.stdout.close()  # type: ignore[union-attr]
        watcher.stderr.close()  # type: ignore[union-attr]


def test_watch_errors_in_a_pipe(instance) -> None:
    inst = instance(3)
    watcher = start_tbon("status", inst.uri, "--watch", "--errors", "-v")
    try:
        reader = Reader(watcher)
        assert len(reader.block()) == 1  # the time alone: nothing is down
        pid = kill_rank(inst, 1)
        while len(block := reader.block()) == 1:
            pass
        assert re.fullmatch(
            rf"1 \S+: lost for \S+: connection dropped \(last pid {pid}\)", block[1]
        )
    finally:
        watcher.kill()
        watcher.wait()
        watcher.stdout.close()  # type: ignore[union-attr]
        watcher.stderr.close()  # type: ignore[union-attr]


# --- the views, from status objects alone ---------------------------------------------------------


def status_of(*states: str, **fields: Any) -> dict[str, Any]:
    """A status object of a chain 0 - 1 - 2 ... with these states (each may add fields)."""
    ranks = []
    for rank, state in enumerate(states):
        entry: dict[str, Any] = {
            "rank": rank,
            "state": state,
            "host": f"n{rank}",
            "pid": 100 + rank if state in ("online", "retiring") else None,
            "incarnation": 1,
            "parent": rank - 1 if rank else None,
            "children": [rank + 1] if rank + 1 < len(states) else [],
            "subtree": "full",
            "torpid": False,
            "since": 10.0,
        }
        entry.update(fields.get(f"r{rank}", {}))
        ranks.append(entry)
    return {"size": len(states), "topo": "kary:1", "ranks": ranks}


def test_wait_up_expects_offline_reserved_and_lost_ranks_only() -> None:
    from tbon.cli.status import missing

    for state in ("offline", "reserved", "lost"):
        assert missing(status_of("online", state), 0) == [1], state
    for state in ("online", "retiring", "vacant"):
        assert missing(status_of("online", state), 0) == [], state
    assert missing(status_of("online", "online", "lost"), 1) == [2]


def test_the_clock_shown_is_the_subtree_status_clock_and_runs_with_age() -> None:
    from tbon.cli.render import line

    status = status_of("online", "lost", r0={"subtree_since": 2.0}, r1={"reason": "x"})
    root, lost = status["ranks"]
    assert str(line(root, True)) == "0 n0: full for 2s incarnation 1"
    assert str(line(root, True, age=1.5)) == "0 n0: full for 3.5s incarnation 1"
    assert str(line(lost, True, age=1.5)) == "1 n1: lost for 11.5s incarnation 1: x"
    del root["subtree_since"]  # an older rank 0's table: its own clock
    assert str(line(root, True)) == "0 n0: full for 10s incarnation 1"


def test_down_and_errors_lines() -> None:
    from tbon.cli.render import not_online

    status = status_of(
        "online",
        "online",
        "lost",
        "vacant",
        r2={"reason": "connection dropped", "last_pid": 42},
        r3={"incarnation": 0},
    )
    assert [str(t) for t in not_online(status, 0, paths=True)] == [
        "2 n2: lost (via 1, 0): connection dropped",
        "3: vacant: spare never held",
    ]
    assert [str(t) for t in not_online(status, 0, verbose=True)] == [
        "2 n2: lost for 10s: connection dropped (last pid 42)",
        "3: vacant: spare never held",
    ]
    assert [str(t) for t in not_online(status, 0)] == [
        "2 n2: lost: connection dropped",
        "3: vacant: spare never held",
    ]
    assert not_online(status_of("online", "online"), 0) == []


def test_a_view_taller_than_the_screen_says_what_is_cut() -> None:
    from tbon.cli.status import fit

    assert fit(["a", "b"], 2) == ["a", "b"]
    cut = fit(["a", "b", "c", "d"], 3)
    assert cut[:2] == ["a", "b"] and str(cut[2]).startswith("... 2 more lines")


# --- fostered ranks (issue 12), from status objects alone -------------------------------------


def healing(**fields: Any) -> dict[str, Any]:
    """A kary:2 table of 10 ranks, 0 - {1 - {3 - {7, 8}, 4 - {9}}, 2 - {5, 6}}, each online and
    attached to its parent, as a rank 0 that fosters reports it; `rN=` changes rank N."""
    ranks = []
    for rank in range(10):
        parent = None if rank == 0 else (rank - 1) // 2
        entry: dict[str, Any] = {
            "rank": rank,
            "state": "online",
            "host": f"n{rank}",
            "pid": 100 + rank,
            "incarnation": 1,
            "parent": parent,
            "children": [c for c in (2 * rank + 1, 2 * rank + 2) if c < 10],
            "subtree": "full",
            "torpid": False,
            "since": 10.0,
            "attached_to": parent,
        }
        entry.update(fields.get(f"r{rank}", {}))
        ranks.append(entry)
    return {"size": 10, "topo": "kary:2", "ranks": ranks}


LOST_ONE = {"state": "lost", "pid": None, "attached_to": None, "reason": "connection dropped"}


def rank_1_lost(**fields: Any) -> dict[str, Any]:
    """Rank 1 lost; rank 3 fostered by rank 0, rank 4 still reattaching."""
    table = healing(
        r0={"subtree": "degraded"},
        r1={**LOST_ONE, "subtree": "lost"},
        r3={"attached_to": 0},
        r4={"attached_to": None, "reattaching": True},
        **fields,
    )
    del table["ranks"][1]["attached_to"]  # a rank not connected has none
    return table


def drawn(table: dict[str, Any], root: int = 0, kind: str = "tree", pretty: bool = True) -> list:
    from tbon.cli.render import view

    return [str(text) for text in view(table, root, kind, pretty)]


def test_a_fostered_rank_is_drawn_under_its_foster_parent_with_its_subtree() -> None:
    assert drawn(rank_1_lost()) == [
        "0 n0: degraded",
        "├─ 1 n1: lost",
        "│  └─ 4 n4: full (reattaching)",
        "│     └─ 9 n9: full (behind rank 4, reattaching: last known)",
        "├─ 2 n2: full",
        "│  ├─ 5 n5: full",
        "│  └─ 6 n6: full",
        "└─ 3 n3: full (fostered, home is rank 1)",
        "   ├─ 7 n7: full",
        "   └─ 8 n8: full",
    ]
    assert drawn(rank_1_lost(), pretty=False)[-3:] == [
        "  3 n3: full (fostered, home is rank 1)",
        "    7 n7: full",
        "    8 n8: full",
    ]


def test_ranks_behind_a_reattaching_rank_are_not_presumed_well() -> None:
    """Like Flux's ghosts: rank 0 cannot reach what is below a rank still reattaching, so
    what it shows for them is what it knew last, and the view says so, at any depth and in a
    view of the subtree alone."""
    table = rank_1_lost(r9={"children": [10]})
    table["ranks"].append({**table["ranks"][9], "rank": 10, "host": "n10", "parent": 9})
    table["ranks"][10]["attached_to"] = 9
    table["size"] = 11
    lines = drawn(table)
    assert "│        └─ 10 n10: full (behind rank 4, reattaching: last known)" in lines
    assert drawn(table, 9) == [
        "9 n9: full (behind rank 4, reattaching: last known)",
        "└─ 10 n10: full (behind rank 4, reattaching: last known)",
    ]
    assert not any("behind" in line for line in drawn(healing()))  # nothing to hide when whole


def test_highlight_marks_the_ranks_and_their_way_to_the_root() -> None:
    from tbon.cli.render import Marks, view

    table = rank_1_lost()
    plain = [str(t) for t in view(table, 0, "tree", marks=Marks(frozenset({8, 9}), plain=True))]
    marked = [line for line in plain if line.endswith(" *")]
    assert marked == [
        "0 n0: degraded *",
        "├─ 1 n1: lost *",
        "│  └─ 4 n4: full (reattaching) *",
        "│     └─ 9 n9: full (behind rank 4, reattaching: last known) *",
        "└─ 3 n3: full (fostered, home is rank 1) *",  # 8 is drawn under its foster parent
        "   └─ 8 n8: full *",
    ]
    coloured = view(table, 0, "tree", marks=Marks(frozenset({8}), plain=False))
    assert not any(str(t).endswith("*") for t in coloured)
    assert any("reverse" in str(span.style) for span in coloured[-1].spans)


def test_fostered_and_reattaching_marks_are_coloured_and_stay_before_verbose_words() -> None:
    from tbon.cli.render import line

    ranks = rank_1_lost()["ranks"]
    fostered, reattaching = line(ranks[3], True), line(ranks[4], True)
    assert str(fostered) == "3 n3: full (fostered, home is rank 1) for 10s incarnation 1"
    assert str(reattaching) == "4 n4: full (reattaching) for 10s incarnation 1"
    assert any(span.style == "yellow" for span in fostered.spans)
    assert any(span.style == "dark_orange" for span in reattaching.spans)
    # attached to its own parent, or rank 0 with no parent: no mark
    assert [str(line(ranks[r], False)) for r in (0, 2)] == ["0 n0: degraded", "2 n2: full"]


def test_rank_subtrees_and_summaries_follow_the_tree_as_drawn() -> None:
    from tbon.cli.render import subtree

    table = rank_1_lost()
    assert subtree(table, 0) == list(range(10))
    assert subtree(table, 1) == [1, 4, 9]  # rank 3 moved away, with 7 and 8
    assert drawn(table, 3) == [
        "3 n3: full (fostered, home is rank 1)",
        "├─ 7 n7: full",
        "└─ 8 n8: full",
    ]
    assert drawn(table, 1, "summary") == ["1 n1: lost (3 ranks: 1 lost, 2 online)"]
    assert drawn(table, 3, "summary") == [
        "3 n3: full (fostered, home is rank 1) (3 ranks: 3 online)"
    ]


def test_down_paths_and_errors_follow_the_attachment() -> None:
    table = rank_1_lost(r8={**LOST_ONE, "last_pid": 42}, r9={**LOST_ONE})
    assert drawn(table, 0, "down") == [
        "1 n1: lost (via 0): connection dropped",
        "8 n8: lost (via 3, 0): connection dropped",  # through its fostered parent
        "9 n9: lost (via 4, 1, 0): connection dropped",  # a reattaching rank stays put
    ]
    assert drawn(table, 3, "errors") == ["8 n8: lost: connection dropped"]
    assert drawn(table, 1, "errors") == ["1,9 n[1,9]: lost: connection dropped"]


def test_errors_are_grouped_by_what_happened_with_ranks_and_a_host_list() -> None:
    """As `flux overlay errors`: one line per distinct error, its ranks and hosts."""
    from tbon.cli.render import not_online

    dropped = {"reason": "connection dropped"}
    status = status_of(
        "online",
        "lost",
        "lost",
        "lost",
        "lost",
        "offline",
        "vacant",
        r1=dropped,
        r2={"reason": "silent for 60s"},
        r3=dropped,
        r4=dropped,
        r6={"incarnation": 0},
    )
    assert [str(t) for t in not_online(status, 0)] == [
        "1,3-4 n[1,3-4]: lost: connection dropped",
        "2 n2: lost: silent for 60s",
        "5 n5: offline: not online yet",
        "6: vacant: spare never held",
    ]


def test_without_attached_to_the_tree_is_the_topology() -> None:
    """An older rank 0 sends no `attached_to`: the table is drawn as it always was."""
    table = rank_1_lost()
    for entry in table["ranks"]:
        entry.pop("attached_to", None)
        entry.pop("reattaching", None)
    assert drawn(table, 1) == [
        "1 n1: lost",
        "├─ 3 n3: full",
        "│  ├─ 7 n7: full",
        "│  └─ 8 n8: full",
        "└─ 4 n4: full",
        "   └─ 9 n9: full",
    ]
    table["ranks"][8].update(LOST_ONE)
    assert drawn(table, 0, "down") == [
        "1 n1: lost (via 0): connection dropped",
        "8 n8: lost (via 3, 1, 0): connection dropped",
    ]


def test_attachments_that_loop_or_point_nowhere_still_draw_every_rank_once() -> None:
    """A table caught mid-move must not hang the view nor lose ranks."""
    from tbon.cli.render import attachments

    table = healing(r1={"attached_to": 3}, r3={"attached_to": 7}, r5={"attached_to": 99})
    up = attachments(table)
    assert up[1] == 0 and up[3] == 1 and up[7] == 3 and up[5] == 2  # back to the topology
    lines = drawn(table)
    assert len(lines) == 10
    assert sorted(int(text.lstrip(" │├└─").split()[0]) for text in lines) == list(range(10))
