"""Habits a Flux user brings (issue 22): each as a user would try it."""

from __future__ import annotations

import contextlib
import os
import signal

from conftest import TBON, child_env, tbon
from test_terminal import Terminal

from tbon.cli.start import Progress


def test_relay_help_exits_0_and_says_what_it_is() -> None:
    for flag in ("--help", "-h"):
        result = tbon("relay", flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: tbon relay PATH\n"), result.stdout
        assert "ssh" in result.stdout and result.stderr == ""
    wrong = tbon("relay")
    assert wrong.returncode == 2 and wrong.stdout == ""


def test_progress_lines_only_for_a_slow_start_and_one_a_period() -> None:
    """What `tbon start -s N COMMAND` writes on a terminal while the brokers come up."""
    progress = Progress(4, now=100.0)
    assert progress.line(None, 100.0) is None
    assert progress.line(2, 100.9) is None  # under a second: nothing at all
    assert progress.line(None, 101.0) == "tbon start: 2 of 4 brokers online"
    assert progress.line(3, 101.5) is None  # one line a period
    assert progress.line(None, 102.0) == "tbon start: 3 of 4 brokers online"
    assert progress.line(4, 103.0) is None  # all online: COMMAND has the terminal


def launcher_of(pid: int) -> int | None:
    """The launcher `tbon start` runs (its only child), once it runs the launcher's code: a
    child stopped between fork and exec would stop tbon start too, whose Popen waits for the
    exec."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            found = children.read().split()
        with open(f"/proc/{found[0]}/cmdline", "rb") as cmdline:
            launching = b"tbon.overlay.launch.local" in cmdline.read()
    except (OSError, IndexError):
        return None
    return int(found[0]) if launching else None


def test_start_with_a_command_shows_progress_on_a_terminal() -> None:
    """The brokers cannot come up while their launcher (their PMI server) is stopped: tbon
    start says how many are online, a line a second, then the command runs as usual."""
    term = Terminal([TBON, "start", "--test-size=2", "echo", "command-ran"], child_env(TERM="dumb"))
    launcher = None
    try:
        while launcher is None:  # caught before it has even imported the broker
            assert term.process.poll() is None, term.screen
            launcher = launcher_of(term.process.pid)
        os.kill(launcher, signal.SIGSTOP)
        term.expect(r"tbon start: [0-2] of 2 brokers online\r?\n")
        os.kill(launcher, signal.SIGCONT)
        term.expect(r"command-ran")
    finally:
        if launcher is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(launcher, signal.SIGCONT)
        code = term.close()
    assert code == 0, term.screen
