"""How many brokers this machine can hold: `tbon start` refuses to fork more (--force overrides).

`refusal(size, machine)` is pure: what `size` brokers cost against what the machine has, both
given, and why they do not fit, if they do not. `this_machine()` is the thin reader of /proc,
the cgroup files and the rlimits that fills in a `Machine`.

What one broker forked by `tbon start` costs, measured on Linux x86-64 (Python 3.11, pyzmq 27)
with 16 and 64 brokers, after `tbon exec -r all true` and `tbon status` had run in them:

* memory: a forked broker shares the launcher's pages until it writes to them. Each owned
  4.4-5.1 MB privately (USS; the largest 8.2 MB) of its 22 MB RSS, 15 MB of which is anonymous
  memory. Python's garbage collector writes to every object it visits, so a broker that runs
  long can come to own its anonymous pages: we count 16 MiB per broker, and 64 MiB for the
  launcher and `tbon start` together. (On a 24 GB machine with 23 GB available, 1480 fit.)
* tasks: 3 per broker, its own thread and ZeroMQ's I/O and reaper threads. RLIMIT_NPROC,
  kernel.pid_max, kernel.threads-max and a cgroup's pids.max all count tasks, not processes.
* file descriptors: the launcher holds one PMI socket per rank until wire-up ends, and rank 0 of
  a flat tree (kary:0) one TCP connection per child, on top of about 20 of its own (measured:
  size + 20). RLIMIT_NOFILE is per process: one process needs size + 32.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass

from tbon.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Cost:
    """What each broker costs, and what the launch costs besides."""

    memory: int = 16 * MiB
    tasks: int = 3
    files: int = 1  # descriptors that one process of the launch holds per rank
    base_memory: int = 64 * MiB
    base_tasks: int = 8
    base_files: int = 32


FORKED = Cost()
"""A broker forked by `tbon start`'s launcher (see the module's text for the measurements)."""


@dataclass(frozen=True, slots=True)
class Machine:
    """What this machine has now. None: unknown, or no limit."""

    memory: int | None = None  # MemAvailable, in bytes
    cgroup_memory: int | None = None  # bytes left below this cgroup's memory limit
    nproc: int | None = None  # RLIMIT_NPROC (None when unlimited or not applied: root)
    user_tasks: int = 0  # tasks (threads) this user runs now, which RLIMIT_NPROC counts
    task_max: int | None = None  # the lower of kernel.pid_max and kernel.threads-max
    tasks: int = 0  # tasks on the machine now
    cgroup_tasks: int | None = None  # tasks left below this cgroup's pids.max
    nofile: int | None = None  # RLIMIT_NOFILE: descriptors one process may hold


def _size(count: int, up: bool = False) -> str:
    """Bytes in MiB, or in GiB to a tenth from 10 GiB up; rounded up for what is needed and
    down for what is there, so that a refusal never reads "needs 1.0 GiB, 1.0 GiB is free"."""
    unit, name, steps = (GiB, "GiB", 10) if count >= 10 * GiB else (MiB, "MiB", 1)
    value = (math.ceil if up else math.floor)(count * steps / unit) / steps
    return f"{value:.1f} {name}" if steps > 1 else f"{value:.0f} {name}"


def _bounds(size: int, machine: Machine, cost: Cost) -> Iterator[tuple[int, str]]:
    """For each limit the machine has: how many brokers fit under it, and what `size` of them
    would need, in words."""
    memory = size * cost.memory + cost.base_memory
    for room, where in (
        (machine.memory, "available (MemAvailable)"),
        (machine.cgroup_memory, "left under this cgroup's memory limit"),
    ):
        if room is not None:
            yield (
                (room - cost.base_memory) // cost.memory,
                f"{size} brokers need about {_size(memory, up=True)} of memory "
                f"({_size(cost.memory, up=True)} each) and {_size(max(room, 0))} is {where}",
            )
    tasks = size * cost.tasks + cost.base_tasks
    for room, where in (
        (None if machine.nproc is None else machine.nproc - machine.user_tasks, "RLIMIT_NPROC"),
        (None if machine.task_max is None else machine.task_max - machine.tasks, "the kernel"),
        (machine.cgroup_tasks, "this cgroup's pids.max"),
    ):
        if room is not None:
            yield (
                (room - cost.base_tasks) // cost.tasks,
                f"{size} brokers need {tasks} tasks ({cost.tasks} threads each) and "
                f"{where} leaves room for {max(room, 0)}",
            )
    if machine.nofile is not None:
        files = size * cost.files + cost.base_files
        yield (
            (machine.nofile - cost.base_files) // cost.files,
            f"{size} brokers need {files} file descriptors in one process and RLIMIT_NOFILE "
            f"is {machine.nofile} (ulimit -n)",
        )


def refusal(size: int, machine: Machine, cost: Cost = FORKED) -> str | None:
    """Why `size` brokers do not fit on `machine` (told by its tightest limit), or None."""
    fit, need = min(_bounds(size, machine, cost), default=(size, ""), key=lambda b: b[0])
    return None if size <= fit else f"{need}; at most {max(fit, 0)} fit here"


def check_room(size: int, what: str, machine: Machine | None = None) -> None:
    """A UsageError if this machine cannot hold `size` forked brokers."""
    why = refusal(size, this_machine() if machine is None else machine)
    if why is not None:
        raise UsageError(
            f"{what} {size} is more than this machine can hold: {why} (--force starts them anyway)"
        )


# --- the thin reader ----------------------------------------------------------------------------


def this_machine() -> Machine:
    """What this machine has now, as far as Linux tells; None for whatever it does not."""
    nproc = _limit(resource.RLIMIT_NPROC)
    if os.getuid() == 0:
        nproc = None  # the kernel does not hold root to RLIMIT_NPROC
    pid_max = _number("/proc/sys/kernel/pid_max")
    threads_max = _number("/proc/sys/kernel/threads-max")
    known = [n for n in (pid_max, threads_max) if n is not None]
    return Machine(
        memory=_mem_available(),
        cgroup_memory=_cgroup_memory(),
        nproc=nproc,
        user_tasks=_user_tasks() if nproc is not None else 0,
        task_max=min(known) if known else None,
        tasks=_all_tasks(),
        cgroup_tasks=_cgroup_room("pids", ("pids.max", "pids.current")),
        nofile=_limit(resource.RLIMIT_NOFILE),
    )


def _limit(which: int) -> int | None:
    soft, _hard = resource.getrlimit(which)
    return None if soft == resource.RLIM_INFINITY else soft


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _number(path: str) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def _mem_available() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable" and value.split()[:1] and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024
    return None


def _all_tasks() -> int:
    """Tasks on the machine: the fourth field of /proc/loadavg is running/total."""
    fields = (_read("/proc/loadavg") or "").split()
    total = fields[3].partition("/")[2] if len(fields) > 3 else ""
    return int(total) if total.isdigit() else 0


def _user_tasks() -> int:
    """Tasks whose real user is ours, which is what RLIMIT_NPROC counts."""
    uid, count = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        uids = threads = ""
        for line in (_read(f"/proc/{pid}/status") or "").splitlines():
            if line.startswith("Uid:"):
                uids = line.split()[1]
            elif line.startswith("Threads:"):
                threads = line.split()[1]
        if uids == uid and threads.isdigit():
            count += int(threads)
    return count


def _cgroup_memory(root: str = "/sys/fs/cgroup", table: str = "/proc/self/cgroup") -> int | None:
    v2 = _cgroup_room("memory", ("memory.max", "memory.current"), root, table)
    if v2 is not None:
        return v2
    return _cgroup_room("memory", ("memory.limit_in_bytes", "memory.usage_in_bytes"), root, table)


_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number close to 2^63


def _cgroup_room(
    controller: str,
    files: tuple[str, str],
    root: str = "/sys/fs/cgroup",
    table: str = "/proc/self/cgroup",
) -> int | None:
    """The least room (limit - usage) in this process's cgroup and every cgroup above it, for
    one controller, cgroup v2 or v1; None if no limit is set or the files are not there."""
    rooms = []
    for line in (_read(table) or "").splitlines():
        _id, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if controllers == "":  # v2: the unified hierarchy (under unified/ on a hybrid system)
            mounts = [root, os.path.join(root, "unified")]
        elif controller in controllers.split(","):
            mounts = [os.path.join(root, controllers)]
        else:
            continue
        for mount in mounts:
            directory = os.path.normpath(mount + path)
            while directory.startswith(mount):
                limit = _number(os.path.join(directory, files[0]))
                usage = _number(os.path.join(directory, files[1]))
                if limit is not None and usage is not None and limit < _NO_LIMIT:
                    rooms.append(limit - usage)
                if directory == mount:
                    break
                directory = os.path.dirname(directory)
    return min(rooms) if rooms else None
