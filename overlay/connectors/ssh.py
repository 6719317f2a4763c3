"""Reaching an instance on another host: `ssh://[user@]host[:port]/PATH` runs `tbon relay PATH`
on that host over ssh and speaks framed messages (frames.py) through the session.

`$TBON_SSH` replaces the ssh command (e.g. `ssh -p 2222 -o StrictHostKeyChecking=no`). The
remote `tbon` is this one's path (a shared file system, as on a cluster) unless
`$TBON_REMOTE_TBON` names another.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import os
import selectors
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tbon.errors import TbonError
from tbon.overlay.connectors.uri import Uri
from tbon.overlay.wire.frames import FrameError, FrameReader, encode_frames
from tbon.overlay.wire.message import Buffer, Message, decode_sized


def ssh_command() -> list[str]:
    return shlex.split(os.environ.get("TBON_SSH") or "ssh")


def tbon_script() -> str | None:
    """The console script next to this interpreter, if there is one: started by its path,
    brokers show as `tbon broker` to ps and pgrep, and other hosts find the same one."""
    script = Path(sys.executable).parent / "tbon"
    return str(script) if script.exists() else None


def remote_tbon() -> str:
    """The tbon to run on other hosts: $TBON_REMOTE_TBON, else this very script."""
    return os.environ.get("TBON_REMOTE_TBON") or tbon_script() or "tbon"


def endpoint_on(host: str, attributes: list[str]) -> list[str]:
    """The tbon.endpoint for a broker started on `host` through ssh: when the host is given as
    an address, bind there, so that its children reach it as this command does; otherwise (or
    when the user chose) the broker's own default (tcp://%h:*) stands."""
    if any(attribute.startswith("tbon.endpoint=") for attribute in attributes):
        return []
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return []
    return [f"tbon.endpoint=tcp://{host}:*"]


def ssh_argv(host: str, user: str, port: int | None, remote: list[str]) -> list[str]:
    """ssh to `host` running `remote` (quoted for the remote shell), never asking a question."""
    argv = [*ssh_command(), "-T", "-o", "BatchMode=yes"]
    if port:
        argv += ["-p", str(port)]
    argv += [f"{user}@{host}" if user else host, "--", " ".join(map(shlex.quote, remote))]
    return argv


class SshTransport:
    def __init__(self, uri: Uri) -> None:
        self.uri = uri
        argv = ssh_argv(uri.host, uri.user, uri.port, [remote_tbon(), "relay", uri.path])
        try:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as error:
            raise TbonError(f"cannot connect to {uri}: {argv[0]}: {error.strerror}") from None
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._reader = FrameReader()
        self._ready: collections.deque[list[bytes]] = collections.deque()

    def send(self, frames: list[Buffer]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(encode_frames(frames))
            stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self._failure() from None

    def poll(self, timeout_ms: int | None) -> bool:
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while not self._ready:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._selector.select(left):
                return False
            assert self.process.stdout is not None
            data = os.read(self.process.stdout.fileno(), 65536)
            if not data:
                raise self._failure()
            self._reader.feed(data)
            try:
                self._ready.extend(self._reader.drain())
            except FrameError as error:
                raise TbonError(f"{self.uri}: garbled answer from the relay ({error})") from None
        return True

    def wait(self, fds: list[int], timeout_ms: int | None) -> tuple[bool, list[int]]:
        if self._ready or not fds:
            return self.poll(timeout_ms), []
        assert self.process.stdout is not None
        pipe = self.process.stdout.fileno()
        with selectors.PollSelector() as selector:  # poll(2): regular files too
            selector.register(pipe, selectors.EVENT_READ)
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            ready = {
                key.fd
                for key, _ in selector.select(None if timeout_ms is None else timeout_ms / 1000)
            }
        return (pipe in ready and self.poll(0)), [fd for fd in fds if fd in ready]

    def recv(self) -> tuple[int, Message | None]:
        return decode_sized(self._ready.popleft())

    def close(self) -> None:
        self._selector.close()
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()  # the relay ends when its stdin does
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def _failure(self) -> TbonError:
        """Why the session ended: ssh's or the relay's last word."""
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        said = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
        lines = [line.strip() for line in said.splitlines() if line.strip()]
        why = lines[-1] if lines else f"ssh exited with status {self.process.returncode}"
        if why.startswith("tbon relay: "):
            why = why[len("tbon relay: ") :]
        return TbonError(f"cannot reach {self.uri}: {why}")
