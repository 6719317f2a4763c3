"""What a user sees from the commands: exit statuses, one-line errors, signals, URIs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess

import pytest
from conftest import DEADLINE, TBON, child_env, process_gone, tbon, wait_for


def one_line_error(result: subprocess.CompletedProcess[str], code: int, pattern: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "code", "pattern"),
    [
        (["status", "--frob"], 2, r"^tbon status: no such option: --frob"),
        (["frob"], 2, r"^tbon: no such command 'frob'"),
        (
            ["status", "local:///nonexistent/socket"],
            1,
            r"^tbon status: cannot connect to local:///nonexistent/socket: no such socket",
        ),
        (["status", "bogus://x"], 2, r"^tbon status: invalid URI 'bogus://x'"),
        (["status"], 2, r"TBON_URI is not set"),
        (["ping", "1"], 2, r"TBON_URI is not set"),
        (["ping", "local:///x", "one"], 2, r"invalid rank 'one'"),
        (["status", "--wait", "bogus", "local:///x"], 2, r"invalid --wait state 'bogus'"),
        (
            ["status", "--timeout", "soon", "--wait", "full", "local:///x"],
            2,
            r"invalid --timeout 'soon'",
        ),
        (["shutdown", "local:///nonexistent/socket"], 1, r"no such socket"),
        (["start", "--test-size=0", "true"], 2, r"--test-size"),
        (
            ["start", "--test-size=2", "-S", "tbon.topo=kary:x", "true"],
            2,
            r"invalid topology 'kary:x'",
        ),
        (["start", "--test-size=2", "-S", "nonsense=1", "true"], 2, r"unknown attribute"),
        (
            ["start", "--test-size=2", "-S", "tbon.heartbeat=fast", "true"],
            2,
            r"invalid tbon.heartbeat 'fast'",
        ),
        (["start", "--test-size=2", "-o", "-v", "true"], 2, r"unsupported broker option '-v'"),
        (["broker", "-S", "nonsense=1"], 2, r"^tbon broker: unknown attribute 'nonsense'"),
        (["broker", "-S", "size"], 2, r"^tbon broker: invalid attribute 'size'"),
        (["broker", "--frob"], 2, r"^tbon broker: unrecognized arguments: --frob"),
        (["uri", "pid:999999999"], 1, r"pid 999999999: no such process"),
        (["uri", "/nonexistent"], 1, r"no such run directory"),
        (["uri", "--local", "--remote", "local:///x"], 2, r"exclude each other"),
    ],
)
def test_bad_input_gets_a_one_line_error(args: list[str], code: int, pattern: str) -> None:
    one_line_error(tbon(*args), code, pattern)


def test_stale_socket_is_refused_clearly(tmp_path) -> None:
    path = tmp_path / "local"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file remains, nobody listens
    one_line_error(tbon("status", f"local://{path}"), 1, r"connection refused")


def test_start_returns_the_exit_status_of_its_command() -> None:
    assert tbon("start", "--test-size=2", "sh", "-c", "exit 7").returncode == 7
    killed = tbon("start", "--test-size=2", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    missing = tbon("start", "--test-size=2", "no-such-command-anywhere")
    assert missing.returncode == 127
    assert "cannot run no-such-command-anywhere" in missing.stderr


def test_sigterm_to_start_ends_the_command_and_returns_its_status() -> None:
    process = subprocess.Popen(
        [TBON, "start", "--test-size=3", "sh", "-c", "echo ready; exec sleep 60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "killed" not in err


def test_shutdown_from_inside_returns_the_commands_status() -> None:
    for size in ("1", "3"):
        result = tbon(
            "start", f"--test-size={size}", "sh", "-c", "tbon shutdown --no-wait && sleep 60"
        )
        assert result.returncode == 128 + signal.SIGTERM, result.stderr


def test_command_sees_the_instance_environment() -> None:
    result = tbon("start", "--test-size=2", "sh", "-c", 'echo "$TBON_URI $TBON_RANK $PMI_FD"')
    assert result.returncode == 0, result.stderr
    uri, rank = result.stdout.split()
    assert uri.startswith("local://") and rank == "0"


def test_singleton_broker_runs_its_initial_program() -> None:
    result = tbon("broker", "sh", "-c", "tbon status --summary; exit 3")
    assert result.returncode == 3, result.stderr
    assert re.fullmatch(r"0 \S+: full \(1 ranks: 1 online\)\n", result.stdout)


def test_start_prints_the_uri_and_shuts_down_on_sigterm(instance) -> None:
    inst = instance(4)
    pids = set(inst.broker_pids)
    assert len(pids) == 4
    inst.process.send_signal(signal.SIGTERM)
    assert inst.process.wait(timeout=DEADLINE) == 0
    wait_for(lambda: all(process_gone(pid) for pid in pids), "every broker to exit")
    assert not os.path.exists(inst.uri[len("local://") :])
    assert "exited" not in inst.stderr() and "Traceback" not in inst.stderr()


def test_shutdown_command_stops_the_instance(instance) -> None:
    inst = instance(8, "tbon.fanout=2")
    result = tbon("shutdown", inst.uri)
    assert result.returncode == 0, result.stderr
    assert inst.process.wait(timeout=DEADLINE) == 0
    wait_for(lambda: all(process_gone(pid) for pid in inst.broker_pids), "every broker to exit")
    assert "exited" not in inst.stderr()


def test_killing_tbon_start_leaves_nothing_behind() -> None:
    process = subprocess.Popen(
        [TBON, "start", "--test-size=4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout is not None
        uri = process.stdout.readline().strip()
        status = tbon("status", uri, "--json")
        pids = [int(p) for p in re.findall(r'"pid":(\d+)', status.stdout)]
        assert len(pids) == 4
        process.kill()  # no chance to clean up: the launcher must notice by itself
        process.wait()
        wait_for(lambda: all(process_gone(pid) for pid in pids), "orphaned brokers to exit")
        rundir = os.path.dirname(os.path.dirname(uri[len("local://") :]))
        wait_for(lambda: not os.path.exists(rundir), "the run directory to be removed")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_uri_finds_instances(instance) -> None:
    inst = instance(2)
    rundir = os.path.dirname(inst.uri[len("local://") :])
    assert tbon("uri", rundir).stdout.strip() == inst.uri
    assert tbon("uri", f"pid:{inst.process.pid}").stdout.strip() == inst.uri
    assert tbon("uri", f"pid:{inst.pid(1)}").stdout.strip().endswith("/1/local")
    remote = tbon("uri", "--remote", inst.uri).stdout.strip()
    assert remote == f"ssh://{socket.gethostname()}{inst.uri[len('local://') :]}"
    assert tbon("uri", "--local", remote).stdout.strip() == inst.uri
    inside = tbon("start", "--test-size=1", "tbon", "uri")
    assert inside.returncode == 0 and inside.stdout.startswith("local://")


def test_help_explains_every_command() -> None:
    for command in ("start", "status", "ping", "uri", "shutdown", "keygen"):
        result = tbon(command, "--help")
        assert result.returncode == 0 and "Usage" in result.stdout, command
    broker = tbon("broker", "--help")
    assert broker.returncode == 0 and "exit status" in broker.stdout
    top = tbon("--help").stdout
    assert all(name in top for name in ("start", "broker", "status", "ping", "shutdown"))
