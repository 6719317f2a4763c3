"""`--bg` for the commands that start an instance (`tbon start`, `tbon alloc`): the instance is
kept by a detached process, and the command returns once it is up, printing its URI.

The keeper is forked from the command, in a session of its own (no terminal signal reaches it),
with nothing of the caller's open: its standard input and output are /dev/null, so that
`uri=$(tbon start --bg ...)` returns, and its standard error, which the launcher and brokers
inherit, is a pipe that a thread of the keeper drains. Until the keeper announces the URI, what
arrives there is passed on to the command, which writes it to its own standard error (a broker
that fails to start is named, as in the foreground); after that, it is dropped (the brokers'
log stays readable with `tbon dmesg`). The command shows a spinner while it waits, on a terminal
only, and returns the keeper's status if the keeper ends without a URI.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext

from tbon.cli.common import interactive
from tbon.errors import TbonError

Announce = Callable[[str], None]


def detach(name: str, work: Callable[[Announce], int], progress: str) -> int:
    """Run `work(announce)` in a detached keeper; print the URI it announces and return 0, or
    return the keeper's exit status if it ends without one. `name` is the command, for the
    keeper's own error lines (`tbon NAME: ...`)."""
    uri_r, uri_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(uri_r)
        os.close(err_r)
        _keep(name, work, uri_w, err_w)
    os.close(uri_w)
    os.close(err_w)
    try:
        uri = _await(uri_r, err_r, progress)
    except KeyboardInterrupt:
        os.kill(pid, signal.SIGTERM)  # the keeper shuts its instance down, as on any SIGTERM
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(uri_r)
        os.close(err_r)
    if uri is not None:
        print(uri, flush=True)
        return 0
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1


def _await(uri_r: int, err_r: int, progress: str) -> str | None:
    """The URI the keeper announces, passing on its standard error meanwhile; None if it ended
    without one."""
    from rich.console import Console

    text = b""
    with (
        Console(stderr=True).status(progress) if interactive() else nullcontext(),
        selectors.DefaultSelector() as selector,
    ):
        selector.register(uri_r, selectors.EVENT_READ)
        selector.register(err_r, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                elif key.fd == err_r:
                    sys.stderr.write(data.decode(errors="replace"))  # under a spinner, too
                    sys.stderr.flush()
                else:
                    text += data
                    if text.endswith(b"\n"):
                        return text.decode().strip()
    return None


class _Drain(threading.Thread):
    """Reads the keeper's standard error, passes it on to the command until the URI is
    announced (or the command is gone), and drops it after."""

    def __init__(self, source: int, sink: int) -> None:
        super().__init__(daemon=True)
        self.source, self.sink = source, sink
        self.lock = threading.Lock()

    def run(self) -> None:
        while data := os.read(self.source, 65536):
            with self.lock:
                if self.sink < 0:
                    continue
                try:
                    os.write(self.sink, data)
                except OSError:  # the command was interrupted: nobody reads any more
                    self._close_sink()
        os.close(self.source)

    def stop_passing_on(self) -> None:
        with self.lock:
            self._close_sink()

    def _close_sink(self) -> None:
        if self.sink >= 0:
            os.close(self.sink)
            self.sink = -1


def _keep(name: str, work: Callable[[Announce], int], uri_w: int, err_w: int) -> None:
    """The keeper: never returns into the command."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        source, stderr = os.pipe()
        for fd, to in ((0, null), (1, null), (2, stderr)):
            os.dup2(to, fd)
        os.close(stderr)
        drain = _Drain(source, err_w)
        drain.start()

        def announce(uri: str) -> None:
            os.write(uri_w, f"{uri}\n".encode())
            os.close(uri_w)
            drain.stop_passing_on()

        try:
            code = work(announce)
        except TbonError as error:
            sys.stderr.write(f"tbon {name}: {error}\n")
            code = error.exit_code
        except BaseException as error:
            sys.stderr.write(f"tbon {name}: internal error: {error!r}\n")
        sys.stdout.flush()
        sys.stderr.flush()
        # The drain ends once every process that holds the pipe (launcher, brokers) is gone;
        # one that some stray process still holds is not waited for long.
        os.dup2(null, 2)
        drain.join(timeout=5.0)
    finally:
        os._exit(code)
