"""How a broker starts a `tbon exec` job: posix_spawn(3) rather than subprocess.Popen.

Every rank of an exec starts a job (1024 brokers at once for `tbon exec -r all true`), so what a
start costs the broker is paid once per rank. Popen's own Python (its environment encoded name
by name, a file object for each pipe, an error pipe read back after the exec) took a broker about
as much CPU as the rest of the job's start; posix_spawn does the same work in C (glibc's is a
vfork-like clone that reports a failed exec by its errno).

Python's posix_spawn (3.11) cannot change the job's directory, so the broker goes there itself
for the moment of the spawn and comes back: a broker runs Python in one thread, and ZeroMQ's
threads use no paths. A job's signals are at their default, but for those the broker was started
ignoring, as with Popen (`_defaulted`). A job inherits no descriptor but its three: Python and
ZeroMQ make theirs close-on-exec, and those a broker was started with are made so once (`seal`),
where Popen closed them in each job's child (close_fds).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterator, Mapping
from io import FileIO

PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)
"""Signals Python itself ignores: a job gets them as any program does, as Popen's
restore_signals gave them back (so that `yes | head` ends by SIGPIPE, not with an error)."""

REAP_POLL_S = 0.005
"""How often wait() with a timeout looks whether the job has ended (as Popen.wait does)."""


class Spawned:
    """A job's process, as much of Popen as the job runner uses: its PID, argv, its ends of the
    pipes (stdin None if the job reads /dev/null) and, once reaped, its return code (-N: killed
    by signal N)."""

    def __init__(
        self, pid: int, args: list[str], stdin: FileIO | None, stdout: FileIO, stderr: FileIO
    ) -> None:
        self.pid = pid
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Reap the process and return its code; TimeoutError if it outlives `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: nothing more is known
                self.returncode = 0
                break
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.pid} still runs")
            else:
                time.sleep(REAP_POLL_S)
        return self.returncode


def seal() -> None:
    """Make every descriptor above 2 this process has close-on-exec, so that no job inherits one
    (a broker's are so already, but not what its own launcher may have left open)."""
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2:
                with contextlib.suppress(OSError):
                    os.set_inheritable(fd, False)


def spawn(
    executable: str,
    argv: list[str],
    cwd: str | None,
    env: Mapping[str, str],
    stdin_devnull: bool,
) -> Spawned:
    """Start `executable` with `argv` and `env` in `cwd`, in a session of its own, its stdout and
    stderr on pipes and its stdin on a pipe or /dev/null. OSError if it cannot start (its
    filename is `cwd` if the directory is what failed)."""
    opened: list[int] = []
    try:
        out_r, out_w = _pipe(opened)
        err_r, err_w = _pipe(opened)
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        if stdin_devnull:
            actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
            in_w = None
        else:
            in_r, in_w = _pipe(opened)
            actions.append((os.POSIX_SPAWN_DUP2, in_r, 0))
        with _directory(cwd):
            pid = os.posix_spawn(
                executable, argv, env, file_actions=actions, setsid=True, setsigdef=_defaulted()
            )
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in (out_w, err_w) if in_w is None else (out_w, err_w, in_r):
        os.close(fd)
    stdin = None if in_w is None else FileIO(in_w, "wb")
    return Spawned(pid, argv, stdin, FileIO(out_r, "rb"), FileIO(err_r, "rb"))


@functools.cache
def _defaulted() -> tuple[int, ...]:
    """The signals a job starts with at their default: all but those the broker was started
    ignoring (inherited, as Popen let them be), and those Python ignores (PYTHON_IGNORES) however
    the broker was started. Asked once: a broker's dispositions are set as it starts (signals.py).
    glibc's own two (32 and 33) are not Python's to name: glibc leaves them ignored in the job."""
    return tuple(
        signum
        for signum in sorted(signal.valid_signals())
        if signum not in (signal.SIGKILL, signal.SIGSTOP)
        and (signum in PYTHON_IGNORES or signal.getsignal(signum) is not signal.SIG_IGN)
    )


def _pipe(opened: list[int]) -> tuple[int, int]:
    ends = os.pipe()  # close-on-exec: the child gets its copies by dup2 only
    opened.extend(ends)
    return ends


@contextlib.contextmanager
def _directory(cwd: str | None) -> Iterator[None]:
    """In `cwd` for the moment of a spawn, back where the broker was after it."""
    if cwd is None:
        yield
        return
    # O_PATH: a directory the broker may not read is one it may come back to
    here = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(cwd)
        try:
            yield
        finally:
            os.fchdir(here)
    finally:
        os.close(here)
