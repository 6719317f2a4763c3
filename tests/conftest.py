"""Real instances for tests: started with the real `tbon` script, always reaped.

Every helper waits on a condition with a deadline (pushed status updates, process exits); none
sleeps and hopes. Teardown kills, by PID, anything an instance left behind, and fails the test.
"""

from __future__ import annotations

import errno
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from tbon.overlay.connectors.client import Client

TBON = str(Path(sys.executable).parent / "tbon")
DEADLINE = 20.0  # generous: the machine is shared and noisy

# A run started in the background (nohup, or `&` in a shell without job control) inherits
# SIGINT ignored, and so would every command it starts, which Python then leaves ignored: the
# tests that end a command with Ctrl-C would wait for it in vain. A handler of our own is reset
# to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def tbon(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60.0, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real console script and capture what a user would see."""
    return subprocess.run(
        [TBON, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env() if env is None else env,
        input=input,
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for files that must name one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_gone(pid: int) -> bool:
    """True once `pid` has exited and been reaped (or is a zombie nobody will run again)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it went while we read
        return True


HEAL_QUICK = ("tbon.heartbeat=100ms", "tbon.torpid=0", "tbon.timeout=1500ms")
"""Liveness settings short enough for a stopped broker to be judged within a healing test."""


def pids(status: dict[str, Any]) -> dict[int, int]:
    """Each rank's broker pid, as status shows it (ranks with none left out)."""
    return {r["rank"]: r["pid"] for r in status["ranks"] if r["pid"]}


def attached(status: dict[str, Any], *ranks: int) -> list[Any]:
    """The broker each rank is attached to now (None: reattaching)."""
    return [status["ranks"][rank].get("attached_to") for rank in ranks]


def launcher_said(log: str, rank: int, pid: int, how: str) -> bool:
    """Whether `tbon start` reported that broker's end (`how`: "exited with status 75", "killed
    by signal SIGKILL"), alone (`rank 3 (pid 812) ...`) or with others that ended the same way
    (`ranks 1,3 (pids 811,812) ...`, pids in rank order)."""
    if f"rank {rank} (pid {pid}) {how}" in log:
        return True
    for ranks, pids in re.findall(r"ranks (\S+) \(pids ([\d,]+)\) " + re.escape(how), log):
        listed = [int(p) for p in pids.split(",")]
        if pid in listed and rank in _idset(ranks):
            return True
    return False


def _idset(text: str) -> set[int]:
    ranks: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranks.update(range(int(low), int(high or low) + 1))
    return ranks


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    """Wait for a condition that only the passage of events can make true (process exits)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Instance:
    """`tbon start --test-size=N` in wait mode: it prints the URI and runs until SIGTERM."""

    def __init__(
        self, size: int, *attributes: str, exit_timeout: str = "5s", nofile: int | None = None
    ) -> None:
        """`nofile`: the RLIMIT_NOFILE (soft and hard) of `tbon start`, and so of its brokers."""
        self.size = size
        # Lives as long as the instance: closed in stop().
        self.stderr_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        argv = [TBON, "start", f"--test-size={size}", f"--test-exit-timeout={exit_timeout}"]
        for attribute in attributes:
            argv += ["-S", attribute]
        if nofile is not None:
            argv = ["prlimit", f"--nofile={nofile}:{nofile}", "--", *argv]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self.stderr_file, text=True, env=child_env()
        )
        self.broker_pids: set[int] = set()
        self.joiners: list[subprocess.Popen[str]] = []
        try:
            self.uri = self._read_uri()
            self.broker_pids = {r["pid"] for r in self.status()["ranks"] if r["pid"]}
        except BaseException:
            self.stop()
            raise

    def _read_uri(self) -> str:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(DEADLINE):
                raise AssertionError(f"no URI from tbon start within {DEADLINE}s: {self.stderr()}")
        line = self.process.stdout.readline().strip()
        if not line.startswith("local://"):
            raise AssertionError(f"tbon start printed {line!r}; stderr: {self.stderr()}")
        return line

    def client(self) -> Client:
        return Client(self.uri)

    def status(self) -> dict[str, Any]:
        """Rank 0's table: whole, or past WHOLE_TABLE_MAX ranks (EFBIG) as its held view, the
        spares made up as read (heldtable.py)."""
        from tbon.cli.common import read_held
        from tbon.overlay.connectors.client import RequestError

        with self.client() as client:
            try:
                return client.rpc("status.get", nodeid=0)
            except RequestError as error:
                if error.errnum != errno.EFBIG:
                    raise
                return read_held(client)

    def pid(self, rank: int) -> int:
        pid = self.status()["ranks"][rank]["pid"]
        assert pid, f"rank {rank} has no broker"
        return pid

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = DEADLINE
    ) -> dict[str, Any]:
        """The first pushed status that satisfies `predicate` (rank 0 pushes every change)."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        from tbon.overlay.state.heldtable import HeldPages, whole

        pages = HeldPages()  # the held view comes in pages past thousands of ranks held
        with self.client() as client:
            tag = client.send("status.watch", {}, nodeid=0)
            while time.monotonic() < deadline:
                reply = client.receive(deadline - time.monotonic())
                if reply is None:
                    break
                if reply.tag != tag:
                    continue
                if reply.errnum == errno.EFBIG:  # too many ranks to send whole: the held view
                    tag = client.send("status.watch", {"view": "held"}, nodeid=0)
                    continue
                assert not reply.errnum, reply.errstr
                view = pages.take(reply.payload) if "launched" in reply.payload else None
                if view is None and "launched" in reply.payload:
                    continue  # more pages of this table to come
                last = view if view is not None else whole(reply.payload)
                if predicate(last):
                    return last
        tail = "\n  ".join(self.stderr().splitlines()[-40:])  # enough to tell a race apart
        shown = json.dumps(last, default=lambda ranks: f"<{len(ranks)} ranks>")
        raise AssertionError(
            f"timed out waiting for {what}; last status: {shown}; tbon start "
            f"{'running' if self.process.poll() is None else 'exited'}; its stderr ends:\n  {tail}"
        )

    def join(
        self, *attributes: str, boot: list[str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[str]:
        """Start `tbon broker` that joins this instance by FLUB (reaped by stop()): through
        its URI, or the boot servers `boot` in that order; its stderr piped, or in the file
        `log` for a test to read while it runs."""
        argv = [
            TBON,
            "broker",
            "-S",
            f"broker.boot-server={','.join(boot or [self.uri])}",
            "-S",
            "tbon.endpoint=tcp://127.0.0.1:*",
        ]
        for attribute in attributes:
            argv += ["-S", attribute]
        with open(log, "w") if log is not None else nullcontext() as stderr:
            joiner = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE if stderr is None else stderr,
                text=True,
                env=child_env(),
            )
        self.joiners.append(joiner)
        return joiner

    def rank_state(self, status: dict[str, Any], rank: int) -> str:
        return status["ranks"][rank]["state"]

    def stderr(self) -> str:
        """What tbon start and its brokers wrote to stderr (all of it, once stopped)."""
        if self.stderr_file.closed:
            return self._stderr_text
        self.stderr_file.seek(0)
        return self.stderr_file.read()

    def stop(self) -> int:
        """Shut down as a user would (SIGTERM), then make sure nothing is left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if not self.stderr_file.closed:
            self._stderr_text = self.stderr()
            self.stderr_file.close()
        for joiner in self.joiners:  # joined brokers leave with the instance
            try:
                joiner.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                joiner.kill()
                joiner.wait()
                raise AssertionError(f"joined broker {joiner.pid} outlived its instance") from None
            finally:
                if joiner.stderr is not None:
                    joiner.stderr.close()
        # A broker that joined by a test's `tbon expand` is no child of the launcher, which
        # therefore never waited for it: once its parent is gone it seeks another for its
        # reattach grace (docs/protocol.md §12.1), then leaves. Given a deadline, as joiners are.
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and not all(map(process_gone, self.broker_pids)):
            time.sleep(0.05)
        leaked = [pid for pid in self.broker_pids if not process_gone(pid)]
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not leaked, f"brokers left running after tbon start exited: {leaked}"
        crashed = [
            line
            for line in self._stderr_text.splitlines()
            if "internal error" in line
            or "Traceback" in line
            or re.search(r"request '.*' failed", line)
        ]
        if crashed:  # the traceback itself, to tell what failed from the report alone
            text = self._stderr_text
            start = text.find("Traceback")
            shown = text[start : start + 3000] if start >= 0 else "\n".join(crashed)
            raise AssertionError(f"a broker of this instance failed: {crashed}\n{shown}")
        return code


@pytest.fixture
def instance() -> Iterator[Callable[..., Instance]]:
    """A factory of instances, every one of them stopped and checked at teardown."""
    started: list[Instance] = []

    def start(size: int, *attributes: str, **options: Any) -> Instance:
        started.append(Instance(size, *attributes, **options))
        return started[-1]

    yield start
    for inst in started:
        inst.stop()


def start_exec(*args: str) -> subprocess.Popen[str]:
    """`tbon exec ARGS...` in the background, its output piped to the test (wait for it!)."""
    return start_tbon("exec", *args)


def start_tbon(*args: str) -> subprocess.Popen[str]:
    """`tbon ARGS...` in the background, its output piped to the test (wait for it!)."""
    return subprocess.Popen(
        [TBON, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a user whose shell has tbon on PATH and no instance around it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TBON_", "PMI_"))}
    env["PATH"] = os.pathsep.join([os.path.dirname(TBON), env.get("PATH", "")])
    env.update(extra)
    return env
