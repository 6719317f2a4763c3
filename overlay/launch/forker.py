"""The brokers of `tbon expand`, forked from one process that imported the broker once.

A joiner's start is mostly the interpreter's and the broker's imports (~0.5 s of CPU), and
`tbon expand --ranks R` starts several at once (R and the vacant ranks above it): started as
processes of their own, they import side by side on the same cores, and the first of the chain,
the one the others wait for, is slowed by the rest. Forked from one process that has imported
everything a joiner needs (as `tbon start` forks its brokers, overlay/launch/local.py), each
starts booting at once.

The forker is a process of its own (`python -P -m tbon.overlay.launch.forker`), never the CLI:
the CLI has loaded Typer and Rich, which a broker must not carry (docs/design.md §13), and holds a
ZeroMQ context, which a forked child must not inherit. It reads batches from stdin, one a line:
a JSON list of `{"argv": [...], "log": PATH}`, one per broker (`argv`: what follows `tbon
broker`). It forks each batch's brokers (stdin /dev/null, stdout and stderr appended to its
log), and writes their PIDs as one JSON list a line on stdout; at the
end of stdin it exits. Expand sends a batch whenever its window has room (launch/pace.py), so
the forker lives as long as expand starts brokers, and the brokers must not be its children:
each batch is forked by a child of the forker that exits once it has, and its brokers, orphaned,
become the children of expand, which made itself a child subreaper (prctl(2)
PR_SET_CHILD_SUBREAPER) before starting the forker, and which waits for them as for its own
(`Forked`). Where a caller cannot be a subreaper (not Linux), `Forker.start` says so (None) and
the caller starts processes as before.

The forker starts a session of its own, and its brokers stay in it: detached from expand's
terminal (a Ctrl-C there is not theirs), and, where Linux shares CPU time between sessions
(autogroup), a thousand booting brokers weigh as one session against a command run from another
terminal, not as a thousand, as the brokers of one `tbon start` share its launcher's. Not a lower
priority (nice): an unprivileged broker could not raise it back once online, and it lives on,
with the jobs it starts, which would inherit it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

JOINERS_NEED = (
    "encodings.idna",  # socket.gethostbyname, when a broker with children binds
    "shlex",
    "subprocess",
    "tbon.keys.cert",
    "tbon.overlay.boot.flub",
    "tbon.overlay.broker.broker",
    "tbon.overlay.broker.main",
    "tbon.overlay.links.children",
    "tbon.overlay.links.parent",
    "tbon.overlay.links.uplink",
    "tbon.overlay.state.groupwire",  # a joiner refilling a standby's rank
    "tbon.overlay.state.heldtable",
    "tbon.overlay.state.leadership",
)
"""What a joiner loads before it is online, whatever its rank: loaded once, here, before the
forks (the links both up and down: which a joiner needs is known only once it has its rank; the
root group's member machine, which a joiner refilling a standby's rank runs)."""

_PR_SET_CHILD_SUBREAPER = 36
FORK_DEADLINE_S = 60.0
"""How long the forker may take to answer a batch, its imports included for the first (well
under a second for a thousand brokers on a quiet machine): a forker stopped or stuck past it is
killed, and expand says so."""
_ROOM = 4096
"""Bytes of command line the forker starts with, blank: its brokers write their titles there
(tbon/proctitle.py), which name their run directories and boot servers."""


@dataclass
class Forked:
    """A broker the forker started, now a child of this process: what `subprocess.Popen` offers
    for one, as far as `tbon expand` uses it."""

    pid: int
    returncode: int | None = None  # as Popen's: the exit status, or -N for signal N

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped already: nobody else waits for it here
            self.returncode = -signal.SIGKILL
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def become_subreaper() -> bool:
    """Adopt the orphans among this process's descendants; whether this system allows it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    """The PIDs of this process's children now (Linux's /proc/PID/task/TID/children), adopted
    ones included; empty where the system does not say."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{os.getpid()}/task"):
            with open(f"/proc/{os.getpid()}/task/{task}/children") as listed:
                found.update(int(pid) for pid in listed.read().split())
    return found


def _stop_strays(known: set[int]) -> None:
    """Kill and reap the brokers a forker started but never named (it failed or was stopped
    half-way): orphaned, they are this subreaper's children now, and not ones it knew before.
    Again until none is left: a batch's forking child, killed here, hands what it forked to
    this process only as it dies."""
    while strays := _children() - known:
        for pid in strays:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


_early: Forker | None = None


def start_early() -> None:
    """Start a forker before the CLI has loaded its own modules (cli/main.py does, for `tbon
    expand`), so that its imports overlap theirs too; `cancel_early` once the command is over."""
    global _early
    _early = Forker.start()


def cancel_early() -> None:
    """Stop the forker started early if the command did not take it (a usage error, --help).
    Left alone, it would end by itself, but only once it had imported the broker for nothing."""
    global _early
    if _early is not None:
        _early.cancel()
        _early = None


def take_forker() -> Forker | None:
    """The forker started early, or a new one (None: see `Forker.start`)."""
    global _early
    found, _early = _early, None
    return found if found is not None else Forker.start()


class Forker:
    """A forker, started early so that its imports overlap the caller's own work (one round
    trip or two to the instance), and used once: `fork` the brokers, or `cancel`."""

    def __init__(self, command: list[str]) -> None:
        """Start the forker, run as `command`; the caller is a child subreaper by now."""
        self.process = subprocess.Popen(
            [*command, " " * _ROOM],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    @classmethod
    def start(cls) -> Forker | None:
        """A forker, or None where this process cannot adopt what it forks (not Linux) or cannot
        start it (no descriptor or process left: OSError): the caller starts its brokers as
        processes of their own then, as before the forker, and says so if that fails too. Started
        before the command line is read, a forker must never be the reason a command fails."""
        # -P: never from the working directory, which may be a checkout (cli/common.py)
        command = [sys.executable, "-P", "-m", "tbon.overlay.launch.forker"]
        if not become_subreaper():
            return None
        try:
            return cls(command)
        except OSError:
            return None

    def fork(self, brokers: list[tuple[list[str], str]]) -> list[Forked]:
        """One broker for each (argv, log), now children of this process: one batch, asked of
        a forker that may fork more later. TbonError if the forker failed (it is stopped then,
        and what it forked of this batch with it)."""
        from tbon.errors import TbonError

        batch = [{"argv": argv, "log": log} for argv, log in brokers]
        ours = _children()
        try:
            said = self._exchange(json.dumps(batch).encode() + b"\n")
        except TimeoutError:
            self.cancel()
            _stop_strays(ours)
            raise TbonError(
                f"cannot start brokers: the forker did not answer within {FORK_DEADLINE_S:g}s"
            ) from None
        except BaseException:  # interrupted (Ctrl-C): it is ours, by PID, and so is what it forked
            self.cancel()
            _stop_strays(ours)
            raise
        try:
            pids = json.loads(said)
        except ValueError:
            pids = None
        if not isinstance(pids, list) or len(pids) != len(brokers):
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            assert self.process.stderr is not None
            trouble = self.process.stderr.read()  # at its end: nothing else holds the pipe
            self.cancel()
            _stop_strays(ours)  # a fork that failed half-way: the brokers it started, unnamed
            last = trouble.decode(errors="replace").strip().splitlines()[-1:] or ["no word"]
            code = self.process.returncode
            raise TbonError(f"cannot start brokers: the forker exited {code}: {last[0]}")
        return [Forked(pid) for pid in pids]

    def _exchange(self, batch: bytes) -> bytes:
        """Send one batch and read its line of PIDs (b"" if the forker ended first), within
        FORK_DEADLINE_S (TimeoutError): the forker may be stopped, and a pipe never says so."""
        assert self.process.stdin is not None and self.process.stdout is not None
        deadline = time.monotonic() + FORK_DEADLINE_S
        into, out = self.process.stdin.fileno(), self.process.stdout.fileno()
        os.set_blocking(into, False)
        poller = select.poll()
        poller.register(into, select.POLLOUT)
        poller.register(out, select.POLLIN)
        read = b""
        while not read.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for fd, _events in poller.poll(left * 1000):
                if fd == into:
                    try:
                        batch = batch[os.write(into, batch) :]
                    except BrokenPipeError:  # it ended: its stdout says how
                        batch = b""
                    if not batch:
                        poller.unregister(into)
                elif chunk := os.read(out, 65536):
                    read += chunk
                else:
                    return read  # the end of its output: it exited
        return read

    def cancel(self) -> None:
        """Stop the forker, used or not: between batches it has nothing in hand, and what it
        forked is this process's (or, mid-batch, this process's to stop: `_stop_strays`)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def main() -> NoReturn:
    """The forker: import, then for each batch read, fork its brokers and say their PIDs; exit
    at the end of stdin."""
    import gc
    import importlib

    from tbon.proctitle import set_title

    set_title("tbon expand: forking brokers")
    try:
        os.setsid()  # the brokers' one session (above)
        alone = False
    except OSError:  # a group's leader already (not as expand starts it): one session each
        alone = True
    for name in JOINERS_NEED:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # a broker's collections then leave the shared pages alone (local.py)
    sys.stdout.flush()
    sys.stderr.flush()
    for line in sys.stdin.buffer:
        pids = _fork_batch(json.loads(line), alone)
        if pids is None:
            os._exit(1)  # the batch's forking child said why on stderr
        sys.stdout.write(json.dumps(pids) + "\n")
        sys.stdout.flush()
    os._exit(0)


def _fork_batch(specs: list[dict[str, object]], alone: bool) -> list[int] | None:
    """Fork one broker per spec through a child of this process that exits once it has, so
    that they are orphans (the caller's children, as subreaper) rather than the forker's: their
    PIDs, or None if that child failed (the brokers it forked are the caller's to stop)."""
    reader, writer = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(reader)
        _fork_each(specs, writer, alone)
    os.close(writer)
    said = b""
    while chunk := os.read(reader, 65536):
        said += chunk
    os.close(reader)
    _, status = os.waitpid(middle, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    pids: list[int] = json.loads(said)
    return pids


def _fork_each(specs: list[dict[str, object]], said: int, alone: bool) -> NoReturn:
    """In the batch's forking child: fork each broker, write their PIDs to `said`, exit."""
    code = 1
    try:
        if specs:
            _warm(specs[0]["argv"])
        pids = []
        for spec in specs:
            log = os.open(str(spec["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            pid = os.fork()
            if pid == 0:
                os.close(said)
                argv = spec["argv"]
                assert isinstance(argv, list)
                _become_broker(argv, log, alone)
            os.close(log)
            pids.append(pid)
        os.write(said, json.dumps(pids).encode())
        code = 0
    except BaseException as error:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"tbon expand: forker: {error}\n")
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _warm(argv: object) -> None:
    """In the batch's forking child, before its forks: what each broker of the batch would do
    alike as it starts, done once for all, as `tbon start`'s launcher does for its brokers
    (overlay/launch/local.py). Expand is paced by its joiners' CPU where cores are scarce (each
    queues for one far longer than it runs: benchmarks/expand_rank0.py), so a joiner's first
    steps are its whole cost: the argument parse (its patterns compiled, its code run once),
    logging set up at the batch's level, the descriptor limit raised and the reserve opened
    (handed down, overlay/links/descriptors.py), the method cache emptied and what all this
    made frozen, so that each broker finds it done and copies fewer pages. The batch's brokers
    share their argv but for their run directory; one the warm-up cannot read is left to the
    broker, which says what is wrong with it."""
    import gc

    from tbon.errors import TbonError
    from tbon.overlay.broker.logs import setup_logging
    from tbon.overlay.broker.main import parse_args
    from tbon.overlay.config.attributes import broker_config, parse_assignments
    from tbon.overlay.links.descriptors import (
        Reserve,
        descriptor_limit,
        hand_down,
        raise_limit,
        reserve_size,
    )

    if isinstance(argv, list):
        try:
            args = parse_args([str(word) for word in argv])
            config = broker_config(parse_assignments(args.setattr), args.config_file)
            setup_logging(config.log_level)
        except (TbonError, ValueError):
            pass
    raise_limit()
    hand_down(Reserve(reserve_size(descriptor_limit())))  # closed by this child's exit
    gc.collect()
    gc.freeze()
    sys._clear_type_cache()


def _become_broker(argv: list[str], log: int, alone: bool) -> NoReturn:
    """`tbon broker ARGV`, in this forked child, which must never return into the forker; in
    a session of its own if `alone`, else in the forker's."""
    from tbon import exitcodes

    code = exitcodes.INTERNAL
    try:
        if alone:
            os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        from tbon.overlay.broker.main import main as broker_main

        code = broker_main(argv)
    except BaseException as error:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"tbon broker: internal error: {error!r}\n")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
