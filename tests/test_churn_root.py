"""A bounded churn soak that includes the root (issue 23): kill -9 at random on 13 ranks
(kary:4, tbon.standbys=2), once the root itself, and the lost ranks refilled with `tbon
expand`, while the invariants of docs/protocol.md §12 and §13.7 are polled through the URI list
taken before the root died (`tbon uri --all`), against /proc:

- one rank, one broker: no two running brokers of this instance claim one rank (their titles,
  `tbon broker rank R/N`) for longer than tbon.timeout + MARGIN_S; no two online ranks share a
  pid; every online rank's pid is one of this instance's brokers, whose title claims that rank;
- status tells the truth: a rank shown online with a dead pid reads otherwise within
  tbon.timeout + MARGIN_S of the death (twice the timeout plus the reattach grace when a broker
  above it, the root included, was killed around then: nobody may be left to see it);
- the root status names is a live broker, one of the root group (ranks 0 to 2), and status
  answers again within NO_ANSWER_S of its last answer;
- at the end every rank is online with a live broker, or lost or vacant with its broker gone.

Kills keep a majority of the root group alive (otherwise the instance ends by design, §13.6): a
standby only while the root and the other standby are online and the other holds the whole
log, the root once (when both standbys do), no member after that. Rank 0 is not refilled (not
built: §13.6), nor its children once it is gone (their parent is lost for good). The run is
seeded (TBON_SOAK_SEED, printed), lasts TBON_ROOT_SOAK_SECONDS (default DEFAULT_SOAK_S, at most
SOAK_CAP_S: the test stays within about 90 s) and never has more than 16 brokers running.
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

from brokers import BROKER_COMM, alive, claimed_rank, instance_brokers, instance_rundir, read_proc
from conftest import TBON, Instance, child_env, tbon

from tbon.errors import TbonError
from tbon.overlay.connectors.client import connect
from tbon.overlay.state.topology import Topology

SIZE = 13
KARY4 = Topology("kary:4", SIZE)  # the instance's tree: whose ancestors a rank has
MEMBERS = (0, 1, 2)
TIMEOUT_S = 2.0
REATTACH_S = 2.0
ATTRIBUTES = (
    "tbon.standbys=2",
    "tbon.topo=kary:4",
    "tbon.heartbeat=200ms",
    "tbon.torpid=0",
    f"tbon.timeout={TIMEOUT_S:g}s",
    f"broker.reattach-timeout={REATTACH_S:g}s",
    "broker.join-timeout=10s",
    "broker.shutdown-timeout=5s",
)
MARGIN_S = 2.0  # polling and a loaded 2-core machine
DUPLICATE_GRACE_S = TIMEOUT_S + MARGIN_S
DEAD_GRACE_S = TIMEOUT_S + MARGIN_S
ADRIFT_GRACE_S = 2 * TIMEOUT_S + REATTACH_S + MARGIN_S
NO_ANSWER_S = 10.0  # the takeover is about a second; a loaded machine makes it more
DEFAULT_SOAK_S = 40.0
SOAK_CAP_S = 50.0
MAX_RUNNING = 16
MAX_EVER = 60
POLL_S = 0.25
EXPAND_TIMEOUT = "15s"
END_DEADLINE_S = 20.0


@dataclass
class Soak:
    inst: Instance
    uris: str
    rng: random.Random
    t0: float = field(default_factory=time.monotonic)
    story: list[str] = field(default_factory=list)
    violations: dict[tuple[str, int, int], str] = field(default_factory=dict)
    ours: set[int] = field(default_factory=set)  # every broker pid of this instance, ever
    died: dict[int, float] = field(default_factory=dict)  # pid -> when killed or seen dead
    killed: list[tuple[float, int]] = field(default_factory=list)  # (when, rank)
    shot: set[int] = field(default_factory=set)  # the pids this soak killed
    duplicate_since: dict[int, float] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    answered: float = 0.0
    holder: dict[int, int] = field(default_factory=dict)  # rank -> the last pid shown for it
    root_killed: bool = False
    expand: subprocess.Popen[str] | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rundir = instance_rundir(self.inst.uri)
        self.answered = self.now()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, kind: str, text: str) -> None:
        self.story.append(f"t={self.now():6.2f}s {kind:9} {text}")
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def violate(self, key: tuple[str, int, int], text: str) -> None:
        if key not in self.violations:
            self.violations[key] = f"t={self.now():.1f}s: {text}"
            self.log("violation", text)

    # --- looking ------------------------------------------------------------------------------

    def running(self) -> set[int]:
        found = set(instance_brokers(self.inst.process.pid, self.rundir))
        self.ours.update(found)
        self.inst.broker_pids.update(found)  # reaped and checked at the instance's stop
        return {pid for pid in found if alive(pid)}

    def read_status(self) -> dict[str, Any] | None:
        try:
            with connect(self.uris) as client:
                return client.rpc("status.get", nodeid=0, timeout=2.0)
        except TbonError as error:
            if self.now() - self.answered > NO_ANSWER_S:
                self.violate(("no answer", -1, 0), f"no status for {NO_ANSWER_S:g}s: {error}")
            return None

    def look(self) -> None:
        running = self.running()
        status = self.read_status()
        for pid in self.ours:
            if pid not in self.died and not alive(pid):
                self.died[pid] = self.now()
        self.check_one_holder(running)
        if status is None:
            return
        self.status, self.answered = status, self.now()
        root = status["root"]
        if root not in MEMBERS or not alive(status["ranks"][root]["pid"] or 0):
            self.violate(("root", root, 0), f"status names root {root}, not a live member")
        online = [r for r in status["ranks"] if r["state"] in ("online", "retiring")]
        shown = [r["pid"] for r in online]
        if len(shown) != len(set(shown)):
            self.violate(("shared pid", 0, 0), f"two online ranks share a pid: {shown}")
        for entry in online:
            self.check_online(entry)

    def check_online(self, entry: dict[str, Any]) -> None:
        rank, pid = entry["rank"], entry["pid"]
        self.holder[rank] = pid
        if pid not in self.ours:
            self.ours.update(self.running())
        if alive(pid):
            if pid not in self.ours:
                self.violate(
                    ("not ours", rank, pid), f"rank {rank} online with pid {pid}: not ours"
                )
            elif claimed_rank(pid) not in (None, rank):
                self.violate(
                    ("wrong pid", rank, pid), f"rank {rank} online with pid {pid} of another rank"
                )
            return
        death = self.died.setdefault(pid, self.now())
        above = set(KARY4.ancestors(rank))
        adrift = any(r in above and when >= death - ADRIFT_GRACE_S for when, r in self.killed)
        grace = ADRIFT_GRACE_S if adrift else DEAD_GRACE_S
        if self.now() - death > grace:
            self.violate(
                ("online but dead", rank, pid),
                f"rank {rank} shown online with pid {pid}, dead since t={death:.1f}s "
                f"(> {grace:g}s)",
            )

    def check_one_holder(self, running: set[int]) -> None:
        holders: dict[int, list[int]] = {}
        for pid in running:
            proc = read_proc(pid)
            rank = claimed_rank(pid)
            if proc is not None and not proc.stopped and rank is not None:
                holders.setdefault(rank, []).append(pid)
        for rank in list(self.duplicate_since):
            if len(holders.get(rank, [])) < 2:
                del self.duplicate_since[rank]
        for rank, pids in holders.items():
            if len(pids) > 1:
                since = self.duplicate_since.setdefault(rank, self.now())
                if self.now() - since > DUPLICATE_GRACE_S:
                    self.violate(("two holders", rank, min(pids)), f"rank {rank} held by {pids}")

    # --- acting -------------------------------------------------------------------------------

    def entry(self, rank: int) -> dict[str, Any]:
        return self.status["ranks"][rank]

    def whole_log(self, rank: int) -> bool:
        """Whether standby `rank` is online and holds everything the root committed."""
        group = self.status.get("group") or {}
        acked = {s["rank"]: s["acked"] for s in group.get("standbys", [])}
        return (
            self.entry(rank)["state"] == "online"
            and not group.get("paused")
            and acked.get(rank, -1) >= group.get("commit", 0)
        )

    def killable(self) -> list[int]:
        """Ranks whose kill keeps a majority of the root group (the module's docstring)."""
        if not self.status:
            return []
        root = self.status["root"]
        found = []
        for entry in self.status["ranks"]:
            rank, pid = entry["rank"], entry["pid"]
            if entry["state"] != "online" or not pid or not alive(pid) or pid not in self.ours:
                continue
            if rank == root:
                continue  # the root only by kill_root
            if rank in MEMBERS:
                other = 3 - rank  # the other standby
                if self.root_killed or root != 0 or not self.whole_log(other):
                    continue
            found.append(rank)
        return found

    def kill(self, rank: int, why: str) -> None:
        pid = self.entry(rank)["pid"]
        proc = read_proc(pid)
        if proc is None or proc.gone or proc.comm != BROKER_COMM or pid not in self.ours:
            return
        os.kill(pid, signal.SIGKILL)  # one of this instance's brokers, by PID
        self.died.setdefault(pid, self.now())
        self.shot.add(pid)
        self.killed.append((self.now(), rank))
        self.log(
            "kill", f"kill -9 rank {rank} pid {pid} inc {self.entry(rank)['incarnation']}{why}"
        )

    def root_may_die(self) -> bool:
        recent = any(r in MEMBERS and self.now() - when < 3.0 for when, r in self.killed)
        return (
            not self.root_killed
            and self.status.get("root") == 0
            and not recent
            and self.whole_log(1)
            and self.whole_log(2)
        )

    def holes(self) -> list[int]:
        """Lost or vacant ranks a broker may be started for: not rank 0, nor (once it is gone)
        its children."""
        root_gone = self.entry(0)["state"] != "online"
        return [
            r["rank"]
            for r in self.status.get("ranks", [])
            if r["state"] in ("lost", "vacant")
            and r["rank"] != 0
            and not (root_gone and r["parent"] == 0)
        ]

    def step(self, running: int, soak_s: float) -> None:
        if not self.status:
            return
        late = self.now() > 0.4 * soak_s
        if late and self.root_may_die():
            self.root_killed = True
            self.kill(0, " (the root)")
            return
        holes = self.holes()
        choices = []
        if self.expand is None and holes and running + len(holes) <= MAX_RUNNING:
            choices += ["expand"] * 2
        killable = self.killable()
        if late and not self.root_killed:  # the standbys are kept for the root's turn
            killable = [r for r in killable if r not in MEMBERS]
        if killable and len(self.ours) < MAX_EVER:
            choices += ["kill"] * 3
        if not choices:
            return
        if self.rng.choice(choices) == "expand":
            self.start_expand(holes)
        else:
            self.kill(self.rng.choice(killable), "")

    def start_expand(self, holes: list[int]) -> None:
        ranks = ",".join(map(str, holes))
        self.expand = subprocess.Popen(
            [TBON, "expand", "-r", ranks, "--json", "--timeout", EXPAND_TIMEOUT, self.uris],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.log("expand", f"tbon expand -r {ranks}")

    def reap_expand(self, wait: float = 0.0) -> None:
        expand = self.expand
        if expand is None or (not wait and expand.poll() is None):
            return
        try:
            out, err = expand.communicate(timeout=wait or None)
        except subprocess.TimeoutExpired:
            expand.kill()
            out, err = expand.communicate()
        self.expand = None
        try:
            report = json.loads(out)
        except ValueError:
            report = {"joined": [], "failed": []}
        self.ours.update(e["pid"] for e in report["joined"])
        failed = [(f["rank"], f["exit_code"]) for f in report["failed"]]
        # A joiner may fail by 75 (no parent) or 69 (no rank); or by this soak's own kill -9, of
        # a joiner it saw online (its title names the instance) before expand had seen it so.
        unexplained = [
            f
            for f in report["failed"]
            if f["exit_code"] not in (75, 69)
            and not (f["exit_code"] == -signal.SIGKILL and f["pid"] in self.shot)
        ]
        if expand.returncode not in (0, 1, 69) or unexplained:
            self.violate(
                ("expand", expand.pid, 0),
                f"tbon expand exited {expand.returncode}, joiners {failed}: {err.strip()}",
            )
        joined = [(e["rank"], e["pid"]) for e in report["joined"]]
        self.log("expanded", f"exit {expand.returncode}: joined {joined}, failed {failed}")
        if joined:
            self.refresh_uris()

    def refresh_uris(self) -> None:
        """A refilled standby's socket is its joiner's, not the launched broker's: as a user
        would, take `tbon uri --all` again (through the list we have), the new root and
        standbys first, then the URIs we knew (at most 16)."""
        listed = tbon("uri", "--all", self.uris)
        if listed.returncode != 0:
            return
        fresh = listed.stdout.strip().split(",")
        known = [u for u in self.uris.split(",") if u not in fresh]
        self.uris = ",".join([*fresh, *known][:16])

    # --- the end ------------------------------------------------------------------------------

    def settled(self) -> list[str]:
        """What is not yet true of the end: every rank online with a live broker, or lost or
        vacant with the broker last shown for it gone."""
        wrong = []
        for entry in self.status.get("ranks", []):
            rank, pid = entry["rank"], entry["pid"]
            if entry["state"] == "online":
                if not pid or not alive(pid):
                    wrong.append(f"rank {rank} online, its broker {pid} gone")
            elif entry["state"] in ("lost", "vacant"):
                last = self.holder.get(rank)
                if last is not None and alive(last):
                    wrong.append(f"rank {rank} {entry['state']}, its broker {last} alive")
            else:
                wrong.append(f"rank {rank} {entry['state']}")
        return wrong


def soak_seconds() -> float:
    text = os.environ.get("TBON_ROOT_SOAK_SECONDS", "")
    return max(5.0, min(float(text) if text else DEFAULT_SOAK_S, SOAK_CAP_S))


def test_churn_with_the_root_keeps_one_broker_per_rank_and_status_truthful() -> None:
    seed = int(os.environ.get("TBON_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    seconds = soak_seconds()
    rerun = f"TBON_SOAK_SEED={seed} TBON_ROOT_SOAK_SECONDS={seconds:g}"
    print(f"root churn soak: seed {seed}, {seconds:g}s ({rerun})")
    inst = Instance(SIZE, *ATTRIBUTES, exit_timeout="5s")
    problems: list[str] = []
    soak: Soak | None = None
    try:
        listed = tbon("uri", "--all", inst.uri)
        assert listed.returncode == 0, listed.stderr
        soak = Soak(inst, listed.stdout.strip(), random.Random(seed))
        soak.look()
        end = time.monotonic() + seconds
        next_step = time.monotonic() + soak.rng.uniform(0.5, 1.5)
        while time.monotonic() < end:
            soak.reap_expand()
            soak.look()
            running = len(soak.running())
            if running > MAX_RUNNING:
                soak.violate(("too many", running, 0), f"{running} brokers running")
            if time.monotonic() >= next_step:
                soak.step(running, seconds)
                next_step = time.monotonic() + soak.rng.uniform(0.5, 1.5)
            time.sleep(POLL_S)  # the pace of the checks (a paced loop, not a wait)
        soak.reap_expand(wait=30.0)
        deadline = time.monotonic() + END_DEADLINE_S
        while True:
            soak.look()
            wrong = soak.settled()
            if not wrong or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        if wrong:
            problems.append(f"not settled {END_DEADLINE_S:g}s after the churn: {wrong}")
        if not soak.root_killed:
            problems.append("the root was never killed (its standbys never both caught up)")
    finally:
        if soak is not None and soak.expand is not None:
            soak.reap_expand(wait=30.0)
        ours = set() if soak is None else soak.running() | soak.ours
        try:
            inst.stop()
        except AssertionError as error:
            problems.append(f"tbon start's shutdown: {error}")
        deadline = time.monotonic() + END_DEADLINE_S
        while time.monotonic() < deadline and any(alive(pid) for pid in ours):
            time.sleep(0.05)
        left = sorted(pid for pid in ours if alive(pid))
        for pid in left:
            proc = read_proc(pid)
            if proc is not None and proc.comm == BROKER_COMM:
                os.kill(pid, signal.SIGKILL)
        if left:
            problems.append(f"brokers still running after shutdown: {left}")
    assert soak is not None
    summary = (
        f"seed {seed}; {soak.now():.0f}s; steps {soak.counts}; brokers ever {len(soak.ours)}; "
        f"rerun with {rerun} .venv/bin/python -m pytest -s tests/test_churn_root.py"
    )
    print("\n".join(soak.story))
    print(summary)
    found = list(soak.violations.values()) + problems
    assert not found, (
        f"{len(found)} violations ({summary}):\n"
        + "\n".join(found)
        + "\nsteps:\n"
        + "\n".join(soak.story[-80:])
    )
