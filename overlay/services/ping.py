"""broker.ping and broker.info, served by every broker; instance.shutdown, served by rank 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tbon.overlay.services.actions import Action, Respond, ShutDown
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message
from tbon.record import Record


class Whoami(Record):
    """What a broker says about itself."""

    __slots__ = __match_args__ = (
        "rank",
        "hostname",
        "pid",
        "uri",
        "endpoint",
        "public_key",
        "attributes",
    )

    def __init__(
        self,
        rank: int,
        hostname: str,
        pid: int,
        uri: str,
        endpoint: str,
        public_key: str,
        attributes: dict[str, str] | None = None,
    ) -> None:
        self.rank, self.hostname, self.pid, self.uri = rank, hostname, pid, uri
        self.endpoint, self.public_key = endpoint, public_key
        self.attributes: dict[str, str] = {} if attributes is None else attributes


class PingService:
    def __init__(self, me: Whoami, topology: Topology) -> None:
        self.me = me
        self.topology = topology
        # why this broker cannot reach the current root's table now (None: it can), said on
        # every ping so that a client given a URI list passes over it (connectors/client.py)
        self.adrift: Callable[[float], str | None] = lambda now: None

    def identity(self) -> dict[str, Any]:
        return {"rank": self.me.rank, "hostname": self.me.hostname, "pid": self.me.pid}

    def ping(self, request: Message, now: float) -> list[Action]:
        """Echo the payload with who answered and how many brokers it crossed."""
        hops = len(request.route) - 1
        answer = {**request.payload, **self.identity(), "hops": hops}
        if (why := self.adrift(now)) is not None:
            answer["adrift"] = why
        return [Respond(request.respond(answer))]

    def info(self, request: Message, now: float) -> list[Action]:
        rank = self.me.rank
        about = {
            **self.identity(),
            "size": self.topology.size,
            "topo": self.topology.spec,
            "uri": self.me.uri,
            "endpoint": self.me.endpoint,
            "public_key": self.me.public_key,
            "parent": self.topology.parent(rank),
            "children": list(self.topology.children(rank)),
            "attributes": self.me.attributes,
        }
        return [Respond(request.respond(about))]

    def shutdown(self, request: Message, now: float) -> list[Action]:
        """Rank 0: answer at once, then end the initial program and shut the tree down."""
        return [Respond(request.respond({"rank": self.me.rank})), ShutDown(end_program=True)]
