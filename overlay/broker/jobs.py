"""The processes `tbon exec` runs on this broker: their pipes, their input, their end.

Output is sent as soon as it is read, but only in whole lines (a line longer than a chunk is sent
in pieces), so that labels from many ranks never cut a line in two. It is read only while the
client's window has credit (overlay/services/flow.py): when the client stops reading, the job's
pipes fill and the job blocks on write, and nothing piles up here. Input is taken up to a window
too, and credited back as the job reads it. A job's exit is sent only after both its pipes are
drained, so it always comes last. Pipes are non-blocking and watched by the broker's poller: a
command that floods its output or ignores its input never stalls the broker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tbon.overlay.broker.program import program_environment
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.flow import (
    CHUNK,
    DEFAULT_WINDOW,
    MAX_WINDOW,
    MESSAGE_COST,
    MIN_WINDOW,
    STDIN_WINDOW,
    Window,
)
from tbon.overlay.wire.message import Message

log = logging.getLogger("tbon.exec")

F_SETPIPE_SZ = 1031  # Linux fcntl: a pipe's capacity


@functools.cache
def orphan_guard() -> tuple[str, ...]:
    """Jobs are started through util-linux's setpriv with a parent-death signal, so that even a
    broker killed outright (SIGKILL) takes its jobs with it. (preexec_fn could set it without a
    helper, but it is unsafe in a process that has threads, as ZeroMQ's.) Looked up at the first
    job, not at start-up."""
    import shutil

    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", "KILL", "--") if setpriv else ()


Watch = Callable[[int, bool, Callable[[], None]], None]  # fd, for writing?, on ready


@dataclass
class Job:
    id: str
    request: Message  # exec.start as it reached this broker: answers go back along its route
    process: subprocess.Popen[bytes]
    window: Window  # output credit: the client's window, both streams together
    streams: dict[int, str] = field(default_factory=dict)  # open output fd -> stdout/stderr
    partial: dict[str, bytes] = field(default_factory=dict)
    paused: bool = False  # output fds unwatched: the window is spent
    unmetered: bool = False  # its client has gone: read (and drop) freely so that it can end
    stdin: bytearray = field(default_factory=bytearray)
    stdin_eof: bool = False
    stdin_read: int = 0  # bytes the job took from its stdin since the last credit sent back
    status: int | None = None
    note: str = ""  # why the broker ended it, told to the client with its exit status

    @property
    def done(self) -> bool:
        return self.status is not None and not self.streams


def _os_text(value: object) -> bool:
    """A string the system takes as an argument or a path: no NUL byte, and nothing that has no
    bytes (surrogateescape's U+DC80-U+DCFF, standing for bytes that are not UTF-8, do)."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


class JobRunner:
    """The processes of `tbon exec` on this broker: the I/O edge of the exec service."""

    def __init__(
        self,
        rank: int,
        uri: str,
        watch: Watch,
        unwatch: Callable[[int], None],
        send: Callable[[Message], None],
    ) -> None:
        self.rank = rank
        self.uri = uri
        self.watch = watch
        self.unwatch = unwatch
        self.send = send
        self.jobs: dict[str, Job] = {}

    def start(self, request: Message) -> Message | None:
        """Start the command of an exec.start request; an error response if it cannot start."""
        payload = request.payload
        job_id, argv, cwd = payload.get("id"), payload.get("argv"), payload.get("cwd")
        if not isinstance(job_id, str) or not isinstance(argv, list) or not argv:
            return request.fail(errno.EINVAL, "exec.start needs id and argv")
        if not all(_os_text(word) for word in argv) or job_id in self.jobs:
            return request.fail(errno.EINVAL, "exec.start: bad argv or a duplicate id")
        if cwd is not None and not _os_text(cwd):
            return request.fail(errno.EINVAL, "exec.start: cwd must be a directory's path or null")
        window = payload.get("window", DEFAULT_WINDOW)
        if not is_int(window) or not MIN_WINDOW <= window <= MAX_WINDOW:
            why = f"exec.start: window must be a number of bytes from {MIN_WINDOW} to {MAX_WINDOW}"
            return request.fail(errno.EINVAL, why)
        if cwd is not None and not os.path.isdir(cwd):
            self._cannot_start(request, f"tbon exec: {cwd}: no such directory\n", 126)
            return None
        env = program_environment(self.uri, self.rank)
        try:
            import shutil

            if os.sep not in argv[0] and shutil.which(argv[0], path=env.get("PATH")) is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
            # A path is checked here too: setpriv would fail on it in words of its own.
            program = os.path.join(cwd or "", argv[0])
            if os.sep in argv[0] and not os.path.exists(program):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
            if os.sep in argv[0] and (os.path.isdir(program) or not os.access(program, os.X_OK)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv[0])
            process = subprocess.Popen(
                [*orphan_guard(), *argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            code = 127 if isinstance(error, FileNotFoundError) else 126
            where = f" in {cwd}" if cwd is not None else ""
            self._cannot_start(request, f"tbon exec: {argv[0]}{where}: {error.strerror}\n", code)
            return None
        job = Job(job_id, request, process, Window.full(window))
        self.jobs[job_id] = job
        for pipe, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            with contextlib.suppress(OSError):  # a bigger pipe: fewer, larger messages
                fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)
            job.streams[fd] = name
            job.partial[name] = b""
        self._watch_output(job)
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)
        return None

    def _cannot_start(self, request: Message, why: str, code: int) -> None:
        """What a shell would say on stderr, then the exit status it would give."""
        said = request.respond({"rank": self.rank, "stream": "stderr"}, streaming=True)
        said.data = why.encode("utf-8", "surrogateescape")
        self.send(said)
        self.send(request.respond({"rank": self.rank, "exit": code}, streaming=True))

    # --- output, within the client's window ------------------------------------------------

    def _watch_output(self, job: Job) -> None:
        job.paused = False
        for fd in job.streams:
            self.watch(fd, False, lambda fd=fd, job=job: self._readable(job, fd))

    def _pause(self, job: Job) -> None:
        """The window is spent: stop reading, so the job's pipes fill and it blocks."""
        job.paused = True
        for fd in job.streams:
            self.unwatch(fd)

    def _readable(self, job: Job, fd: int) -> None:
        name = job.streams[fd]
        if not job.window.open and not job.unmetered:
            self._pause(job)
            return
        want = CHUNK if job.unmetered else min(CHUNK, job.window.credit)
        try:
            data = os.read(fd, want)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._emit(job, name, job.partial[name], final=True)
            self.unwatch(fd)
            del job.streams[fd]
            self._maybe_finish(job)
            return
        self._emit(job, name, job.partial[name] + data, final=False)
        if not job.window.open and not job.unmetered:
            self._pause(job)

    def _emit(self, job: Job, name: str, pending: bytes, final: bool) -> None:
        """Send the whole lines of `pending` (all of it if `final`); keep the rest for later.

        Credit is spent on what is sent, not on what is read: a window is spent only by bytes in
        flight, which the client will give back, so a line held here (less than a chunk) can
        never stall the stream. It may overdraw the window by one message, never more."""
        cut = len(pending) if final else pending.rfind(b"\n") + 1
        if not final and cut == 0 and len(pending) >= CHUNK:
            cut = len(pending)  # a line too long to hold back
        if cut:
            message = job.request.respond({"rank": self.rank, "stream": name}, streaming=True)
            message.data = pending[:cut]
            job.window.spend(cut + MESSAGE_COST)
            self.send(message)
        job.partial[name] = pending[cut:]

    def grant(self, job_id: str, amount: int) -> None:
        """Credit the client gave back: read again if the window had been spent."""
        job = self.jobs.get(job_id)
        if job is not None and job.window.grant(amount) and job.paused:
            self._watch_output(job)

    # --- input, within its own window ------------------------------------------------------

    def write_stdin(self, job_id: str, data: bytes, eof: bool) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.process.stdin is None:
            return
        if job.stdin_eof:
            if data:  # closed: whatever comes is dropped, and the client told again
                self._stdin_closed(job)
            return
        room = STDIN_WINDOW - len(job.stdin)
        if len(data) > room:
            log.warning(
                "exec %s: the client sent %d bytes of stdin beyond its window: dropped",
                job.id,
                len(data) - room,
            )
            data = data[:room]
        job.stdin += data
        job.stdin_eof = eof
        self._flush_stdin(job)

    def _flush_stdin(self, job: Job) -> None:
        pipe = job.process.stdin
        if pipe is None or pipe.closed:
            return
        fd = pipe.fileno()
        try:
            while job.stdin:
                written = os.write(fd, job.stdin[:CHUNK])
                del job.stdin[:written]
                job.stdin_read += written
        except BlockingIOError:
            self._credit_stdin(job)
            self.watch(fd, True, lambda: self._writable(job))
            return
        except OSError:  # the command closed its input: drop what it will never read
            job.stdin.clear()
            job.stdin_eof = True
            self._stdin_closed(job)
        else:
            self._credit_stdin(job, drained=True)
        if job.stdin_eof:
            pipe.close()

    def _credit_stdin(self, job: Job, drained: bool = False) -> None:
        """Tell the client what the job has read: in quarter windows, and whenever the job has
        read everything it was given, so that the client never waits on a small remainder."""
        if job.stdin_read and (drained or job.stdin_read * 4 >= STDIN_WINDOW):
            said = {"rank": self.rank, "stdin": job.stdin_read}
            self.send(job.request.respond(said, streaming=True))
            job.stdin_read = 0

    def _stdin_closed(self, job: Job) -> None:
        said = {"rank": self.rank, "stdin_closed": True}
        self.send(job.request.respond(said, streaming=True))

    def _writable(self, job: Job) -> None:
        pipe = job.process.stdin
        if pipe is not None and not pipe.closed:
            self.unwatch(pipe.fileno())
        self._flush_stdin(job)

    def send_signal(self, job_id: str, signum: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.status is None:
            with contextlib.suppress(ProcessLookupError):  # the whole session: a shell's kids too
                os.killpg(job.process.pid, signum)

    def reap(self) -> None:
        """After SIGCHLD: note every job whose process ended."""
        for job in list(self.jobs.values()):
            if job.status is None and job.process.poll() is not None:
                code = job.process.returncode
                job.status = 128 - code if code < 0 else code
                self._maybe_finish(job)

    def _maybe_finish(self, job: Job) -> None:
        if not job.done:
            return
        pipe = job.process.stdin
        if pipe is not None and not pipe.closed:
            self.unwatch(pipe.fileno())
            pipe.close()
        del self.jobs[job.id]
        answer: dict[str, Any] = {"rank": self.rank, "exit": job.status}
        if job.note:
            answer["note"] = job.note
        self.send(job.request.respond(answer, streaming=True))

    def kill_from(self, route: tuple[str, ...]) -> None:
        """Kill the jobs whose answers travel along `route`: their client has gone."""
        for job in list(self.jobs.values()):
            if tuple(job.request.route) == route:
                log.info("exec %s: its client went away, killing it", job.id)
                self.send_signal(job.id, signal.SIGKILL)
                job.unmetered = True  # no credit will come: drain the pipes so that it ends
                if job.paused:
                    self._watch_output(job)

    def busy(self) -> bool:
        return bool(self.jobs)

    def kill_all(self, signum: int = signal.SIGKILL, note: str = "") -> None:
        for job_id, job in list(self.jobs.items()):
            if note and job.status is None:
                job.note = note
            self.send_signal(job_id, signum)

    def wait_all(self) -> None:
        """Reap every job's process (after kill_all), so that none is left a zombie."""
        for job in self.jobs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.process.wait(timeout=2)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"id": j.id, "pid": j.process.pid, "argv": j.process.args} for j in self.jobs.values()
        ]
