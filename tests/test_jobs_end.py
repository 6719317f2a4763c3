"""How the job runner sees a job end (overlay/broker/jobs.py): on a pidfd beside its pipes, with
no SIGCHLD, whichever comes first, its end or its pipes' ends; and, with no pidfd to be had, by
SIGCHLD, which it then asks to have caught. Real processes."""

from __future__ import annotations

import errno
import os
import time

import pytest
from test_jobs_resend import DEADLINE, Loop, exited

from tbon.overlay.wire.message import Kind, Message


def start(argv: list[str]) -> Message:
    payload = {"id": "j", "argv": argv, "cwd": None, "env": None, "eof": True}
    return Message(Kind.REQUEST, "exec.start", payload, tag=5, route=["l01"])


def without_sigchld(loop: Loop) -> None:
    """Run the loop's poll alone: what SIGCHLD would have the broker reap is never reaped."""
    deadline = time.monotonic() + DEADLINE
    while not exited(loop):
        assert time.monotonic() < deadline, f"timed out; sent: {loop.sent}"
        for key, _ in loop.selector.select(0.05):
            key.data()


def run(argv: list[str]) -> tuple[int, bytes]:
    """The job's exit status and its stdout, seen with no reap() by the loop."""
    loop = Loop()
    try:
        assert loop.runner.start(start(argv)) is None
        without_sigchld(loop)
        assert not loop.runner.jobs  # done: its pidfd closed and unwatched with it
        assert not loop.selector.get_map()
    finally:
        loop.close()
    out = b"".join(bytes(m.data) for m in loop.sent if m.payload.get("stream") == "stdout")
    return loop.sent[-1].payload["exit"], out


def test_a_job_ends_by_its_pidfd_whichever_comes_first() -> None:
    assert run(["true"]) == (0, b"")
    assert run(["sh", "-c", "echo out; exit 5"]) == (5, b"out\n")
    # its pipes end long before it does
    assert run(["sh", "-c", "exec >&- 2>&-; sleep 0.3; exit 3"]) == (3, b"")
    # it ends while what it started holds its pipes: its group is killed, then they end
    assert run(["sh", "-c", "(sleep 0.3; echo late) & exit 4"]) == (4, b"")


def test_without_a_pidfd_sigchld_is_asked_for_and_reaps(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    loop = Loop()
    asked: list[bool] = []
    loop.runner.catch_children = lambda: asked.append(True)
    try:
        assert loop.runner.start(start(["sh", "-c", "exec >&- 2>&-; sleep 0.2; exit 6"])) is None
        assert asked == [True]
        loop.run_until(lambda: exited(loop))  # with reap(), as on SIGCHLD
        assert loop.sent[-1].payload["exit"] == 6
    finally:
        loop.close()
