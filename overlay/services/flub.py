"""The broker's FLUB services: reservations and lease expiry at rank 0, key exchange and
revocation at a joiner's parent (docs/flub.md). A mixin of Broker, in a module of its own."""

from __future__ import annotations

import dataclasses
import errno
import logging
import time
from collections.abc import Callable
from typing import Any

from tbon.keys.cert import decode_key, fingerprint
from tbon.overlay.broker.attributes import BrokerConfig
from tbon.overlay.links.children import Children, Rejoin
from tbon.overlay.links.parent import ParentLink
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.instance import Instance
from tbon.overlay.state.ranktable import Event, Reboot, Reserve
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

log = logging.getLogger("tbon.broker")


class FlubServices:
    """What a broker does for joining brokers (the attributes are Broker's)."""

    rank: int
    config: BrokerConfig
    topology: Topology
    children: Children | None
    instance: Instance | None
    stopping: bool
    public: str
    endpoint: str
    _due: float
    _call: Callable[[Message, Callable[[Message], None]], None]
    _respond: Callable[[Message], bool]
    _route: Callable[[Message, str, float], None]
    _report: Callable[[list[Event], float], None]
    parent: ParentLink | None
    _waiting_admission: list[Rejoin]

    def _adopt(self, attributes: dict[str, Any]) -> None:
        """Take the instance's liveness settings, so that both ends of each link agree."""
        self.config = dataclasses.replace(
            self.config,
            heartbeat=float(attributes["tbon.heartbeat"]),
            torpid=float(attributes["tbon.torpid"]),
            timeout=float(attributes["tbon.timeout"]),
            join_timeout=float(attributes["broker.join-timeout"]),
        )
        if self.children is not None:
            self.children.config = self.config

    def _instance_attributes(self) -> dict[str, Any]:
        return {
            "tbon.heartbeat": self.config.heartbeat,
            "tbon.torpid": self.config.torpid,
            "tbon.timeout": self.config.timeout,
            "broker.join-timeout": self.config.join_timeout,
        }

    def _allocate(self, request: Message, now: float) -> Message:
        """Rank 0: reserve a rank for a joining broker's key (atomic: one table, one thread)."""
        assert self.instance is not None
        payload = request.payload
        key, host, rank = payload.get("public_key"), payload.get("hostname"), payload.get("rank")
        if not isinstance(key, str) or not _valid_key(key) or not isinstance(host, str):
            return request.fail(errno.EINVAL, "flub.allocate needs public_key and hostname")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
            return request.fail(errno.EINVAL, "flub.allocate: rank must be a whole number")
        if self.stopping:
            return request.fail(errno.ESHUTDOWN, "the instance is shutting down")
        table = self.instance.table
        grant = table.reserve(Reserve(key, host, rank, self.config.join_timeout), now)
        if not grant.granted:
            log.info("FLUB: refused a joiner on %s: %s", host, grant.reason)
            errnum = errno.ENOSPC if rank is None else errno.EBUSY
            if rank is not None and not 0 <= rank < self.topology.size:
                errnum = errno.ENOENT
            if grant.never:
                errnum = errno.EPERM
            return request.fail(errnum, grant.reason)
        self._due = 0.0  # a new lease to watch
        if not grant.repeated:
            log.info(
                "FLUB: rank %d incarnation %d reserved for %s (key %s)",
                grant.rank,
                grant.incarnation,
                host,
                fingerprint(key),
            )
        return request.respond(
            {
                "rank": grant.rank,
                "incarnation": grant.incarnation,
                "size": self.topology.size,
                "topo": self.topology.spec,
                "parent": self.topology.parent(grant.rank),
                "lease": self._lease_left(grant.rank, now),
                "attributes": self._instance_attributes(),
            }
        )

    def _lease_left(self, rank: int, now: float) -> float:
        assert self.instance is not None
        until = self.instance.table.entry(rank).lease_until
        return max(0.0, (until or now) - now)

    def _kex(self, request: Message) -> Message | None:
        """A parent: check a joiner's key with rank 0, then authorize it for that incarnation."""
        payload = request.payload
        rank, incarnation, key = (
            payload.get("rank"),
            payload.get("incarnation"),
            payload.get("public_key"),
        )
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str) and _valid_key(key)):
            return request.fail(errno.EINVAL, "flub.kex needs rank, incarnation, public_key")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if not 0 < rank < self.topology.size or self.topology.parent(rank) != self.rank:
            return request.fail(errno.EPERM, f"rank {rank} is not a child of rank {self.rank}")
        if self.stopping:
            return request.fail(errno.ESHUTDOWN, "the instance is shutting down")
        if self.children is None:
            return request.fail(errno.EPERM, f"rank {self.rank} takes no children")

        def verified(reply: Message) -> None:
            if reply.errnum:
                log.warning("refused a key exchange for rank %d: %s", rank, reply.errstr)
                self._respond(request.fail(errno.EPERM, reply.errstr))
                return
            assert self.children is not None
            self.children.authorize(rank, incarnation, key)
            self._respond(
                request.respond(
                    {
                        "endpoint": self.endpoint,
                        "public_key": self.public,
                        "hostname": self.config.hostname,
                    }
                )
            )

        self._call(
            Message(
                Kind.REQUEST,
                "flub.verify",
                {"rank": rank, "incarnation": incarnation, "public_key": key},
                nodeid=0,
            ),
            verified,
        )
        return None

    def _revoke(self, request: Message) -> Message | None:
        """A parent, told by rank 0 that an incarnation of its child is void: cut it off."""
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        if (refused := self._unless_from_rank0(request)) is not None:
            return refused
        if self.children is not None and is_int(rank) and is_int(incarnation):
            assert isinstance(rank, int) and isinstance(incarnation, int)
            self.children.revoke(rank, incarnation, str(payload.get("reason", "revoked")))
        return None

    def _unless_from_rank0(self, request: Message) -> Message | None:
        """The refusal of an order that only rank 0 may give, when someone else gave it."""
        if self._from_rank0(request):
            return None
        rank = request.payload.get("rank")
        log.warning("refused %s for rank %s: not from rank 0", request.topic, rank)
        return request.fail(errno.EPERM, f"{request.topic} comes from rank 0 only")

    def _from_rank0(self, request: Message) -> bool:
        """Whether rank 0 itself sent `request`. Each broker on the way pushed the hop it came
        from, and only the last level+1 hops were pushed by brokers we trust (our ancestors):
        rank 0's own "s" followed by one "p" per level down to us."""
        level = self.topology.level(self.rank)
        return request.route[-(level + 1) :] == ["s"] + ["p"] * level

    def _void(self, rank: int, incarnation: int, reason: str) -> None:
        """Rank 0: make the parent of `rank` drop that incarnation's key and connection."""
        parent = self.topology.parent(rank)
        if parent is None:
            return
        notice = Message(
            Kind.REQUEST,
            "flub.revoke",
            {"rank": rank, "incarnation": incarnation, "reason": reason},
            nodeid=parent,
        )
        self._route(notice, "s", time.monotonic())  # one-way: no tag, no answer awaited

    def _ask_rejoin(self, rejoin: Rejoin) -> None:
        """A parent: a config-booted child's broker is here; rank 0 gives its incarnation.
        Until this broker is itself in the tree, the child waits."""
        if self.parent is not None and not self.parent.welcomed:
            self._waiting_admission.append(rejoin)
            return

        def answered(reply: Message) -> None:
            assert self.children is not None
            incarnation = None if reply.errnum else reply.payload.get("incarnation")
            why = reply.errstr or "rank 0 did not give a new incarnation"
            if incarnation is not None:
                log.info("rank %d rejoins as incarnation %d", rejoin.rank, incarnation)
            inbound = self.children.rejoined(rejoin, incarnation, why, time.monotonic())
            self._report(inbound.reports, time.monotonic())
            self._due = 0.0

        ask = {"rank": rejoin.rank, "incarnation": rejoin.incarnation}
        self._call(Message(Kind.REQUEST, "config.rejoin", ask, nodeid=0), answered)

    def _admit_waiting(self) -> None:
        waiting, self._waiting_admission = self._waiting_admission, []
        for rejoin in waiting:
            self._ask_rejoin(rejoin)

    def _rejoin(self, request: Message, now: float) -> Message:
        """Rank 0: a parent asks for a new incarnation of its config-booted child."""
        assert self.instance is not None
        rank, incarnation = request.payload.get("rank"), request.payload.get("incarnation")
        if not (is_int(rank) and is_int(incarnation)):
            return request.fail(errno.EINVAL, "config.rejoin needs rank and incarnation")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if not 0 < rank < self.topology.size or not self._from_parent_of(request, rank):
            return request.fail(errno.EPERM, "config.rejoin comes from the rank's parent only")
        outcome = self.instance.apply(Reboot(rank, incarnation), now)  # the ended one, or 0
        if not outcome.applied:
            return request.fail(errno.EPERM, outcome.reason)
        return request.respond({"incarnation": self.instance.table.entry(rank).incarnation})

    def _from_parent_of(self, request: Message, rank: int) -> bool:
        """Whether the parent broker of `rank` itself sent `request` to rank 0: its own "s",
        then one "c<child>" pushed by each broker on the way up."""
        hops, current = [], self.topology.parent(rank)
        while current:
            hops.append(f"c{current}")
            current = self.topology.parent(current)
        return request.route == ["s", *hops]

    def _expire_leases(self, now: float) -> None:
        assert self.instance is not None
        for expiry in self.instance.table.expired(now):
            entry = self.instance.table.entry(expiry.rank)
            host = entry.host
            if self.instance.apply(expiry, now).applied:
                log.warning(
                    "FLUB: the reservation of rank %d incarnation %d for %s expired",
                    expiry.rank,
                    expiry.incarnation,
                    host,
                )
                self._void(expiry.rank, expiry.incarnation, "the reservation expired")


def _valid_key(key: str) -> bool:
    try:
        decode_key(key)
    except ValueError:
        return False
    return True
