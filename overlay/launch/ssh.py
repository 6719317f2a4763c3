"""The near end of `tbon alloc --launcher ssh` (and `local`): start one broker per host, each
under `tbon relay --pmi` over its own ssh session, and serve their PMI-1 from here.

PMI traffic travels only inside those sessions (see pmi_shim.py), so no port is ever opened for
it. The launch is a pump: `step()` moves PMI lines between the sessions and the PMI server (a
sans-I/O state machine), passes the brokers' output on, and notes how each session ended. A
session that ends without its broker's exit status is a host that failed, named with ssh's own
last word.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tbon.overlay.connectors.ssh import remote_tbon, ssh_argv
from tbon.overlay.launch.pmi_server import PmiClientError, PmiServer
from tbon.overlay.wire.frames import FrameError, FrameReader, encode_frames, write_all


@dataclass
class Session:
    rank: int
    host: str
    process: subprocess.Popen[bytes]
    reader: FrameReader = field(default_factory=FrameReader)
    status: int | None = None  # the broker's exit status, once it told us
    ended: bool = False  # the session (ssh) is over
    said: list[str] = field(default_factory=list)  # its last lines on stderr

    @property
    def failure(self) -> str:
        if self.ended and self.status is None:
            return self.said[-1] if self.said else f"exit status {self.process.returncode}"
        return ""


class HostLaunch:
    """One broker per host of `hosts` (rank = position), over ssh, or here when `ssh` is False."""

    def __init__(
        self,
        hosts: list[str],
        broker_args: Callable[[int], list[str]],
        ssh: bool = True,
        output: Callable[[int, bytes], None] | None = None,
    ) -> None:
        self.hosts = hosts
        self.pmi = PmiServer(len(hosts), kvsname="tbon-alloc")
        self.selector = selectors.DefaultSelector()
        self.output = output or (lambda _rank, data: _write(sys.stdout.fileno(), data))
        self.sessions: list[Session] = []
        tbon = remote_tbon()
        for rank, host in enumerate(hosts):
            remote = [tbon, "relay", "--pmi", str(rank), str(len(hosts)), "--", tbon, "broker"]
            remote += broker_args(rank)
            argv = ssh_argv(host, "", None, remote) if ssh else remote
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            session = Session(rank, host, process)
            self.sessions.append(session)
            assert process.stdout is not None and process.stderr is not None
            self.selector.register(process.stdout, selectors.EVENT_READ, (session, "out"))
            self.selector.register(process.stderr, selectors.EVENT_READ, (session, "err"))

    @property
    def wired(self) -> int:
        """How many brokers are through their PMI wire-up."""
        return len(self.pmi.finalized)

    @property
    def running(self) -> bool:
        return any(not s.ended for s in self.sessions)

    def failed(self) -> list[Session]:
        return [s for s in self.sessions if s.failure]

    def step(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            session, stream = key.data
            data = os.read(key.fd, 65536)
            if not data:
                self.selector.unregister(key.fileobj)
                if not any(k.data[0] is session for k in self.selector.get_map().values()):
                    self._ended(session)
            elif stream == "err":
                self._stderr(session, data)
            else:
                self._frames(session, data)

    def _frames(self, session: Session, data: bytes) -> None:
        session.reader.feed(data)
        try:
            while (frames := session.reader.next()) is not None:
                kind = frames[0]
                if kind == b"pmi" and len(frames) == 2:
                    self._pmi(session.rank, frames[1])
                elif kind == b"out" and len(frames) == 2:
                    self.output(session.rank, frames[1])
                elif kind == b"exit" and len(frames) == 2 and frames[1].isdigit():
                    session.status = int(frames[1])
        except FrameError as error:
            session.said.append(f"garbled session ({error})")
            self._hang_up(session)

    def _pmi(self, rank: int, data: bytes) -> None:
        try:
            replies = self.pmi.receive(rank, data)
        except PmiClientError as error:
            self.sessions[rank].said.append(str(error))
            replies = error.replies
        self._deliver(replies)

    def _deliver(self, replies: list[tuple[int, bytes]]) -> None:
        for rank, line in replies:
            stdin = self.sessions[rank].process.stdin
            if stdin is None or stdin.closed:
                continue
            try:
                stdin.write(encode_frames([b"pmi", line]))
                stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def _stderr(self, session: Session, data: bytes) -> None:
        text = data.decode(errors="replace")
        session.said = (session.said + [line for line in text.splitlines() if line.strip()])[-5:]
        _write(sys.stderr.fileno(), data)

    def _ended(self, session: Session) -> None:
        session.process.wait()
        session.ended = True
        if session.status is None and session.rank not in self.pmi.finalized:
            self._deliver(self.pmi.disconnect(session.rank))

    def _hang_up(self, session: Session) -> None:
        stdin = session.process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()  # its relay terminates its broker

    def hang_up(self) -> None:
        """End every session: each relay terminates its broker when its stdin ends."""
        for session in self.sessions:
            self._hang_up(session)

    def kill(self) -> None:
        """Last resort, after hang_up and a grace period: end the ssh processes themselves."""
        for session in self.sessions:
            if session.process.poll() is None:
                session.process.kill()
            session.process.wait()
            session.ended = True
        self.selector.close()


def _write(fd: int, data: bytes) -> None:
    """Pass the brokers' output on; a reader that has gone takes nothing more."""
    with contextlib.suppress(BrokenPipeError):
        write_all(fd, data)
