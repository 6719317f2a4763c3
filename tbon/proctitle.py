"""What `ps` and `pgrep -f` show for a process: its title, such as `tbon broker rank 5/16`.

Linux shows as /proc/PID/cmdline the memory that held the process's arguments when it started
(from arg_start to arg_end, fields 48 and 49 of /proc/PID/stat). Python keeps copies of its
arguments of its own, so that memory is free to overwrite: `set_title` writes the title there
and fills the rest with NULs, as setproctitle(3) does, cutting the title to the room there is
(the original command line's length; ample for a broker's). It also sets the process's name, the
15 characters that `ps -o comm`, `top` and `pgrep` without `-f` show. Both are written through
/proc (/proc/self/mem at those addresses, /proc/self/comm), not with ctypes, whose import would
cost a broker 0.3 MB of memory (issue 14). Where there is no /proc, or it hides those addresses
or refuses the writes, the title stays as it was.

Brokers use `name_broker`, whether `tbon start` forked them (overlay/launch/local.py) or they were
started as `tbon broker` (overlay/broker/main.py): first without a rank, then with one, as soon as
bootstrap has told it (overlay/broker/broker.py), so that `pgrep -f "tbon broker"` finds them all.
"""

from __future__ import annotations

import functools

BROKER_COMM = b"tbon-broker"

_detail = ""  # what follows the rank in a broker's title: its own arguments, if it has any
_shown: str | None = None  # the title name_broker last set (a forked broker inherits its own)


@functools.cache
def argv_area() -> tuple[int, int] | None:
    """Where this process's argument strings lie: (start, end) addresses, or None. Read once:
    they never move, and a forked child's lie where its parent's do, so `tbon start`'s launcher
    reads them before it forks and no broker reads /proc/self/stat for them again."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # fields[0] is field 3, the state
        start, end = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def set_comm(name: bytes) -> None:
    """The process's name (15 bytes at most), as prctl(PR_SET_NAME) sets it for the thread that
    calls it: /proc/self/comm is the main thread's. Nothing where /proc refuses."""
    try:
        with open("/proc/self/comm", "wb", buffering=0) as comm:
            comm.write(name[:15])
    except OSError:
        pass


def set_title(title: str, comm: bytes | None = None) -> bool:
    """Show `title` as this process's command line; False if it could not be."""
    if comm is not None:
        set_comm(comm)
    area = argv_area()
    if area is None:
        return False
    start, end = area
    room = end - start
    data = title.encode(errors="replace")[: room - 1]
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(data.ljust(room, b"\0"))
    except OSError:
        return False
    return True


def name_broker(
    rank: int | None = None, size: int | None = None, detail: str | None = None
) -> None:
    """`tbon broker rank R/N DETAIL`; before the rank is known, `tbon broker DETAIL`. `detail`
    is kept for later calls. A title already shown is not written again (three opens of /proc
    saved: a broker `tbon start` forked is named before it boots, and the same after)."""
    global _detail, _shown
    if detail is not None:
        _detail = detail
    words = ["tbon broker"]
    if rank is not None:
        words.append(f"rank {rank}/{size}")
    if _detail:
        words.append(_detail)
    title = " ".join(words)
    if title == _shown:
        return  # already shown: a forked broker is named before it boots, and again after
    if set_title(title, BROKER_COMM):
        _shown = title
