"""Run directories for brokers that a command starts on this host to join an instance
(`tbon expand`).

Left to itself, such a broker makes a private run directory under $TMPDIR and removes it when it
exits; killed with SIGKILL, it cannot, and the directory stays for good. So a joiner's run
directory is put inside rank 0's, when rank 0 runs on this host: `RANK0_RUNDIR/joiners/NAME`.
There it goes with the instance at the latest (rank 0, or `tbon start`, removes its own), and the
next command that starts joiners sweeps out those whose broker is gone: a socket that refuses
connections has nobody behind it. A broker still starting has no socket yet and is left alone.
With standbys, `tbon start` keeps the directory while a joiner there listens (`listening_joiners`):
after a takeover the instance may live on in joiners alone.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket

from tbon.overlay.links.local import SOCKET_NAME

JOINERS = "joiners"
MAX_SOCKET_PATH = 100  # what LocalServer accepts


def joiners_directory(rank0_uri: str) -> str | None:
    """Where joiners' run directories go: under rank 0's run directory if it is on this host
    (and ours); else None, and each joiner makes its own private one."""
    if not rank0_uri.startswith("local://"):
        return None
    rundir = os.path.dirname(rank0_uri[len("local://") :])
    try:
        if not os.path.isdir(rundir) or os.stat(rundir).st_uid != os.getuid():
            return None
        path = os.path.join(rundir, JOINERS)
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path


def joiner_rundir(directory: str | None, name: str) -> str | None:
    """`directory/name` for one joiner, if its socket's path is short enough to bind."""
    if directory is None:
        return None
    path = os.path.join(directory, name)
    return path if len(os.path.join(path, SOCKET_NAME).encode()) <= MAX_SOCKET_PATH else None


def knock(rundir: str) -> int | None:
    """Connect to the socket of `rundir` and hang up: None if a broker accepted, else why not
    (the errno: ECONNREFUSED, its socket there and nobody listening; ENOENT, no socket yet)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.path.join(rundir, SOCKET_NAME))
    except OSError as error:
        return error.errno
    finally:
        probe.close()
    return None


def gone(rundir: str) -> bool:
    """True if the broker of `rundir` has gone: its socket is there and nobody listens."""
    return knock(rundir) == errno.ECONNREFUSED


def sweep(directory: str | None) -> list[str]:
    """Remove the run directories under `directory` whose broker has gone; those removed."""
    if directory is None:
        return []
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path) and gone(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def listening_joiners(rundir: str) -> list[str]:
    """The sockets under `rundir` (an instance's) of joiners whose broker listens: those of
    `JOINERS` directories at any depth (a joiner started while a refilled root served expand
    has its run directory under that root's). After a takeover the instance may live on in
    joiners alone, once every broker `tbon start` launched has gone."""
    found = []
    for path, _dirs, files in os.walk(rundir):
        if SOCKET_NAME in files and JOINERS in path.split(os.sep) and listens(path):
            found.append(os.path.join(path, SOCKET_NAME))
    return sorted(found)


def listens(rundir: str) -> bool:
    """True if a broker accepts connections on the socket of `rundir`."""
    return knock(rundir) is None
