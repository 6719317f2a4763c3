"""Config-file bootstrap (`tbon broker -c FILE`): the `[bootstrap]` table, read and checked.

Every broker of the instance reads the same file. A broker's rank is the index of its host name
in `hosts` (ranges such as `node[0-15]` expanded in order); a rank with children binds its `bind`
URI, and a child connects to its parent's `connect` URI. `%h` stands for the host and `%p` for
`default_port`. All ranks share one CURVE certificate (`curve_cert`, made by `tbon keygen`):
whoever holds it is the instance. tbon-config(5) documents the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tbon.errors import UsageError
from tbon.overlay.boot.wireup import BusinessCard, Wireup
from tbon.overlay.parse.hostlist import expand_hostlist
from tbon.overlay.state.topology import Topology, explicit_parents
from tbon.record import Record

DEFAULT_PORT = 8050
DEFAULT_BIND = "tcp://*:%p"
DEFAULT_CONNECT = "tcp://%h:%p"
BOOTSTRAP_KEYS = frozenset(
    {"hosts", "curve_cert", "default_port", "default_bind", "default_connect"}
)
HOST_KEYS = frozenset({"host", "bind", "connect", "parent"})
_TCP = re.compile(r"^tcp://[^/:\s]+:\d+$")


class HostEntry(Record):
    __slots__ = __match_args__ = ("host", "bind", "connect", "parent")

    def __init__(self, host: str, bind: str, connect: str, parent: str | None = None) -> None:
        self.host = host
        # %h still to be replaced by the host's address (only the broker can resolve it)
        self.bind = bind
        self.connect = connect
        self.parent = parent


class BootConfig(Record):
    __slots__ = __match_args__ = ("path", "hosts", "curve_cert")

    def __init__(self, path: str, hosts: tuple[HostEntry, ...], curve_cert: str) -> None:
        self.path = path
        self.hosts = hosts
        self.curve_cert = curve_cert

    def rank_of(self, hostname: str) -> int:
        for rank, entry in enumerate(self.hosts):
            if entry.host == hostname:
                return rank
        names = ", ".join(e.host for e in self.hosts[:4]) + (", ..." if len(self.hosts) > 4 else "")
        raise UsageError(
            f"{self.path}: host {hostname!r} is not in [bootstrap] hosts ({names}); "
            "-S hostname=NAME says which one this broker is"
        )

    def topology(self, topo: str, size: int) -> Topology:
        """The tree: `topo` (tbon.topo) unless some host names its parent, which then wins for
        that host; the spare ranks beyond the hosts stay where `topo` puts them."""
        shape = Topology(topo, size)
        if all(entry.parent is None for entry in self.hosts):
            return shape
        index = {entry.host: rank for rank, entry in enumerate(self.hosts)}
        parents = []
        for rank in range(1, size):
            named = self.hosts[rank].parent if rank < len(self.hosts) else None
            parents.append(index[named] if named is not None else shape.parent(rank) or 0)
        try:
            return Topology(explicit_parents(parents), size)
        except UsageError:
            raise UsageError(
                f"{self.path}: the parents in [bootstrap] hosts form a cycle"
            ) from None


def bootstrap_table(hosts: list[str], curve_cert: str) -> dict[str, Any]:
    """A config file's contents for `hosts` (rank = position) with the default templates:
    the inverse of parse_bootconfig, for `tbon alloc --write-config`."""
    return {
        "bootstrap": {
            "curve_cert": curve_cert,
            "default_port": DEFAULT_PORT,
            "default_bind": DEFAULT_BIND,
            "default_connect": DEFAULT_CONNECT,
            "hosts": [{"host": host} for host in hosts],
        }
    }


def load_bootconfig(path: str) -> BootConfig:
    """Read FILE; every problem is one UsageError line naming the file."""
    import tomllib  # only config-booted brokers read TOML: the others start without it

    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: not valid TOML: {error}") from None
    return parse_bootconfig(data, path)


def parse_bootconfig(data: dict[str, Any], path: str) -> BootConfig:
    def fail(problem: str) -> UsageError:
        return UsageError(f"{path}: {problem}")

    table = data.get("bootstrap")
    if not isinstance(table, dict):
        raise fail("no [bootstrap] table")
    unknown = sorted(set(table) - BOOTSTRAP_KEYS)
    if unknown:
        raise fail(
            f"unknown key bootstrap.{unknown[0]} (known: {', '.join(sorted(BOOTSTRAP_KEYS))})"
        )
    cert = table.get("curve_cert")
    if not isinstance(cert, str) or not cert:
        raise fail("bootstrap.curve_cert must name the instance's certificate (tbon keygen)")
    port = table.get("default_port", DEFAULT_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise fail(f"bootstrap.default_port must be a port number, not {port!r}")
    bind = _template(table.get("default_bind", DEFAULT_BIND), "bootstrap.default_bind", fail)
    connect = _template(
        table.get("default_connect", DEFAULT_CONNECT), "bootstrap.default_connect", fail
    )
    raw_hosts = table.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise fail('bootstrap.hosts must be a non-empty array of tables like { host = "node0" }')
    hosts: list[HostEntry] = []
    for number, raw in enumerate(raw_hosts):
        where = f"bootstrap.hosts[{number}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("host"), str):
            raise fail(f'{where} must be a table with a host name, like {{ host = "node0" }}')
        extra = sorted(set(raw) - HOST_KEYS)
        if extra:
            raise fail(f"unknown key {where}.{extra[0]} (known: {', '.join(sorted(HOST_KEYS))})")
        try:
            names = expand_hostlist(raw["host"])
        except UsageError as error:
            raise fail(f"{where}: {error}") from None
        entry_bind = _template(raw.get("bind", bind), f"{where}.bind", fail)
        entry_connect = _template(raw.get("connect", connect), f"{where}.connect", fail)
        parent = raw.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise fail(f"{where}.parent must be a host name")
        for name in names:
            hosts.append(
                HostEntry(
                    name,
                    _fill(entry_bind, "%h", port),
                    _fill(entry_connect, name, port),
                    parent,
                )
            )
    seen: set[str] = set()
    for rank, entry in enumerate(hosts):
        if entry.host in seen:
            raise fail(f"host {entry.host!r} appears twice in bootstrap.hosts")
        seen.add(entry.host)
        if entry.parent is not None:
            if rank == 0:
                raise fail(f"host {entry.host!r} is rank 0, the root: it has no parent")
            if entry.parent not in {e.host for e in hosts}:
                raise fail(f"host {entry.host!r} names parent {entry.parent!r}, not in hosts")
    return BootConfig(path, tuple(hosts), cert)


def _template(value: object, where: str, fail: Any) -> str:
    """A URI template: tcp://HOST:PORT once %h and %p are filled in."""
    if not isinstance(value, str) or not _TCP.match(_fill(value, "host", 1)):
        raise fail(f"{where}: {value!r} is not a URI template like tcp://%h:%p")
    return value


def _fill(template: str, host: str, port: int) -> str:
    return template.replace("%p", str(port)).replace("%h", host)


def config_wireup(
    boot: BootConfig,
    topo: str,
    requested_size: int | None,
    hostname: str,
    public_key: str,
    bind: Callable[[Topology, int, str], str],
    share: Callable[[], None],
) -> Wireup:
    """Config-file bootstrap: everything is in the file, so there is nothing to exchange. The
    rank is this host's place in `hosts`; every rank holds the instance's one key pair."""
    rank = boot.rank_of(hostname)
    launched = len(boot.hosts)
    size = launched if requested_size is None else requested_size
    if size < launched:
        raise UsageError(f"size={size} is smaller than the {launched} hosts of {boot.path}")
    topology = boot.topology(topo, size)
    if topology.children(rank):
        bind(topology, rank, boot.hosts[rank].bind)
        share()  # its config-booted children hold the instance's key
    parent = topology.parent(rank)
    card = None
    if parent is not None:
        entry = boot.hosts[parent]
        card = BusinessCard(entry.host, public_key, entry.connect)
    hosts = [entry.host for entry in boot.hosts]
    return Wireup(rank, size, launched, topology, parent=card, hosts=hosts)
