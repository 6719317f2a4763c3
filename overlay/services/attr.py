"""attr.get and attr.list, served by every broker: its attributes (`-S NAME=VALUE`,
overlay/config/attributes.py), each with the value it runs with and where that value came from,
for `tbon attr` (as `flux getattr` and `flux lsattr` ask a Flux broker).

The table is worked out once, when the broker's services are built, from what it was started
with and what bootstrap told it; nothing in it changes while the broker runs. Where a value came
from is one of SOURCES: its default, `-S` on the command line, the config file (`tbon broker -c`:
the size, a tree whose hosts name their parents, where a parent listens), the boot server (a
joiner takes the instance's size, tree and liveness settings: docs/design.md §8), or bootstrap
(the size PMI gave, or 1 for a broker alone), or the launcher that forked it (the run
directory `tbon start` gives each of its brokers). An attribute with no value (`broker.cert` not
given) is `unset`.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from tbon.overlay.config.attributes import DEFAULTS, KNOWN, BrokerConfig
from tbon.overlay.parse.duration import format_duration
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.services.ping import Whoami
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message
from tbon.record import Record

DEFAULT, SETATTR, CONFIG_FILE, BOOT_SERVER, BOOTSTRAP, LAUNCHER, UNSET = (
    "default",
    "-S",
    "config file",
    "boot server",
    "bootstrap",
    "launcher",
    "unset",
)
SOURCES = (DEFAULT, SETATTR, CONFIG_FILE, BOOT_SERVER, BOOTSTRAP, LAUNCHER, UNSET)
LIVENESS = {  # what a joiner adopts from the instance, and where its config keeps it
    "tbon.heartbeat": "heartbeat",
    "tbon.torpid": "torpid",
    "tbon.timeout": "timeout",
    "broker.join-timeout": "join_timeout",
}
OPTIONAL = ("tbon.fanout", "broker.boot-server", "broker.rank", "broker.cert")


class Attribute(Record):
    __slots__ = __match_args__ = ("name", "value", "source")

    def __init__(self, name: str, value: str | None, source: str) -> None:
        self.name, self.value, self.source = name, value, source  # value None: unset

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "source": self.source}


def describe(me: Whoami, config: BrokerConfig, topology: Topology) -> dict[str, Attribute]:
    """Every attribute in KNOWN, by name: its value in this broker, and where it came from."""
    given = config.attributes
    by_file = config.config_file is not None
    joined = config.boot_server is not None
    found: dict[str, Attribute] = {}

    def put(name: str, value: str | None, source: str) -> None:
        found[name] = Attribute(name, value, source)

    def plain(name: str, value: str | None = None) -> None:
        """-S if given, else the default (its text, or `value` for a default worked out)."""
        if name in given:
            put(name, given[name], SETATTR)
        else:
            put(name, value if value is not None else DEFAULTS[name], DEFAULT)

    size = str(topology.size)
    if joined:
        put("size", size, BOOT_SERVER)
    elif "size" in given:
        put("size", size, SETATTR)
    else:
        put("size", size, CONFIG_FILE if by_file else BOOTSTRAP)

    spec = topology.spec
    if joined:
        put("tbon.topo", spec, BOOT_SERVER)
    elif by_file and spec.startswith("parents:") and given.get("tbon.topo") != spec:
        put("tbon.topo", spec, CONFIG_FILE)  # its hosts name their parents
    elif "tbon.topo" in given or "tbon.fanout" in given:
        put("tbon.topo", spec, SETATTR)
    else:
        put("tbon.topo", spec, DEFAULT)

    for name, field in LIVENESS.items():
        if joined:
            put(name, format_duration(getattr(config, field)), BOOT_SERVER)
        elif name == "tbon.heartbeat":  # its default follows tbon.torpid and tbon.timeout
            plain(name, format_duration(config.heartbeat))
        else:
            plain(name)

    # tbon.endpoint: what its children dial once it listens, else the template it would bind
    template = given.get("tbon.endpoint", DEFAULTS["tbon.endpoint"])
    source = CONFIG_FILE if by_file else SETATTR if "tbon.endpoint" in given else DEFAULT
    put("tbon.endpoint", me.endpoint or template, source)
    # broker.rundir: the directory made of it (%r replaced), or the one made for it
    source = SETATTR if "broker.rundir" in given else DEFAULT if config.rundir is None else LAUNCHER
    put("broker.rundir", _rundir(me.uri), source)
    plain_names = (
        "broker.shutdown-timeout",
        "broker.client-backlog",
        "broker.handshake-timeout",
        "log-stderr-level",
        "tbon.standbys",
    )
    for name in plain_names:
        plain(name)
    plain("hostname", config.hostname)
    total = config.client_backlog_total  # by default, follows broker.client-backlog
    plain(
        "broker.client-backlog-total", f"{total >> 20}M" if total % (1 << 20) == 0 else str(total)
    )
    if "broker.reattach-timeout" in given:
        put("broker.reattach-timeout", given["broker.reattach-timeout"], SETATTR)
    else:  # follows tbon.timeout (60s if that is 0)
        put("broker.reattach-timeout", format_duration(config.timeout or 60.0), DEFAULT)
    for name in OPTIONAL:
        if name in given:
            put(name, given[name], SETATTR)
        else:
            put(name, None, UNSET)
    assert found.keys() == KNOWN, sorted(found.keys() ^ KNOWN)
    return dict(sorted(found.items()))


def _rundir(uri: str) -> str:
    """The run directory: where the broker's local socket is (links/local.py)."""
    return os.path.dirname(uri.removeprefix("local://"))


class AttrService:
    def __init__(self, rank: int, attributes: dict[str, Attribute]) -> None:
        self.rank = rank
        self.attributes = attributes

    def get(self, request: Message, now: float) -> list[Action]:
        """attr.get: one attribute, by `name`; ENOENT for a name that is not an attribute."""
        name = request.payload.get("name")
        found = self.attributes.get(name) if isinstance(name, str) else None
        if found is None:
            shown = repr(name)[:80]
            return [Respond(request.fail(errno.ENOENT, f"unknown attribute {shown}"))]
        return [Respond(request.respond({"rank": self.rank, **found.wire()}))]

    def list(self, request: Message, now: float) -> list[Action]:
        """attr.list: every attribute, by name."""
        listed = [found.wire() for found in self.attributes.values()]
        return [Respond(request.respond({"rank": self.rank, "attributes": listed}))]
