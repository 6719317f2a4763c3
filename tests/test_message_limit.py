"""No message exceeds the 4 MiB frame limit at 262,144 ranks (issue 26): the status watches'
pushes of every view, FLUB's answers, and the orders rank 0 derives from its table, the largest
of which is a heal order naming every broker a loss near the root cut off.

Tables are built as rank 0 builds them (the compact store) and messages encoded with the real
encoder (overlay/wire/message.py). tests/test_limits.py covers `status.get`'s pages and views.
"""

from __future__ import annotations

import errno
import itertools
from typing import Any

from rank0 import AtRank0
from test_limits import worst_table

from tbon.keys.cert import generate_keypair
from tbon.limits import MAX_SIZE
from tbon.overlay.services.actions import Action, Call, Respond, Send
from tbon.overlay.services.flub import FlubService, flub_attributes
from tbon.overlay.services.heal import MAX_ADMISSIONS, ORDER_RANKS
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.services.status import StatusService
from tbon.overlay.state.heldtable import HeldPages
from tbon.overlay.state.ranktable import Lost, Online, RankTable
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import MAX_MESSAGE_BYTES, Kind, Message, encode

NOW = 123456.789
KEY = "P" * 40  # a Z85 public key's length: the longest admission


def wire_bytes(message: Message) -> int:
    """What `message` takes on the wire, its route as long as a client's through a relay."""
    message.route = message.route or ["l" + "ab" * 5]
    return sum(map(len, encode(message)))


TAGS = itertools.count(2**48 - 1000)


def request(topic: str, payload: dict[str, Any] | None = None) -> Message:
    return Message(Kind.REQUEST, topic, payload or {}, nodeid=0, tag=next(TAGS), route=["l01"])


def answers(actions: list[Action]) -> list[Message]:
    return [a.message for a in actions if isinstance(a, Respond)]


def test_every_status_watch_push_fits_at_the_largest_size() -> None:
    """A summary watch of the root and of a subtree, and a held watch of 30,000 ranks held
    whose every update goes as pages; a table watch is refused, not sent."""
    table = worst_table("kary:32", 30000, range(2, 20001))  # rank 1 still to come
    status = StatusService(table, Lifecycle())
    for view in ({"view": "summary"}, {"view": "summary", "rank": 1}):
        watching = request("status.watch", view)
        [first] = answers(status.watch(watching, NOW))
        assert not first.errnum and wire_bytes(first) < MAX_MESSAGE_BYTES
        status.ack(request("status.ack", {"watch": watching.tag}), NOW)
    [refused] = answers(status.watch(request("status.watch"), NOW))
    assert refused.errnum == errno.EFBIG
    watch = request("status.watch", {"view": "held"})
    ack = request("status.ack", {"watch": watch.tag})
    [reply] = answers(status.watch(watch, NOW))
    pages, count = HeldPages(), 1
    while pages.take(reply.payload) is None:
        assert wire_bytes(reply) < MAX_MESSAGE_BYTES
        [reply] = answers(status.ack(ack, NOW))
        count += 1
    assert count > 4 and wire_bytes(reply) < MAX_MESSAGE_BYTES
    assert status.ack(ack, NOW) == []  # the last page read: nothing new to send
    generation = table.generation
    table.apply(Online(1, 1, "h" * 64, 4_194_303), NOW)
    assert table.generation != generation
    pushed = status.pushes(NOW)  # every watcher has read its last: each is sent the newest
    assert len(pushed) == 3
    assert all(wire_bytes(message) < MAX_MESSAGE_BYTES for _, message in pushed)


def test_flub_answers_fit_at_the_largest_size() -> None:
    table = worst_table("kary:0", 64, range(1, 2))
    flub = AtRank0.of(
        lambda t: FlubService(
            0,
            t.topology,
            t,
            Lifecycle(),
            {"endpoint": "tcp://" + "h" * 64 + ":65535", "public_key": KEY, "hostname": "h" * 64},
            flub_attributes(2.0, 10.0, 60.0, 30.0),
        ),
        table,
    )
    key = generate_keypair()[0]
    ask = {"public_key": key, "hostname": "h" * 64, "rank": MAX_SIZE - 1}
    actions = flub.allocate(request("flub.allocate", ask), NOW)
    [call] = [a for a in actions if isinstance(a, Call)]  # rank 0 is the parent: its card
    assert wire_bytes(call.request) < MAX_MESSAGE_BYTES
    card = call.request.respond(
        {"endpoint": "tcp://" + "h" * 64 + ":65535", "public_key": KEY, "hostname": "h" * 64}
    )
    [granted] = answers(call.then(card, NOW))
    assert granted.payload["rank"] == MAX_SIZE - 1 and wire_bytes(granted) < MAX_MESSAGE_BYTES
    other = {"public_key": generate_keypair()[0], "hostname": "h" * 64, "rank": MAX_SIZE - 1}
    [busy] = answers(flub.allocate(request("flub.allocate", other), NOW))
    assert busy.errnum == errno.EBUSY and wire_bytes(busy) < MAX_MESSAGE_BYTES


def binomial_held(lost_below: int) -> tuple[RankTable, RankPath]:
    """MAX_SIZE ranks of a binomial tree, all launched; rank 0 and every rank below
    `lost_below` (and it) online, each with a key."""
    table = RankTable(Topology("binomial", MAX_SIZE), ["h" * 64] * MAX_SIZE, now=0.0)
    table.apply(Online(0, 1, "h" * 64, 1), 1.0)
    path = RankPath(table)
    below = [lost_below, *table.topology.descendants(lost_below)]
    for rank in sorted(below):  # a parent's number is below its children's
        assert table.apply(Online(rank, 1, "h" * 64, 4_194_303, key=KEY), 1.0).applied
    return table, path


def test_a_loss_near_the_root_fosters_and_withdraws_in_orders_that_fit() -> None:
    """Rank 1 of a binomial tree of 262,144 ranks holds 131,071 brokers below it: when it is
    lost, rank 0 is told to foster all of them, in several heal.foster orders each under a
    message (and under what a broker accepts in one); as rank 1's children come to rank 0,
    the admissions of the ranks below them, moot now, are withdrawn in orders that fit too."""
    table, path = binomial_held(1)
    applied = path.handle(Lost(1, 1, "r" * 64), 2.0)
    orders = [a.request for a in applied.actions if isinstance(a, Call)]
    assert {o.topic for o in orders} == {"heal.foster"} and len(orders) > 1
    assert sum(len(o.payload["ranks"]) for o in orders) == MAX_SIZE // 2 - 1
    for order in orders:
        assert len(order.payload["ranks"]) <= min(ORDER_RANKS, MAX_ADMISSIONS)
        assert wire_bytes(order) < MAX_MESSAGE_BYTES
    withdrawn = 0
    for child in table.topology.children(1):
        done = path.handle(Online(child, 1, "h" * 64, 4_194_303, parent=0, key=KEY), 3.0)
        for action in done.actions:
            if isinstance(action, Send) and action.message.topic == "heal.withdraw":
                assert len(action.message.payload["ranks"]) <= ORDER_RANKS
                assert wire_bytes(action.message) < MAX_MESSAGE_BYTES
                withdrawn += len(action.message.payload["ranks"])
    assert withdrawn > 2 * ORDER_RANKS  # rank 3 alone held 65,535 below it
