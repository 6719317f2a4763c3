"""`tbon exec`'s decisions without an instance: the environment a job is given (--env rules, the
broker's checks of exec.start, tbon's own variables), how a command is found and why it cannot
start, and what `-r all` says it skips. Process-level tests of the same are in test_exec.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tbon.cli.exec import _skipped_lines, job_environment
from tbon.errors import UsageError
from tbon.limits import ENV_LIMIT, environment_size
from tbon.overlay.broker.program import (
    SHELL,
    Launch,
    launch,
    program_environment,
    quick_launch,
)
from tbon.overlay.parse.idset import format_idset
from tbon.overlay.services.actions import Respond, StartJob
from tbon.overlay.services.exec import (
    ExecService,
    environment_problem,
    os_text,
    start_problem,
)
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.state.exectargets import pick_targets as _targets
from tbon.overlay.state.statesview import RankStates
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

NOW = 100.0
CALLER = {"HOME": "/home/u", "PATH": "/usr/bin:/bin", "FOO": "bar", "SLURM_A": "1", "SLURM_B": "2"}


# --- --env rules (the client) ----------------------------------------------------------------


def test_without_rules_the_job_gets_the_callers_environment() -> None:
    env = job_environment(CALLER, [])
    assert env == CALLER and env is not CALLER


def test_a_minus_rule_removes_matching_names_and_minus_star_all() -> None:
    assert job_environment(CALLER, ["-*"]) == {}
    assert job_environment(CALLER, ["-SLURM_*"]) == {
        "HOME": "/home/u",
        "PATH": "/usr/bin:/bin",
        "FOO": "bar",
    }
    assert job_environment(CALLER, ["-FOO", "-NOT_THERE"]) == {
        k: v for k, v in CALLER.items() if k != "FOO"
    }
    assert job_environment(CALLER, ["-foo"]) == CALLER  # names are matched case and all


def test_a_name_brings_back_the_callers_variable_and_a_glob_several() -> None:
    assert job_environment(CALLER, ["-*", "FOO"]) == {"FOO": "bar"}
    assert job_environment(CALLER, ["-*", "SLURM_*", "NOPE"]) == {"SLURM_A": "1", "SLURM_B": "2"}
    assert job_environment(CALLER, ["-*", "FOO=set", "FOO"]) == {"FOO": "set"}  # not over a set one


def test_name_equals_value_sets_one_with_dollar_references() -> None:
    assert job_environment({}, ["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    env = job_environment(CALLER, ["-*", "PATH=/opt/bin:$PATH", "P2=${FOO}s", "D=5$$", "E="])
    assert env == {"PATH": "/opt/bin:/usr/bin:/bin", "P2": "bars", "D": "5$", "E": ""}
    # $NAME is what the rules built so far, else the caller's:
    assert job_environment(CALLER, ["FOO=one", "BAR=$FOO"])["BAR"] == "one"
    assert job_environment(CALLER, ["-FOO", "BAR=$FOO"])["BAR"] == "bar"


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        ("", "--env needs a RULE"),
        ("=x", "no variable name before '='"),
        ("X=$NOPE", "$NOPE is not set"),
        ("X=5$", "write $$ for a '$' of its own"),
    ],
)
def test_a_rule_that_cannot_apply_is_a_usage_error(rule: str, said: str) -> None:
    with pytest.raises(UsageError, match=said.replace("$", r"\$")) as caught:
        job_environment(CALLER, [rule])
    assert caught.value.exit_code == 2


names = st.text(st.characters(min_codepoint=65, max_codepoint=90), min_size=1, max_size=6)


@given(st.dictionaries(names, st.text(max_size=8)), st.lists(st.tuples(names, names)))
def test_rules_applied_to_nothing_give_exactly_what_they_set(
    caller: dict[str, str], sets: list[tuple[str, str]]
) -> None:
    """An oracle: after -*, only NAME=VALUE rules count, the last one of a name winning."""
    rules = ["-*"] + [f"{name}={value}" for name, value in sets]
    assert job_environment(caller, rules) == dict(sets)


# --- exec.start's environment, as a broker checks it -------------------------------------------


def test_an_env_of_names_to_values_or_null_is_taken() -> None:
    assert environment_problem(None) is None
    assert environment_problem({}) is None
    assert environment_problem({"A": "", "B_2": "x y=z", "lower": "\udcff"}) is None


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ([["A", "1"]], "env must be an object of names to values, or null"),
        ("A=1", "env must be an object"),
        ({"": "x"}, "'' is not a variable name"),
        ({"A=B": "x"}, "'A=B' is not a variable name"),
        ({"A\0": "x"}, "is not a variable name"),
        ({"\ud800": "x"}, "is not a variable name"),
        ({"A": 1}, "the value of A must be a string without NUL"),
        ({"A": None}, "the value of A must be"),
        ({"A": "x\0y"}, "the value of A must be"),
        ({"A": "\ud800"}, "the value of A must be"),
    ],
)
def test_an_env_execve_could_not_take_is_refused(env: Any, said: str) -> None:
    why = environment_problem(env)
    assert why is not None and why.startswith("exec.start: env") and said in why, why


_TEXT = st.text(st.sampled_from(["A", "b", "=", "\0", "é", "\udcff", "\ud800", " "]), max_size=4)


@given(st.dictionaries(_TEXT, st.one_of(_TEXT, st.integers(), st.none()), max_size=4))
def test_the_env_check_of_all_at_once_says_what_one_by_one_would(env: dict[str, Any]) -> None:
    """environment_problem checks the whole env in one pass, and names the culprit one by one
    only when that pass fails: the answer is the first bad variable's, as a check of each."""
    expected = None
    for name, value in env.items():
        if not name or "=" in name or not os_text(name):
            expected = f"exec.start: env: {name[:64]!r} is not a variable name"
            break
        if not os_text(value):
            expected = f"exec.start: env: the value of {name[:64]} must be a string without NUL"
            break
    assert environment_problem(env) == expected


def test_an_env_is_bounded_as_execve_counts_it() -> None:
    assert environment_size({"AB": "xyz", "é": ""}) == (2 + 3 + 2) + (2 + 0 + 2)
    value = "x" * (ENV_LIMIT - len("BIG") - 2)
    assert environment_problem({"BIG": value}) is None
    why = environment_problem({"BIG": value + "x"})
    assert (
        why == f"exec.start: env takes {ENV_LIMIT + 1} bytes, over the limit of {ENV_LIMIT} (1 MiB)"
    )


def test_start_checks_every_field_before_anything_runs() -> None:
    good = {"id": "j", "argv": ["true"], "cwd": None, "env": {"A": "1"}, "window": 4096}
    assert start_problem(good) is None
    assert start_problem({"id": "j", "argv": ["true"]}) is None  # an older client's
    assert start_problem({**good, "argv": []}) == "exec.start needs id and argv"
    assert start_problem({**good, "argv": ["a\0"]}) == "exec.start: bad argv or a duplicate id"
    assert start_problem({**good, "cwd": 3}) == "exec.start: cwd must be a directory's path or null"
    assert "env must be an object" in (start_problem({**good, "env": []}) or "")
    assert "window must be" in (start_problem({**good, "window": 1}) or "")


def exec_start(payload: dict[str, Any], targets: list[int]) -> Message:
    return Message(
        Kind.REQUEST,
        "exec.start",
        {"id": "j1", "argv": ["true"], "targets": targets, **payload},
        nodeid=0,
        tag=7,
        route=["l01"],
    )


def test_the_service_refuses_a_bad_env_at_each_target_and_still_passes_it_down() -> None:
    service = ExecService(0, Topology("kary:2", 7), Lifecycle())
    actions = service.handle(exec_start({"env": {"A=B": "x"}}, [0, 1]), NOW)
    [answer] = [a.message for a in actions if isinstance(a, Respond)]
    assert answer.streaming and answer.payload["rank"] == 0
    assert answer.payload["error"] == "exec.start: env: 'A=B' is not a variable name"
    assert not [a for a in actions if isinstance(a, StartJob)]
    assert len(actions) == 2  # rank 1 answers for itself, the same way


def test_the_job_runner_gets_the_checked_start_with_defaults_and_the_size() -> None:
    service = ExecService(0, Topology("kary:2", 7), Lifecycle())
    [start] = service.handle(exec_start({"cwd": "/tmp", "env": {"A": "1"}}, [0]), NOW)
    assert isinstance(start, StartJob)
    assert start.request.payload == {
        "id": "j1",
        "argv": ["true"],
        "cwd": "/tmp",
        "env": {"A": "1"},
        "window": 1024 * 1024,
        "eof": False,
        "acks": False,
        "size": 7,
    }
    assert (start.request.route, start.request.tag) == (["l01"], 7)  # answers go back the same way


def test_a_client_s_jobs_are_remembered_without_their_environment() -> None:
    service = ExecService(0, Topology("kary:2", 7), Lifecycle())
    service.started_by("l0a", exec_start({"env": {"A": "x" * 1000}}, [0, 3]))
    [kill] = service.client_gone("l0a")
    assert kill.message.payload["targets"] == [0, 3] and kill.message.payload["id"] == "j1"
    assert service._client_jobs == {}


# --- tbon's own variables (the broker) ----------------------------------------------------------


def test_tbon_variables_override_the_callers_and_pmi_ones_are_dropped() -> None:
    caller = {"TBON_RANK": "99", "TBON_SIZE": "99", "TBON_URI": "x", "PMI_FD": "3", "A": "1"}
    env = program_environment("local:///r/1/local", 1, 4, caller)
    assert env == {"A": "1", "TBON_URI": "local:///r/1/local", "TBON_RANK": "1", "TBON_SIZE": "4"}
    assert caller["TBON_RANK"] == "99"  # the caller's mapping is not changed
    assert program_environment("u", 0, None, {}) == {"TBON_URI": "u", "TBON_RANK": "0"}


def test_without_an_env_a_program_gets_the_brokers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TBON_TEST_MARK", "m")
    monkeypatch.setenv("PMI_RANK", "2")
    env = program_environment("u", 0, 2)
    assert env["TBON_TEST_MARK"] == "m" and "PMI_RANK" not in env and env["TBON_SIZE"] == "2"


# --- finding the command, and why it cannot start -----------------------------------------------


def executable(path: Path, content: bytes, mode: int = 0o755) -> Path:
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_a_bare_name_is_looked_up_in_the_jobs_path(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    executable(tools / "mytool", b"#!/bin/sh\necho hi\n")
    found = launch(["mytool", "a"], None, {"PATH": str(tools)})
    assert found == Launch(["mytool", "a"], path=str(tools / "mytool"))
    missing = launch(["mytool"], None, {"PATH": "/usr/bin:/bin"})
    assert missing == Launch(["mytool"], "mytool: command not found", 127)
    assert launch(["sh"], None, {}).why == ""  # no PATH: the default path, as execvp's


def test_a_relative_path_entry_is_from_the_jobs_directory(tmp_path: Path) -> None:
    executable(tmp_path / "here", b"#!/bin/sh\n")
    assert launch(["here"], str(tmp_path), {"PATH": "."}).why == ""
    assert launch(["here"], str(tmp_path), {"PATH": ""}).why == ""  # empty: the directory
    assert launch(["here"], "/", {"PATH": "."}).status == 127


def test_a_non_executable_match_in_path_is_passed_over(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    executable(first / "tool", b"#!/bin/sh\n", mode=0o644)
    (first / "dir").mkdir()
    assert launch(["tool"], None, {"PATH": f"{first}:{second}"}).status == 127
    executable(second / "tool", b"#!/bin/sh\n")
    assert launch(["tool"], None, {"PATH": f"{first}:{second}"}).why == ""


def test_paths_fail_in_the_words_of_a_shell(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    (tmp_path / "adir").mkdir()
    executable(tmp_path / "plain", b"echo hi\n", mode=0o644)
    executable(tmp_path / "badinterp", b"#!/no/such/interp -x\necho\n")
    executable(tmp_path / "noexecinterp", f"#!{tmp_path}/plain\n".encode())
    assert launch(["./nope"], cwd, {}) == Launch(
        ["./nope"], "./nope: No such file or directory", 127
    )
    assert launch(["./adir"], cwd, {}) == Launch(["./adir"], "./adir: Permission denied", 126)
    assert launch(["./plain"], cwd, {}).why == "./plain: Permission denied"
    assert launch(["./badinterp"], cwd, {}) == Launch(
        ["./badinterp"],
        "./badinterp: /no/such/interp: bad interpreter: No such file or directory",
        127,
    )
    said = launch(["./noexecinterp"], cwd, {})
    assert said.why.endswith("/plain: bad interpreter: Permission denied") and said.status == 126
    assert launch(["x"], str(tmp_path / "gone"), {}).why == f"{tmp_path}/gone: no such directory"


def test_binaries_for_no_machine_here_are_an_exec_format_error(tmp_path: Path) -> None:
    real = Path(shutil.which("true") or "/bin/true").read_bytes()
    arm = bytearray(real)
    arm[18:20] = (40).to_bytes(2, "little")  # 32-bit ARM's e_machine, in a 64-bit header
    executable(tmp_path / "foreign", bytes(arm))
    executable(tmp_path / "garbage", b"\x7fELFgarbage")
    executable(tmp_path / "blob", b"ab\0cd\n")
    executable(tmp_path / "native", real)
    for name in ("foreign", "garbage", "blob"):
        plan = launch([f"./{name}"], str(tmp_path), {})
        assert plan == Launch(
            [f"./{name}"], f"./{name}: cannot execute binary file: Exec format error", 126
        ), name
    assert launch(["./native"], str(tmp_path), {}) == Launch(["./native"])


def test_a_script_without_hash_bang_runs_with_sh_as_a_shell_would(tmp_path: Path) -> None:
    executable(tmp_path / "plain", b"echo hi\n")
    executable(tmp_path / "bare", b"#!\necho hi\n")
    executable(tmp_path / "empty", b"")
    for name in ("plain", "bare", "empty"):
        assert launch([f"./{name}", "a"], str(tmp_path), {}) == Launch([SHELL, f"./{name}", "a"])
    found = launch(["plain"], str(tmp_path), {"PATH": "."})
    assert found == Launch([SHELL, "./plain"])


def test_the_quick_lookup_finds_what_access_allows_and_leaves_the_rest_to_launch(
    tmp_path: Path,
) -> None:
    """quick_launch takes the first PATH entry access(2) says is executable, a directory
    included (the exec then refuses it, and launch finds what a shell would run); a name with a
    slash is the exec's to judge; anything not found so is launch's to word."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "tool").mkdir()
    executable(second / "tool", b"#!/bin/sh\n")
    path = {"PATH": f"{first}:{second}"}
    assert quick_launch(["tool", "x"], None, path) == Launch(["tool", "x"], path=f"{first}/tool")
    assert launch(["tool", "x"], None, path) == Launch(["tool", "x"], path=f"{second}/tool")
    assert quick_launch(["./anything"], "/nowhere", {}) == Launch(["./anything"])
    assert quick_launch(["tbon-test-nosuchcmd"], None, path) is None
    assert quick_launch(["sh"], None, {}) is not None  # no PATH: the default path
    executable(tmp_path / "here", b"#!/bin/sh\n")
    assert quick_launch(["here"], str(tmp_path), {"PATH": ""}) == Launch(["here"], path="./here")
    assert quick_launch(["here"], "/", {"PATH": "."}) is None


PATH_TEXT = st.text(alphabet="ab/.", max_size=6)


@given(st.lists(PATH_TEXT, min_size=1, max_size=4), st.none() | PATH_TEXT)
def test_the_quick_lookup_asks_access_of_what_os_path_join_would_name(
    entries: list[str], cwd: str | None
) -> None:
    """quick_launch spells its paths out rather than call os.path.join: the same paths, asked in
    the same order (an empty entry is the job's directory, a relative one is from it)."""
    asked: list[str] = []

    def access(where: str, mode: int) -> bool:
        asked.append(where)
        return False

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.access", access)
        assert quick_launch(["tool"], cwd, {"PATH": ":".join(entries)}) is None
    joined = [os.path.join(entry or ".", "tool") for entry in entries]
    assert asked == [path if cwd is None else os.path.join(cwd, path) for path in joined]


# --- what -r all says it skips ----------------------------------------------------------------


def status(*states: str) -> RankStates:
    """Rank 0's `states` view of ranks in these states (statusviews.states writes it so)."""
    named: dict[str, list[int]] = {}
    for rank, state in enumerate(states):
        named.setdefault(state, []).append(rank)
    view = {"size": len(states), "states": {s: format_idset(r) for s, r in named.items()}}
    return RankStates(view)


def test_all_skips_down_ranks_and_says_which_in_one_line() -> None:
    table = status("online", "lost", "online", "offline", "lost", "vacant", "retiring", "reserved")
    targets, problems, skipped = _targets(table, "all", None)
    assert (targets, problems) == ([0, 2], {})
    assert _skipped_lines(skipped) == [
        "skipping lost ranks 1,4 and offline ranks 3",
        "skipping retiring ranks 6",
    ]
    _, _, some = _targets(table, "all", "1,6")  # what -x leaves out is not said
    assert _skipped_lines(some) == ["skipping lost ranks 4 and offline ranks 3"]
    assert _skipped_lines(_targets(status("online", "vacant"), "all", None)[2]) == []


def test_ranks_named_with_r_are_problems_not_skips() -> None:
    targets, problems, skipped = _targets(status("online", "lost", "offline"), "0-3", None)
    assert targets == [0] and skipped == {}
    assert problems == {
        1: "rank 1 is lost",
        2: "rank 2 is offline",
        3: "no such rank in this instance of size 3",
    }
