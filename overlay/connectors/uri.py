"""Instance URIs: `local://PATH` and `ssh://[user@]host[:port]/PATH`, and how to find one.

Every command that talks to an instance imports this module (connectors/client.py does), so
what it builds at import is kept cheap: `Uri` is a record (tbon/record.py), not a dataclass,
and each pattern is a string that `re` compiles, and caches, the first time it is matched,
which a `local://` URI never is.
"""

from __future__ import annotations

import itertools
import os
import re
import socket

from tbon.errors import TbonError, UsageError
from tbon.overlay.parse.numbers import is_decimal
from tbon.record import Record

SOCKET_NAME = "local"
"""A broker's socket in its run directory (overlay/links/local.py binds it): named here, so that
a command finds it without importing the broker's side."""

_BOUND_NAME = rf"{SOCKET_NAME}(\.\d+)?"
_SCHEME = r"^[A-Za-z][A-Za-z0-9+.-]*://"
_SSH = r"^ssh://(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+)(?::(?P<port>[0-9]+))?(?P<path>/.*)$"


class Uri(Record):
    __slots__ = __match_args__ = ("scheme", "path", "host", "user", "port")

    def __init__(
        self, scheme: str, path: str, host: str = "", user: str = "", port: int | None = None
    ) -> None:
        self.scheme = scheme  # "local" or "ssh"
        self.path = path
        self.host = host
        self.user = user
        self.port = port

    def __str__(self) -> str:
        if self.scheme == "local":
            return f"local://{self.path}"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"ssh://{user}{self.host}{port}{self.path}"


def looks_like_uri(word: str) -> bool:
    """`SCHEME://...`, of any scheme: a word that is meant as a URI, so that a mistyped one
    (`bogus://x`) is refused as a URI, not run as a command by `tbon exec`."""
    return re.match(_SCHEME, word) is not None


FORMS = "use local://PATH or ssh://[user@]host[:port]/PATH"


def parse_uri(text: str) -> Uri:
    found = _parsed(text)
    if isinstance(found, str):
        raise UsageError(f"invalid URI {text!r}: {found}")
    return found


def _parsed(text: str) -> Uri | str:
    """The URI, or why `text` is not one."""
    if text.startswith("local://"):
        path = text[len("local://") :]
        if not path.startswith("/"):
            return "local:// takes an absolute path"
        return Uri("local", path)
    match = re.match(_SSH, text)
    if match:
        digits = match["port"]
        # checked on the digits first: int() refuses very long ones
        if digits is not None and (len(digits) > 5 or not 1 <= int(digits) <= 65535):
            return "the port must be 1 to 65535"
        port = int(digits) if digits is not None else None
        return Uri("ssh", match["path"], match["host"], match["user"] or "", port)
    return FORMS


MAX_URIS = 16
"""The most URIs a list (broker.boot-server, a command's [URI] or TBON_URI) may hold. A joiner
gives each one at most a broker.join-timeout, and a command LIST_WAIT, so a longer list would
only stretch how long a hopeless join or command lasts."""


def split_uris(text: str) -> list[str]:
    """The URIs of a comma-separated list, in order, unchecked (parse_uri_list checks them).
    Nothing is trimmed, so a path that holds a comma cannot be named in such a list."""
    return text.split(",")


def parse_uri_list(text: str, what: str = "URI") -> list[Uri]:
    """The URIs of a comma-separated list, in order, each once: the one parser of such lists
    (broker.boot-server, a command's [URI], TBON_URI). More than MAX_URIS, an empty one (a
    comma too many) or a malformed one is a UsageError (exit 2) that names it and its place;
    a repeat is dropped, as trying it again could only fail again."""
    items = split_uris(text)
    if len(items) > MAX_URIS:
        raise UsageError(
            f"invalid {what}: {len(items)} URIs, at most {MAX_URIS} may be given (separated by "
            "commas)"
        )
    found: list[Uri] = []
    for place, item in enumerate(items, 1):
        uri = _parsed(item) if item else "empty (a comma too many?)"
        if isinstance(uri, str):
            where = f" (URI {place} of {len(items)})" if len(items) > 1 else ""
            why = uri if uri == FORMS else f"{uri}; {FORMS}"
            raise UsageError(f"invalid {what} {item!r}{where}: {why}, several separated by commas")
        if uri not in found:
            found.append(uri)
    return found


def to_remote(uri: Uri) -> Uri:
    """The form of `uri` that reaches it from another host."""
    if uri.scheme == "ssh":
        return uri
    return Uri("ssh", uri.path, socket.gethostname())


def to_local(uri: Uri) -> Uri:
    return Uri("local", uri.path)


def reach(local: str, host: str, given: Uri, remote: bool = False) -> Uri:
    """How a command here reaches a broker whose own URI is `local` (local://PATH) on `host`,
    having reached the instance through `given`: local:// on this host, else ssh://, with the
    user and port `given` took if it went to that host; ssh:// always if `remote` (for use on
    another host)."""
    path = local.removeprefix("local://")
    if remote or host != socket.gethostname():
        same = given.scheme == "ssh" and given.host == host
        return Uri("ssh", path, host, given.user if same else "", given.port if same else None)
    return Uri("local", path)


def resolve_target(target: str) -> Uri:
    """A URI from what `tbon uri` accepts: a URI, a run directory, or pid:PID."""
    if target.startswith("pid:"):
        pid = target[4:]
        if not is_decimal(pid):
            raise UsageError(f"invalid target {target!r}: use pid:PID")
        return uri_of_pid(int(pid))
    if "://" in target:
        return parse_uri(target)
    candidate = os.path.join(target, SOCKET_NAME)
    if os.path.isdir(target):
        if not os.path.exists(candidate):
            raise TbonError(f"{target} is not a broker's run directory (no {SOCKET_NAME} socket)")
        return Uri("local", os.path.abspath(candidate))
    raise TbonError(f"{target}: no such run directory, URI or pid:PID")


def uri_of_pid(pid: int) -> Uri:
    """The instance a process belongs to: a broker's own socket; for `tbon start` (or its
    launcher), its rank 0's, or an error that says the instance is not up yet; the TBON_URI in
    the process's environment; or else the first broker among its descendants."""
    if not os.path.exists(f"/proc/{pid}"):
        raise TbonError(f"pid {pid}: no such process")
    found = _broker_socket(pid) or _started_instance(pid) or _environment_uri(pid)
    if found is None:
        for child in _descendants(pid):
            found = _broker_socket(child)
            if found is not None:
                break
    if found is None:
        raise TbonError(f"pid {pid} is not a broker and does not run inside a tbon instance")
    return found


LAUNCHER_MODULE = "tbon.overlay.launch.local"
"""The launcher that `tbon start` runs (cli/start.py), its run directory given as --rundir."""


def _started_instance(pid: int) -> Uri | None:
    """Rank 0's URI if `pid` is `tbon start` or its launcher (None if it is neither): the
    launcher names the instance's run directory, whose rank 0 socket is DIR/0/SOCKET_NAME.
    Right after `tbon start ... &` there may be no launcher yet, or no socket: that is said."""
    args = _cmdline(pid)
    if _runs_module(args, LAUNCHER_MODULE):
        launchers = [args]
    elif _is_tbon_start(args):
        below = (_cmdline(child) for child in _descendants(pid))
        launchers = [args for args in below if _runs_module(args, LAUNCHER_MODULE)]
    else:
        return None
    for launcher in launchers[:1]:
        rundir = _option(launcher, "--rundir")
        path = os.path.join(rundir, "0", SOCKET_NAME) if rundir else ""
        if path and os.path.exists(path):
            return Uri("local", path)
    raise TbonError(
        f"pid {pid} is tbon start, whose instance is not up yet (rank 0 has no socket): "
        "try again in a moment"
    )


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def _runs_module(args: list[str], module: str) -> bool:
    return any(a == "-m" and b == module for a, b in itertools.pairwise(args))


def _is_tbon_start(args: list[str]) -> bool:
    """`.../tbon start ...` (the console script) or `python -m tbon.cli start ...`."""
    if _runs_module(args, "tbon.cli"):
        return args[args.index("tbon.cli") + 1 : args.index("tbon.cli") + 2] == ["start"]
    for at, word in enumerate(args[:-1]):
        if os.path.basename(word) == "tbon" and args[at + 1] == "start":
            return True
    return False


def _option(args: list[str], name: str) -> str | None:
    for at, word in enumerate(args[:-1]):
        if word == name:
            return args[at + 1]
    return None


def _broker_socket(pid: int) -> Uri | None:
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        with open("/proc/net/unix") as table:
            next(table)
            for line in table:
                fields = line.split()
                if len(fields) >= 8 and fields[6] in inodes:
                    # The kernel lists the name the socket was bound under, which the broker
                    # then renamed to SOCKET_NAME (overlay/links/local.py).
                    bound = os.path.basename(fields[7])
                    path = os.path.join(os.path.dirname(fields[7]), SOCKET_NAME)
                    if re.fullmatch(_BOUND_NAME, bound) and os.path.exists(path):
                        return Uri("local", path)
    except OSError:
        return None
    return None


def _environment_uri(pid: int) -> Uri | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(b"TBON_URI="):  # a list: its first
                    return parse_uri_list(entry[9:].decode())[0]
    except (OSError, UsageError, UnicodeDecodeError):
        return None
    return None


def _descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as children:
                    kids = [int(word) for word in children.read().split()]
            except OSError:
                continue
            found.extend(kids)
            queue.extend(kids)
    return found
