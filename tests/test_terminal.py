"""`tbon start` on a terminal, driven through a pseudo-terminal as a person would use it."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from conftest import DEADLINE, TBON, child_env

from tbon.overlay.connectors.client import Client
from tbon.overlay.parse.duration import parse_duration

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor movement
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # select graphic rendition: colours, bold
HOME = "\x1b[H"  # the cursor to the top left: a --watch view is redrawn whole from there


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: _take_terminal(slave),
        )
        os.close(slave)
        self.screen = ""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def expect(self, pattern: str, timeout: float = DEADLINE) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, ANSI.sub("", self.screen))
            if match:
                return match
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} on the terminal; it shows:\n{self.screen}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the other side closed
                    raise AssertionError(f"terminal closed; it showed:\n{self.screen}") from None

    def wait_until(self, done: Callable[[str], bool], what: str, timeout: float = DEADLINE) -> str:
        """Read until `done` holds for all the terminal received (escape codes included)."""
        deadline = time.monotonic() + timeout
        while not done(self.screen):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out waiting for {what}; the terminal shows:\n{self.screen}"
                )
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.screen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the other side closed
                    raise AssertionError(f"terminal closed; it showed:\n{self.screen}") from None
        return self.screen

    def close(self) -> int:
        try:
            return self.process.wait(timeout=DEADLINE)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            os.close(self.master)


def _take_terminal(fd: int) -> None:
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)


def test_start_without_command_runs_a_shell_on_a_terminal() -> None:
    env = child_env(SHELL="/bin/sh", PS1="tbon$ ", TERM="dumb")
    term = Terminal([TBON, "start", "--test-size=3"], env)
    try:
        term.expect(r"tbon\$ ")
        term.type("tbon status --no-pretty; echo rank=$TBON_RANK\n")
        term.expect(r"rank=0")
        assert re.search(r"0 \S+: full", term.screen)
        term.type("exit 5\n")
    finally:
        code = term.close()
    assert code == 5


def test_ctrl_c_stops_the_command_not_the_instance() -> None:
    env = child_env(TERM="dumb")
    # The program can be interrupted before it says "ready" (a shell's `echo ready; sleep 60`
    # cannot: a Ctrl-C between the two is caught by the shell and sleep runs on).
    program = (
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "print('ready', flush=True); time.sleep(60); print('not-interrupted')"
    )
    term = Terminal([TBON, "start", "--test-size=3", sys.executable, "-c", program], env)
    try:
        term.expect(r"(?m)^ready")
        term.type("\x03")  # Ctrl-C: SIGINT to the terminal's foreground process group
    finally:
        code = term.close()
    assert code == 128 + signal.SIGINT
    assert "not-interrupted" not in term.screen
    assert "Traceback" not in term.screen and "exited with status" not in term.screen


def test_status_watch_redraws_live_until_ctrl_c(instance) -> None:
    inst = instance(3)
    term = Terminal([TBON, "status", inst.uri, "--watch"], child_env(TERM="xterm", COLUMNS="80"))
    try:
        term.expect(r"2 \S+: full")
        os.kill(inst.pid(2), signal.SIGKILL)
        term.expect(r"0 \S+: degraded")
        term.expect(r"2 \S+: lost")
        term.type("\x03")
    finally:
        code = term.close()
    assert code == 0
    assert "Traceback" not in term.screen


def watch_env(**extra: str) -> dict[str, str]:
    return child_env(TERM="xterm", COLUMNS="80", LINES="24", **extra)


def root_times(screen: str) -> list[float]:
    """Every `for TIME` the terminal showed on rank 0's line, in seconds."""
    found = re.findall(r"0 \S+: full for (\S+) ", ANSI.sub("", screen))
    return [parse_duration(text) for text in found]


def test_status_watch_keeps_its_clock_ticking(instance) -> None:
    """Nothing changes in the instance, and the `for` time still runs (issue 13)."""
    inst = instance(2)
    term = Terminal([TBON, "status", inst.uri, "--watch", "-v"], watch_env())
    try:
        term.expect(r"0 \S+: full for \S+ ")
        term.wait_until(
            lambda screen: max(root_times(screen)) - min(root_times(screen)) >= 1.5,
            "rank 0's time in state to run on by 1.5s",
        )
        assert "\x1b[?1049h" in term.screen  # drawn on the alternate screen
        term.type("\x03")
    finally:
        code = term.close()
    assert code == 0
    times = root_times(term.screen)
    assert times == sorted(times)


def test_status_watch_in_a_tbon_start_shell_redraws_over_broker_warnings() -> None:
    """The brokers of `tbon start` share the shell's terminal, and warn on it when a rank is lost
    (issue 13): the watch redraws its whole screen after them, so they do not stay on the view."""
    env = watch_env(SHELL="/bin/sh", PS1="tbon$ ")
    term = Terminal([TBON, "start", "--test-size=3"], env)
    try:
        term.expect(r"tbon\$ ")
        term.type("echo URI=$TBON_URI\n")
        uri = term.expect(r"URI=(local://\S+)").group(1)
        with Client(uri) as client:
            pid = client.rpc("status.get", nodeid=0)["ranks"][2]["pid"]
        term.type("tbon status --watch\n")
        term.expect(r"2 \S+: full")
        os.kill(pid, signal.SIGKILL)
        term.expect(r"2 \S+: lost")

        def redrawn_after_the_brokers(screen: str) -> bool:
            said = [m.end() for m in re.finditer(r"warning|killed by signal", screen)]
            home = screen.rfind(HOME)
            after = ANSI.sub("", screen[home:]) if home >= 0 else ""
            return (not said or home > said[-1]) and re.search(r"2 \S+: lost", after) is not None

        term.wait_until(redrawn_after_the_brokers, "a whole redraw after the brokers' warnings")
        mark = len(term.screen)
        term.type("\x03")
        term.wait_until(lambda screen: "tbon$ " in screen[mark:], "the prompt after Ctrl-C")
        assert re.search(r"2 \S+: lost", ANSI.sub("", term.screen[mark:]))  # the last view stays
        term.type("exit 0\n")
    finally:
        code = term.close()
    assert code == 0
    assert "Traceback" not in term.screen


@pytest.mark.parametrize(
    ("argv", "extra", "coloured"),
    [
        ([], {}, True),
        ([], {"NO_COLOR": "1"}, False),
        (["--color=never"], {}, False),
        (["--color=always"], {"NO_COLOR": "1"}, True),
    ],
)
def test_colour_on_a_terminal(
    instance, argv: list[str], extra: dict[str, str], coloured: bool
) -> None:
    inst = instance(2)
    term = Terminal([TBON, "status", inst.uri, *argv], watch_env(**extra))
    try:
        term.expect(r"1 \S+: full")
    finally:
        code = term.close()
    assert code == 0
    assert bool(COLOUR.search(term.screen)) is coloured, repr(term.screen)
