"""The processes `tbon exec` runs on this broker: their pipes, their input, their end.

Output is sent as soon as it is read, but only in whole lines (a line longer than a chunk is sent
in pieces), so that labels from many ranks never cut a line in two. It is read only while the
client's window has credit (overlay/wire/flow.py): when the client stops reading, the job's
pipes fill and the job blocks on write, and nothing piles up here. Input is taken up to a window
too, and credited back as the job reads it. A job's exit is sent only after both its pipes are
drained, so it always comes last. When the main process ends, its whole process group is
killed, and a job that was killed or abandoned reads what is left without credit, so that it is
done once the group is gone, whatever its window (overlay/state/joblife.py decides; this module
carries it out). Pipes are non-blocking and watched by the broker's poller: a command that
floods its output or ignores its input never stalls the broker.

A job's end is watched on a pidfd beside its pipes, not by SIGCHLD (signals.py): a command that
ends has closed its pipes first, so one turn of the loop sees both, and one whose pipes are at
their end is looked at then, so that a pidfd not yet readable costs no second turn. A job left
without a pidfd (an old kernel, no descriptor left) has SIGCHLD caught for it.

A command that cannot start is answered with its exit status (127, 126) and a `note` in a shell's
words. It is found in PATH and spawned at once (program.py's quick_launch); only if the exec
refuses it does launch check it (what a shell would say, or run instead: sh for a script without
#!), and an exec that fails all the same, a file removed meanwhile, is worded alike. Whatever
ends the broker, SIGKILL included, its jobs end with it: the orphan guard (guard.py) kills them.

A job whose client has no input for it (exec.start's `eof`) gets /dev/null as its stdin: no pipe,
and no exec.stdin to wait for.

Every answer of a job is numbered (`seq`). For a client that acknowledges (exec.start's `acks`),
each is kept until acknowledged (exec.credit's `seq`), a finished job's last ones too, and all
that is kept is sent again when the way up changes (`resend`: a heal above this broker) or the
client asks (overlay/wire/resend.py): so a link that dies mid-stream loses nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from tbon.overlay.broker.guard import OrphanGuard
from tbon.overlay.broker.program import Launch, launch, program_environment, quick_launch
from tbon.overlay.broker.spawn import Spawned, seal, spawn
from tbon.overlay.links.descriptors import OUT_OF_DESCRIPTORS, Reserve
from tbon.overlay.state.joblife import Finish, Instruction, JobLife, ReadFreely, SignalGroup
from tbon.overlay.wire.flow import CHUNK, DEFAULT_WINDOW, MESSAGE_COST, STDIN_WINDOW, Window
from tbon.overlay.wire.message import Buffer, Kind, Message
from tbon.overlay.wire.resend import Outbox
from tbon.record import Record

log = logging.getLogger("tbon.exec")

F_SETPIPE_SZ = 1031  # Linux fcntl: a pipe's capacity
JOB_DESCRIPTORS = 8  # lent from the reserve to start a job: three pipes, a pidfd and room


Watch = Callable[[int, bool, Callable[[], None]], None]  # fd, for writing?, on ready

Kept = tuple[dict[str, Any], Buffer | None]
"""An answer kept to send again: its payload (with its `seq`) and its data frame."""

TAIL_KEEP_S = 600.0
"""Seconds a finished job's unacknowledged answers are kept for a client that never says it has
them (it went away unnoticed): longer than any heal may take (tbon.timeout plus
broker.reattach-timeout)."""


class Tail(Record):
    """A finished job's answers that its client has not acknowledged yet: its exit at least.
    Not a dataclass, for start-up time (tbon/record.py); mutable, so not hashable."""

    __slots__ = __match_args__ = ("request", "outbox", "until")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, request: Message, outbox: Outbox[Kept], until: float) -> None:
        self.request, self.outbox, self.until = request, outbox, until


class Job(Record):
    """A job running here, until its exit is sent. Not a dataclass, for start-up time
    (tbon/record.py); mutable, so not hashable."""

    __slots__ = __match_args__ = (
        "id",
        "request",
        "process",
        "window",
        "streams",
        "partial",
        "paused",
        "life",
        "stdin",
        "stdin_eof",
        "stdin_read",
        "status",
        "signal",
        "note",
        "outbox",
        "pidfd",
        "grown",
    )
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        id: str,
        request: Message,
        process: Spawned,
        window: Window,
        streams: dict[int, str] | None = None,
        partial: dict[str, bytes] | None = None,
        paused: bool = False,
        life: JobLife | None = None,
        stdin: bytearray | None = None,
        stdin_eof: bool = False,
        stdin_read: int = 0,
        status: int | None = None,
        signal: int | None = None,
        note: str = "",
        outbox: Outbox[Kept] | None = None,
        pidfd: int | None = None,
        grown: set[int] | None = None,
    ) -> None:
        self.id = id
        self.request = request  # exec.start as it reached this broker: answers go back its route
        self.process = process
        self.window = window  # output credit: the client's window, both streams together
        self.streams: dict[int, str] = {} if streams is None else streams  # fd -> stdout/stderr
        self.partial: dict[str, bytes] = {} if partial is None else partial
        self.paused = paused  # output fds unwatched: the window is spent
        self.life = JobLife() if life is None else life
        self.stdin = bytearray() if stdin is None else stdin
        self.stdin_eof = stdin_eof
        self.stdin_read = stdin_read  # bytes the job took from its stdin since credit went back
        self.status = status
        self.signal = signal  # the signal that ended its main process, if one did
        self.note = note  # why the broker ended it, told to the client with its exit status
        # its answers, numbered and kept
        self.outbox: Outbox[Kept] = Outbox() if outbox is None else outbox
        self.pidfd = pidfd  # readable once its main process has ended, watched till reaped
        self.grown: set[int] = set() if grown is None else grown  # output fds enlarged (at first)

    @property
    def may_read(self) -> bool:
        """Whether its output may be read now: credit is left, or nobody will return any."""
        return self.life.may_read(self.window.open)

    @property
    def unmetered(self) -> bool:
        return self.life.may_read(False)


class JobRunner:
    """The processes of `tbon exec` on this broker: the I/O edge of the exec service."""

    def __init__(
        self,
        rank: int,
        uri: str,
        watch: Watch,
        unwatch: Callable[[int], None],
        send: Callable[[Message], object],  # what it returns is not looked at
        reserve: Reserve | None = None,  # descriptors lent to a job when none are left
        catch_children: Callable[[], None] = lambda: None,  # SIGCHLD wanted: a job has no pidfd
    ) -> None:
        self.rank = rank
        self.uri = uri
        self.watch = watch
        self.unwatch = unwatch
        self.send = send
        self.jobs: dict[str, Job] = {}
        self.tails: dict[str, Tail] = {}  # finished jobs' answers not yet acknowledged
        self.guard = OrphanGuard()
        self.reserve = reserve
        self.catch_children = catch_children
        self._sealed = False

    def start(self, request: Message) -> Message | None:
        """Start the command of an exec.start request (checked by the exec service); an error
        response if it cannot be taken at all. A command that cannot start is answered as one
        that ran and failed: its status and a note."""
        payload = request.payload
        job_id, argv, cwd = payload["id"], payload["argv"], payload.get("cwd")
        if job_id in self.jobs:
            return request.fail(errno.EINVAL, "exec.start: bad argv or a duplicate id")
        self._prune(time.monotonic())
        self.tails.pop(job_id, None)
        env = program_environment(self.uri, self.rank, payload.get("size"), payload.get("env"))
        plan = quick_launch(argv, cwd, env) or launch(argv, cwd, env)
        if plan.why:
            self._cannot_start(request, plan.why, plan.status)
            return None
        if not self._sealed:
            seal()  # once: no job inherits what this broker was started with
            self._sealed = True
        eof = bool(payload.get("eof"))
        try:
            process, pidfd = self._spawn(plan, cwd, env, eof)
        except OSError as error:
            # the exec refused it: what a shell would say, or run instead (launch's checks)
            checked = launch(argv, cwd, env)
            if checked.why:
                self._cannot_start(request, checked.why, checked.status)
                return None
            if (checked.executable, checked.argv) == (plan.executable, plan.argv):
                self._exec_failed(request, error, argv[0], cwd)
                return None
            try:
                process, pidfd = self._spawn(checked, cwd, env, eof)
            except OSError as failed:
                self._exec_failed(request, failed, argv[0], cwd)
                return None
        self.guard.watch(process.pid)
        window = payload.get("window", DEFAULT_WINDOW)
        outbox: Outbox[Kept] = Outbox(keep=bool(payload.get("acks")))
        job = Job(job_id, _anchor(request), process, Window.full(window), outbox=outbox)
        job.pidfd = pidfd
        self.jobs[job_id] = job
        for pipe, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            job.streams[fd] = name
            job.partial[name] = b""
        self._watch_output(job)
        if process.stdin is not None:
            os.set_blocking(process.stdin.fileno(), False)
        if pidfd is not None:  # after its pipes: their ends are read first in a turn
            self.watch(pidfd, False, functools.partial(self._reap_if_ended, job))
        else:
            self.catch_children()
            self._reap_if_ended(job)  # ended before SIGCHLD was caught: not told otherwise
        return None

    def _spawn(
        self, plan: Launch, cwd: str | None, env: dict[str, str], eof: bool
    ) -> tuple[Spawned, int | None]:
        """Start the job as `plan` says, with its pidfd (None if none could be had); OSError if
        it cannot start. With no descriptor left, what the reserve holds for it is lent
        (descriptors.py: what a flood cannot take)."""
        try:
            return _with_pidfd(spawn(plan.executable, plan.argv, cwd, env, eof))
        except OSError as error:
            if error.errno not in OUT_OF_DESCRIPTORS or self.reserve is None:
                raise
            with self.reserve.lending():
                self.reserve.release(JOB_DESCRIPTORS)
                return _with_pidfd(spawn(plan.executable, plan.argv, cwd, env, eof))

    def _exec_failed(self, request: Message, error: OSError, name: str, cwd: str | None) -> None:
        """An exec that failed after the checks passed (a file removed meanwhile, no
        descriptor left): said alike."""
        code = 127 if isinstance(error, FileNotFoundError) else 126
        what = cwd if cwd is not None and error.filename == cwd else name
        self._cannot_start(request, f"{what}: {error.strerror}", code)

    def _cannot_start(self, request: Message, why: str, code: int) -> None:
        """The exit status a shell would give, and what it would say, as the job's note."""
        outbox: Outbox[Kept] = Outbox(keep=bool(request.payload.get("acks")))
        anchor = _anchor(request)
        self._answer(anchor, outbox, {"rank": self.rank, "exit": code, "note": why})
        self._keep_tail(str(request.payload["id"]), anchor, outbox)

    # --- answers, numbered and kept until acknowledged -------------------------------------

    def _answer(
        self, anchor: Message, outbox: Outbox[Kept], said: dict[str, Any], data: Buffer = b""
    ) -> None:
        said["seq"] = outbox.number((said, data or None))
        message = anchor.respond(said, streaming=True)
        if data:
            message.data = data
        self.send(message)

    def _keep_tail(self, job_id: str, anchor: Message, outbox: Outbox[Kept]) -> None:
        if not outbox.settled:
            self.tails[job_id] = Tail(anchor, outbox, time.monotonic() + TAIL_KEEP_S)

    def _prune(self, now: float) -> None:
        for job_id in [j for j, tail in self.tails.items() if now >= tail.until]:
            del self.tails[job_id]

    def _streams(self) -> list[tuple[str, Message, Outbox[Kept]]]:
        running = [(j.id, j.request, j.outbox) for j in self.jobs.values()]
        return running + [(i, t.request, t.outbox) for i, t in self.tails.items()]

    def resend(self, job_id: str | None = None, start: int = 0) -> None:
        """Send again what the clients have not acknowledged: every job's (`job_id` None: the
        way up changed, and what crossed the old way may be lost), or one job's from `start`
        (its client found a hole there)."""
        sent = 0
        for ident, anchor, outbox in self._streams():
            if job_id is not None and ident != job_id:
                continue
            if job_id is None and not (anchor.route and anchor.route[-1].startswith("p")):
                continue  # its client is this broker's own: its way did not change
            for _seq, (said, data) in outbox.unacknowledged(start):
                message = anchor.respond(said, streaming=True)
                if data:
                    message.data = data
                self.send(message)
                sent += 1
        if sent:
            why = "its client asked" if job_id is not None else "the way up changed"
            log.info("exec: sent %d unacknowledged answer(s) again (%s)", sent, why)

    def started(self, job_id: str) -> Message | None:
        """What a job here (running, or finished with answers kept) keeps of its exec.start: its
        route says which client it is (exec service: only that client acts on it)."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job.request
        tail = self.tails.get(job_id)
        return None if tail is None else tail.request

    def acknowledge(self, job_id: str, upto: int) -> None:
        """The client has taken every answer of `job_id` numbered below `upto`."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.outbox.acknowledged(upto)
        elif (tail := self.tails.get(job_id)) is not None:
            tail.outbox.acknowledged(upto)
            if tail.outbox.settled:
                del self.tails[job_id]

    # --- output, within the client's window ------------------------------------------------

    def _watch_output(self, job: Job) -> None:
        job.paused = False
        for fd in job.streams:
            self.watch(fd, False, functools.partial(self._readable, job, fd))

    def _pause(self, job: Job) -> None:
        """The window is spent: stop reading, so the job's pipes fill and it blocks."""
        job.paused = True
        for fd in job.streams:
            self.unwatch(fd)

    def _readable(self, job: Job, fd: int) -> None:
        name = job.streams.get(fd)
        if name is None:  # its end was read already, with the other pipe's, in this turn
            return
        if not job.may_read:
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
            for pipe in (job.process.stdout, job.process.stderr):
                if not pipe.closed and pipe.fileno() == fd:
                    pipe.close()
            self._perform(job, job.life.stream_closed())
            if not job.streams:  # its end is likely here too: no turn more for its pidfd
                self._reap_if_ended(job)
            else:
                # the other pipe's end is likely here too (a command that ends closes both):
                # read at once, not by one more call from the loop (a read more, that finds
                # nothing, for a command that closed one of them early)
                for other in list(job.streams):
                    self._readable(job, other)
            return
        if fd not in job.grown:  # output comes: a bigger pipe, fewer and larger messages
            job.grown.add(fd)  # (not at the start: most jobs of `exec -r all` say nothing)
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)
        self._emit(job, name, job.partial[name] + data, final=False)
        if not job.may_read:
            self._pause(job)

    def _emit(self, job: Job, name: str, pending: bytes, final: bool) -> None:
        """Send the whole lines of `pending` (all of it if `final`); keep the rest for later.

        Credit is spent on what is sent, not on what is read: a window is spent only by bytes in
        flight, which the client will give back, so a line held here (less than a chunk) can
        never stall the stream. It may overdraw the window by one message, never more."""
        cut = len(pending) if final else pending.rfind(b"\n") + 1
        if not final and cut == 0 and len(pending) >= CHUNK:
            cut = len(pending)  # a line too long to hold back
        job.partial[name] = pending[cut:]
        data = pending[:cut]
        if data:
            self._send_output(job, name, data)

    def _send_output(self, job: Job, name: str, data: bytes) -> None:
        """One data message of `name`, paid for from the job's window."""
        job.window.spend(len(data) + MESSAGE_COST)
        self._answer(job.request, job.outbox, {"rank": self.rank, "stream": name}, data)

    def grant(self, job_id: str, amount: int) -> None:
        """Credit the client gave back: read again if the window had been spent."""
        job = self.jobs.get(job_id)
        if job is not None and job.window.grant(amount) and job.paused:
            self._watch_output(job)

    # --- input, within its own window ------------------------------------------------------

    def write_stdin(self, job_id: str, data: Buffer, eof: bool) -> None:
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
            self._answer(job.request, job.outbox, {"rank": self.rank, "stdin": job.stdin_read})
            job.stdin_read = 0

    def _stdin_closed(self, job: Job) -> None:
        self._answer(job.request, job.outbox, {"rank": self.rank, "stdin_closed": True})

    def _writable(self, job: Job) -> None:
        pipe = job.process.stdin
        if pipe is not None and not pipe.closed:
            self.unwatch(pipe.fileno())
        self._flush_stdin(job)

    def send_signal(self, job_id: str, signum: int, by_broker: bool = False) -> None:
        """exec.signal (or the broker itself ending the job: `by_broker`)."""
        job = self.jobs.get(job_id)
        if job is not None:
            self._perform(job, job.life.signalled(signum, by_broker))

    def reap(self) -> None:
        """After SIGCHLD: note every job whose process ended (_reap_if_ended)."""
        for job in list(self.jobs.values()):
            self._reap_if_ended(job)

    def _reap_if_ended(self, job: Job) -> None:
        """If the job's main process has ended: kill the rest of its group while the zombie
        still holds the group's ID, have the guard forget its PID then too, and reap it."""
        if job.status is not None or not _ended(job.process.pid):
            return
        then = job.life.exited()
        self._perform(job, [i for i in then if isinstance(i, SignalGroup)])
        self.guard.forget(job.process.pid)
        code = job.process.wait()
        job.status = 128 - code if code < 0 else code
        job.signal = -code if code < 0 else None
        self._drop_pidfd(job)
        self._perform(job, [i for i in then if not isinstance(i, SignalGroup)])

    def _drop_pidfd(self, job: Job) -> None:
        if job.pidfd is not None:
            self.unwatch(job.pidfd)
            os.close(job.pidfd)
            job.pidfd = None

    def _perform(self, job: Job, instructions: list[Instruction]) -> None:
        """Carry out what the job's life asks."""
        for instruction in instructions:
            match instruction:
                case SignalGroup(signum):
                    with contextlib.suppress(ProcessLookupError):  # a shell's kids too
                        os.killpg(job.process.pid, signum)
                case ReadFreely():
                    if job.paused:
                        self._watch_output(job)
                case Finish():
                    self._finish(job)

    def _finish(self, job: Job) -> None:
        pipe = job.process.stdin
        if pipe is not None and not pipe.closed:
            self.unwatch(pipe.fileno())
            pipe.close()
        del self.jobs[job.id]
        answer: dict[str, Any] = {"rank": self.rank, "exit": job.status}
        if job.signal is not None:
            answer["signal"] = job.signal
        if job.note:
            answer["note"] = job.note
        self._answer(job.request, job.outbox, answer)
        self._keep_tail(job.id, job.request, job.outbox)

    def abandon(self, job_id: str) -> None:
        """Its client has gone: kill the job, and keep nothing of what it says (no
        acknowledgement will come)."""
        self.tails.pop(job_id, None)
        job = self.jobs.get(job_id)
        if job is not None:
            log.info("exec %s: its client went away, killing it", job.id)
            job.outbox.stop_keeping()
            self.send_signal(job.id, signal.SIGKILL, by_broker=True)

    def kill_from(self, route: tuple[str, ...]) -> None:
        """Kill the jobs whose answers travel along `route`: their client has gone. What their
        finished jobs kept for it is dropped."""
        for job_id in [j for j, tail in self.tails.items() if tuple(tail.request.route) == route]:
            del self.tails[job_id]
        for job in list(self.jobs.values()):
            if tuple(job.request.route) == route:
                log.info("exec %s: its client went away, killing it", job.id)
                job.outbox.stop_keeping()  # no acknowledgement will come either
                self.send_signal(job.id, signal.SIGKILL, by_broker=True)

    def busy(self) -> bool:
        return bool(self.jobs)

    def kill_all(self, signum: int = signal.SIGKILL, note: str = "") -> None:
        """The broker ends every job (retire, shutdown): none waits for credit once it ended."""
        for job_id, job in list(self.jobs.items()):
            if note and job.status is None:
                job.note = note
            self.send_signal(job_id, signum, by_broker=True)

    def wait_all(self) -> None:
        """Reap every job's process (after kill_all), so that none is left a zombie."""
        for job in self.jobs.values():
            self.guard.forget(job.process.pid)
            with contextlib.suppress(TimeoutError):
                job.process.wait(timeout=2)
            self._drop_pidfd(job)

    def close(self) -> None:
        """The broker is ending: its guard ends too (killing any job still listed)."""
        self.guard.close()


def _ended(pid: int) -> bool:
    """Whether the child `pid` has ended, without reaping it (its PID stays taken)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already: Spawned.wait says what is known
        return True


def _with_pidfd(process: Spawned) -> tuple[Spawned, int | None]:
    """The job's process and a pidfd of it, or None (no pidfds here, or no descriptor left)."""
    try:
        return process, os.pidfd_open(process.pid)
    except OSError:  # none on this kernel (ENOSYS), or none left (EMFILE): SIGCHLD will say
        return process, None


def _anchor(request: Message) -> Message:
    """What a job keeps of its exec.start: the way back, not the argv and environment."""
    return Message(
        Kind.REQUEST, request.topic, {}, nodeid=request.nodeid, tag=request.tag, route=request.route
    )
