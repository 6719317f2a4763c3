"""Healing the tree (docs/protocol.md §12), at any broker: rank 0's orders obeyed from rank 0
alone, and `heal.wait`, which lets a client wait for the tree to be whole before it asks again.

Rank 0 decides after each event it applies (services/rankpath.py, by the rules of
state/healing.py); the orders travel as requests down the tree, so that only what rank 0
confirms as current (rank, incarnation, key) is ever admitted anywhere:

* `heal.foster` to the foster parent: admit these (rank, incarnation, key), for a while;
* `heal.withdraw` to a foster parent: forget these admissions, moot now;
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
    Foster,
    GoHome,
    Respond,
    Withdraw,
    fail,
)
from tbon.overlay.services.trust import unless_from_root
from tbon.overlay.state.healing import may_admit
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message

MAX_ADMISSIONS = 65536
"""The most (rank, incarnation, key) one heal.foster (or heal.withdraw) may carry."""

ORDER_RANKS = 16384
"""The most admissions rank 0 puts in one heal.foster or heal.withdraw: one takes at most 57
bytes of JSON (a rank, an incarnation, a 40-character key), so an order stays under 1 MiB, a
quarter of a message, and within MAX_ADMISSIONS. A loss near the root of 262,144 ranks may cut
off 131,071 brokers (rank 1 of a binomial tree), or all but two (a chain): such an order goes as
several, each obeyed on its own."""


def in_orders(items: list[Any]) -> list[list[Any]]:
    """`items` cut into orders of at most ORDER_RANKS."""
    return [items[at : at + ORDER_RANKS] for at in range(0, len(items), ORDER_RANKS)]

MAX_WAIT = 3600.0
"""The longest heal.wait a client may ask for (seconds)."""


class HealService:
    def __init__(self, rank: int, topology: Topology, card: dict[str, str]) -> None:
        """`card` is this broker's own, for children that come home to it."""
        self.rank = rank
        self.topology = topology
        self.card = card
        self.waiting: list[tuple[Message, float]] = []  # heal.wait requests and their deadlines
        # this broker took over as the root (§13.4): it fosters whatever the dead root's death
        # cut off, its own topology subtree or not (state/ranktable.py, `holds`)
        self.leads = False

    # --- any broker: the root's orders ---------------------------------------------------------

    def foster(self, request: Message, now: float) -> list[Action]:
        """heal.foster: admit these brokers as foster children, for a while."""
        if (refused := unless_from_root(request)) is not None:
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
        if not (self.leads or may_admit(self.topology, self.rank, rank)):
            return None
        if key and not is_key(key):
            return None
        return rank, incarnation, key

    def withdraw(self, request: Message, now: float) -> list[Action]:
        """heal.withdraw: forget these foster admissions, unless their brokers came (one-way)."""
        if (refused := unless_from_root(request)) is not None:
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
        if (refused := unless_from_root(request)) is not None:
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
        if (refused := unless_from_root(request)) is not None:
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
        if not self.waiting:  # asked every busy turn: most have nothing waiting
            return None
        return min((deadline for _, deadline in self.waiting), default=None)
