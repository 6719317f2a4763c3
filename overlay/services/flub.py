"""FLUB, the serving side (docs/flub.md): rank 0 reserves ranks and orders parents to admit
joiners' keys; a parent obeys only rank 0. Config-booted brokers that come back are given their
incarnation by rank 0 through the same service.

Rank 0 alone decides, and only rank 0 tells a parent to admit a key: in one step of its own loop
it checks that (rank, incarnation, key) is its current reservation and sends `flub.authorize` to
the parent, which answers with its endpoint and public key for the joiner. A revocation for the
same incarnation can only follow that order down the same links, so a parent never admits a key
that rank 0 has already voided.

A reservation is used (`flub.kex`, `flub.release`) by the client connection it was granted on,
or by one that proves it holds the secret half of the reservation's key (a restarted joiner,
or one that failed over to another boot server): the key it names is public, the connection
and the secret key are not. Asking again with that key on another connection gets the same
reservation named, but not the right to use it; answering a challenge (`flub.challenge`,
state/possession.py) moves that right to the answering connection. Each order is obeyed only
from whom may give it (trust.py): `flub.authorize` and `flub.revoke` from rank 0,
`config.rejoin` from the rank's parent.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tbon.keys.cert import fingerprint, is_key
from tbon.keys.proof import encode_nonce
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.actions import (
    Action,
    Apply,
    Authorize,
    Call,
    Readmit,
    Respond,
    Revoke,
    fail,
    info,
    warning,
)
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.trust import from_parent_of, unless_from_root
from tbon.overlay.state.possession import CHALLENGE_LIFE, Challenges
from tbon.overlay.state.rankevents import Outcome, Reboot, Release, Reserve
from tbon.overlay.state.rankstates import CONNECTED, RankState
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message
from tbon.overlay.wire.route import Connection, connection_of

if TYPE_CHECKING:  # the children's side is loaded by a broker that has children only
    from tbon.overlay.links.children import Rejoin
    from tbon.overlay.state.ranktable import RankTable  # rank 0's, and a member's

Card = dict[str, str]
"""What a joiner needs to reach its parent: endpoint, public_key (Z85), hostname."""

RESERVATIONS_PER_CONNECTION = 4
"""How many reservations one client connection may hold at once. A joiner needs one, and
`tbon expand` runs one broker (one connection) per rank, so this never slows a real join; it
stops one client from taking every vacancy with throw-away keys (docs/flub.md §5)."""


class FlubService:
    def __init__(
        self,
        rank: int,
        topology: Topology,
        table: RankTable | None,
        lifecycle: Lifecycle,
        card: Card,
        attributes: dict[str, float],
        challenges: Challenges | None = None,
    ) -> None:
        """`table` is rank 0's (None elsewhere); `card` is this broker's own, for joiners that
        become its children; `attributes` are the liveness settings every joiner adopts;
        `challenges`, rank 0's open challenges (a test passes its own randomness)."""
        self.rank = rank
        self.topology = topology
        self.table = table
        self.lifecycle = lifecycle
        self.card = card
        self.attributes = attributes
        self.waiting_admission: list[Rejoin] = []  # config children, until we are welcomed
        # rank 0: the reservations each client connection (trust.connection_of) was granted first
        self.held: dict[Connection, set[tuple[int, int]]] = {}
        self.challenges = challenges if challenges is not None else Challenges()
        # rank 0: the key exchanges (`wait`) held until their parent rank is connected
        self.parked: dict[int, list[Message]] = {}
        self._parked_seen = -1  # the table's generation when `unpark` last looked

    # --- rank 0 -------------------------------------------------------------------------------

    def allocate(self, request: Message, now: float) -> list[Action]:
        """Reserve a rank for a joiner's key, in one step of the table. When the rank's parent
        is online, have it admit the key at once and give the joiner its card in the answer, so
        that the joiner needs no second round."""
        assert self.table is not None
        payload = request.payload
        key, host, rank = payload.get("public_key"), payload.get("hostname"), payload.get("rank")
        if not isinstance(key, str) or not is_key(key) or not isinstance(host, str):
            return fail(request, errno.EINVAL, "flub.allocate needs public_key and hostname")
        if rank is not None and not is_int(rank):
            return fail(request, errno.EINVAL, "flub.allocate: rank must be a whole number")
        if self.lifecycle.stopping:
            return fail(request, errno.ESHUTDOWN, "the instance is shutting down")
        route = connection_of(request)
        held = self._held(route)
        repeat = any(entry.joiner == key for entry in self.table.keyed(key))
        if len(held) >= RESERVATIONS_PER_CONNECTION and not repeat:
            why = (
                f"this connection already holds {len(held)} reservations (ranks "
                f"{', '.join(str(r) for r, _ in sorted(held))}), the most one client may hold "
                "until they end"
            )
            return [
                info(f"FLUB: refused a joiner on {host}: {why}"),
                *fail(request, errno.EAGAIN, why),
            ]
        lease = float(self.attributes["broker.join-timeout"])
        return [
            Apply(
                Reserve(key, host, rank, lease),
                then=lambda outcome, now: self._reserved(request, outcome, now),
                request=request,
            )
        ]

    def _reserved(self, request: Message, outcome: Outcome, now: float) -> list[Action]:
        """The table's answer to a joiner's Reserve (the one before it, if replaced, is
        revoked on the one path): refused, told its reservation, and its parent ordered to
        admit the key when the parent is online."""
        assert self.table is not None
        payload = request.payload
        key, host, rank = payload.get("public_key"), payload.get("hostname"), payload.get("rank")
        grant = outcome.reservation
        assert grant is not None  # a Reserve always answers with one
        if not grant.granted:
            errnum = errno.ENOSPC if rank is None else errno.EBUSY
            if isinstance(rank, int) and not 0 <= rank < self.topology.size:
                errnum = errno.ENOENT
            if grant.never:
                errnum = errno.EPERM
            return [
                info(f"FLUB: refused a joiner on {host}: {grant.reason}"),
                *fail(request, errnum, grant.reason),
            ]
        actions: list[Action] = []
        pair = (grant.rank, grant.incarnation)
        if not grant.repeated:  # a repeat is told its reservation, and holds it only if it did
            self.held.setdefault(connection_of(request), set()).add(pair)
            actions.append(
                info(
                    f"FLUB: rank {grant.rank} incarnation {grant.incarnation} reserved for "
                    f"{host} (key {fingerprint(str(key))})"
                )
            )
        parent = self.table.parent_of(grant.rank)
        assert parent is not None  # the root's rank is never reserved

        def answer(card: Card | None, now: float) -> list[Action]:
            assert self.table is not None
            entry = self.table.entry(grant.rank)
            if entry.incarnation != grant.incarnation or entry.state is not RankState.RESERVED:
                why = f"the reservation of rank {grant.rank} incarnation {grant.incarnation} lapsed"
                return fail(request, *self._ended(grant.rank, grant.incarnation, str(key), why))
            reply = {
                "rank": grant.rank,
                "incarnation": grant.incarnation,
                "size": self.topology.size,
                "topo": self.topology.spec,
                "parent": parent,
                "lease": self._lease_left(grant.rank, now),
                "attributes": self.attributes,
                # whether this connection may use it as it is, or must prove it holds the key
                "held": pair in self.held.get(connection_of(request), ()),
            }
            if card is not None:
                reply["parent_card"] = card
            else:  # the joiner's flub.kex waits for this parent: its log says for what
                reply["parent_state"] = str(self.table.entry(parent).state)
            return [Respond(request.respond(reply))]

        if self.table.entry(parent).state is not RankState.ONLINE:
            return [*actions, *answer(None, now)]  # the joiner waits, then asks flub.kex
        return [
            *actions,
            self._order_authorize(
                grant.rank,
                grant.incarnation,
                str(key),
                then=lambda reply, now: answer(None if reply.errnum else _card(reply), now),
            ),
        ]

    def kex(self, request: Message, now: float) -> list[Action]:
        """A joiner asks for its parent's card: check the reservation and that it was granted
        to this connection, have the parent admit the key, and pass the parent's answer on. A
        request that says `wait`, for a parent not connected yet, is held (`parked`) and taken
        through here again once the parent is (`unpark`): the joiner needs no status stream,
        and is answered in the turn that saw its parent come online."""
        assert self.table is not None
        payload = request.payload
        rank, incarnation, key = (payload.get(k) for k in ("rank", "incarnation", "public_key"))
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str) and is_key(key)):
            return fail(request, errno.EINVAL, "flub.kex needs rank, incarnation, public_key")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if (refused := self._not_holder(request, rank, incarnation, key, now)) is not None:
            errnum, why = refused
            return [
                warning(f"refused a key exchange for rank {rank}: {why}"),
                *fail(request, errnum, why),
            ]
        if self.lifecycle.stopping:
            return fail(request, errno.ESHUTDOWN, "the instance is shutting down")
        parent = self.table.parent_of(rank)
        assert parent is not None  # verify refuses the root's rank: it is never reserved
        state = self.table.entry(parent).state
        if state not in CONNECTED:
            if payload.get("wait") is True:  # answered once the parent is online (unpark)
                self.parked.setdefault(parent, []).append(request)
                return []
            return fail(request, errno.EHOSTUNREACH, f"rank {parent} is {state}")

        def passed_on(reply: Message, now: float) -> list[Action]:
            if reply.errnum:  # the joiner's exit code follows from it: 77, 0, 75 or 1
                return fail(request, reply.errnum, reply.errstr)
            return [Respond(request.respond(_card(reply)))]

        return [self._order_authorize(rank, incarnation, key, then=passed_on)]

    def unpark(self, now: float) -> list[Action]:
        """The held key exchanges whose parent is connected now (or all of them, when the
        instance stops), each taken through `kex` again, which orders the parent or answers
        why not. Called after each turn of the loop; it looks only when the table changed (a
        parent came online) or the instance stops: one look per parent waited for, not per
        joiner."""
        table = self.table
        if table is None or not self.parked:
            return []
        stopping = self.lifecycle.stopping
        if table.generation == self._parked_seen and not stopping:
            return []
        self._parked_seen = table.generation
        due = [
            parent for parent in self.parked if stopping or table.entry(parent).state in CONNECTED
        ]
        return [
            action
            for parent in due
            for request in self.parked.pop(parent)
            for action in self.kex(request, now)
        ]

    def _unpark_rank(self, rank: int, now: float) -> list[Action]:
        """The held key exchanges for `rank`, whose reservation just ended (its lease ran out,
        its joiner gave it back): `kex` answers each why (ESTALE)."""
        parent = self.table.parent_of(rank) if self.table is not None else None
        held = self.parked.get(parent, []) if parent is not None else []
        ended = [r for r in held if r.payload.get("rank") == rank]
        if not ended:
            return []
        assert parent is not None
        kept = [r for r in held if r.payload.get("rank") != rank]
        if kept:
            self.parked[parent] = kept
        else:
            del self.parked[parent]
        return [action for request in ended for action in self.kex(request, now)]

    def release(self, request: Message, now: float) -> list[Action]:
        """A joiner that failed before its hello gives its reservation back, on the connection
        it was granted on: the rank is vacant at once instead of when the lease runs out, and
        its parent drops the key."""
        assert self.table is not None
        payload = request.payload
        rank, incarnation, key = (payload.get(k) for k in ("rank", "incarnation", "public_key"))
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str) and is_key(key)):
            return fail(request, errno.EINVAL, "flub.release needs rank, incarnation, public_key")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if (refused := self._not_holder(request, rank, incarnation, key, now)) is not None:
            errnum, why = refused
            return [
                info(f"FLUB: refused to release rank {rank}: {why}"),
                *fail(request, errnum, why),
            ]
        host = self.table.entry(rank).host

        def released(outcome: Outcome, now: float) -> list[Action]:
            """The rank is vacant, and its parents told to drop the key (the one path)."""
            if not outcome.applied:  # verify passed, so the table's row agrees: kept as a guard
                return fail(request, errno.EPERM, outcome.reason)
            said = f"FLUB: the joiner on {host} released rank {rank} incarnation {incarnation}"
            return [info(said), Respond(request.respond({})), *self._unpark_rank(rank, now)]

        return [Apply(Release(rank, incarnation, key), then=released, request=request)]

    def challenge(self, request: Message, now: float) -> list[Action]:
        """A connection that was not granted a reservation asks how to prove it holds the
        reservation's key: a fresh challenge, for that reservation and this connection only,
        which it answers in its `flub.kex` or `flub.release` (state/possession.py)."""
        assert self.table is not None
        payload = request.payload
        rank, incarnation, key = (payload.get(k) for k in ("rank", "incarnation", "public_key"))
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str) and is_key(key)):
            return fail(request, errno.EINVAL, "flub.challenge needs rank, incarnation, public_key")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if (why := self.table.verify(rank, incarnation, key)) is not None:
            return fail(request, *self._ended(rank, incarnation, key, why))
        issued = self.challenges.issue(connection_of(request), rank, incarnation, key, now)
        answer = {
            "challenge": encode_nonce(issued.challenge.nonce),
            "key": issued.challenge.public,
            "expires": CHALLENGE_LIFE,
        }
        return [Respond(request.respond(answer))]

    def disconnect(self, request: Message, now: float) -> list[Action]:
        """client.disconnect at rank 0: the connection's reservations no longer count against
        it (they stay reserved until their joiners come online, release them or they expire),
        nobody may exchange keys for them or release them without a proof any more, and its
        challenges can no longer be answered."""
        gone = connection_of(request)
        self.held.pop(gone, None)
        self.challenges.forget(gone)
        for parent in list(self.parked):  # nobody to answer: its key exchanges are dropped
            kept = [r for r in self.parked[parent] if connection_of(r) != gone]
            if kept:
                self.parked[parent] = kept
            else:
                del self.parked[parent]
        return []

    def _not_holder(
        self, request: Message, rank: int, incarnation: int, key: str, now: float
    ) -> tuple[int, str] | None:
        """Why `request` may not use the reservation (rank, incarnation, key), and the errno
        that says so; None if it may. It must be rank 0's current reservation (else ESTALE: it
        lapsed or was given back; but EPERM if a broker with this key came online with it:
        this one is a second holder); and, since a public key is no secret, either this
        connection holds it or the request's `proof` answers this connection's challenge with
        the key's secret half, which moves the reservation to this connection (else EPERM; a
        challenge that expired, ETIMEDOUT)."""
        assert self.table is not None
        if (why := self.table.verify(rank, incarnation, key)) is not None:
            return self._ended(rank, incarnation, key, why)
        route = connection_of(request)
        if (rank, incarnation) in self.held.get(route, ()):
            return None
        if "proof" not in request.payload:
            why = f"rank {rank} incarnation {incarnation} was not reserved by this connection"
            return errno.EPERM, why
        proof = request.payload["proof"]
        refused = self.challenges.redeem(route, rank, incarnation, key, proof, now)
        if refused is not None:
            return (errno.ETIMEDOUT if refused.expired else errno.EPERM), refused.why
        for pairs in self.held.values():  # one holder at a time: the latest to prove it
            pairs.discard((rank, incarnation))
        self.held.setdefault(route, set()).add((rank, incarnation))
        return None

    def _ended(self, rank: int, incarnation: int, key: str, why: str) -> tuple[int, str]:
        """The errno and reason for a reservation (rank, incarnation, key) that is not rank 0's
        current one. Used by a broker with this key, which is online with it: the asker is a
        second holder (EPERM: its joiner exits 77, and a new process with this key could not
        have it either). Otherwise it lapsed, was given back, or never was (ESTALE: a joiner
        exits 75, and a new process may be granted a new reservation)."""
        assert self.table is not None
        entry = self.table.entry(rank) if 0 <= rank < self.topology.size else None
        if (
            entry is not None
            and (entry.incarnation, entry.key) == (incarnation, key)
            and entry.state in CONNECTED
        ):
            held = f"held by another broker (pid {entry.pid} on {entry.host})"
            return errno.EPERM, f"rank {rank} incarnation {incarnation} is {held}"
        return errno.ESTALE, why

    def _held(self, route: Connection) -> set[tuple[int, int]]:
        """The reservations `route` holds that are still reserved. Every connection's ended
        ones (online, expired, released, reserved again) are forgotten on the way."""
        table = self.table
        assert table is not None

        def current(rank: int, incarnation: int) -> bool:
            entry = table.entry(rank)
            return entry.incarnation == incarnation and entry.state is RankState.RESERVED

        for hops in list(self.held):
            still = {pair for pair in self.held[hops] if current(*pair)}
            if still:
                self.held[hops] = still
            else:
                del self.held[hops]
        return self.held.get(route, set())

    def _order_authorize(
        self,
        rank: int,
        incarnation: int,
        key: str,
        then: Callable[[Message, float], list[Action]],
    ) -> Call:
        assert self.table is not None
        parent = self.table.parent_of(rank)  # rank 0 after a takeover: the root (§13.6)
        assert parent is not None
        order = {"rank": rank, "incarnation": incarnation, "public_key": key}
        return Call(Message(Kind.REQUEST, "flub.authorize", order, nodeid=parent), then)

    def _lease_left(self, rank: int, now: float) -> float:
        assert self.table is not None
        until = self.table.entry(rank).lease_until
        return max(0.0, (until or now) - now)

    def expire(self, now: float) -> list[Action]:
        """Have every reservation whose lease ran out before its joiner said hello ended (the
        one path voids it at its parents)."""
        assert self.table is not None
        return [
            Apply(expiry, then=self._expired(expiry.rank, expiry.incarnation))
            for expiry in self.table.expired(now)
        ]

    def _expired(self, rank: int, incarnation: int) -> Callable[[Outcome, float], list[Action]]:
        assert self.table is not None
        host = self.table.entry(rank).host  # the joiner's, until the rank is vacant again

        def said(outcome: Outcome, now: float) -> list[Action]:
            if not outcome.applied:
                return []
            why = f"FLUB: the reservation of rank {rank} incarnation {incarnation} for {host}"
            return [warning(f"{why} expired"), *self._unpark_rank(rank, now)]

        return said

    def rejoin(self, request: Message, now: float) -> list[Action]:
        """A parent asks for the incarnation of its config-booted child, back at its door."""
        assert self.table is not None
        rank, incarnation = request.payload.get("rank"), request.payload.get("incarnation")
        if not (is_int(rank) and is_int(incarnation)):
            return fail(request, errno.EINVAL, "config.rejoin needs rank and incarnation")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if not 0 < rank < self.topology.size or not from_parent_of(request, self.topology, rank):
            return fail(request, errno.EPERM, "config.rejoin comes from the rank's parent only")

        def answered(outcome: Outcome, now: float) -> list[Action]:
            """The current incarnation (a raised one supersedes the last: the one path)."""
            if not outcome.applied:
                return fail(request, errno.EPERM, outcome.reason)
            assert self.table is not None
            now_is = self.table.entry(rank).incarnation
            return [Respond(request.respond({"incarnation": now_is}))]

        # Reboot names the ended incarnation, or 0
        return [Apply(Reboot(rank, incarnation), then=answered, request=request)]

    # --- a parent -----------------------------------------------------------------------------

    def authorize(self, request: Message, now: float) -> list[Action]:
        """The root's order to admit a joiner's key as one of this broker's children."""
        if (refused := unless_from_root(request)) is not None:
            return refused
        payload = request.payload
        rank, incarnation, key = (payload.get(k) for k in ("rank", "incarnation", "public_key"))
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str) and is_key(key)):
            return fail(request, errno.EINVAL, "flub.authorize needs rank, incarnation, key")
        assert isinstance(rank, int) and isinstance(incarnation, int)
        if not 0 <= rank < self.topology.size or self._parent_of(rank) != self.rank:
            return fail(request, errno.EPERM, f"rank {rank} is not a child of rank {self.rank}")
        if self.lifecycle.stopping:
            return fail(request, errno.ESHUTDOWN, "the instance is shutting down")
        return [Authorize(rank, incarnation, key), Respond(request.respond(self.card))]

    def _parent_of(self, rank: int) -> int | None:
        """Who admits `rank`'s joiner: its topology parent; for rank 0, the root that took over
        (this broker, if it holds the table: docs/protocol.md §13.6)."""
        if rank == 0:
            table = self.table
            return table.parent_of(0) if table is not None and table.root == self.rank else None
        return self.topology.parent(rank)

    def revoke(self, request: Message, now: float) -> list[Action]:
        """The root voided an incarnation of a child: cut it off (one-way: nothing to answer)."""
        if (refused := unless_from_root(request)) is not None:
            return refused
        payload = request.payload
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        holds = self.topology.children(self.rank) or self._parent_of(0) == self.rank
        if not (is_int(rank) and is_int(incarnation)) or not holds:
            return []
        assert isinstance(rank, int) and isinstance(incarnation, int)
        return [Revoke(rank, incarnation, str(payload.get("reason", "revoked")))]

    def ask_rejoin(self, rejoin: Rejoin, welcomed: bool) -> list[Action]:
        """A config-booted child's broker is at the door: rank 0 gives its incarnation. Until
        this broker is itself in the tree (`welcomed`), the child waits."""
        if not welcomed:
            self.waiting_admission.append(rejoin)
            return []

        def answered(reply: Message, now: float) -> list[Action]:
            incarnation = None if reply.errnum else reply.payload.get("incarnation")
            if not is_int(incarnation):
                why = reply.errstr or "rank 0 did not give a new incarnation"
                return [Readmit(rejoin, None, why)]
            assert isinstance(incarnation, int)
            said = info(f"rank {rejoin.rank} rejoins as incarnation {incarnation}")
            return [said, Readmit(rejoin, incarnation, "")]

        ask = {"rank": rejoin.rank, "incarnation": rejoin.incarnation}
        return [Call(Message(Kind.REQUEST, "config.rejoin", ask, nodeid=0), answered)]

    def welcomed(self) -> list[Action]:
        """This broker is in the tree now: ask for the children that waited at its door."""
        waiting, self.waiting_admission = self.waiting_admission, []
        return [action for rejoin in waiting for action in self.ask_rejoin(rejoin, True)]


def _card(reply: Message) -> Card:
    payload = reply.payload
    return {
        "endpoint": str(payload.get("endpoint", "")),
        "public_key": str(payload.get("public_key", "")),
        "hostname": str(payload.get("hostname", "")),
    }


def flub_attributes(
    heartbeat: float, torpid: float, timeout: float, join: float, standbys: int = 0
) -> dict[str, Any]:
    """The settings a joiner takes from the instance, so that both ends of each link agree,
    and tbon.standbys, so that a joiner refilling a standby's rank binds its endpoint even with
    no children: the other members must reach it across a dead root (protocol §13.4)."""
    return {
        "tbon.heartbeat": heartbeat,
        "tbon.torpid": torpid,
        "tbon.timeout": timeout,
        "broker.join-timeout": join,
        "tbon.standbys": standbys,
    }
