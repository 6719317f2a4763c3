"""The job runner's side of exactly-once output (overlay/broker/jobs.py, docs/protocol.md §7.1):
real commands, their answers numbered, kept until acknowledged, sent again on demand, and
forgotten once acknowledged or their client is gone."""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable

from tbon.overlay.broker.jobs import JobRunner
from tbon.overlay.wire.message import Kind, Message

DEADLINE = 20.0


class Loop:
    """The few things a broker's loop does for its job runner: poll the fds it watches, and
    reap after a child ends (polled here rather than on SIGCHLD)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.sent: list[Message] = []
        self.runner = JobRunner(3, "local:///nowhere", self.watch, self.unwatch, self.sent.append)

    def watch(self, fd: int, writing: bool, ready: Callable[[], None]) -> None:
        events = selectors.EVENT_WRITE if writing else selectors.EVENT_READ
        self.selector.register(fd, events, ready)

    def unwatch(self, fd: int) -> None:
        self.selector.unregister(fd)

    def run_until(self, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE
        while not done():
            assert time.monotonic() < deadline, f"timed out; sent: {self.sent}"
            for key, _ in self.selector.select(0.05):
                key.data()
            self.runner.reap()

    def close(self) -> None:
        self.runner.kill_all()
        self.runner.wait_all()
        self.runner.close()
        self.selector.close()


def start(job_id: str, argv: list[str], acks: bool = True, route: list[str] | None = None):
    payload = {"id": job_id, "argv": argv, "cwd": None, "env": None, "eof": True, "acks": acks}
    return Message(Kind.REQUEST, "exec.start", payload, tag=5, route=route or ["l01", "p0"])


def exited(loop: Loop) -> bool:
    return any("exit" in m.payload for m in loop.sent)


def test_answers_are_numbered_kept_until_acknowledged_and_sent_again() -> None:
    loop = Loop()
    try:
        loop.runner.start(start("j", ["sh", "-c", "echo one; echo two >&2; echo three"]))
        loop.run_until(lambda: exited(loop))
        first = [(m.payload["seq"], m.payload.get("stream"), m.data) for m in loop.sent]
        assert [seq for seq, _, _ in first] == list(range(len(first)))
        assert "exit" in loop.sent[-1].payload  # last
        assert "j" in loop.runner.tails and "j" not in loop.runner.jobs

        loop.sent.clear()
        loop.runner.resend()  # the way up changed: everything, as first sent, in order
        again = [(m.payload["seq"], m.payload.get("stream"), m.data) for m in loop.sent]
        assert again == first
        assert all(m.streaming and m.route == ["l01", "p0"] and m.tag == 5 for m in loop.sent)

        loop.sent.clear()
        loop.runner.acknowledge("j", 2)
        loop.runner.resend("j", 0)  # the client asks: only what it has not acknowledged
        assert [m.payload["seq"] for m in loop.sent] == [seq for seq, _, _ in first[2:]]

        loop.runner.acknowledge("j", len(first))  # the exit taken: nothing left to keep
        assert "j" not in loop.runner.tails
    finally:
        loop.close()


def test_nothing_is_kept_for_a_client_that_does_not_acknowledge() -> None:
    loop = Loop()
    try:
        loop.runner.start(start("old", ["echo", "hi"], acks=False))
        loop.run_until(lambda: exited(loop))
        assert [m.payload["seq"] for m in loop.sent] == [0, 1]  # numbered all the same
        assert loop.runner.tails == {}
        loop.sent.clear()
        loop.runner.resend()
        assert loop.sent == []
    finally:
        loop.close()


def test_a_command_that_cannot_start_is_kept_too_and_a_local_client_is_not_resent_to() -> None:
    loop = Loop()
    try:
        loop.runner.start(start("bad", ["/nonexistent/command"], route=["l01"]))
        [answer] = loop.sent
        assert answer.payload["exit"] == 127 and answer.payload["seq"] == 0
        assert "bad" in loop.runner.tails
        loop.sent.clear()
        loop.runner.resend()  # the way up changed, but this client is the broker's own
        assert loop.sent == []
        loop.runner.resend("bad", 0)  # it asks, though: it gets it
        assert [m.payload["exit"] for m in loop.sent] == [127]
        loop.runner.kill_from(("l01",))  # its client went: forgotten
        assert loop.runner.tails == {}
    finally:
        loop.close()
