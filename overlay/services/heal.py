"""Healing the tree (docs/protocol.md §12): rank 0 has brokers cut off below a rank that ended
fostered by a live ancestor, and sends them home once their parent's rank is online again;
every broker obeys those orders from rank 0 alone; and `heal.wait` lets a client wait for the
tree to be whole before it asks again.

Rank 0 decides from its table (fostering.py) after each event it applies; the orders travel as
requests down the tree, so that only what rank 0 confirms as current (rank, incarnation, key)
is ever admitted anywhere:

* `heal.foster` to the foster parent: admit these (rank, incarnation, key), for a while;
* `heal.adopt` to the rank online again: admit this child (it answers with its card);
* `heal.home` to the child, through its foster parent: go to this card.
"""

from __future__ import annotations

import errno
from typing import Any

from tbon.keys.cert import is_key
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.actions import (
    Action,
    Authorize,
    Call,
    Foster,
    GoHome,
    Respond,
    Send,
    Withdraw,
    fail,
    info,
    warning,
)
from tbon.overlay.services.trust import unless_from_rank0
from tbon.overlay.state.admissions import Admissions
from tbon.overlay.state.healing import (
    Fate,
    admission_fate,
    away_from_home,
    cut_off_below,
    foster_parent,
    goes_home,
    may_admit,
)
from tbon.overlay.state.rankstates import CONNECTED
from tbon.overlay.state.ranktable import (
    Departed,
    Event,
    Lost,
    Online,
    Outcome,
    RankTable,
    Void,
)
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

MAX_ADMISSIONS = 65536
"""The most (rank, incarnation, key) one heal.foster may carry: an instance's size bounds it."""

MAX_WAIT = 3600.0
"""The longest heal.wait a client may ask for (seconds)."""


class HealService:
    def __init__(
        self, rank: int, topology: Topology, table: RankTable | None, card: dict[str, str]
    ) -> None:
        """`table` is rank 0's (None elsewhere); `card` is this broker's own, for children that
        come home to it."""
        self.rank = rank
        self.topology = topology
        self.table = table
        self.card = card
        self.waiting: list[tuple[Message, float]] = []  # heal.wait requests and their deadlines
        self.admissions = Admissions(topology)  # rank 0: who was told to admit whom

    # --- rank 0: what an applied event calls for --------------------------------------------

    def after(self, event: Event, outcome: Outcome, now: float) -> list[Action]:
        """Orders that an event rank 0 just applied calls for."""
        table = self.table
        if table is None or not outcome.applied:
            return []
        actions: list[Action] = []
        if isinstance(event, Lost | Departed | Void):
            actions = self._foster_below(event.rank, now)
        elif isinstance(event, Online):
            home = self.topology.parent(event.rank)
            welcomer = event.parent if event.parent is not None else home
            if welcomer is not None:
                self.admissions.told(event.rank, event.incarnation, welcomer)
            actions = self._send_home(event.rank, event.parent)
        return actions + self._withdraw_moot()

    def _withdraw_moot(self) -> list[Action]:
        """Withdraw each open foster admission that is moot now (admissions.py): its rank is
        attached to another broker that reaches rank 0, or its incarnation is no longer a
        connected one. One that its rank used is closed without a word."""
        table = self.table
        assert table is not None
        moot: dict[int, list[tuple[int, int]]] = {}
        for rank, incarnation, parent in self.admissions.open():
            fate = admission_fate(table, rank, incarnation, parent)
            if fate is Fate.OPEN:
                continue
            self.admissions.close(rank, parent)
            if fate is Fate.MOOT:
                moot.setdefault(parent, []).append((rank, incarnation))
        return [
            Send(
                Message(
                    Kind.REQUEST,
                    "heal.withdraw",
                    {"ranks": [list(a) for a in ranks]},
                    nodeid=parent,
                )
            )
            for parent, ranks in sorted(moot.items())
            if table.entries[parent].state in CONNECTED
        ]

    def revocations(
        self, rank: int, incarnation: int, reason: str, also: set[int] | None = None
    ) -> list[Action]:
        """Rank 0 ended (rank, incarnation) for good (replaced, or voided): `flub.revoke` to
        every parent that may still admit it (admissions.py), and to those in `also`."""
        parents = self.admissions.withdraw(rank, incarnation) | (also or set())
        notice = {"rank": rank, "incarnation": incarnation, "reason": reason}
        return [
            Send(Message(Kind.REQUEST, "flub.revoke", dict(notice), nodeid=parent))
            for parent in sorted(parents)
            if may_admit(self.topology, parent, rank)
        ]

    def _foster_below(self, rank: int, now: float) -> list[Action]:
        assert self.table is not None
        admitted = cut_off_below(self.table, rank)
        if not admitted:
            return []
        foster = foster_parent(self.table, rank)
        for admitted_rank, incarnation, _ in admitted:
            self.admissions.fostered(admitted_rank, incarnation, foster)
        order = {
            "ranks": [list(admission) for admission in admitted],
            "for": self.table.reattach_grace,
        }
        shown = ",".join(str(r) for r, _, _ in admitted[:8]) + ("..." if len(admitted) > 8 else "")
        return [
            info(f"rank {rank} ended: rank {foster} fosters what it held ({shown})"),
            Call(
                Message(Kind.REQUEST, "heal.foster", order, nodeid=foster),
                then=lambda reply, now: _unless_failed(reply, f"fostering at rank {foster}"),
            ),
        ]

    def _send_home(self, rank: int, parent: int | None) -> list[Action]:
        """`rank` is online: its children away from home go back to it, and it goes home itself
        if it came online under a foster parent while its own parent is there."""
        assert self.table is not None
        actions: list[Action] = []
        for child, incarnation, key in away_from_home(self.table, rank):
            actions.append(self._adopt(rank, child, incarnation, key))
        home = goes_home(self.table, rank, parent)
        if home is not None:
            entry = self.table.entries[rank]
            actions.append(self._adopt(home, rank, entry.incarnation, entry.key or ""))
        return actions

    def _adopt(self, parent: int, child: int, incarnation: int, key: str) -> Call:
        """Have `parent` admit `child`, then tell the child to go to it."""
        order = {"rank": child, "incarnation": incarnation, "public_key": key}
        self.admissions.told(child, incarnation, parent)

        def adopted(reply: Message, now: float) -> list[Action]:
            if reply.errnum:
                return [warning(f"rank {parent} could not take rank {child} home: {reply.errstr}")]
            card = {k: reply.payload.get(k) for k in ("rank", "endpoint", "public_key")}
            go = Message(Kind.REQUEST, "heal.home", {**card, "incarnation": incarnation})
            go.nodeid = child
            return [
                info(f"rank {child} goes home to rank {parent}"),
                Call(go, then=lambda r, now: _unless_failed(r, f"sending rank {child} home")),
            ]

        return Call(Message(Kind.REQUEST, "heal.adopt", order, nodeid=parent), then=adopted)

    # --- any broker: rank 0's orders ---------------------------------------------------------

    def foster(self, request: Message, now: float) -> list[Action]:
        """heal.foster: admit these brokers as foster children, for a while."""
        if (refused := unless_from_rank0(request)) is not None:
            return refused
        ranks, lasting = request.payload.get("ranks"), request.payload.get("for")
        if not isinstance(ranks, list) or len(ranks) > MAX_ADMISSIONS:
            return fail(request, errno.EINVAL, "heal.foster needs a list of ranks")
        if not isinstance(lasting, int | float) or not 0 < lasting <= MAX_WAIT * 24:
            return fail(request, errno.EINVAL, "heal.foster needs how long (for)")
        admitted: list[tuple[int, int, str]] = []
        for item in ranks:
            admission = self._admission(item)
            if admission is None:
                return fail(request, errno.EINVAL, f"heal.foster: bad admission {item!r}")
            admitted.append(admission)
        return [Foster(tuple(admitted), now + float(lasting)), Respond(request.respond({}))]

    def _admission(self, item: Any) -> tuple[int, int, str] | None:
        """One (rank, incarnation, key) of this broker's subtree, or None if it is not one."""
        if not (isinstance(item, list) and len(item) == 3):
            return None
        rank, incarnation, key = item
        if not (is_int(rank) and is_int(incarnation) and isinstance(key, str)):
            return None
        if not may_admit(self.topology, self.rank, rank):
            return None
        if key and not is_key(key):
            return None
        return rank, incarnation, key

    def withdraw(self, request: Message, now: float) -> list[Action]:
        """heal.withdraw: forget these foster admissions, unless their brokers came (one-way)."""
        if (refused := unless_from_rank0(request)) is not None:
            return refused
        ranks = request.payload.get("ranks")
        if not isinstance(ranks, list) or len(ranks) > MAX_ADMISSIONS:
            return []
        withdrawn = tuple(
            (int(item[0]), int(item[1]))
            for item in ranks
            if isinstance(item, list) and len(item) == 2 and is_int(item[0]) and is_int(item[1])
        )
        return [Withdraw(withdrawn)] if withdrawn else []

    def adopt(self, request: Message, now: float) -> list[Action]:
        """heal.adopt: admit this child of ours, coming home; answer with our card."""
        if (refused := unless_from_rank0(request)) is not None:
            return refused
        payload = request.payload
        item = [payload.get("rank"), payload.get("incarnation"), payload.get("public_key")]
        admission = self._admission(item)
        if admission is None or self.topology.parent(admission[0]) != self.rank:
            return fail(request, errno.EINVAL, f"heal.adopt: not a child of rank {self.rank}")
        rank, incarnation, key = admission
        card = {"rank": self.rank, **self.card}
        return [Authorize(rank, incarnation, key), Respond(request.respond(card))]

    def home(self, request: Message, now: float) -> list[Action]:
        """heal.home: go to this card, our own parent's broker."""
        if (refused := unless_from_rank0(request)) is not None:
            return refused
        payload = request.payload
        rank, endpoint, key = (
            payload.get("rank"),
            payload.get("endpoint"),
            payload.get("public_key"),
        )
        if not (
            is_int(rank)
            and rank == self.topology.parent(self.rank)
            and isinstance(endpoint, str)
            and endpoint.startswith("tcp://")
            and isinstance(key, str)
            and is_key(key)
        ):
            return fail(request, errno.EINVAL, "heal.home needs this broker's parent's card")
        return [GoHome(request, (int(rank), endpoint, key))]

    # --- heal.wait ----------------------------------------------------------------------------

    def wait(self, request: Message, now: float, whole: bool) -> list[Action]:
        """heal.wait: answered once this broker is attached (rank 0: once no rank is adrift),
        or ETIMEDOUT. `whole` says whether that holds now."""
        timeout = request.payload.get("timeout", 10.0)
        if not isinstance(timeout, int | float) or not 0 <= timeout <= MAX_WAIT:
            return fail(request, errno.EINVAL, f"heal.wait: timeout from 0 to {MAX_WAIT:g}s")
        if whole:
            return [Respond(request.respond({}))]
        self.waiting.append((request, now + float(timeout)))
        return []

    def settle(self, now: float, whole: bool) -> list[Action]:
        """Answer the waiters whose wait is over: the tree is whole, or their time is up."""
        if not self.waiting:
            return []
        actions: list[Action] = []
        still = []
        for request, deadline in self.waiting:
            if whole:
                actions.append(Respond(request.respond({})))
            elif now >= deadline:
                actions.append(Respond(request.fail(errno.ETIMEDOUT, "the tree is still healing")))
            else:
                still.append((request, deadline))
        self.waiting = still
        return actions

    def next_deadline(self) -> float | None:
        return min((deadline for _, deadline in self.waiting), default=None)


def adrift(table: RankTable) -> bool:
    """Whether some connected rank is seeking a parent now."""
    return any(entry.adrift_until is not None for entry in table.entries)


def _unless_failed(reply: Message, what: str) -> list[Action]:
    return [warning(f"{what}: {reply.errstr}")] if reply.errnum else []
