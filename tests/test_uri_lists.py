"""Comma-separated URI lists for every command and TBON_URI (the first that answers serves),
and `tbon uri --all`, the list of an instance's root and standbys, through real instances."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import DEADLINE, child_env, tbon

from tbon.errors import UsageError
from tbon.overlay.connectors.client import LIST_WAIT
from tbon.overlay.connectors.uri import MAX_URIS, Uri, parse_uri_list

BOUND = MAX_URIS * LIST_WAIT + DEADLINE
"""How long a command may take at worst on a list: a guard against a hang, not a timing."""


def one_line(result: subprocess.CompletedProcess[str], code: int, pattern: str) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_the_list_parser_keeps_order_and_drops_repeats() -> None:
    text = "local:///a/local,ssh://u@h:22/b,local:///a/local"
    assert parse_uri_list(text) == [Uri("local", "/a/local"), Uri("ssh", "/b", "h", "u", 22)]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("local:///a,,local:///b", r"invalid URI '' \(URI 2 of 3\): empty \(a comma too many\?\)"),
        ("local:///a,", r"invalid URI '' \(URI 2 of 2\): empty"),
        ("local:///a,bogus://x", r"invalid URI 'bogus://x' \(URI 2 of 2\): use local://PATH"),
        ("local://rel,local:///a", r"'local://rel' \(URI 1 of 2\): local:// takes an absolute"),
        (",".join(["local:///a"] * 10_000), r"invalid URI: 10000 URIs, at most 16 may be given"),
    ],
)
def test_a_bad_list_is_a_usage_error_naming_the_culprit(text: str, pattern: str) -> None:
    with pytest.raises(UsageError, match=pattern) as raised:
        parse_uri_list(text)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300


@pytest.mark.parametrize("command", [["status"], ["ping"], ["exec"], ["uri"], ["attr"]])
def test_commands_refuse_a_bad_list_with_exit_2(command: list[str]) -> None:
    tail = {"ping": ["0"], "exec": ["true"], "attr": ["list"]}.get(command[0], [])
    one_line(tbon(*command, "local:///a,,local:///b", *tail), 2, r"invalid URI '' \(URI 2 of 3\)")
    huge = ",".join(["local:///a"] * 10_000)
    one_line(tbon(*command, huge, *tail), 2, r"10000 URIs, at most 16")


def dead_uris(tmp_path: Path) -> list[str]:
    """A socket path that no longer exists, and a socket file whose broker is gone."""
    stale = tmp_path / "stale"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(str(stale))  # closed at once: the file stays, nobody listens
    return [f"local://{tmp_path}/removed/local", f"local://{stale}"]


def test_a_dead_first_uri_is_passed_over_by_every_command(instance, tmp_path: Path) -> None:
    inst = instance(3)
    listed = ",".join([*dead_uris(tmp_path), inst.uri])
    status = tbon("status", listed, "--json", timeout=BOUND)
    assert status.returncode == 0 and status.stderr == "", status
    assert [r["state"] for r in json.loads(status.stdout)["ranks"]] == ["online"] * 3
    ran = tbon("exec", listed, "-r", "all", "sh", "-c", "echo $TBON_RANK", timeout=BOUND)
    assert ran.returncode == 0 and ran.stderr == "", ran
    assert sorted(ran.stdout.split()) == ["0", "1", "2"]
    ping = tbon("ping", listed, "2", "--count", "1", timeout=BOUND)
    assert ping.returncode == 0 and ping.stderr == "", ping
    assert re.match(r"rank 2 \(\S+\): seq=", ping.stdout), ping.stdout
    through_env = tbon("status", "--summary", env=child_env(TBON_URI=listed), timeout=BOUND)
    assert through_env.returncode == 0 and through_env.stderr == "", through_env
    assert re.fullmatch(r"0 \S+: full \(3 ranks: 3 online\)\n", through_env.stdout)


def test_a_list_where_none_answers_fails_in_one_line_naming_each(tmp_path: Path) -> None:
    """A removed socket, a gone broker, and one that accepts but never answers (a listening
    socket nobody serves): each named with why, exit 1, within the list's bound."""
    hung_path = tmp_path / "hung"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hung:
        hung.bind(str(hung_path))
        hung.listen(8)
        removed, stale = dead_uris(tmp_path)
        listed = f"{removed},{stale},local://{hung_path}"
        for args, env in [(["status", listed], None), (["status"], child_env(TBON_URI=listed))]:
            line = one_line(tbon(*args, env=env, timeout=BOUND), 1, r"no URI of the list answered")
            assert f"{removed}: no such socket" in line, line
            assert f"{stale}: connection refused" in line, line
            assert f"local://{hung_path}: no answer within {LIST_WAIT:g}s" in line, line


def test_uri_converts_a_list_and_refuses_json_without_all() -> None:
    shown = tbon("uri", "--local", "ssh://h/a/local,local:///b/local")
    assert shown.returncode == 0 and shown.stdout == "local:///a/local,local:///b/local\n"
    one_line(tbon("uri", "--json", "local:///a"), 2, r"--json goes with --all")
    one_line(tbon("uri", "--all", "--local", "local:///a"), 2, r"--all and --local")


def test_uri_all_lists_the_root_then_each_standby(instance, tmp_path: Path) -> None:
    inst = instance(4, "tbon.standbys=2")
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0 and listed.stderr == "", listed
    uris = listed.stdout.strip().split(",")
    assert len(uris) == 3 and uris[0] == inst.uri, uris
    for rank, uri in enumerate(uris):  # each one serves, and is that rank's own broker
        assert uri.startswith("local://"), uri
        status = tbon("status", uri, "--json")
        assert status.returncode == 0, status
        assert (json.loads(status.stdout)["root"], json.loads(status.stdout)["standbys"]) == (
            0,
            [1, 2],
        )
        attr = tbon("attr", uri, "get", "tbon.standbys", "--json")
        assert json.loads(attr.stdout)["rank"] == rank, attr
    as_json = tbon("uri", "--all", "--json", env=child_env(TBON_URI=inst.uri))
    assert json.loads(as_json.stdout) == uris
    through_dead = tbon("uri", "--all", ",".join([*dead_uris(tmp_path), inst.uri]))
    assert through_dead.stdout.strip().split(",") == uris
    remote = tbon("uri", "--all", "--remote", inst.uri).stdout.strip().split(",")
    host = socket.gethostname()
    assert remote == [uri.replace("local://", f"ssh://{host}") for uri in uris]


def test_uri_all_without_standbys_is_the_root_alone(instance) -> None:
    inst = instance(2)
    listed = tbon("uri", "--all", inst.uri)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, f"{inst.uri}\n", "")
