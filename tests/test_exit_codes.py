"""One exit code per kind of error, whichever command (docs/design.md §10), each said on one
line, `tbon NAME: message`, with no traceback. Every command meets every kind of bad input
that applies to it."""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEADLINE, Instance, start_tbon, tbon, wait_for

USAGE, FAILED, NO_SUCH_RANK = 2, 1, 68

CLIENTS = {  # command -> its arguments after the URI
    "status": [],
    "exec": ["true"],
    "ping": ["1"],
    "retire": ["1"],
    "shutdown": [],
    "dmesg": [],
    "expand": ["-n", "1"],
}


def one_line(result, name: str, pattern: str) -> None:
    """What a user must see: one line on stderr naming the command, saying `pattern`."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tbon {name}: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture(scope="module")
def plain_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("codes") / "not-a-socket"
    path.write_text("hello\n")
    return path


@pytest.fixture(scope="module")
def shared() -> Iterator[Instance]:
    """One instance of two ranks for every row that needs one (none of them changes it)."""
    inst = Instance(2)
    try:
        yield inst
    finally:
        inst.stop()


# --- usage: the command line is wrong, whatever the instance (2) ------------------------------


@pytest.mark.parametrize("name", sorted(CLIENTS))
@pytest.mark.parametrize(
    ("kind", "uri", "extra", "pattern"),
    [
        ("no URI", None, [], r"TBON_URI is not set"),
        ("bad scheme", "bogus://x", [], r"bogus://x"),
        ("relative path", "local://relative/sock", [], r"local://relative/sock"),
        ("unknown option", "local:///x", ["--bogus"], r"no such option: --bogus"),
    ],
)
def test_usage_errors_exit_2(name: str, kind: str, uri: str | None, extra: list[str], pattern):
    argv = [name, *extra]
    if uri is not None:
        argv.append(uri)
    argv += CLIENTS[name]
    result = tbon(*argv)
    assert result.returncode == USAGE, (kind, result.stderr)
    one_line(result, name, pattern)


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["keygen"], r"missing argument 'PATH'"),
        (["uri", "--local", "--remote", "local:///x"], r"exclude each other"),
        (["completion", "tcsh"], r"tcsh"),
        (["status", "--timeout", "soon", "local:///x"], r"soon"),
        (["ping", "local:///x", "one"], r"invalid rank 'one'"),
        (["retire", "local:///x", "1-"], r"invalid rank set '1-'"),
    ],
)
def test_other_usage_errors_exit_2(argv: list[str], pattern: str) -> None:
    result = tbon(*argv)
    assert result.returncode == USAGE, result.stderr
    one_line(result, argv[0], pattern)


def test_a_broker_refuses_a_bad_certificate_or_config_file_as_a_usage_error(
    tmp_path: Path,
) -> None:
    readable = tmp_path / "open.cert"
    assert tbon("keygen", str(readable)).returncode == 0
    readable.chmod(0o644)
    garbage = tmp_path / "garbage"
    garbage.write_text("not = [toml\n")
    garbage.chmod(0o600)
    cases = [
        (["-S", f"broker.cert={readable}"], r"readable by group or others"),
        (["-S", f"broker.cert={garbage}"], r"not a certificate"),
        (["-S", f"broker.cert={tmp_path / 'none'}"], r"no such file"),
        (["-c", str(garbage)], r"not valid TOML"),
    ]
    for argv, pattern in cases:
        result = tbon("broker", *argv, "true")
        assert result.returncode == USAGE, (argv, result.stderr)
        one_line(result, "broker", pattern)


def test_a_broker_says_a_usage_error_found_while_booting_as_any_command_does(
    tmp_path: Path,
) -> None:
    """A config file that does not name this host is found out only by bootstrap."""
    cert = tmp_path / "instance.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    config = tmp_path / "tbon.toml"
    config.write_text(f'[bootstrap]\ncurve_cert = "{cert}"\nhosts = [ {{ host = "elsewhere" }} ]\n')
    result = tbon("broker", "-c", str(config), "-S", "hostname=here", "true")
    assert result.returncode == USAGE, result.stderr
    one_line(result, "broker", r"host 'here' is not in \[bootstrap\] hosts \(elsewhere\)")


def test_a_broker_whose_tree_endpoint_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tbon(
            "broker",
            "-S",
            "size=2",
            "-S",
            f"tbon.endpoint=tcp://127.0.0.1:{port}",
            "-S",
            f"broker.rundir={tmp_path}/run",
            "true",
        )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith(
        f"error: cannot bind the tree endpoint tcp://127.0.0.1:{port}: Address already in use"
    ), lines[0]


# --- failed: the instance cannot be reached (1) -----------------------------------------------


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_no_broker_at_the_uri_exits_1(name: str, tmp_path: Path) -> None:
    result = tbon(name, f"local://{tmp_path}/no/socket", *CLIENTS[name])
    assert result.returncode == FAILED, result.stderr
    one_line(result, name, r"no such socket")


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_a_uri_naming_a_plain_file_exits_1_and_says_it_is_no_socket(
    name: str, plain_file: Path
) -> None:
    result = tbon(name, f"local://{plain_file}", *CLIENTS[name])
    assert result.returncode == FAILED, result.stderr
    one_line(result, name, r"not a socket")
    assert "the broker is gone" not in result.stderr


# --- a rank not in the instance (68) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "before", "after", "pattern"),
    [
        ("status", [], ["--rank", "9"], r"--rank 9: no such rank in this instance of size 2"),
        ("exec", [], ["-r", "9", "true"], r"rank 9: no such rank in this instance of size 2"),
        ("dmesg", [], ["-r", "9"], r"rank 9: no such rank in this instance of size 2"),
        ("ping", [], ["9"], r"no rank 9 in this instance of size 2"),
        ("retire", [], ["9"], r"rank 9: no rank 9 in this instance of size 2"),
        ("expand", [], ["--ranks", "9"], r"no rank 9 in this instance of size 2"),
    ],
)
def test_a_rank_outside_the_instance_exits_68(
    shared: Instance, name: str, before: list[str], after: list[str], pattern: str
) -> None:
    argv = [name, *before, shared.uri, *after] if name != "exec" else [name, shared.uri, *after]
    result = tbon(*argv)
    assert result.returncode == NO_SUCH_RANK, result.stderr
    one_line(result, name, pattern)


# --- --timeout 0 is no limit -------------------------------------------------------------------


def test_status_wait_with_timeout_0_waits_and_succeeds(shared: Instance) -> None:
    result = tbon("status", shared.uri, "--timeout", "0", "--wait", "up")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_shutdown_with_timeout_0_shuts_down_and_exits_0(instance) -> None:
    inst = instance(2)
    result = tbon("shutdown", inst.uri, "--timeout", "0")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert inst.process.wait(timeout=DEADLINE) == 0


# --- ended by a signal (128+N) -----------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_ends_a_waiting_command_with_128_plus_n(shared: Instance, signum: int) -> None:
    # Rank 1 is never lost: the command waits until it is ended.
    waiting = start_tbon("status", shared.uri, "--rank", "1", "--wait", "lost")
    try:
        wait_for(lambda: _has_socket_to(waiting.pid), "tbon status to be connected")
        waiting.send_signal(signum)
        _, err = waiting.communicate(timeout=DEADLINE)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 128 + signum, err
    assert "Traceback" not in err
    if signum == signal.SIGINT:  # Ctrl-C: the person who typed it needs no word
        assert err == "", err
    else:  # a batch log says why the command stopped
        assert err == f"tbon status: ended by {signal.Signals(signum).name}\n", err


def _has_socket_to(pid: int) -> bool:
    """Whether `pid` holds a Unix socket: it has connected to the broker, its handlers set."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return True
        except OSError:
            continue
    return False
