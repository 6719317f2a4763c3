"""Which broker processes belong to a test's instance, and what each of them claims to be.

A black-box view from /proc, as `ps` shows it: a broker's title is `tbon broker rank R/N ...`
once it has its rank (tbon/proctitle.py), its name `tbon-broker`. An instance's brokers are the
descendants of its `tbon start`, plus the brokers `tbon expand` started in their own sessions,
whose titles name the instance's run directory (their boot servers and run directories lie under
it). Nothing here signals a process: the tests decide, by PID, from what this finds.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

BROKER_COMM = "tbon-broker"
_TITLE_RANK = re.compile(r"^tbon broker rank (\d+)/\d+")


@dataclass(frozen=True)
class Proc:
    """One process as /proc showed it a moment ago."""

    pid: int
    ppid: int
    state: str  # the one-letter state of /proc/PID/stat: R, S, T (stopped), Z (zombie), ...
    comm: str

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP) or traced: alive, but it cannot run."""
        return self.state in ("T", "t")

    @property
    def gone(self) -> bool:
        """Dead: a zombie runs no more, whether or not it has been reaped."""
        return self.state in ("Z", "X", "x")


def read_proc(pid: int) -> Proc | None:
    """The process `pid`, or None once it has exited and been reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    return Proc(pid, int(fields[1]), fields[0], head.partition("(")[2])


def alive(pid: int) -> bool:
    """Neither reaped nor a zombie (a stopped process is alive)."""
    proc = read_proc(pid)
    return proc is not None and not proc.gone


def title(pid: int) -> str:
    """The process's command line as `ps` shows it ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def claimed_rank(pid: int) -> int | None:
    """The rank a broker's title says it holds; None before it has one, or if it is gone."""
    found = _TITLE_RANK.match(title(pid))
    return int(found.group(1)) if found else None


def all_procs() -> dict[int, Proc]:
    """Every process this user can see now."""
    procs: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := read_proc(int(name))) is not None:
            procs[proc.pid] = proc
    return procs


def instance_rundir(uri: str) -> str:
    """`local:///X/0/local` (rank 0's socket under `tbon start`'s run directory X) -> `X/`."""
    path = uri.removeprefix("local://")
    return os.path.dirname(os.path.dirname(path)) + "/"


def instance_brokers(root: int, rundir: str) -> dict[int, Proc]:
    """The live broker processes of the instance whose `tbon start` is `root` and whose run
    directory is `rundir`: descendants of `root`, and brokers whose title names `rundir`."""
    procs = all_procs()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    below: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in below:
                below.add(child)
                todo.append(child)
    found: dict[int, Proc] = {}
    for proc in procs.values():
        if proc.comm != BROKER_COMM or proc.gone:
            continue
        if proc.pid in below or rundir in title(proc.pid):
            found[proc.pid] = proc
    return found
