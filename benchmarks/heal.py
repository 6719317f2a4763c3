"""Self-healing benchmark for tbon: SIGKILL an interior broker and time how the tree heals.

Run from the repository with the project's virtualenv:

    .venv/bin/python benchmarks/heal.py [--rounds R] [--size N] [--topo kary:K] [--sleep S]
        [--sections kill,double,rank0,shutdown,subtree,takeover] [--markdown | --json]

Each round is a fresh `tbon start --test-size=N -S tbon.topo=TOPO` in wait mode (defaults: 64
ranks, kary:4, so rank 1's children are 5-8 and its grandchildren 21-36). Once rank 0 pushes
every rank online, the round:

  1. reads `tbon status URI --json` (every rank's pid and incarnation), and times one
     `tbon exec -r OTHERS URI true` (OTHERS: every rank but 1) on the whole tree, for comparison;
  2. starts `tbon exec -r G URI sh -c 'echo started; sleep S; echo done'` on G, the first
     grandchild of rank 1 (a child if it has none), and waits for "started" to arrive;
  3. SIGKILLs rank 1's broker (checked to be a descendant of the `tbon start` we launched), then
     runs `tbon exec -r OTHERS URI true` again and again, each after the last one exits, until one
     exits 0: the clock stops at that CLI's exit (target: within 1 s of the kill);
  4. starts `tbon expand URI --fill --json` and times, from its Popen, rank 1 online with a new
     incarnation, rank 0's subtree `full` (target: within 0.5 s) and every rank back under its own
     parent; also the expand CLI's own wall time, and `full` counted from the start of the joiner
     broker it forked (its start time from /proc/PID/stat, in clock ticks: 10 ms steps);
  5. waits for the job of step 2 (it must exit 0 having printed "started" then "done"), and
     reads `tbon status URI --json` again: every rank but 1 must have kept its pid.

Issue 20's sections (`double`, `rank0`, `shutdown`), R rounds of each, every measure on a fresh
15-rank kary:2 instance (depth 3) with tbon.timeout=2s, broker.reattach-timeout=3s and
broker.shutdown-timeout=5s, its launcher told to kill nothing for 2 minutes:

  double    SIGKILL rank 1 and its child rank 3 together: until rank 0 pushes both `lost`
            (target: tbon.timeout);
  rank0     SIGKILL rank 0: until every other broker process has exited, each exit seen on its
            pidfd, and the last exit at each depth (target: tbon.timeout +
            broker.reattach-timeout, whatever the depth);
  subtree   SIGSTOP rank 1, then SIGKILL its grandchildren 7-10 and children 3 and 4, so
            that only silence tells rank 0 anything: until rank 0 pushes every rank of rank 1's
            subtree `lost` (target: tbon.timeout + one reattach grace, tbon.timeout +
            broker.reattach-timeout, whatever the subtree's depth);
  shutdown  SIGTERM to `tbon start` until it exits, on a healthy instance, then on one healed
            (rank 1 killed, its children fostered, `tbon expand --fill`, every rank home again):
            the ratio of the two (target: at most 1.5).

Issue 23's section, `takeover`, R rounds on fresh instances of --size ranks in --topo with
`tbon.standbys=2`: kill -9 rank 0, then how soon a new root answers `tbon status` through a
non-member's URI (target 1 s), every other rank attached and `tbon exec` on all of them exits 0
(target 2 s), whether their pids were kept and whether a `sleep` started before the kill ended
with its output; benchmarks/takeover.py describes the round and adds the steady memory cost.

Rank 0's status snapshots (a status.watch stream from an in-process Client) and the exits of the
CLIs (their pidfds) are waited on together, so each event is timed when it happens, not at the
next turn of a polling loop. Nothing here sleeps and hopes: every wait has a deadline, and every
process this script starts is reaped by PID whether the round passes or fails. The only brokers
it signals are the ones it kills (by PID, each checked to descend from our `tbon start`) and,
should the instance's shutdown leave them running, the joiners started by its own `tbon expand`
(by pidfd, so never a recycled PID). Progress goes to
stderr; a table per measure and round goes to stdout (`--markdown` for GitHub tables, `--json`
for a machine-readable object instead). No assertion is timed: a missed target is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import takeover
from common import (
    STOP_GRACE_S,
    TBON,
    Instance,
    Report,
    all_online,
    begin,
    in_tree,
    log_tail,
    machine_line,
    median,
    ms,
    positive,
    progress,
    read_line,
    stop,
    tbon_start,
    verdict,
)

TARGET_ANSWER_S = 1.0  # kill -> `tbon exec -r OTHERS true` exits 0
TARGET_FULL_S = 0.5  # the joiner's start -> rank 0 reads `full` again

VICTIM = 1
ONLINE_DEADLINE_S = 60.0  # a fresh instance: every rank online
ATTEMPT_DEADLINE_S = 10.0  # one `tbon exec -r OTHERS true` after the kill
ANSWER_DEADLINE_S = 30.0  # kill -> the first of them to exit 0
EXPAND_TIMEOUT_S = 30.0  # given to `tbon expand --timeout`; our own deadline adds a margin
CLI_DEADLINE_S = 30.0  # `tbon status --json`, the "started" line, the job past its sleep
WAIT_SLICE_S = 0.5  # longest single wait, so that deadlines are checked
NO_PIDFD_SLICE_S = 0.005  # without pidfds, how often a CLI's exit is polled

CONNECTED = ("online", "retiring")


# --- the CLIs we start --------------------------------------------------------------------------


@dataclass
class Cli:
    """A `tbon` CLI we started: its process, a pidfd that becomes readable when it exits, when it
    started and ended (perf_counter), and the log its stderr goes to."""

    process: subprocess.Popen[bytes]
    argv: list[str]
    stderr_path: str
    started: float
    pidfd: int | None
    ended: float | None = None

    def reap(self, now: float) -> None:
        """It has exited: reap it and note when (once)."""
        if self.ended is None and self.process.poll() is not None:
            self.ended = now

    def said(self) -> str:
        """The last line of its stderr, for progress lines and errors."""
        lines = log_tail(self.stderr_path, 1)
        return lines or "(nothing on stderr)"


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+), or None where there is none: waits then poll instead."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def launched(argv: Sequence[str], *, stdout: Any = subprocess.DEVNULL) -> Iterator[Cli]:
    """Popen `argv` (stdin /dev/null, stderr to a temporary log); on the way out, always, it is
    stopped by PID (common.stop: SIGTERM, then SIGKILL after the grace) and reaped, its pidfd
    closed and its log removed."""
    fd, stderr_path = tempfile.mkstemp(prefix="heal-cli-", suffix=".log")
    try:
        started = time.perf_counter()
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=fd)
    except BaseException:
        os.unlink(stderr_path)
        raise
    finally:
        os.close(fd)
    cli = Cli(process, list(argv), stderr_path, started, _pidfd(process.pid))
    try:
        yield cli
    finally:
        try:
            stop(process)
        finally:
            if cli.pidfd is not None:
                os.close(cli.pidfd)
            with contextlib.suppress(OSError):
                os.unlink(stderr_path)


def status_json(uri: str) -> list[dict[str, Any]]:
    """`tbon status URI --json`: the rank table as a user gets it."""
    done = subprocess.run(
        [str(TBON), "status", uri, "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=CLI_DEADLINE_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"tbon status --json exited {done.returncode}: {done.stderr!r}")
    ranks: list[dict[str, Any]] = json.loads(done.stdout)["ranks"]
    return ranks


# --- rank 0's snapshots and the CLIs' exits, in one wait ----------------------------------------

Snapshot = dict[str, Any]


class Timeline:
    """A status.watch stream from rank 0 and the CLIs of a round, waited on together (the
    client's socket and each CLI's pidfd in one poll), so that a snapshot and an exit are both
    timed when they arrive. `marks` holds when the first snapshot satisfying each armed rule
    arrived."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tag = client.send("status.watch", {}, nodeid=0)
        self.snapshot: Snapshot | None = None
        self.marks: dict[str, float] = {}
        self.seen: dict[str, Snapshot] = {}  # the snapshot that set each mark
        self.rules: dict[str, Callable[[Snapshot], bool]] = {}
        self.clis: list[Cli] = []

    def arm(self, name: str, rule: Callable[[Snapshot], bool]) -> None:
        """From now on, note the arrival of the first snapshot for which `rule` holds."""
        self.rules[name] = rule

    def follow(self, cli: Cli) -> None:
        """Note this CLI's exit when it happens, whatever we are waiting for then."""
        self.clis.append(cli)

    def until(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Take snapshots and exits as they come until `done()`; TimeoutError past the monotonic
        `deadline`, saying `what` was awaited."""
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} before the deadline")
            running = [c for c in self.clis if c.ended is None]
            fds = [c.pidfd for c in running if c.pidfd is not None]
            limit = min(left, WAIT_SLICE_S)
            if len(fds) < len(running):
                limit = min(limit, NO_PIDFD_SLICE_S)
            has_reply, _ = self.client.wait(fds, limit)
            now = time.perf_counter()
            for cli in running:
                cli.reap(now)
            if has_reply:
                self._take()

    def _take(self) -> None:
        """Read every response that is here; each snapshot is timed as it is read."""
        while (reply := self.client.receive(0)) is not None:
            arrived = time.perf_counter()
            if reply.tag != self.tag:
                continue
            if reply.errnum:
                raise RuntimeError(f"status.watch failed: {reply.errstr}")
            self.snapshot = reply.payload
            for name, rule in self.rules.items():
                if name not in self.marks and rule(reply.payload):
                    self.marks[name] = arrived
                    self.seen[name] = reply.payload


# --- one round ----------------------------------------------------------------------------------


@dataclass
class Round:
    """What one round measured; seconds, None where the event was not seen."""

    exec_whole: float | None = None  # `tbon exec -r OTHERS true` before the kill (wall)
    lost: float | None = None  # kill -> rank 0 pushes the victim lost
    reattached: float | None = None  # kill -> every other rank connected and attached somewhere
    answered: float | None = None  # kill -> the first `tbon exec -r OTHERS true` exits 0
    answered_popen: float | None = None  # kill -> that CLI's Popen
    attempts: int = 0  # `tbon exec -r OTHERS true` runs after the kill, the successful one too
    failures: list[str] = field(default_factory=list)  # exit codes and words of the others
    fostered: dict[int, int] = field(default_factory=dict)  # rank -> foster parent, once healed
    # kill -> each child of the victim pushed attached again (to a foster parent)
    each: dict[int, float] = field(default_factory=dict)
    joiner_start: float | None = None  # expand Popen -> the joiner broker's process start
    replaced: float | None = None  # expand Popen -> victim online with a new incarnation
    full: float | None = None  # expand Popen -> rank 0's subtree `full`
    full_joiner: float | None = None  # the joiner's process start -> `full`
    home: float | None = None  # expand Popen -> every rank attached to its own parent
    expand_wall: float | None = None  # expand Popen -> its exit
    expand_exit: int | None = None
    pids_kept: bool = False  # every rank but the victim: same pid before and after
    incarnations_kept: bool = False  # ... and the same incarnation
    changed: list[int] = field(default_factory=list)  # ranks whose pid or incarnation changed
    job_ok: bool = False  # exit 0, and printed "started" then "done"
    job_exit: int | None = None
    job_output: str = ""
    job_end: float | None = None  # kill -> the job's CLI exits
    job_after_home: bool | None = None  # whether it ended once every rank was home


@dataclass
class Shape:
    """Where a round strikes, from the topology: the victim, the job's rank, who else."""

    victim: int
    job_rank: int
    children: list[int]  # the victim's: the ranks that must reattach
    below: list[int]  # every rank in the victim's subtree but itself
    others: list[int]  # every rank but the victim
    job_is_grandchild: bool


def idset(ranks: Sequence[int]) -> str:
    """Ranks as tbon's idset syntax, runs compressed: [0, 2, 3, 4] -> "0,2-4"."""
    words: list[str] = []
    ordered = sorted(ranks)
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        words.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(words)


def shape_of(ranks: list[dict[str, Any]], victim: int) -> Shape:
    """The victim's subtree and the rank the job runs on; RuntimeError if the victim is a leaf
    (nothing below it to heal)."""
    children = ranks[victim]["children"]
    if not children:
        raise RuntimeError(f"rank {victim} has no children in this topology: nothing to heal")
    below, stack = [], list(children)
    while stack:
        rank = stack.pop()
        below.append(rank)
        stack.extend(ranks[rank]["children"])
    grandchildren = [g for c in children for g in ranks[c]["children"]]
    job_rank = min(grandchildren) if grandchildren else min(children)
    others = [r["rank"] for r in ranks if r["rank"] != victim]
    return Shape(victim, job_rank, list(children), sorted(below), others, bool(grandchildren))


def started_at(pid: int) -> float | None:
    """When process `pid` started, as a time.perf_counter() value: its start time in /proc (clock
    ticks since boot, so 10 ms steps at 100 Hz) moved onto perf_counter's clock; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    now_perf, now_boot = time.perf_counter(), time.clock_gettime(time.CLOCK_BOOTTIME)
    return now_perf - (now_boot - ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class Stray:
    """The joiner that our `tbon expand` forked into its own session: not our child, so it is
    followed by a pidfd, which never points at a recycled PID."""

    pid: int
    pidfd: int


@contextlib.contextmanager
def strays() -> Iterator[list[Stray]]:
    """On the way out, once the instance is down (it is entered before tbon_start), each joiner
    has STOP_GRACE_S to exit by itself with the instance, else it is SIGKILLed by pidfd."""
    found: list[Stray] = []
    try:
        yield found
    finally:
        deadline = time.monotonic() + STOP_GRACE_S
        for stray in found:
            try:
                left = max(0.0, deadline - time.monotonic())
                if not select.select([stray.pidfd], [], [], left)[0]:
                    progress(f"joiner pid {stray.pid} outlived the instance: SIGKILL")
                    signal.pidfd_send_signal(stray.pidfd, signal.SIGKILL)
            finally:
                os.close(stray.pidfd)


def one_round(size: int, topo: str, sleep: float, number: int) -> tuple[Round, Shape]:
    from tbon.overlay.connectors.client import Client

    with (
        strays() as joiners,
        tbon_start(size, [f"tbon.topo={topo}"]) as inst,
        Client(inst.uri) as client,
    ):
        timeline = Timeline(client)
        timeline.until(
            lambda: (
                timeline.snapshot is not None
                and all(r["state"] == "online" for r in timeline.snapshot["ranks"])
            ),
            time.monotonic() + ONLINE_DEADLINE_S,
            f"snapshot with all {size} ranks online",
        )
        return strike(inst, timeline, joiners, sleep, number)


def strike(
    inst: Instance, timeline: Timeline, joiners: list[Stray], sleep: float, number: int
) -> tuple[Round, Shape]:
    """Steps 1-5 of the docstring, on an instance whose every rank is online."""
    result = Round()
    before = status_json(inst.uri)
    shape = shape_of(before, VICTIM)
    victim = before[VICTIM]
    if not in_tree(victim["pid"], inst.process.pid):
        raise RuntimeError(f"rank {VICTIM}'s pid {victim['pid']} is not one of our brokers")
    others = [str(TBON), "exec", "-r", idset(shape.others), inst.uri, "true"]
    for _ in range(2):  # the first run also warms every broker's exec path: time the second
        with launched(others) as whole:
            whole.process.wait(CLI_DEADLINE_S)
            if whole.process.returncode != 0:
                raise RuntimeError(
                    f"`{' '.join(others)}` exited {whole.process.returncode} "
                    f"before any kill: {whole.said()}"
                )
            result.exec_whole = time.perf_counter() - whole.started

    script = f"echo started; sleep {sleep:g}; echo done"
    job_argv = [str(TBON), "exec", "-r", str(shape.job_rank), inst.uri, "sh", "-c", script]
    with launched(job_argv, stdout=subprocess.PIPE) as job:
        first = read_line(job.process, CLI_DEADLINE_S)
        if first != "started":
            raise RuntimeError(f"job on rank {shape.job_rank} said {first!r}: {job.said()}")
        timeline.follow(job)
        _arm(timeline, shape, victim["incarnation"])
        killed = time.perf_counter()
        os.kill(victim["pid"], signal.SIGKILL)
        _answer(timeline, result, others, killed, number)
        try:
            timeline.until(
                lambda: "reattached" in timeline.marks,
                time.monotonic() + 10.0,
                "snapshot with every other rank reattached",
            )
        except TimeoutError as error:
            progress(f"round {number}: {error}")
        _expand(inst, timeline, result, joiners, shape, number)
        try:
            timeline.until(
                lambda: job.ended is not None,
                job.started + sleep + CLI_DEADLINE_S,
                "exit of the job's CLI",
            )
        except TimeoutError:
            progress(
                f"round {number}: the job's CLI had not exited {sleep + CLI_DEADLINE_S:g}s "
                "after it started"
            )
        if job.ended is not None:
            out, _ = job.process.communicate(timeout=CLI_DEADLINE_S)
            result.job_exit = job.process.returncode
            result.job_output = " ".join(["started", *out.decode(errors="replace").split()])
            result.job_ok = result.job_exit == 0 and result.job_output == "started done"
            result.job_end = job.ended - killed
            if "home" in timeline.marks:
                result.job_after_home = job.ended > timeline.marks["home"]
            if not result.job_ok:
                progress(
                    f"round {number}: job exited {result.job_exit}, printed "
                    f"{result.job_output!r}: {job.said()}"
                )
    for name in ("lost", "reattached"):
        if name in timeline.marks:
            setattr(result, name, timeline.marks[name] - killed)
    for child in shape.children:
        if f"child {child}" in timeline.marks:
            result.each[child] = timeline.marks[f"child {child}"] - killed
    if "reattached" in timeline.seen:
        result.fostered = {
            r["rank"]: r["attached_to"]
            for r in timeline.seen["reattached"]["ranks"]
            if r["parent"] is not None and r.get("attached_to") not in (None, r["parent"])
        }
    after = status_json(inst.uri)
    result.changed = [
        r
        for r in shape.others
        if (after[r]["pid"], after[r]["incarnation"])
        != (before[r]["pid"], before[r]["incarnation"])
    ]
    result.pids_kept = all(after[r]["pid"] == before[r]["pid"] for r in shape.others)
    result.incarnations_kept = all(
        after[r]["incarnation"] == before[r]["incarnation"] for r in shape.others
    )
    return result, shape


def _arm(timeline: Timeline, shape: Shape, incarnation: int) -> None:
    """The events of a round, as rules on rank 0's snapshots, armed just before the kill (a
    snapshot from before it would read as the tree healed)."""
    victim = shape.victim

    def lost(s: Snapshot) -> bool:
        return bool(s["ranks"][victim]["state"] == "lost")

    def attached(entry: dict[str, Any]) -> bool:
        return bool(
            entry["state"] in CONNECTED
            and (entry["parent"] is None or entry.get("attached_to") is not None)
            and not entry.get("reattaching")
        )

    def reattached(s: Snapshot) -> bool:
        return lost(s) and all(attached(s["ranks"][r]) for r in shape.others)

    def replaced(s: Snapshot) -> bool:
        entry = s["ranks"][victim]
        return bool(entry["state"] in CONNECTED and entry["incarnation"] > incarnation)

    def full(s: Snapshot) -> bool:
        return replaced(s) and s["ranks"][0]["subtree"] == "full"

    def home(s: Snapshot) -> bool:
        return full(s) and all(
            r["parent"] is None
            or (r.get("attached_to") == r["parent"] and not r.get("reattaching"))
            for r in s["ranks"]
        )

    rules = {
        "lost": lost,
        "reattached": reattached,
        "replaced": replaced,
        "full": full,
        "home": home,
    }
    for name, rule in rules.items():
        timeline.arm(name, rule)
    for child in shape.children:
        timeline.arm(f"child {child}", lambda s, c=child: lost(s) and attached(s["ranks"][c]))


def _answer(timeline: Timeline, result: Round, argv: list[str], killed: float, number: int) -> None:
    """Run `argv` (`tbon exec -r OTHERS true`) again and again from the kill, each once the last
    has exited, until one exits 0 or ANSWER_DEADLINE_S pass."""
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    while time.monotonic() < deadline:
        with launched(argv) as attempt:
            result.attempts += 1
            timeline.follow(attempt)
            try:
                timeline.until(
                    lambda: attempt.ended is not None,
                    min(deadline, time.monotonic() + ATTEMPT_DEADLINE_S),
                    "exit of `tbon exec`",
                )
            except TimeoutError:
                result.failures.append(f"hung past {ATTEMPT_DEADLINE_S:g}s")
                progress(
                    f"round {number}: `tbon exec` attempt {result.attempts} hung: {attempt.said()}"
                )
                continue
            assert attempt.ended is not None
            code = attempt.process.returncode
            if code == 0:
                result.answered = attempt.ended - killed
                result.answered_popen = attempt.started - killed
                return
            result.failures.append(f"{code} at {ms(attempt.ended - killed)} ms: {attempt.said()}")
            progress(
                f"round {number}: `tbon exec` attempt {result.attempts} exited {code} "
                f"{ms(attempt.ended - killed)} ms after the kill: {attempt.said()}"
            )
    progress(
        f"round {number}: no `tbon exec -r OTHERS true` exited 0 within "
        f"{ANSWER_DEADLINE_S:g}s of the kill"
    )


def _expand(
    inst: Instance,
    timeline: Timeline,
    result: Round,
    joiners: list[Stray],
    shape: Shape,
    number: int,
) -> None:
    """`tbon expand --fill` and the events that follow it, timed from its Popen."""
    argv = [
        str(TBON),
        "expand",
        inst.uri,
        "--fill",
        "--json",
        "--timeout",
        f"{EXPAND_TIMEOUT_S:g}s",
    ]
    with launched(argv, stdout=subprocess.PIPE) as expand:
        timeline.follow(expand)
        deadline = time.monotonic() + EXPAND_TIMEOUT_S + CLI_DEADLINE_S
        try:
            timeline.until(
                lambda: expand.ended is not None and "home" in timeline.marks,
                deadline,
                "exit of `tbon expand` and snapshot with every rank home",
            )
        except TimeoutError as error:
            progress(f"round {number}: {error}; launcher said: {inst.stderr_tail(5)}")
        snapshot = timeline.seen.get("replaced")
        if snapshot is not None:
            pid = snapshot["ranks"][shape.victim]["pid"]
            joiner_start = started_at(pid)
            pidfd = _pidfd(pid)
            if pidfd is not None:
                joiners.append(Stray(pid, pidfd))
            if joiner_start is not None:
                result.joiner_start = joiner_start - expand.started
                if "full" in timeline.marks:
                    result.full_joiner = timeline.marks["full"] - joiner_start
        for name in ("replaced", "full", "home"):
            if name in timeline.marks:
                setattr(result, name, timeline.marks[name] - expand.started)
        if expand.ended is not None:
            result.expand_wall = expand.ended - expand.started
            result.expand_exit = expand.process.returncode
            out, _ = expand.process.communicate(timeout=CLI_DEADLINE_S)
            if result.expand_exit != 0:
                progress(
                    f"round {number}: `tbon expand --fill` exited {result.expand_exit}: "
                    f"{out.decode(errors='replace').strip()} {expand.said()}"
                )


# --- issue 20: two deaths at once, rank 0's death, shutdown after a heal -----------------------

I20_SIZE = 15  # kary:2, depth 3: rank 1 has grandchildren (7-10), rank 3 children (7, 8)
I20_TIMEOUT_S = 2.0  # tbon.timeout
I20_REATTACH_S = 3.0  # broker.reattach-timeout
I20_SHUTDOWN_S = 5.0  # broker.shutdown-timeout
I20_HEARTBEAT_S = 0.2  # tbon.heartbeat: silence is judged on its ticks
I20_ATTRIBUTES = (
    "tbon.topo=kary:2",
    f"tbon.heartbeat={I20_HEARTBEAT_S * 1000:g}ms",
    "tbon.torpid=0",
    f"tbon.timeout={I20_TIMEOUT_S:g}s",
    f"broker.reattach-timeout={I20_REATTACH_S:g}s",
    f"broker.shutdown-timeout={I20_SHUTDOWN_S:g}s",
)
# The launcher must not kill what outlives rank 0 for us: it would hide how long they last.
I20_OPTIONS = ("--test-exit-timeout=2m",)
TARGET_BOTH_LOST_S = I20_TIMEOUT_S
TARGET_ALL_GONE_S = I20_TIMEOUT_S + I20_REATTACH_S
# silence, then one grace, each noticed on a heartbeat's tick
TARGET_SUBTREE_LOST_S = 2 * I20_TIMEOUT_S + I20_REATTACH_S + 2 * I20_HEARTBEAT_S
TARGET_SHUTDOWN_RATIO = 1.5
I20_DEADLINE_S = 60.0  # for any one event of these rounds: far past what the defects cost


@dataclass
class Issue20Round:
    """What one round of each issue 20 measure gave; seconds, None where not seen."""

    first_lost: float | None = None  # kill of 1 and 3 -> rank 0 pushes rank 1 lost
    both_lost: float | None = None  # ... -> rank 0 pushes 1 and 3 both lost
    all_gone: float | None = None  # kill of rank 0 -> the last broker process exits
    depth_gone: dict[int, float] = field(default_factory=dict)  # depth -> its last exit
    healthy_shutdown: float | None = None  # SIGTERM -> tbon start exits, a fresh instance
    healed_shutdown: float | None = None  # the same after a kill, expand and every rank home
    subtree_lost: float | None = None  # SIGSTOP of 1, kill of 3, 4, 7-10 -> all seven lost


@contextlib.contextmanager
def fresh(number: int, what: str) -> Iterator[tuple[Instance, Timeline]]:
    """A fresh issue 20 instance, once rank 0 pushes every rank online."""
    from tbon.overlay.connectors.client import Client

    with (
        tbon_start(I20_SIZE, I20_ATTRIBUTES, options=I20_OPTIONS) as inst,
        Client(inst.uri) as client,
    ):
        timeline = Timeline(client)
        timeline.until(
            lambda: timeline.snapshot is not None and all_online(timeline.snapshot),
            time.monotonic() + ONLINE_DEADLINE_S,
            f"round {number} ({what}): snapshot with all {I20_SIZE} ranks online",
        )
        yield inst, timeline


def _ours(inst: Instance, ranks: Sequence[int]) -> dict[int, int]:
    """The pids of `ranks`, each checked to be a broker of the `tbon start` we launched."""
    pids = {r["rank"]: r["pid"] for r in status_json(inst.uri)}
    for rank in ranks:
        if not in_tree(pids[rank], inst.process.pid):
            raise RuntimeError(f"rank {rank}'s pid {pids[rank]} is not one of our brokers")
    return {rank: pids[rank] for rank in ranks}


def double_kill(result: Issue20Round, joiners: list[Stray], number: int) -> None:
    """Kill -9 rank 1 and its child 3 together: how soon rank 0 reads both lost. Rank 3's
    children (7, 8) see its connections drop; nobody is left to see rank 1's, but rank 0 does."""
    with fresh(number, "double kill") as (inst, timeline):
        pids = _ours(inst, (1, 3))
        timeline.arm("1 lost", lambda s: s["ranks"][1]["state"] == "lost")
        timeline.arm(
            "both lost", lambda s: s["ranks"][1]["state"] == s["ranks"][3]["state"] == "lost"
        )
        killed = time.perf_counter()
        os.kill(pids[1], signal.SIGKILL)
        os.kill(pids[3], signal.SIGKILL)
        try:
            timeline.until(
                lambda: "both lost" in timeline.marks,
                time.monotonic() + I20_DEADLINE_S,
                "snapshot with ranks 1 and 3 both lost",
            )
        except TimeoutError as error:
            progress(f"round {number} (double kill): {error}")
        if "1 lost" in timeline.marks:
            result.first_lost = timeline.marks["1 lost"] - killed
        if "both lost" in timeline.marks:
            result.both_lost = timeline.marks["both lost"] - killed


SUBTREE = (1, 3, 4, 7, 8, 9, 10)  # rank 1's subtree at 15 ranks, kary:2


def dead_subtree(result: Issue20Round, joiners: list[Stray], number: int) -> None:
    """SIGSTOP rank 1, then kill -9 its subtree from the leaves up: each death is seen only by a
    broker that dies next or by rank 1, which reads nothing. Rank 0 hears rank 1's silence, then
    waits out the grace of the ranks below it: how soon every rank of the subtree reads lost."""
    with fresh(number, "dead subtree") as (inst, timeline):
        pids = _ours(inst, SUBTREE)
        timeline.arm(
            "subtree lost", lambda s: all(s["ranks"][r]["state"] == "lost" for r in SUBTREE)
        )
        stopped = time.perf_counter()
        os.kill(pids[1], signal.SIGSTOP)
        try:
            for rank in (7, 8, 9, 10, 3, 4):
                os.kill(pids[rank], signal.SIGKILL)
            timeline.until(
                lambda: "subtree lost" in timeline.marks,
                time.monotonic() + I20_DEADLINE_S,
                "snapshot with rank 1's whole subtree lost",
            )
        except TimeoutError as error:
            progress(f"round {number} (dead subtree): {error}")
        finally:
            os.kill(pids[1], signal.SIGKILL)  # stopped: it would never hear the shutdown
        if "subtree lost" in timeline.marks:
            result.subtree_lost = timeline.marks["subtree lost"] - stopped


def rank0_death(result: Issue20Round, joiners: list[Stray], number: int) -> None:
    """Kill -9 rank 0: how soon every other broker process has exited (each exit is seen on its
    pidfd when it happens), and the last exit at each depth."""
    with fresh(number, "rank 0's death") as (inst, _):
        ranks = list(range(I20_SIZE))
        pids = _ours(inst, ranks)
        fds: dict[int, int] = {}
        try:
            for rank in ranks[1:]:
                fd = _pidfd(pids[rank])
                if fd is None:
                    progress(f"round {number}: no pidfd for rank {rank}: not measured")
                    return
                fds[fd] = rank
            killed = time.perf_counter()
            os.kill(pids[0], signal.SIGKILL)
            gone: dict[int, float] = {}
            deadline = time.monotonic() + I20_DEADLINE_S
            waiting = dict(fds)
            while waiting and time.monotonic() < deadline:
                ready, _, _ = select.select(list(waiting), [], [], WAIT_SLICE_S)
                now = time.perf_counter()
                for fd in ready:
                    gone[waiting.pop(fd)] = now - killed
            if waiting:
                progress(
                    f"round {number}: ranks {idset(sorted(waiting.values()))} still running "
                    f"{I20_DEADLINE_S:g}s after rank 0's death"
                )
                return
            result.all_gone = max(gone.values())
            for rank, seconds in gone.items():
                depth = 0
                while rank > 0:
                    rank, depth = (rank - 1) // 2, depth + 1
                result.depth_gone[depth] = max(result.depth_gone.get(depth, 0.0), seconds)
        finally:
            for fd in fds:
                os.close(fd)


def _shutdown(inst: Instance, number: int, what: str) -> float | None:
    """SIGTERM to `tbon start` -> its exit (the brokers it forked are gone by then)."""
    began = time.perf_counter()
    inst.process.send_signal(signal.SIGTERM)
    try:
        inst.process.wait(I20_DEADLINE_S)
    except subprocess.TimeoutExpired:
        progress(f"round {number} ({what}): tbon start still running {I20_DEADLINE_S:g}s on")
        return None
    return time.perf_counter() - began


def shutdowns(result: Issue20Round, joiners: list[Stray], number: int) -> None:
    """A healthy instance's shutdown, then one's after a heal: rank 1 killed, its children
    fostered, `tbon expand --fill`, and every rank home under its own parent again."""
    with fresh(number, "healthy shutdown") as (inst, _):
        result.healthy_shutdown = _shutdown(inst, number, "healthy shutdown")
    with fresh(number, "shutdown after a heal") as (inst, timeline):
        pid = _ours(inst, (1,))[1]
        timeline.arm(
            "fostered",
            lambda s: (
                s["ranks"][1]["state"] == "lost"
                and all(s["ranks"][c].get("attached_to") == 0 for c in (3, 4))
            ),
        )
        os.kill(pid, signal.SIGKILL)
        timeline.until(
            lambda: "fostered" in timeline.marks,
            time.monotonic() + I20_DEADLINE_S,
            "snapshot with rank 1's children fostered",
        )

        def home(s: Snapshot) -> bool:
            return all(
                r["state"] == "online"
                and r.get("attached_to") == r["parent"]
                and not r.get("reattaching")
                for r in s["ranks"]
            )

        timeline.arm("home", home)
        argv = [str(TBON), "expand", inst.uri, "--fill", "--json", "--timeout", "30s"]
        with launched(argv, stdout=subprocess.PIPE) as expand:
            timeline.follow(expand)
            timeline.until(
                lambda: expand.ended is not None and "home" in timeline.marks,
                time.monotonic() + I20_DEADLINE_S,
                "exit of `tbon expand` and snapshot with every rank home",
            )
            out, _ = expand.process.communicate(timeout=CLI_DEADLINE_S)
        for joined in json.loads(out)["joined"]:
            pidfd = _pidfd(joined["pid"])
            if pidfd is not None:
                joiners.append(Stray(joined["pid"], pidfd))
        result.healed_shutdown = _shutdown(inst, number, "shutdown after a heal")


def issue20_round(sections: Sequence[str], number: int) -> Issue20Round:
    result = Issue20Round()
    steps = {
        "double": double_kill,
        "rank0": rank0_death,
        "shutdown": shutdowns,
        "subtree": dead_subtree,
    }
    for name, step in steps.items():
        if name in sections:
            with strays() as joiners:
                step(result, joiners, number)
    return result


def issue20_rows(rounds: Sequence[Issue20Round]) -> list[list[str]]:
    """One row per measure, as rows_of: each round, the median, the target."""

    def timed(label: str, values: list[float | None], target: float | None = None) -> list[str]:
        middle = median_of(values)
        judged = ""
        if target is not None:
            judged = f"≤ {target * 1000:g} ms {verdict(middle is not None and middle <= target)}"
        return [label, *(cell(v) for v in values), cell(middle), judged]

    rows = []
    if any(r.both_lost is not None or r.first_lost is not None for r in rounds):
        rows += [
            timed(
                "kill -9 of ranks 1 and 3 → rank 0 pushes rank 1 `lost`",
                [r.first_lost for r in rounds],
            ),
            timed(
                "kill -9 of ranks 1 and 3 → rank 0 pushes both `lost`",
                [r.both_lost for r in rounds],
                TARGET_BOTH_LOST_S,
            ),
        ]
    if any(r.all_gone is not None or r.depth_gone for r in rounds):
        depths = sorted({d for r in rounds for d in r.depth_gone})
        rows += [
            timed(
                f"  rank 0 killed → last broker at depth {d} exits",
                [r.depth_gone.get(d) for r in rounds],
            )
            for d in depths
        ]
        rows.append(
            timed(
                "kill -9 of rank 0 → every broker process gone",
                [r.all_gone for r in rounds],
                TARGET_ALL_GONE_S,
            )
        )
    if any(r.subtree_lost is not None for r in rounds):
        rows.append(
            timed(
                "SIGSTOP of rank 1, kill -9 of 3, 4, 7-10 → rank 0 pushes all seven `lost`",
                [r.subtree_lost for r in rounds],
                TARGET_SUBTREE_LOST_S,
            )
        )
    if any(r.healthy_shutdown is not None for r in rounds):
        ratios = [
            r.healed_shutdown / r.healthy_shutdown
            if r.healed_shutdown is not None and r.healthy_shutdown
            else None
            for r in rounds
        ]
        middle = median_of(ratios)
        rows += [
            timed(
                "shutdown of a healthy instance (SIGTERM → tbon start exits)",
                [r.healthy_shutdown for r in rounds],
            ),
            timed(
                "shutdown after a heal (rank 1 killed, expand, all home)",
                [r.healed_shutdown for r in rounds],
            ),
            [
                "  after a heal ÷ healthy",
                *("—" if v is None else f"{v:.1f}" for v in ratios),
                "—" if middle is None else f"{middle:.1f}",
                f"≤ {TARGET_SHUTDOWN_RATIO:g} "
                f"{verdict(middle is not None and middle <= TARGET_SHUTDOWN_RATIO)}",
            ],
        ]
    return rows


def report_issue20(report: Report, rounds: Sequence[Issue20Round]) -> None:
    header = ["measure", *(f"round {i + 1}" for i in range(len(rounds))), "median", "target"]
    report.heading(
        f"Issue 20: {I20_SIZE} ranks (kary:2, depth 3), tbon.timeout={I20_TIMEOUT_S:g}s, "
        f"broker.reattach-timeout={I20_REATTACH_S:g}s, "
        f"broker.shutdown-timeout={I20_SHUTDOWN_S:g}s; each measure a fresh instance (ms)"
    )
    report.table(header, issue20_rows(rounds))
    report.note(
        "Targets: both `lost` within tbon.timeout; every broker gone within tbon.timeout + "
        "broker.reattach-timeout of rank 0's death, whatever the depth; a subtree dead behind a "
        "stopped rank 1 all `lost` one grace (tbon.timeout + broker.reattach-timeout) after "
        "rank 1's silence is noticed, not one grace per level; a shutdown after a heal "
        f"at most {TARGET_SHUTDOWN_RATIO:g} times a healthy one. `lost` is timed at the arrival "
        "of rank 0's status.watch snapshot; each broker's exit on its pidfd; a shutdown from "
        "SIGTERM to `tbon start`'s exit. The launcher's exit timeout is 2 minutes, so that it "
        "kills nothing that outlives rank 0."
    )


# --- the report ---------------------------------------------------------------------------------


def cell(value: float | None) -> str:
    """Milliseconds, or a dash for an event that was not seen."""
    return "—" if value is None else ms(value)


def median_of(values: Sequence[float | None]) -> float | None:
    """The median of the values seen; None if none was (the dash in the table)."""
    seen = [v for v in values if v is not None]
    return median(seen) if seen else None


def yes_no(flags: Sequence[bool]) -> tuple[list[str], str]:
    """Cells for a yes/no measure, and its summary: yes only if every round said yes."""
    cells = ["yes" if flag else "NO" for flag in flags]
    summary = "yes" if all(flags) else f"NO ({flags.count(False)} of {len(flags)})"
    return cells, summary


def rows_of(rounds: Sequence[Round], shape: Shape) -> list[list[str]]:
    """One row per measure: each round's figure, the median, and the target where there is
    one."""
    others = idset(shape.others)

    def timed(label: str, values: list[float | None], target: float | None = None) -> list[str]:
        middle = median_of(values)
        judged = ""
        if target is not None:
            ok = middle is not None and middle <= target
            judged = f"≤ {target * 1000:g} ms {verdict(ok)}"
        return [label, *(cell(v) for v in values), cell(middle), judged]

    def flags(label: str, values: list[bool], target: str = "yes") -> list[str]:
        cells, summary = yes_no(values)
        judged = f"{target} {verdict(summary == 'yes')}"
        return [label, *cells, summary, judged]

    attempts = [float(r.attempts) for r in rounds]
    job = f"`sleep` on rank {shape.job_rank} (started before the kill) ends 0, `done` arrives"
    return [
        timed(
            f"for comparison: `tbon exec -r {others} true` before the kill",
            [r.exec_whole for r in rounds],
        ),
        timed(f"kill → rank 0 pushes rank {shape.victim} `lost`", [r.lost for r in rounds]),
        timed(
            f"kill → rank 0 pushes all {len(shape.others)} others attached",
            [r.reattached for r in rounds],
        ),
        timed(
            f"kill → `tbon exec -r {others} true` exits 0",
            [r.answered for r in rounds],
            TARGET_ANSWER_S,
        ),
        timed("  kill → Popen of that `tbon exec`", [r.answered_popen for r in rounds]),
        [
            "  `tbon exec` runs until one exited 0",
            *(f"{a:g}" for a in attempts),
            f"{median(attempts):g}",
            "",
        ],
        timed(
            f"`tbon expand --fill` Popen → rank {shape.victim} online, new incarnation",
            [r.replaced for r in rounds],
        ),
        timed(
            "`tbon expand --fill` Popen → rank 0 reads `full`",
            [r.full for r in rounds],
            TARGET_FULL_S,
        ),
        timed(
            "  joiner broker's process start → `full` (10 ms ticks)",
            [r.full_joiner for r in rounds],
        ),
        timed(
            "  `tbon expand --fill` Popen → joiner broker's process start",
            [r.joiner_start for r in rounds],
        ),
        timed(
            "`tbon expand --fill` Popen → every rank under its own parent", [r.home for r in rounds]
        ),
        timed("`tbon expand --fill` wall time (Popen → exit)", [r.expand_wall for r in rounds]),
        flags(
            f"pids of the {len(shape.others)} other ranks unchanged", [r.pids_kept for r in rounds]
        ),
        flags("  and their incarnations", [r.incarnations_kept for r in rounds]),
        flags(job, [r.job_ok for r in rounds]),
        timed("  kill → that job's `tbon exec` exits", [r.job_end for r in rounds]),
    ]


def report_tables(
    report: Report, rounds: Sequence[Round], shape: Shape, size: int, topo: str, sleep: float
) -> None:
    header = ["measure", *(f"round {i + 1}" for i in range(len(rounds))), "median", "target"]
    report.heading(
        f"Self-healing: SIGKILL rank {shape.victim} of {size} ranks ({topo}), "
        f"{len(rounds)} rounds, each a fresh instance (ms)"
    )
    report.table(header, rows_of(rounds, shape))
    fostered = sorted({f"{r} → {p}" for one in rounds for r, p in one.fostered.items()})
    after_home = [r.job_after_home for r in rounds if r.job_after_home is not None]
    kin = (
        f"a grandchild of rank {shape.victim}"
        if shape.job_is_grandchild
        else f"a child of rank {shape.victim} (it has no grandchildren)"
    )
    where = (
        f"The job's `done` arrived after every rank was home in {after_home.count(True)} of "
        f"{len(after_home)} rounds: the job outlived both moves of its rank's parent (to the "
        "foster parent, then home), and `done` came up through the replacement."
        if after_home
        else ""
    )
    report.note(
        f"Rank {shape.victim}'s subtree below it: {len(shape.below)} ranks "
        f"({idset(shape.below)}). Fostered, from rank 0's first snapshot with every other rank "
        f"attached (rank → foster parent): {', '.join(fostered) or 'none seen'}. The job: "
        f"`tbon exec -r {shape.job_rank} sh -c 'echo started; sleep {sleep:g}; echo done'` on "
        f"{kin}, rank {shape.victim} killed once `started` had arrived. {where}"
    )
    report.note(
        "`tbon exec` after the kill runs again as soon as the last run exits; its time includes "
        "the CLI's own start-up (the comparison row: the second of two runs on the whole tree, "
        "just before the kill). The expand's clock starts at its Popen; the joiner's start is "
        "its process's, from /proc/PID/stat. What rank 0 `pushes` and `reads` is timed at the "
        "arrival of its status.watch snapshot at an in-process client."
    )
    slowest = [
        f"round {i + 1}: rank {max(r.each, key=r.each.__getitem__)} at {ms(max(r.each.values()))}"
        for i, r in enumerate(rounds)
        if r.each
    ]
    report.note(
        f"The last of rank {shape.victim}'s children to be pushed attached again, ms after the "
        "kill: " + "; ".join(slowest or ["none seen"]) + "."
    )
    failures = [f"round {i + 1}: {f}" for i, r in enumerate(rounds) for f in r.failures]
    if failures:
        report.note("`tbon exec` runs after the kill that did not exit 0: " + "; ".join(failures))
    changed = [f"round {i + 1}: {idset(r.changed)}" for i, r in enumerate(rounds) if r.changed]
    if changed:
        report.note("Ranks whose pid or incarnation changed: " + "; ".join(changed))
    bad_jobs = [
        f"round {i + 1}: exit {r.job_exit}, printed {r.job_output!r}"
        for i, r in enumerate(rounds)
        if not r.job_ok
    ]
    if bad_jobs:
        report.note("The job did not end normally: " + "; ".join(bad_jobs))


def kill_json(
    rounds: Sequence[Round], shape: Shape, size: int, topo: str, sleep: float
) -> dict[str, Any]:
    """The kill-and-expand rounds as one object (the figures in seconds)."""
    medians = {
        name: median_of([getattr(r, name) for r in rounds])
        for name in (
            "exec_whole",
            "lost",
            "reattached",
            "answered",
            "answered_popen",
            "joiner_start",
            "replaced",
            "full",
            "full_joiner",
            "home",
            "expand_wall",
            "job_end",
        )
    }
    return {
        "machine": machine_line(),
        "size": size,
        "topo": topo,
        "victim": shape.victim,
        "below": shape.below,
        "job_rank": shape.job_rank,
        "sleep_s": sleep,
        "units": "seconds",
        "targets": {"answered": TARGET_ANSWER_S, "full": TARGET_FULL_S},
        "rounds": [asdict(r) for r in rounds],
        "median": medians,
        "met": {
            "answered": medians["answered"] is not None and medians["answered"] <= TARGET_ANSWER_S,
            "full": medians["full"] is not None and medians["full"] <= TARGET_FULL_S,
            "pids_kept": all(r.pids_kept for r in rounds),
            "job_ok": all(r.job_ok for r in rounds),
        },
    }


# --- main ---------------------------------------------------------------------------------------

SECTIONS = ("kill", "double", "rank0", "shutdown", "subtree", "takeover")


def sections_arg(text: str) -> list[str]:
    """`--sections double,rank0`: some of SECTIONS."""
    chosen = [word.strip() for word in text.split(",") if word.strip()]
    if not chosen or any(word not in SECTIONS for word in chosen):
        raise argparse.ArgumentTypeError(f"--sections: choose from {','.join(SECTIONS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh instances (default 3)")
    parser.add_argument("--size", type=int, default=64, help="ranks (default 64)")
    parser.add_argument("--topo", default="kary:4", help="tbon.topo (default kary:4)")
    parser.add_argument(
        "--sleep", type=positive, default=2.0, help="the job's sleep in seconds (default 2)"
    )
    parser.add_argument(
        "--sections",
        type=sections_arg,
        default=list(SECTIONS),
        help=f"which measures, of {','.join(SECTIONS)} (default all): kill is issue 12's "
        "kill and expand; double, rank0 and shutdown are issue 20's; takeover issue 23's",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="print GitHub tables")
    output.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.size < 3:
        parser.error("--size must be at least 3: rank 1 needs a subtree")
    if not TBON.exists():
        parser.error(f"no tbon console script at {TBON}: run with the project's .venv/bin/python")
    if args.json:  # stdout holds the JSON alone; the machine line goes with the progress
        with contextlib.redirect_stdout(sys.stderr):
            begin("heal", markdown=False)
        report = None
    else:
        report = begin("heal", args.markdown)
    rounds: list[Round] = []
    shape = None
    for number in range(1, args.rounds + 1 if "kill" in args.sections else 1):
        progress(f"round {number}/{args.rounds}: {args.size} ranks, {args.topo}")
        result, shape = one_round(args.size, args.topo, args.sleep, number)
        rounds.append(result)
        progress(
            f"round {number}: answered {cell(result.answered)} ms after the kill, full "
            f"{cell(result.full)} ms after expand's Popen, pids kept: {result.pids_kept}, "
            f"job ok: {result.job_ok}"
        )
    later = [s for s in args.sections if s not in ("kill", "takeover")]
    issue20: list[Issue20Round] = []
    for number in range(1, args.rounds + 1 if later else 1):
        progress(f"issue 20 round {number}/{args.rounds}: {','.join(later)}")
        issue20.append(issue20_round(later, number))
        progress(f"issue 20 round {number}: {asdict(issue20[-1])}")
    takeovers = []
    if "takeover" in args.sections:  # issue 23's rounds: benchmarks/takeover.py says what
        for number in range(1, args.rounds + 1):
            progress(f"takeover round {number}/{args.rounds}: {args.size} ranks, {args.topo}")
            takeovers.append(takeover.one_round(args.size, args.topo, 2, args.sleep, number))
            progress(f"takeover round {number}: {asdict(takeovers[-1])}")
    if report is None:
        found: dict[str, Any] = {"machine": machine_line()}
        if shape is not None:
            found = kill_json(rounds, shape, args.size, args.topo, args.sleep)
        if issue20:
            found["issue20"] = {
                "size": I20_SIZE,
                "attributes": list(I20_ATTRIBUTES),
                "units": "seconds",
                "targets": {
                    "both_lost": TARGET_BOTH_LOST_S,
                    "all_gone": TARGET_ALL_GONE_S,
                    "shutdown_ratio": TARGET_SHUTDOWN_RATIO,
                },
                "rounds": [asdict(r) for r in issue20],
            }
        if takeovers:
            found["takeover"] = {"standbys": 2, "rounds": [asdict(r) for r in takeovers]}
        print(json.dumps(found, indent=2), flush=True)
        return 0
    if takeovers:
        settings = argparse.Namespace(size=args.size, topo=args.topo, standbys=2)
        takeover.report_tables(report, takeovers, settings, {})
    if shape is not None:
        report_tables(report, rounds, shape, args.size, args.topo, args.sleep)
    if issue20:
        report_issue20(report, issue20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
