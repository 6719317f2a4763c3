"""The processes `tbon exec` runs on this broker: their pipes, their input, their end.

Output is sent as soon as it is read, but only in whole lines (a line longer than CHUNK is sent in
pieces), so that labels from many ranks never cut a line in two. A job's exit is sent only after
both its pipes are drained, so it always comes last. Pipes are non-blocking and watched by the
broker's poller: a command that floods its output or ignores its input never stalls the broker.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tbon.overlay.broker.program import program_environment
from tbon.overlay.wire.message import Message

log = logging.getLogger("tbon.exec")

CHUNK = 64 * 1024


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
    streams: dict[int, str] = field(default_factory=dict)  # open output fd -> stdout/stderr
    partial: dict[str, bytes] = field(default_factory=dict)
    stdin: bytearray = field(default_factory=bytearray)
    stdin_eof: bool = False
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
        if cwd is not None and not os.path.isdir(cwd):
            self.send(
                request.respond(
                    {
                        "rank": self.rank,
                        "stream": "stderr",
                        "data": f"tbon exec: {cwd}: no such directory\n",
                    },
                    streaming=True,
                )
            )
            self.send(request.respond({"rank": self.rank, "exit": 126}, streaming=True))
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
            self.send(
                request.respond(
                    {
                        "rank": self.rank,
                        "stream": "stderr",
                        "data": f"tbon exec: {argv[0]}{where}: {error.strerror}\n",
                    },
                    streaming=True,
                )
            )
            self.send(request.respond({"rank": self.rank, "exit": code}, streaming=True))
            return None
        job = Job(job_id, request, process)
        self.jobs[job_id] = job
        for pipe, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            job.streams[fd] = name
            job.partial[name] = b""
            self.watch(fd, False, lambda fd=fd, job=job: self._readable(job, fd))
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)
        return None

    def _readable(self, job: Job, fd: int) -> None:
        name = job.streams[fd]
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._emit(job, name, job.partial[name] + data, final=False)
            return
        self._emit(job, name, job.partial[name], final=True)
        self.unwatch(fd)
        del job.streams[fd]
        self._maybe_finish(job)

    def _emit(self, job: Job, name: str, pending: bytes, final: bool) -> None:
        """Send the whole lines of `pending` (all of it at EOF); keep the rest for later."""
        cut = len(pending) if final else pending.rfind(b"\n") + 1
        if not final and cut == 0 and len(pending) >= CHUNK:
            cut = len(pending)  # a line too long to hold back
        if cut:
            text = pending[:cut].decode("utf-8", "surrogateescape")
            self.send(
                job.request.respond(
                    {"rank": self.rank, "stream": name, "data": text}, streaming=True
                )
            )
        job.partial[name] = pending[cut:]

    def write_stdin(self, job_id: str, data: str, eof: bool) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.stdin_eof or job.process.stdin is None:
            return
        job.stdin += data.encode("utf-8", "surrogateescape")
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
        except BlockingIOError:
            self.watch(fd, True, lambda: self._writable(job))
            return
        except OSError:  # the command closed its input: drop what it will never read
            job.stdin.clear()
            job.stdin_eof = True
        if job.stdin_eof:
            pipe.close()

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
