"""What `ps` and `pgrep -f` show for a process: its title, such as `tbon broker rank 5/16`.

Linux shows as /proc/PID/cmdline the memory that held the process's arguments when it started
(from arg_start to arg_end, fields 48 and 49 of /proc/PID/stat). Python keeps copies of its
arguments of its own, so that memory is free to overwrite: `set_title` writes the title there
and fills the rest with NULs, as setproctitle(3) does, cutting the title to the room there is
(the original command line's length; ample for a broker's). It also sets the thread's name, the
15 characters that `ps -o comm`, `top` and `pgrep` without `-f` show, with prctl(PR_SET_NAME).
Where there is no /proc, or it hides those addresses, the title stays as it was.

Brokers use `name_broker`, whether `tbon start` forked them (overlay/launch/local.py) or they were
started as `tbon broker` (overlay/broker/main.py): first without a rank, then with one, as soon as
bootstrap has told it (overlay/broker/broker.py), so that `pgrep -f "tbon broker"` finds them all.
"""

from __future__ import annotations

import ctypes

_PR_SET_NAME = 15
BROKER_COMM = b"tbon-broker"

_detail = ""  # what follows the rank in a broker's title: its own arguments, if it has any


def _argv_area() -> tuple[int, int] | None:
    """Where this process's argument strings lie: (start, end) addresses, or None."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # fields[0] is field 3, the state
        start, end = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def set_comm(name: bytes) -> None:
    """The thread's name (15 bytes at most); nothing where prctl(2) is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_title(title: str, comm: bytes | None = None) -> bool:
    """Show `title` as this process's command line; False if it could not be."""
    if comm is not None:
        set_comm(comm)
    area = _argv_area()
    if area is None:
        return False
    start, end = area
    room = end - start
    data = title.encode(errors="replace")[: room - 1]
    ctypes.memmove(start, data + b"\0" * (room - len(data)), room)
    return True


def name_broker(
    rank: int | None = None, size: int | None = None, detail: str | None = None
) -> None:
    """`tbon broker rank R/N DETAIL`; before the rank is known, `tbon broker DETAIL`. `detail`
    is kept for later calls."""
    global _detail
    if detail is not None:
        _detail = detail
    words = ["tbon broker"]
    if rank is not None:
        words.append(f"rank {rank}/{size}")
    if _detail:
        words.append(_detail)
    set_title(" ".join(words), BROKER_COMM)
