"""Rank 0's initial program: started once every launched rank is online; its exit status is the
instance's, and its exit shuts the instance down."""

from __future__ import annotations

import logging
import os
import subprocess

log = logging.getLogger("tbon.broker")

PMI_VARIABLES = ("PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID")
"""What a PMI launcher gave this broker, and no program of the instance should inherit."""


def program_environment(uri: str, rank: int) -> dict[str, str]:
    env = {**os.environ, "TBON_URI": uri, "TBON_RANK": str(rank)}
    for name in PMI_VARIABLES:
        env.pop(name, None)
    return env


class InitialProgram:
    def __init__(self, command: list[str], uri: str, rank: int) -> None:
        self.command = command
        self.uri = uri
        self.rank = rank
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pending(self) -> bool:
        """There is a program, and it has not been started yet."""
        return bool(self.command) and self.process is None

    def start(self) -> int | None:
        """Start it; None, or the exit status that says it could not start (127, 126)."""
        log.info("instance up: running %s", self.command)
        try:
            self.process = subprocess.Popen(
                self.command, env=program_environment(self.uri, self.rank)
            )
        except OSError as error:
            log.error("cannot run %s: %s", self.command[0], error.strerror)
            return 127 if isinstance(error, FileNotFoundError) else 126
        return None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_status(self) -> int | None:
        """Its exit status as a shell reports it (128+N for signal N), once it has ended."""
        if self.process is None or self.process.poll() is None:
            return None
        code = self.process.returncode
        return 128 - code if code < 0 else code

    def terminate(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.terminate()

    def kill(self) -> None:
        if self.running():
            assert self.process is not None
            log.warning("shutdown: killing the initial program (pid %d)", self.process.pid)
            self.process.kill()
            self.process.wait()

    def wait(self, timeout: float) -> None:
        """At the very end: give it `timeout` to finish, then kill it."""
        if not self.running():
            return
        assert self.process is not None
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
