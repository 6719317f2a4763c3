"""`tbon exec`'s command line read before Typer (cli/execargs.py): whatever it takes, it reads as
Typer does; whatever it leaves (None), Typer reads and judges, so help and errors are Typer's."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.cli import exec as exec_cli
from tbon.cli.app import run
from tbon.cli.execargs import ExecArgs, parse


def through_typer(args: list[str], monkeypatch: pytest.MonkeyPatch) -> ExecArgs | None:
    """What Typer's `tbon exec` hands to run_exec for `args`, or None if it runs nothing."""
    seen: list[ExecArgs] = []

    def captured(asked: ExecArgs) -> int:
        seen.append(asked)
        return 0

    with monkeypatch.context() as patch:
        patch.setattr(exec_cli, "run_exec", captured)
        run(["exec", *args])
    return seen[0] if seen else None


@pytest.mark.parametrize(
    "args",
    [
        ["-r", "all", "local:///x", "true"],
        ["local:///x", "-r", "1", "-l", "sh", "-c", "echo $TBON_RANK -r 0"],
        ["-lnq", "--json", "-r3-4", "--exclude=0", "hostname"],
        ["-ldDIR", "--env", "-*", "--env=A=1", "--env", "PATH", "x", "-r", "2"],
        ["--rank", "0,1", "--label-io", "--noinput", "--dir", "/tmp", "--", "-r", "x"],
        ["--uri", "local:///a", "--uri=local:///b", "-r", "1", "-r", "2", "cmd"],
        ["-", "arg"],
        ["--rank=", "cmd"],
        ["-r", "-1", "--env", "--", "-d", "-", "x"],  # a value, whatever it looks like
    ],
)
def test_a_line_read_before_typer_is_read_as_typer_reads_it(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = parse(args)
    assert parsed is not None
    assert parsed == through_typer(args, monkeypatch)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["-h", "true"],
        ["-r"],
        ["-z", "true"],
        ["--ranks", "1", "true"],  # no prefix of an option: Click has none
        ["--json=yes", "true"],
        ["-l"],
        ["local:///x"],
        [
            "--",
        ],
    ],
)
def test_anything_else_is_left_to_typer(args: list[str]) -> None:
    assert parse(args) is None


WORDS = st.sampled_from(
    [
        "-r", "-x", "-d", "-l", "-n", "-q", "-h", "--rank", "--exclude", "--dir", "--env",
        "--label", "--label-io", "--noinput", "--json", "--quiet", "--uri", "--help", "--",
        "-", "-lr", "-nl", "-r3", "-qx1", "--rank=2", "--env=A=b", "--json=1", "-z",
        "local:///s", "all", "0-3", "true", "sh", "-c", "A=1", "-*", "x=",
    ]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(WORDS, max_size=7))
def test_any_line_is_read_as_typer_reads_it_or_left_to_typer(args: list[str]) -> None:
    parsed = parse(args)
    if parsed is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        assert parsed == through_typer(args, patch), args


def test_the_exec_command_still_runs_through_typer_when_left_to_it(capsys: Any) -> None:
    assert run(["exec", "-z", "true"]) == 2
    assert "no such option: -z" in capsys.readouterr().err
