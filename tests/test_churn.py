"""A bounded churn soak (issue 20, item 3): kill -9, SIGSTOP/SIGCONT and `tbon expand --fill` at
random on 31 ranks (kary:2), with the two promises of docs/protocol.md §12 polled throughout:

(a) one rank, one broker: at most one live, running broker process claims each rank. What a
    process claims is its title, as `ps` shows it (`tbon broker rank R/N`); the brokers are those
    of this instance (tests/brokers.py). A stopped process (SIGSTOP) cannot serve: it does not
    count while stopped. Once two running brokers claim a rank (one woken after it was replaced,
    say), the issue's invariant gives the other tbon.timeout to be refused (77) or exit: a pair
    that lasts longer than tbon.timeout + MARGIN is a violation.
(b) status tells the truth: a rank that rank 0 shows `online` with the pid of a dead broker must
    read otherwise within tbon.timeout + MARGIN of the death. When a broker above it in the tree
    was killed or stopped around that time, nobody may be left to see the death: the rank is
    adrift, and rank 0's own rule (lost after tbon.timeout + broker.reattach-timeout adrift,
    counted once its parent's loss is known) gives it 2 x tbon.timeout + reattach + MARGIN.

The run is seeded (TBON_SOAK_SEED, else random, printed: the same seed makes the same choices,
though the machine's timing may not repeat), lasts TBON_SOAK_SECONDS (default 60,
at most SOAK_CAP_S) and starts at most MAX_BROKERS brokers in all. At the end every stopped
broker is woken, the instance shut down, and every broker it ever had (those `tbon start` forked
and those our `tbon expand` started in their own sessions) must be gone; the ones left are killed
by PID and the test fails.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from brokers import (
    BROKER_COMM,
    Proc,
    alive,
    claimed_rank,
    instance_brokers,
    instance_rundir,
    read_proc,
)
from conftest import TBON, Instance, child_env

from tbon.errors import TbonError

SIZE = 31
TIMEOUT_S = 2.0
REATTACH_S = 2.0
ATTRIBUTES = (
    "tbon.topo=kary:2",
    "tbon.heartbeat=200ms",
    "tbon.torpid=0",
    f"tbon.timeout={TIMEOUT_S:g}s",
    f"broker.reattach-timeout={REATTACH_S:g}s",
    "broker.shutdown-timeout=5s",
)
MARGIN_S = 2.0  # polling and a loaded 2-core machine, on top of what the rules allow
DUPLICATE_GRACE_S = TIMEOUT_S + MARGIN_S
DEAD_GRACE_S = TIMEOUT_S + MARGIN_S
ADRIFT_GRACE_S = 2 * TIMEOUT_S + REATTACH_S + MARGIN_S

DEFAULT_SOAK_S = 60.0
SOAK_CAP_S = 1800.0
MAX_BROKERS = 200  # every broker this instance ever had, the 31 it started with included
MAX_STOPPED = 2
POLL_S = 0.25  # the pace of the invariant checks (a paced loop, not a wait for a condition)
EXPAND_TIMEOUT = "15s"
END_DEADLINE_S = 30.0


def soak_seconds() -> float:
    text = os.environ.get("TBON_SOAK_SECONDS", "")
    seconds = float(text) if text else DEFAULT_SOAK_S
    return max(1.0, min(seconds, SOAK_CAP_S))


def ancestors(rank: int) -> set[int]:
    """Every rank above `rank` in kary:2 (a foster parent is always one of them)."""
    found = set()
    while rank > 0:
        rank = (rank - 1) // 2
        found.add(rank)
    return found


def signal_broker(pid: int, signum: int) -> bool:
    """Signal one of this instance's brokers by PID, unless it has gone (False then): a pid we
    found as a broker is still one while it is not reaped, and is never reused before."""
    proc = read_proc(pid)
    if proc is None or proc.gone or proc.comm != BROKER_COMM:
        return False
    os.kill(pid, signum)
    return True


@dataclass
class Step:
    at: float
    kind: str  # kill, stop, cont, expand, expand-done, note
    rank: int | None
    pid: int | None
    text: str


@dataclass
class Soak:
    inst: Instance
    rng: random.Random
    t0: float = field(default_factory=time.monotonic)
    steps: list[Step] = field(default_factory=list)
    violations: dict[tuple[str, int, int], str] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)  # every broker pid of this instance, ever
    rank_of: dict[int, int] = field(default_factory=dict)  # pid -> the rank status showed it in
    incarnation_of: dict[int, int] = field(default_factory=dict)  # pid -> status's incarnation
    open_violations: dict[tuple[str, int, int], float] = field(default_factory=dict)  # -> since
    stopped: dict[int, float] = field(default_factory=dict)  # pid -> when to wake it
    died: dict[int, float] = field(default_factory=dict)  # pid -> when it was killed/seen dead
    duplicate_since: dict[int, float] = field(default_factory=dict)  # rank -> first seen
    procs: dict[int, Proc] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    expand: subprocess.Popen[str] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    longest: dict[str, float] = field(default_factory=dict)  # the worst seen, within grace or not

    def __post_init__(self) -> None:
        self.root = self.inst.process.pid
        self.rundir = instance_rundir(self.inst.uri)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, kind: str, rank: int | None, pid: int | None, text: str) -> None:
        self.steps.append(Step(self.now(), kind, rank, pid, text))
        self.counts[kind] = self.counts.get(kind, 0) + 1

    # --- looking ------------------------------------------------------------------------------

    def look(self) -> None:
        """Read /proc and rank 0's status, and check both invariants against them."""
        self.procs = instance_brokers(self.root, self.rundir)
        self.seen.update(self.procs)
        try:
            self.status = self.inst.status()
        except TbonError as error:
            self.log("note", None, None, f"status.get failed: {error}")
            return
        for entry in self.status["ranks"]:
            if entry["pid"]:
                self.rank_of[entry["pid"]] = entry["rank"]
                self.incarnation_of[entry["pid"]] = entry["incarnation"]
                self.seen.add(entry["pid"])
        for pid in self.seen:
            if pid not in self.died and not alive(pid):
                self.died[pid] = self.now()
        still = self.check_one_holder() | self.check_truthful()
        for key, since in list(self.open_violations.items()):
            if key not in still:  # the episode is over: say how long it lasted in all
                del self.open_violations[key]
                self.violations[key] += f"; it lasted {self.now() - since:.1f}s in all"

    def claim(self, pid: int) -> int | None:
        rank = claimed_rank(pid)
        return rank if rank is not None else self.rank_of.get(pid)

    def check_one_holder(self) -> set[tuple[str, int, int]]:
        """Ranks claimed by two running brokers; the keys of those past their grace."""
        now = self.now()
        going: set[tuple[str, int, int]] = set()
        holders: dict[int, list[int]] = {}
        for pid, proc in self.procs.items():
            if proc.stopped or not alive(pid):
                continue
            rank = self.claim(pid)
            if rank is not None:
                holders.setdefault(rank, []).append(pid)
        for rank in list(self.duplicate_since):
            if len(holders.get(rank, [])) < 2:
                del self.duplicate_since[rank]
        for rank, pids in holders.items():
            if len(pids) < 2:
                continue
            since = self.duplicate_since.setdefault(rank, now)
            self.note_longest("two holders", now - since)
            if now - since > DUPLICATE_GRACE_S:
                entry = self.status["ranks"][rank] if self.status else {}
                named = [f"{pid} (inc {self.incarnation_of.get(pid, '?')})" for pid in sorted(pids)]
                key = ("two holders", rank, min(pids))
                going.add(key)
                self.violate(
                    key,
                    since,
                    f"t={now:.1f}s: rank {rank} claimed by {len(pids)} running brokers "
                    f"{', '.join(named)} for {now - since:.1f}s (> {DUPLICATE_GRACE_S:g}s); "
                    f"status shows pid {entry.get('pid')} incarnation "
                    f"{entry.get('incarnation')} {entry.get('state')}",
                )
        return going

    def check_truthful(self) -> set[tuple[str, int, int]]:
        """Ranks shown online with a dead pid; the keys of those past their grace."""
        now = self.now()
        going: set[tuple[str, int, int]] = set()
        for entry in self.status["ranks"]:
            rank, pid = entry["rank"], entry["pid"]
            if entry["state"] != "online" or not pid:
                continue
            if alive(pid):
                claimed = claimed_rank(pid)
                if claimed is not None and claimed != rank:
                    key = ("wrong pid", rank, pid)
                    going.add(key)
                    self.violate(
                        key,
                        now,
                        f"t={now:.1f}s: rank {rank} shown online with pid {pid}, whose title "
                        f"claims rank {claimed}",
                    )
                continue
            death = self.died.setdefault(pid, now)
            adrift = self.above_disturbed(rank, death)
            grace = ADRIFT_GRACE_S if adrift else DEAD_GRACE_S
            self.note_longest("online but dead" + (" (adrift)" if adrift else ""), now - death)
            if now - death > grace:
                key = ("online but dead", rank, pid)
                going.add(key)
                self.violate(
                    key,
                    death,
                    f"t={now:.1f}s: rank {rank} still shown online with pid {pid} (inc "
                    f"{entry['incarnation']}), dead since t={death:.1f}s ({now - death:.1f}s > "
                    f"{grace:g}s)",
                )
        return going

    def above_disturbed(self, rank: int, death: float) -> bool:
        """Whether a broker above `rank` was killed or stopped near its death or since."""
        above = ancestors(rank)
        start = death - TIMEOUT_S - REATTACH_S - MARGIN_S
        return any(
            s.kind in ("kill", "stop") and s.rank in above and s.at >= start for s in self.steps
        )

    def note_longest(self, what: str, seconds: float) -> None:
        self.longest[what] = max(self.longest.get(what, 0.0), seconds)

    def violate(self, key: tuple[str, int, int], since: float, text: str) -> None:
        """Record a violation once, when it is first seen past its grace."""
        if key not in self.violations:
            self.violations[key] = text
            self.open_violations[key] = since
            self.log("violation", key[1], key[2], text)

    # --- acting -------------------------------------------------------------------------------

    def running_ranks(self) -> list[tuple[int, int]]:
        """(rank, pid) of the ranks shown online whose broker is ours and running, but rank 0."""
        found = []
        for entry in self.status.get("ranks", [])[1:]:
            proc = self.procs.get(entry["pid"] or 0)
            if entry["state"] == "online" and proc is not None and not proc.stopped:
                found.append((entry["rank"], proc.pid))
        return found

    def step(self) -> None:
        choices = ["kill"] * 3
        if len(self.stopped) < MAX_STOPPED:
            choices += ["stop"] * 3
        holes = [
            r["rank"] for r in self.status.get("ranks", []) if r["state"] in ("lost", "vacant")
        ]
        if self.expand is None and holes and len(self.seen) + len(holes) <= MAX_BROKERS:
            choices += ["expand"] * 3
        kind = self.rng.choice(choices)
        candidates = self.running_ranks()
        if kind == "expand":
            self.start_expand(holes)
            return
        if not candidates:
            return
        # Half the time, aim where healing is under way: kill a broker with children, stop a
        # fostered one (attached away from home), as a cluster's failures cluster.
        ranks = self.status["ranks"]
        if kind == "kill":
            aimed = [(r, p) for r, p in candidates if ranks[r]["children"]]
        else:
            aimed = [
                (r, p) for r, p in candidates if ranks[r].get("attached_to") != ranks[r]["parent"]
            ]
        rank, pid = self.rng.choice(aimed if aimed and self.rng.random() < 0.5 else candidates)
        incarnation = ranks[rank]["incarnation"]
        if not signal_broker(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP):
            return  # it exited since we looked
        if kind == "kill":
            self.died.setdefault(pid, self.now())
            self.log("kill", rank, pid, f"kill -9 rank {rank} pid {pid} inc {incarnation}")
            return
        pause = self.rng.uniform(0.3, 3 * TIMEOUT_S)
        self.stopped[pid] = time.monotonic() + pause
        where = ranks[rank].get("attached_to")
        self.log(
            "stop",
            rank,
            pid,
            f"SIGSTOP rank {rank} pid {pid} inc {incarnation} (attached to {where}) "
            f"for {pause:.1f}s",
        )

    def wake_due(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for pid, due in list(self.stopped.items()):
            if everyone or now >= due:
                del self.stopped[pid]
                signal_broker(pid, signal.SIGCONT)
                self.log("cont", self.rank_of.get(pid), pid, f"SIGCONT pid {pid}")

    def start_expand(self, holes: list[int]) -> None:
        self.expand = subprocess.Popen(
            [TBON, "expand", self.inst.uri, "--fill", "--json", "--timeout", EXPAND_TIMEOUT],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.log("expand", None, self.expand.pid, f"tbon expand --fill (holes {holes})")

    def reap_expand(self, wait: float = 0.0) -> None:
        expand = self.expand
        if expand is None:
            return
        try:
            out, err = expand.communicate(timeout=wait) if wait else (None, None)
        except subprocess.TimeoutExpired:
            expand.kill()
            out, err = expand.communicate()
        if expand.poll() is None:
            return
        if out is None:
            out, err = expand.communicate()
        self.expand = None
        try:
            joined = json.loads(out)["joined"]
        except (ValueError, KeyError, TypeError):
            joined = []
        self.seen.update(entry["pid"] for entry in joined if entry.get("pid"))
        said = (err or "").strip().splitlines()[-1:] or [""]
        self.log(
            "expand-done",
            None,
            expand.pid,
            f"tbon expand exited {expand.returncode}: joined "
            f"{[(e.get('rank'), e.get('pid')) for e in joined]} {said[0]}",
        )

    # --- the end ------------------------------------------------------------------------------

    def finish(self) -> list[str]:
        """Wake everyone, shut down, and reap: what was left running, killed by PID."""
        self.wake_due(everyone=True)
        for proc in instance_brokers(self.root, self.rundir).values():
            if proc.stopped:  # one we did not stop ourselves: still ours, by its title
                signal_broker(proc.pid, signal.SIGCONT)
        self.seen.update(instance_brokers(self.root, self.rundir))
        self.reap_expand(wait=END_DEADLINE_S)
        problems = []
        try:
            self.inst.stop()
        except AssertionError as error:
            problems.append(f"tbon start's shutdown: {error}")
        deadline = time.monotonic() + END_DEADLINE_S
        while time.monotonic() < deadline and any(alive(pid) for pid in self.seen):
            time.sleep(0.05)
        left = sorted(pid for pid in self.seen if alive(pid))
        for pid in left:
            signal_broker(pid, signal.SIGKILL)
        if left:
            problems.append(f"brokers still running {END_DEADLINE_S:g}s after shutdown: {left}")
        return problems

    def story(self, last: int = 80) -> str:
        lines = [f"  t={s.at:6.2f}s {s.kind:11} {s.text}" for s in self.steps[-last:]]
        return "\n".join(lines)


def test_churn_keeps_one_broker_per_rank_and_status_truthful() -> None:
    seed = int(os.environ.get("TBON_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    seconds = soak_seconds()
    rerun = f"TBON_SOAK_SEED={seed} TBON_SOAK_SECONDS={seconds:g}"
    print(f"churn soak: seed {seed}, {seconds:g}s ({rerun})")
    inst = Instance(SIZE, *ATTRIBUTES, exit_timeout="5s")
    soak = Soak(inst, random.Random(seed))
    problems: list[str] = []
    try:
        soak.look()
        end = time.monotonic() + seconds
        next_step = time.monotonic() + soak.rng.uniform(0.3, 1.2)
        while time.monotonic() < end:
            soak.wake_due()
            soak.reap_expand()
            soak.look()
            if time.monotonic() >= next_step and len(soak.seen) < MAX_BROKERS:
                soak.step()
                next_step = time.monotonic() + soak.rng.uniform(0.3, 1.2)
            time.sleep(POLL_S)
    finally:
        for key, since in soak.open_violations.items():
            soak.violations[key] += f"; still so when the churn ended, {soak.now() - since:.1f}s"
        soak.open_violations.clear()
        problems = soak.finish()
    summary = (
        f"seed {seed}; {soak.now():.0f}s; steps {soak.counts}; brokers ever {len(soak.seen)}; "
        f"longest { ({k: round(v, 1) for k, v in soak.longest.items()}) }; "
        f"rerun with {rerun} .venv/bin/python -m pytest -s tests/test_churn.py"
    )
    print(summary)
    found = list(soak.violations.values()) + problems
    assert not found, (
        f"{len(found)} violations ({summary}):\n"
        + "\n".join(found)
        + f"\nsteps (last 80):\n{soak.story()}"
    )
