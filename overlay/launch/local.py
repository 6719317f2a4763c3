"""The local launcher behind `tbon start`: a PMI-1 server and N brokers forked from one process.

A broker's start-up is mostly interpreter and import time (~0.1 s), so the launcher imports the
broker once and forks it N times: 64 brokers start about as fast as one. Each child gets one end of
a socketpair as PMI_FD, exactly as Hydra's mpiexec would hand it. The launcher reports brokers
that exit badly (one line for all that ended alike, and nothing for rank 0 passing on the initial
program's status), stops what is left once the instance is over (SIGTERM after --exit-timeout,
SIGKILL KILL_GRACE later, each once), and exits with rank 0's status.

Run as `python -P -m tbon.overlay.launch.local --size N --rundir DIR [--exit-timeout D]
[--force] [-S ...] [CMD]` (`-P`: never from the working directory, which may be a checkout;
cli/common.py). It forks nothing for a size above MAX_SIZE (tbon/limits.py), nor, without
--force, for more brokers than this machine can hold (capacity.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import importlib
import math
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

from tbon import exitcodes
from tbon.errors import TbonError
from tbon.limits import check_duration, check_size
from tbon.overlay.boot.wireup import instance_size
from tbon.overlay.broker.broker import run_broker
from tbon.overlay.broker.logs import forget_logging, setup_logging
from tbon.overlay.config.attributes import BrokerConfig, broker_config, parse_assignments
from tbon.overlay.launch.capacity import check_room
from tbon.overlay.launch.pmi_sockets import SocketPmiServer
from tbon.overlay.launch.rundirs import listening_joiners
from tbon.overlay.links.descriptors import (
    Reserve,
    descriptor_limit,
    hand_down,
    raise_limit,
    reserve_size,
)
from tbon.overlay.parse.duration import parse_duration
from tbon.overlay.parse.idset import format_idset
from tbon.proctitle import argv_area, name_broker

PROG = "tbon start"
FORKED_BROKERS_NEED = (
    "encodings.idna",  # socket.gethostbyname, when a broker with children binds
    "hmac",  # and hashlib: rank 0's check of a joiner's proof, group.state's digest
    "shlex",
    "subprocess",
    "tbon.overlay.boot.pmi",
    "tbon.overlay.links.children",
    "tbon.overlay.links.parent",
    "tbon.overlay.links.uplink",
    "tbon.overlay.services.rankpath",
    "tbon.overlay.services.status",
    "tbon.overlay.state.groupwire",  # the root group's members (tbon.standbys above 0)
    "tbon.overlay.state.leadership",
)
"""Modules a broker loads only once it needs them (so that one started on its own stays small:
tests/test_broker_imports.py), which brokers of `tbon start` do need: jobs, PMI, links, rank 0's
status and rank path, the root group's members' machine (with tbon.standbys), the IDNA codec a
bind's host lookup loads, OpenSSL's hashes. The launcher loads them before it forks, once, rather
than each broker after."""
_PR_SET_PDEATHSIG = 1
FORK_BATCH = 32
"""Brokers whose PMI connections and configs the launcher makes at once, before the first of
them is forked (Launch._fork_brokers)."""
SHUTDOWN_ASK_S = 3.0
"""How long a launcher whose rank 0 is gone waits for the root to agree to shut down."""


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, looked up once: by the launcher, for itself, before it forks, so that no
    broker pays for the lookup again (each would, and every page the lookup writes to is one
    more page copied for each of them)."""
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int | bytes) -> None:
    """Linux prctl(2); silently nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(option, value, 0, 0, 0)


def die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the process that started us dies, so that nothing is ever left behind."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


KILL_GRACE = 2.0
"""Seconds between the SIGTERM a broker gets for outliving the instance and the SIGKILL."""

JOINER_POLL_S = 0.5
"""Seconds between looks at the joiners' sockets once every broker this launcher started has
gone but the instance lives on in joiners (a takeover by a refilled standby)."""


@dataclass
class BrokerProcess:
    rank: int
    pid: int
    status: int | None = None  # exit code, or 128+signal
    stopped_at: float | None = None  # when the launcher sent it SIGTERM for outliving the instance
    killed: bool = False  # and SIGKILL, KILL_GRACE later

    @property
    def running(self) -> bool:
        return self.status is None


@dataclass
class Launch:
    size: int
    rundir: str
    config: BrokerConfig
    command: list[str]
    exit_timeout: float
    brokers: dict[int, BrokerProcess] = field(default_factory=dict)
    kill_at: float | None = None
    started: bool = False  # every broker has finalized PMI: it was welcomed into the tree
    failed: bool = False  # a broker failed before that: the instance never came up
    joiners_until: float = math.inf  # once terminated: how long joiners are waited for
    alone: bool = False  # said: the instance lives on in joiners only

    def start(self) -> SocketPmiServer:
        # Done once here, for every broker: the descriptor limit each would raise, and the
        # reserve each would open at that limit (overlay/links/descriptors.py), inherited.
        raise_limit()
        reserve = Reserve(reserve_size(descriptor_limit()))
        try:
            hand_down(reserve)
            return self._fork_brokers()
        finally:
            hand_down(None)
            reserve.close()

    def _fork_brokers(self) -> SocketPmiServer:
        server = SocketPmiServer(self.size, fd_floor=_fd_floor(self.size))
        launcher = os.getpid()
        for name in FORKED_BROKERS_NEED:
            importlib.import_module(name)
        argv_area()  # where each broker writes its title (tbon/proctitle.py), found once
        setup_logging(self.config.log_level)  # each broker's, the same for all: done once here
        size = instance_size(self.config.size, self.size)
        # Every object the launcher holds now is shared with every broker, page for page, until
        # one writes to it. A collection in a broker writes to each object it visits (its GC
        # header), so it would copy every page of the launcher's heap into every broker: frozen
        # objects are never visited again. (Reference counts still write: fewer, fairer copies.)
        gc.collect()
        # After each fork every page the launcher writes is copied again (copy on write), on the
        # critical path of every broker after it: what brokers need (a PMI connection, a config)
        # is made for a batch of them before the batch's first fork, so that the loop between two
        # forks writes almost nothing. Each config is made here, where the code that makes it is
        # warm, rather than in each broker, for which every line run first is pages copied. A
        # broker closes the rest of its batch's client ends with the server ends (one
        # close_range: SocketPmiServer.close_in_child); batches stay small because every
        # descriptor the launcher holds is copied by each fork and closed by each broker.
        batch = FORK_BATCH if server.floored else 1
        pids: list[int] = []
        ends: list[socket.socket] = []
        fork, forked = os.fork, pids.append
        try:
            for first in range(0, self.size, batch):
                ranks = range(first, min(first + batch, self.size))
                ends = [server.make_pair(rank) for rank in ranks]
                configs = [
                    self.config.replaced(rundir=os.path.join(self.rundir, str(rank)))
                    for rank in ranks
                ]
                gc.freeze()
                # CPython's method cache, emptied: a broker's first lookups then fill empty
                # entries, rather than evict the launcher's, each eviction a write (a reference
                # count) to a page of the launcher's heap that the broker never used otherwise
                sys._clear_type_cache()
                for rank, end, config in zip(ranks, ends, configs, strict=True):
                    pid = fork()
                    if pid == 0:
                        self._become_broker(rank, size, config, end, server, launcher)
                    forked(pid)
                for end in ends:
                    end.close()
        finally:
            # Brokers forked before a failed fork are this launcher's to reap and to stop.
            for end in ends:
                end.close()
            for rank, pid in enumerate(pids):
                self.brokers[pid] = BrokerProcess(rank, pid)
            forget_logging()
        return server

    def _become_broker(
        self,
        rank: int,
        size: int,
        config: BrokerConfig,
        pmi: socket.socket,
        server: SocketPmiServer,
        launcher: int,
    ) -> NoReturn:
        code = exitcodes.INTERNAL
        try:
            die_with_parent(launcher)
            # `tbon broker rank R/N`, as a broker started on its own shows (tbon/proctitle.py).
            name_broker(rank, size, detail="")
            server.close_in_child(keep=pmi.fileno())
            # One item at a time: update() goes through the ABCs' isinstance checks, which
            # cost a forked broker a third of a millisecond, mostly copied pages.
            environ = os.environ
            environ["PMI_FD"] = str(pmi.fileno())
            environ["PMI_RANK"] = str(rank)
            environ["PMI_SIZE"] = str(self.size)
            code = run_broker(config, self.command if rank == 0 else [])
        except BaseException as error:  # a forked child must never return into the launcher
            sys.stderr.write(f"tbon-broker[{rank}]: internal error: {error!r}\n")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def reap(self, now: float) -> None:
        """Collect every broker that has exited; one line for all those that ended the same
        way (hundreds of brokers that lose their parent at once would each have had one)."""
        news: dict[str, list[BrokerProcess]] = {}
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            broker = self.brokers.get(pid)
            if broker is None:
                continue
            broker.status = _exit_status(wait_status)
            if self._worth_telling(broker, wait_status):
                news.setdefault(_describe(wait_status), []).append(broker)
            if broker.status != 0 and not self.started and self.kill_at is None:
                self.failed = True
                self.kill_at = now  # nothing to wait for: the instance never came up
            elif broker.rank == 0 and not (self.failover and _taken_over(wait_status)):
                self.end(now)
        for how, brokers in news.items():
            say(f"{_ranks(brokers)} {how}")

    @property
    def failover(self) -> bool:
        """Whether a standby takes over when rank 0 dies (docs/protocol.md §13.4): at least two
        standbys kept (state/standbys.py). Rank 0 killed, or superseded, is then not the
        instance's end; the instance ends when its brokers have."""
        return self.config.standbys >= 2 and self.size >= 3

    def end(self, now: float, grace: float = 0.0) -> None:
        """The instance is over: give the brokers exit_timeout (plus `grace`) to finish."""
        deadline = now + self.exit_timeout + grace
        self.kill_at = deadline if self.kill_at is None else min(self.kill_at, deadline)

    def _worth_telling(self, broker: BrokerProcess, wait_status: int) -> bool:
        """Whether a broker's end is news to the user: not a success, not the end of one the
        launcher stopped itself (it said so then), and not rank 0 passing on the status of the
        initial program (that status is the command's, and tbon start's own)."""
        if broker.status == 0 or broker.stopped_at is not None:
            return False
        return not (
            broker.rank == 0 and self.command and self.started and os.WIFEXITED(wait_status)
        )

    def stragglers(self, now: float) -> list[tuple[BrokerProcess, signal.Signals]]:
        """The signals due now, each sent once to each broker: SIGTERM to those still running at
        kill_at, SIGKILL to those still running KILL_GRACE after their SIGTERM."""
        if self.kill_at is None or now < self.kill_at:
            return []
        due = []
        for broker in self.brokers.values():
            if not broker.running or broker.killed:
                continue
            if broker.stopped_at is None:
                broker.stopped_at = now
                due.append((broker, signal.SIGTERM))
            elif now >= broker.stopped_at + KILL_GRACE:
                broker.killed = True
                due.append((broker, signal.SIGKILL))
        return due

    def next_deadline(self) -> float | None:
        """When stragglers() next has something to do; None: only a broker's exit can matter."""
        if self.kill_at is None:
            return None
        times = [
            self.kill_at if b.stopped_at is None else b.stopped_at + KILL_GRACE
            for b in self.brokers.values()
            if b.running and not b.killed
        ]
        return min(times, default=None)

    def kill_stragglers(self, now: float) -> None:
        due = self.stragglers(now)
        stopped = [broker for broker, signum in due if signum == signal.SIGTERM]
        if stopped and not self.failed:
            verb = "it" if len(stopped) == 1 else "they"
            say(f"stopping {_ranks(stopped)}: {verb} did not exit in time")
        for broker, signum in due:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker.pid, signum)

    def terminate(self, now: float) -> None:
        """Shut the instance down through rank 0, which takes its subtree down leaves first.
        After a takeover (rank 0 gone, standbys kept) the root may be a broker this launcher did
        not start (a refilled standby): the lowest-ranked broker still running is asked to send
        `instance.shutdown` to the root (routed there, docs/protocol.md §13.4), and only if that
        fails is it sent SIGTERM, which a broker that is not the root takes as its own leave."""
        running = sorted((b for b in self.brokers.values() if b.running), key=lambda b: b.rank)
        root = running[0] if running and (running[0].rank == 0 or self.failover) else None
        if root is not None and (root.rank == 0 or not self._shutdown_through(root.rank)):
            os.kill(root.pid, signal.SIGTERM)
        if not running and self.failover:  # only joiners hold the instance: through theirs
            any(self._shutdown_at(path) for path in listening_joiners(self.rundir))
        # Rank 0 may take its shutdown timeout to bring the tree down, leaves first.
        self.end(now, grace=self.config.shutdown_timeout)
        self.joiners_until = now + self.exit_timeout + self.config.shutdown_timeout

    def _shutdown_through(self, rank: int) -> bool:
        """`instance.shutdown` sent to the root through rank `rank`'s local socket; whether the
        root agreed within SHUTDOWN_ASK_S."""
        return self._shutdown_at(os.path.join(self.rundir, str(rank), "local"))

    def _shutdown_at(self, path: str) -> bool:
        from tbon.errors import TbonError
        from tbon.overlay.connectors.client import Client

        uri = f"local://{path}"
        try:
            with Client(uri) as client:
                client.rpc("instance.shutdown", {}, 0, timeout=SHUTDOWN_ASK_S, quiet=True)
        except (TbonError, OSError):
            return False
        return True

    def running(self) -> bool:
        return any(broker.running for broker in self.brokers.values())

    def joiners_hold(self, now: float) -> bool:
        """Whether the instance lives on in joiners alone (docs/protocol.md §13.4): every broker
        this launcher started has gone, standbys took over, and a joiner under its run directory
        (a refilled rank, the root perhaps) still listens. Its run directory, which holds their
        sockets, is kept until they have gone, or until the shutdown asked of them is overdue."""
        if not (self.failover and self.started and not self.failed and now < self.joiners_until):
            return False
        if not listening_joiners(self.rundir):
            return False
        if not self.alone:
            self.alone = True
            say("every broker it started has exited; the instance lives on in brokers that joined")
        return True

    def root_status(self) -> int:
        root = next(b for b in self.brokers.values() if b.rank == 0)
        return root.status if root.status is not None else exitcodes.INTERNAL


def _fd_floor(size: int) -> int | None:
    """A descriptor number above every one this process has open, with room for `size` PMI
    server ends above it and FORK_BATCH client ends (SocketPmiServer moves them there, so that a
    forked broker closes all but its own with one call); None where /proc/self/fd cannot say, or
    RLIMIT_NOFILE leaves no room."""
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return None
    floor = highest + 16  # room for the few descriptors the launcher opens while forking
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and floor + size + FORK_BATCH + 16 > soft:
        return None
    return floor


def say(message: str) -> None:
    """One line on stderr, `tbon start: message`, in one write: the brokers share this stderr,
    and a line written in pieces lets their log lines land inside it."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


def _ranks(brokers: list[BrokerProcess]) -> str:
    """`rank 3 (pid 812)`, or for several `ranks 1-3,7 (pids 812,813,814,820)`, pids in rank
    order: a user matches them with the brokers' own log lines."""
    if len(brokers) == 1:
        return f"rank {brokers[0].rank} (pid {brokers[0].pid})"
    ordered = sorted(brokers, key=lambda b: b.rank)
    pids = ",".join(str(b.pid) for b in ordered)
    return f"ranks {format_idset([b.rank for b in ordered])} (pids {pids})"


def _taken_over(wait_status: int) -> bool:
    """Whether rank 0's end leaves the instance to a standby (with failover): it was killed, or
    it exited 77 superseded by the standby that took over (docs/protocol.md §13.5)."""
    return os.WIFSIGNALED(wait_status) or os.WEXITSTATUS(wait_status) == exitcodes.REFUSED


def _exit_status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _describe(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"killed by signal {signal.Signals(os.WTERMSIG(wait_status)).name}"
    return f"exited with status {os.WEXITSTATUS(wait_status)}"


def serve(launch: Launch) -> int:
    signals: list[int] = []
    reader, writer = socket.socketpair()
    for end in (reader, writer):
        end.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for caught in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(caught, lambda signum, _frame: signals.append(signum))
    server = launch.start()
    selector = selectors.DefaultSelector()
    server.register(selector)
    selector.register(reader, selectors.EVENT_READ, None)
    try:
        while launch.running() or launch.joiners_hold(time.monotonic()):
            now = time.monotonic()
            deadline = launch.next_deadline()
            if not launch.running():  # joiners alone: look at their sockets again soon
                deadline = min(deadline or math.inf, now + JOINER_POLL_S)
            timeout = None if deadline is None else max(0.0, deadline - now)
            for key, _ in selector.select(timeout):
                if key.data is server:
                    server.handle(key.fileobj)
                else:
                    _drain(reader)
            now = time.monotonic()
            if not launch.started and len(server.finalized) == launch.size:
                launch.started = True
            pending, signals[:] = list(signals), []
            for signum in pending:
                if signum == signal.SIGCHLD:
                    launch.reap(now)
                else:
                    launch.terminate(now)
            launch.reap(now)
            launch.kill_stragglers(now)
    finally:
        # A signal that comes later (SIGCHLD of a job orphaned to us) must not be written to a
        # socket closed by then: Python would print its "Bad file descriptor" on our stderr.
        signal.set_wakeup_fd(-1)
        reader.close()
        writer.close()
        server.close()
        for broker in launch.brokers.values():
            if broker.running:
                os.kill(broker.pid, signal.SIGKILL)
                os.waitpid(broker.pid, 0)
        # The run directory is this instance's alone; remove it even if tbon start was killed.
        shutil.rmtree(launch.rundir, ignore_errors=True)
    if launch.failed:
        say("the instance failed to start")
        return exitcodes.INTERNAL
    return launch.root_status()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        say(message)
        sys.exit(exitcodes.USAGE)


def main(argv: list[str]) -> int:
    parser = _Parser(prog="python -m tbon.overlay.launch.local")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--rundir", required=True)
    parser.add_argument("--exit-timeout", default="10s")
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--force", action="store_true", help="start more than fit here")
    parser.add_argument("-S", "--setattr", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    # Ctrl-C on the terminal is for the initial program; brokers inherit the launcher's SIG_IGN.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        # Refuse a bad size once, before forking: tbon start checked it too, but this process
        # is the one that forks, so it never trusts its caller with a fork bomb.
        check_size(args.size, "--test-size")
        config = broker_config(parse_assignments(args.setattr))
        instance_size(config.size, args.size)
        if not args.force:
            check_room(args.size, "--test-size")
        launch = Launch(
            args.size,
            args.rundir,
            config,
            command,
            check_duration(
                parse_duration(args.exit_timeout, "--test-exit-timeout"), "--test-exit-timeout"
            ),
        )
    except TbonError as error:
        say(str(error))
        return error.exit_code
    return serve(launch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
