"""Scripts and a background instance: `tbon start --bg`, and `tbon uri pid:PID` of a `tbon start`
run with `&` (issue 22)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess

from conftest import DEADLINE, TBON, child_env, process_gone, tbon, wait_for


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def end_all(pids: list[int]) -> None:
    """What a failed test leaves: stopped by PID, the keeper first (it shuts its instance down)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: all(process_gone(pid) for pid in pids), "the instance to end")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_bg_returns_the_uri_and_the_instance_runs_until_shut_down() -> None:
    """`tbon start --bg` returns once every broker is online, holding none of the caller's
    stdio (capture_output would wait for every holder of its pipes), and prints the URI; the
    instance, kept by a process in a session of its own, answers until `tbon shutdown`, and then
    nothing of it is left."""
    started = tbon("start", "--bg", "--test-size=3", timeout=DEADLINE)
    assert started.returncode == 0, started.stderr
    assert started.stderr == ""
    uri = started.stdout.strip()
    assert started.stdout == f"{uri}\n" and uri.startswith("local://"), started.stdout
    status = json.loads(tbon("status", uri, "--json").stdout)
    brokers = [rank["pid"] for rank in status["ranks"]]
    launcher = parent_of(brokers[0])
    keeper = parent_of(launcher)
    everything = [keeper, launcher, *brokers]
    try:
        assert [rank["state"] for rank in status["ranks"]] == ["online"] * 3
        assert os.getsid(keeper) == keeper, "the keeper has a session of its own"
        assert os.readlink(f"/proc/{keeper}/fd/1") == os.devnull
        assert tbon("uri", f"pid:{keeper}").stdout.strip() == uri
        done = tbon("shutdown", uri)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: all(process_gone(pid) for pid in everything), "the instance to end")
        assert not os.path.exists(os.path.dirname(os.path.dirname(uri[len("local://") :])))
    finally:
        end_all(everything)


def test_bg_that_fails_says_why_and_exits_1() -> None:
    """A broker that cannot start (its port is taken): what the launcher says reaches the
    caller's stderr, and the status is tbon start's own."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tbon(
            "start", "--bg", "--test-size=2", "-S", f"tbon.endpoint=tcp://127.0.0.1:{port}"
        )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "tbon start: the instance failed to start" in result.stderr


def test_bg_refuses_a_command() -> None:
    result = tbon("start", "--bg", "--test-size=2", "true")
    assert result.returncode == 2
    assert "--bg and COMMAND do not go together" in result.stderr


def test_uri_of_a_tbon_start_in_the_background() -> None:
    """`tbon start ... &` then `tbon uri pid:$!`: a clear "not up yet" while it is not (the
    whole process group is stopped before it can start anything), its URI once it is."""
    process = subprocess.Popen(
        [TBON, "start", "--test-size=2"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    os.killpg(process.pid, signal.SIGSTOP)
    try:
        early = tbon("uri", f"pid:{process.pid}")
        assert early.returncode == 1
        assert early.stderr == (
            f"tbon uri: pid {process.pid} is tbon start, whose instance is not up yet "
            "(rank 0 has no socket): try again in a moment\n"
        )
        os.killpg(process.pid, signal.SIGCONT)
        assert process.stdout is not None
        uri = process.stdout.readline().strip()
        assert uri.startswith("local://"), process.stderr
        assert tbon("uri", f"pid:{process.pid}").stdout == f"{uri}\n"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
    assert process.returncode == 0
