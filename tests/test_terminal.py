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

from conftest import DEADLINE, TBON, child_env

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor movement


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
