"""Run directories left behind by brokers that were killed, and the sweep that removes them.

A broker removes its run directory when it exits; killed with SIGKILL it cannot, and the
directory, with its dead socket, stays in $TMPDIR for good. So each private run directory is
named `tbon-PID-HEX` after the broker that made it, and the next broker or command that makes one
beside it (startup.private_directory, `tbon start`) sweeps out those whose broker is gone.

`verdict` decides from facts alone; `sweep` gathers them and acts. A directory is swept only if
every fact says its broker is gone and it is ours to remove:

* its name is a broker's (`tbon-PID-HEX`), so nothing else in $TMPDIR is ever touched;
* it is a directory itself, not a symbolic link to one (lstat: a link is never followed);
* its owner is this user (never another user's, whatever the sticky bit would allow);
* no process has its PID (a zombie counts as gone: it will never run again);
* and its socket refuses connections: nobody listens there. A PID alone is not proof, as a
  broker in another PID namespace that shares $TMPDIR has a PID that means nothing here; a
  directory without a socket (a broker still starting, or one killed before it listened) is
  kept for that reason.

Two sweepers may find the same directory at once. Each first renames it to
`tbon-PID-HEX.swept-SWEEPER`, which only one rename can do; the winner removes it (rmtree, which
follows no link inside), and a loser finds it gone and moves on. A directory left renamed by a
sweeper that died meanwhile is swept again once that sweeper's PID is gone.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import socket
import stat
from dataclasses import dataclass

from tbon.overlay.connectors.uri import SOCKET_NAME

NAME = re.compile(
    r"tbon-(?P<pid>[1-9][0-9]{0,9})-[0-9a-f]{12}(?:\.swept-(?P<sweeper>[1-9][0-9]{0,9}))?"
)


class Socket(enum.Enum):
    LISTENING = "listening"
    REFUSING = "refusing"
    ABSENT = "absent"
    UNKNOWN = "unknown"  # not looked at, or an answer that proves nothing


@dataclass(frozen=True)
class Facts:
    """What is known of one entry of $TMPDIR."""

    name: str
    directory: bool  # a directory itself, by lstat: not a symbolic link
    owner: int
    me: int  # this user's uid
    alive: bool  # a process has the PID the name gives (its sweeper's, once renamed)
    socket: Socket


def run_directory_name(pid: int) -> str:
    """A private run directory's name for the broker of `pid`: `tbon-PID-HEX`."""
    return f"tbon-{pid}-{os.urandom(6).hex()}"


def named_pid(name: str) -> int | None:
    """The PID whose death would leave the entry `name` for a sweep: its broker's, or the
    sweeper's once renamed; None if the name is not a broker's run directory."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    return int(match["sweeper"] or match["pid"])


def verdict(facts: Facts) -> bool:
    """Whether to sweep the entry: a broker's run directory, ours, whose broker is gone."""
    match = NAME.fullmatch(facts.name)
    if match is None or not facts.directory or facts.owner != facts.me or facts.alive:
        return False
    if match["sweeper"] is not None:
        return True  # a sweeper found its broker gone, then died itself
    return facts.socket is Socket.REFUSING


def sweep(parent: str) -> list[str]:
    """Remove the run directories in `parent` whose brokers are gone (and only those); the
    names removed by this call."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    me = os.getuid()
    for name in names:
        pid = named_pid(name)
        if pid is None:
            continue
        facts = _facts(parent, name, pid, me)
        if facts is not None and verdict(facts) and _remove(parent, name):
            removed.append(name)
    return removed


def _facts(parent: str, name: str, pid: int, me: int) -> Facts | None:
    """The facts of one entry, the cheap ones first: its PID and socket are looked at only if
    it is a directory of ours (None: it went meanwhile)."""
    path = os.path.join(parent, name)
    try:
        info = os.lstat(path)
    except OSError:
        return None
    directory = stat.S_ISDIR(info.st_mode)
    if not directory or info.st_uid != me:
        return Facts(name, directory, info.st_uid, me, True, Socket.UNKNOWN)
    alive = _alive(pid)
    probe = Socket.UNKNOWN if alive else _probe(os.path.join(path, SOCKET_NAME))
    return Facts(name, directory, info.st_uid, me, alive, probe)


def _alive(pid: int) -> bool:
    """Whether a process has `pid` and may still run (a zombie will not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: alive, and not ours to judge
    except OverflowError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as status:
            return status.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _probe(path: str) -> Socket:
    """Whether anyone listens on the Unix socket at `path`."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Socket.ABSENT
    except OSError:
        return Socket.UNKNOWN
    if not stat.S_ISSOCK(info.st_mode):
        return Socket.UNKNOWN
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)  # a listener with a full queue answers EAGAIN: not refusing
    try:
        probe.connect(path)
    except OSError as error:
        return Socket.REFUSING if error.errno == errno.ECONNREFUSED else Socket.UNKNOWN
    finally:
        probe.close()
    return Socket.LISTENING


def _remove(parent: str, name: str) -> bool:
    """Take the entry by renaming it (one sweeper only can), then remove it; whether this
    call removed it."""
    import shutil  # only when there is something to sweep: a broker starts faster without it

    base = name.split(".swept-")[0]
    taken = os.path.join(parent, f"{base}.swept-{os.getpid()}")
    try:
        os.rename(os.path.join(parent, name), taken)
    except OSError:
        return False  # another sweeper took it first, or it went
    with contextlib.suppress(OSError):
        shutil.rmtree(taken)
    return not os.path.lexists(taken)
