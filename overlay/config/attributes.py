"""Broker attributes (`-S NAME=VALUE`), validated once into a BrokerConfig."""

from __future__ import annotations

import socket
from typing import Any

from tbon.errors import UsageError
from tbon.limits import check_duration, parse_rank, parse_size
from tbon.overlay.parse.duration import parse_duration
from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.state.standbys import DEFAULT_STANDBYS, MAX_STANDBYS
from tbon.overlay.state.topology import DEFAULT_SPEC, parse_spec, spec_from_fanout
from tbon.record import Record

DEFAULTS: dict[str, str] = {
    "tbon.topo": DEFAULT_SPEC,
    "tbon.heartbeat": "10s",  # or shorter: default_heartbeat()
    "tbon.torpid": "30s",
    "tbon.timeout": "60s",
    "tbon.endpoint": "tcp://%h:*",
    "tbon.standbys": str(DEFAULT_STANDBYS),
    "broker.shutdown-timeout": "10s",
    "broker.join-timeout": "30s",
    "broker.client-backlog": "64M",
    "broker.handshake-timeout": "5s",
    "log-stderr-level": "warning",
}
KNOWN = frozenset(
    {
        *DEFAULTS,
        "size",
        "tbon.fanout",
        "broker.rundir",
        "hostname",
        "broker.boot-server",
        "broker.rank",
        "broker.cert",
        "broker.reattach-timeout",
        "broker.client-backlog-total",
    }
)
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_BACKLOG = 32 << 20  # broker.client-backlog: twice OUTPUT_BUDGET (wire/flow.py)
MIN_HANDSHAKE, MAX_HANDSHAKE = 0.1, 60.0  # broker.handshake-timeout, seconds


HEARTBEAT_SHARE = 3
"""An unset tbon.heartbeat is at most this fraction of tbon.torpid and of tbon.timeout: a child
that sent nothing beats unasked after 1.5 heartbeats (docs/protocol.md section 5.2), and a peer
must not be judged before it beat twice at that pace."""


def default_heartbeat(torpid: float, timeout: float) -> float:
    """tbon.heartbeat when it is not set: 10 s, the period at which an idle 2048-broker instance
    costs at most 0.1 CPU-s a second (docs/design.md section 14), or a third of the shorter of
    tbon.torpid and tbon.timeout (0 is off) if that is less, so that shortening those alone
    still gives a consistent set (tbon.timeout=2s beats every 667 ms)."""
    limits = [limit / HEARTBEAT_SHARE for limit in (torpid, timeout) if limit > 0]
    return min([parse_duration(DEFAULTS["tbon.heartbeat"]), *limits])


def default_total(each: int) -> int:
    """broker.client-backlog-total when it is not set: five quarters of one client's bound, room
    for one client at its bound and a flow-controlled `tbon exec` beside it (16 MiB, its whole
    output budget in flight), and no more (docs/design.md section 14)."""
    return each * 5 // 4


class BrokerConfig(Record):
    """A broker's settings, validated once (broker_config). A Record, not a frozen dataclass,
    for start-up time (tbon/record.py): treat it as frozen, and make a changed copy with
    replaced(). Equal field by field; not hashable in practice (its attributes are a dict)."""

    __slots__ = __match_args__ = (
        "size",
        "topo",
        "heartbeat",
        "torpid",
        "timeout",
        "endpoint",
        "shutdown_timeout",
        "rundir",
        "hostname",
        "log_level",
        "join_timeout",
        "client_backlog",
        "handshake_timeout",
        "client_backlog_total",
        "boot_server",
        "requested_rank",
        "cert",
        "config_file",
        "reattach_timeout",
        "standbys",
        "attributes",
    )

    def __init__(
        self,
        size: int | None,
        topo: str,
        heartbeat: float,
        torpid: float,
        timeout: float,
        endpoint: str,
        shutdown_timeout: float,
        rundir: str | None,
        hostname: str,
        log_level: str,
        join_timeout: float = 30.0,
        client_backlog: int = 64 << 20,
        handshake_timeout: float = 5.0,
        client_backlog_total: int = 80 << 20,
        boot_server: str | None = None,
        requested_rank: int | None = None,
        cert: str | None = None,
        config_file: str | None = None,
        reattach_timeout: float | None = None,
        standbys: int = DEFAULT_STANDBYS,
        attributes: dict[str, str] | None = None,
    ) -> None:
        self.size, self.topo, self.heartbeat, self.torpid = size, topo, heartbeat, torpid
        self.timeout, self.endpoint, self.shutdown_timeout = timeout, endpoint, shutdown_timeout
        self.rundir, self.hostname, self.log_level = rundir, hostname, log_level
        self.join_timeout = join_timeout
        self.client_backlog = client_backlog  # bytes a local client may leave unread (local.py)
        self.handshake_timeout = handshake_timeout  # a peer's CURVE handshake (children.py)
        self.client_backlog_total = client_backlog_total  # all local clients together, unread
        self.boot_server = boot_server
        self.requested_rank = requested_rank
        self.cert = cert  # a certificate (tbon keygen) holding this broker's key pair
        self.config_file = config_file  # tbon broker -c FILE: config-file bootstrap
        self.reattach_timeout = reattach_timeout  # how long an orphan seeks (None: timeout)
        self.standbys = standbys  # tbon.standbys: copies of the root table (standbys.py)
        self.attributes: dict[str, str] = {} if attributes is None else attributes

    def replaced(self, **changes: Any) -> BrokerConfig:
        """This config with some fields changed, as dataclasses.replace made it (an unknown
        name is a TypeError, as there)."""
        return BrokerConfig(**{**{name: getattr(self, name) for name in self.__slots__}, **changes})


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """`NAME=VALUE` strings as a dict; unknown names and missing `=` are usage errors."""
    attributes: dict[str, str] = {}
    for text in assignments:
        name, equals, value = text.partition("=")
        if not equals or not name:
            raise UsageError(f"invalid attribute {text!r}: use -S NAME=VALUE")
        if name not in KNOWN:
            raise UsageError(f"unknown attribute {name!r} (known: {', '.join(sorted(KNOWN))})")
        attributes[name] = value
    return attributes


def broker_config(attributes: dict[str, str], config_file: str | None = None) -> BrokerConfig:
    values = {**DEFAULTS, **attributes}
    if config_file is not None:
        for clash in ("broker.boot-server", "broker.cert"):
            if clash in attributes:
                raise UsageError(f"-c FILE and {clash} do not go together: choose one bootstrap")
    topo = spec_from_fanout(values["tbon.fanout"]) if "tbon.fanout" in values else None
    if "tbon.topo" in attributes or topo is None:
        topo = parse_spec(values["tbon.topo"])
    size = parse_size(values["size"], "size") if "size" in values else None
    level = values["log-stderr-level"].lower()
    if level not in LOG_LEVELS:
        raise UsageError(f"invalid log-stderr-level {level!r}: use one of {', '.join(LOG_LEVELS)}")
    endpoint = values["tbon.endpoint"]
    if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
        raise UsageError(f"invalid tbon.endpoint {endpoint!r}: use tcp://HOST:PORT (%h, * allowed)")
    requested_rank = None
    if "broker.rank" in values:
        requested_rank = parse_rank(values["broker.rank"], "broker.rank")
        if "broker.boot-server" not in values:
            raise UsageError("broker.rank only makes sense with broker.boot-server")
    boot_server = values.get("broker.boot-server")
    if boot_server is not None:
        _check_boot_servers(boot_server)
    join_timeout = _duration(values, "broker.join-timeout")
    if join_timeout <= 0:
        raise UsageError("broker.join-timeout must be greater than zero")
    reattach_timeout = None
    if "broker.reattach-timeout" in values:
        reattach_timeout = _duration(values, "broker.reattach-timeout")
        if reattach_timeout <= 0:
            raise UsageError("broker.reattach-timeout must be greater than zero")
    backlog = _client_backlog(values["broker.client-backlog"])
    handshake_timeout = _duration(values, "broker.handshake-timeout")
    if not MIN_HANDSHAKE <= handshake_timeout <= MAX_HANDSHAKE:
        raise UsageError(
            f"invalid broker.handshake-timeout {values['broker.handshake-timeout']!r}: "
            f"from {MIN_HANDSHAKE * 1000:g}ms to {MAX_HANDSHAKE:g}s"
        )
    total = _client_backlog_total(values.get("broker.client-backlog-total"), backlog)
    torpid, timeout = _duration(values, "tbon.torpid"), _duration(values, "tbon.timeout")
    heartbeat = _duration(values, "tbon.heartbeat")
    if heartbeat <= 0:
        raise UsageError("tbon.heartbeat must be greater than zero")
    if "tbon.heartbeat" not in attributes:
        heartbeat = default_heartbeat(torpid, timeout)
    return BrokerConfig(
        size=size,
        topo=topo,
        heartbeat=heartbeat,
        torpid=torpid,
        timeout=timeout,
        endpoint=endpoint,
        shutdown_timeout=_duration(values, "broker.shutdown-timeout"),
        rundir=values.get("broker.rundir"),
        hostname=values.get("hostname") or socket.gethostname(),
        log_level=level,
        join_timeout=join_timeout,
        client_backlog=backlog,
        handshake_timeout=handshake_timeout,
        client_backlog_total=total,
        boot_server=boot_server,
        requested_rank=requested_rank,
        cert=values.get("broker.cert") or None,
        config_file=config_file,
        reattach_timeout=reattach_timeout,
        standbys=_standbys(values["tbon.standbys"]),
        attributes=dict(attributes),
    )


def _check_boot_servers(text: str) -> None:
    """broker.boot-server is a comma-separated list of URIs, tried in order by the joiner
    (boot/flub.py): each must parse, and a bad one is named, with its place in a longer list."""
    from tbon.overlay.connectors.uri import parse_uri_list

    parse_uri_list(text, "broker.boot-server")


def _standbys(text: str) -> int:
    """tbon.standbys: a whole number from 0 to MAX_STANDBYS (more than the instance has ranks
    below the root is clamped where the ranks are chosen: state/standbys.py)."""
    if not is_decimal(text) or len(text) > 1 or int(text) > MAX_STANDBYS:
        shown = repr(text) if len(text) <= 16 else f"{text[:16]!r}..."
        raise UsageError(f"invalid tbon.standbys {shown}: a whole number from 0 to {MAX_STANDBYS}")
    return int(text)


def _client_backlog(text: str) -> int:
    from tbon.overlay.parse.numbers import parse_bytes

    size = parse_bytes(text)
    if size is None or not MIN_BACKLOG <= size <= 1 << 40:
        raise UsageError(
            f"invalid broker.client-backlog {text!r}: a size from {MIN_BACKLOG >> 20}M to 1024G "
            "(K, M and G are binary multiples)"
        )
    return size


def _client_backlog_total(text: str | None, backlog: int) -> int:
    """At least one client's bound (else that bound would mean nothing); by default five
    quarters of it (docs/design.md section 14 says why)."""
    from tbon.overlay.parse.numbers import parse_bytes

    if text is None:
        return default_total(backlog)
    size = parse_bytes(text)
    if size is None or not backlog <= size <= 1 << 40:
        raise UsageError(
            f"invalid broker.client-backlog-total {text!r}: a size from broker.client-backlog "
            f"({backlog >> 20}M) to 1024G (K, M and G are binary multiples)"
        )
    return size


def _duration(values: dict[str, str], name: str) -> float:
    return check_duration(parse_duration(values[name], name), name)


def host_address(hostname: str) -> str:
    """The address that `%h` in tbon.endpoint stands for: the host's own, else loopback."""
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return "127.0.0.1"
