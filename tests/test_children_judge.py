"""Pure decisions around a parent's links: the hello judge, the key ring, rank-table reports, and
the broker attributes (config and durations) they are tuned by."""

from __future__ import annotations

import errno
import math
import socket
from typing import Any

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from rank0 import AtRank0, performed, report
from tables import started
from zmq.utils import z85

from tbon import exitcodes
from tbon.errors import UsageError
from tbon.overlay.config.attributes import DEFAULTS, KNOWN, broker_config, parse_assignments
from tbon.overlay.links.children import Children, Inbound
from tbon.overlay.links.downward import Goodbye
from tbon.overlay.links.hello import (
    AskRankZero,
    Parent,
    Refusal,
    Standing,
    Welcome,
    judge_hello,
    judge_stale,
)
from tbon.overlay.links.keyring import Identity, KeyRing
from tbon.overlay.links.sessions import ChildSession, Ended
from tbon.overlay.parse.duration import format_duration, parse_duration
from tbon.overlay.services.actions import Action, Call, Respond, Send
from tbon.overlay.services.flub import FlubService, flub_attributes
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.rankpath import RankPath
from tbon.overlay.state.ranktable import (
    Departed,
    Dropped,
    Event,
    Lost,
    Online,
    RankState,
    Reserve,
    Torpid,
)
from tbon.overlay.state.reports import decode_event, encode_event, encode_events
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION, Kind, Message, MessageError

FAST = settings(max_examples=80, deadline=None)
CARD = {"endpoint": "tcp://10.0.0.1:5000", "public_key": "P" * 40, "hostname": "node1"}

#        0
#      1   2
#     3 4 5 6
TOPOLOGY = Topology("kary:2", 7)
CHILD = Identity(3, 1)


def hello(rank: Any = 3, incarnation: Any = 1, version: Any = PROTOCOL_VERSION) -> dict[str, Any]:
    return {
        "rank": rank,
        "incarnation": incarnation,
        "version": version,
        "hostname": "node3",
        "pid": 4242,
    }


def parent(
    rank: int = 1, current: dict[int, int] | None = None, shutting_down: bool = False
) -> Parent:
    """A parent whose children's current incarnations are `current` (rank -> incarnation)."""
    current = {3: 1, 4: 2} if current is None else current
    standings = {child: Standing(incarnation) for child, incarnation in current.items()}
    return Parent(rank, TOPOLOGY, standings, shutting_down=shutting_down)


def judge(
    payload: dict[str, Any],
    sender: Identity = CHILD,
    parent_rank: int = 1,
    current: dict[int, int] | None = None,
    shutting_down: bool = False,
) -> Refusal | None:
    """The judge's refusal of a hello from `sender`'s key, or None if it welcomes exactly it."""
    judgement = judge_hello(payload, sender, parent(parent_rank, current, shutting_down))
    if isinstance(judgement, Welcome):
        assert judgement.identity == sender
        return None
    assert isinstance(judgement, Refusal)
    return judgement


def public_key(seed: int) -> str:
    return z85.encode(bytes([seed]) * 32).decode()


def only_answer(actions: list[Action]) -> dict[str, Any]:
    [answer] = [a.message for a in actions if isinstance(a, Respond)]
    assert not answer.errnum, answer.errstr
    return answer.payload


def only_refusal(actions: list[Action]) -> Message:
    [answer] = [a.message for a in actions if isinstance(a, Respond)]
    assert answer.errnum, answer.payload
    return answer


# --- judge_hello --------------------------------------------------------------------------------


def test_welcome_for_the_right_child() -> None:
    assert judge(hello()) is None
    assert judge(hello(4, 2), sender=Identity(4, 2)) is None
    assert judge(hello(5, 1), sender=Identity(5, 1), parent_rank=2, current={5: 1}) is None


def test_welcome_ignores_extra_fields() -> None:
    assert judge({**hello(), "future": [1, 2]}) is None


@pytest.mark.parametrize("version", [0, 1, 99, "2", None, [2], {"v": 2}])
def test_wrong_version_is_refused(version: Any) -> None:
    refusal = judge(hello(version=version))
    assert refusal is not None
    assert refusal.exit_code == exitcodes.REFUSED == 77
    assert "incompatible protocol version" in refusal.reason
    assert repr(version) in refusal.reason
    assert f"speaks {PROTOCOL_VERSION}" in refusal.reason


def test_missing_version_is_refused() -> None:
    payload = hello()
    del payload["version"]
    refusal = judge(payload)
    assert refusal is not None and refusal.exit_code == exitcodes.REFUSED
    assert "incompatible protocol version None" in refusal.reason


def test_version_is_judged_first() -> None:
    """A peer of another version learns that, whatever else is wrong with its hello."""
    refusal = judge({"version": 1}, sender=Identity(6, 9), current={}, shutting_down=True)
    assert refusal is not None and "incompatible protocol version 1" in refusal.reason


@pytest.mark.parametrize(
    ("claimed_rank", "claimed_incarnation"),
    [(4, 1), (3, 2), (3, 0), (None, 1), (3, None), ("3", 1), (3, "1"), (5, 1)],
)
def test_claims_must_match_the_keys_identity(claimed_rank: Any, claimed_incarnation: Any) -> None:
    refusal = judge(hello(claimed_rank, claimed_incarnation))
    assert refusal is not None
    assert refusal.exit_code == exitcodes.REFUSED
    assert "key is authorized for rank 3 incarnation 1" in refusal.reason
    assert f"not for rank {claimed_rank} incarnation {claimed_incarnation}" in refusal.reason


@pytest.mark.parametrize("rank", [0, 1, 2, 5, 6, 7, 100])
def test_not_my_child_is_refused(rank: int) -> None:
    refusal = judge(hello(rank, 1), sender=Identity(rank, 1), current={rank: 1})
    assert refusal is not None
    assert refusal.exit_code == exitcodes.REFUSED
    assert f"rank {rank} is not a child of rank 1" in refusal.reason


def test_superseded_incarnation_is_refused() -> None:
    refusal = judge(hello(4, 1), sender=Identity(4, 1))
    assert refusal == Refusal("superseded: rank 4 is now incarnation 2", exitcodes.REFUSED)


def test_rank_without_a_current_incarnation_is_refused() -> None:
    refusal = judge(hello(), current={})
    assert refusal is not None and refusal.exit_code == exitcodes.REFUSED


def test_refusal_for_a_rank_without_a_current_incarnation_names_no_none() -> None:
    refusal = judge(hello(), current={})
    assert refusal is not None and "None" not in refusal.reason


def test_shutting_down_refuses_with_exit_zero() -> None:
    refusal = judge(hello(), shutting_down=True)
    assert refusal == Refusal("the instance is shutting down", exitcodes.SHUTDOWN)
    assert refusal.exit_code == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(
    payload=st.dictionaries(
        st.sampled_from(["rank", "incarnation", "version", "hostname", "pid", "x"]), json_values
    ),
    sender=st.builds(Identity, st.integers(0, 9), st.integers(0, 3)),
    parent_rank=st.integers(0, 6),
    current=st.dictionaries(st.integers(0, 9), st.integers(0, 3)),
    shutting_down=st.booleans(),
)
@FAST
def test_judge_hello_welcomes_exactly_the_expected_child(
    payload: dict[str, Any],
    sender: Identity,
    parent_rank: int,
    current: dict[int, int],
    shutting_down: bool,
) -> None:
    refusal = judge(payload, sender, parent_rank, current, shutting_down)
    expected = (
        payload.get("version") == PROTOCOL_VERSION
        and payload.get("rank") == sender.rank
        and payload.get("incarnation") == sender.incarnation
        and sender.rank < TOPOLOGY.size
        and TOPOLOGY.parent(sender.rank) == parent_rank
        and current.get(sender.rank) == sender.incarnation
        and not shutting_down
    )
    assert (refusal is None) == expected
    if refusal is not None:
        assert refusal.exit_code in (exitcodes.REFUSED, exitcodes.SHUTDOWN)
        assert refusal.reason and "\n" not in refusal.reason


# --- the same judge, for the instance's shared key (config bootstrap) ---------------------------


def shared(
    payload: dict[str, Any], children: dict[int, Standing] | None = None, **parent_fields: Any
) -> AskRankZero | Refusal | Welcome:
    """Judge a hello from a holder of the instance's shared key at rank 1."""
    return judge_hello(payload, None, Parent(1, TOPOLOGY, children or {}, **parent_fields))


def test_shared_key_hello_of_a_first_boot_asks_rank_zero() -> None:
    assert shared(hello(3, 0)) == AskRankZero(3, ended=0, replaces=False)


def test_shared_key_hello_for_a_rank_that_ended_asks_rank_zero_to_end_that_one() -> None:
    lost = Standing(2, ended="was lost: connection lost", shared=True)
    assert shared(hello(3, 0), {3: lost}) == AskRankZero(3, ended=2, replaces=False)


def test_shared_key_hello_for_a_connected_rank_replaces_its_old_broker() -> None:
    live = Standing(2, connected=True, shared=True)
    assert shared(hello(3, 0), {3: live}) == AskRankZero(3, ended=2, replaces=True)


def test_shared_key_leaves_retired_and_ended_ranks_to_rank_zero() -> None:
    """Rank 0 decides whether a config-booted rank may come back: it has the rank table."""
    gone = Standing(1, ended="has retired", end_code=exitcodes.SHUTDOWN, shared=True)
    judgement = shared(hello(3, 1), {3: gone}, retired=frozenset({Identity(3, 1)}))
    assert judgement == AskRankZero(3, ended=1, replaces=False)


def test_shared_key_with_another_version_is_refused() -> None:
    assert shared(hello(3, 0, version=1)) == Refusal(
        "incompatible protocol version 1", exitcodes.REFUSED
    )


@pytest.mark.parametrize("rank", [0, 1, 2, 5, 6, 7, 100])
def test_shared_key_for_a_rank_not_my_child_is_refused(rank: int) -> None:
    assert shared(hello(rank, 0)) == Refusal(
        f"rank {rank} is not a child of rank 1", exitcodes.REFUSED
    )


def test_shared_key_while_shutting_down_exits_zero() -> None:
    assert shared(hello(3, 0), shutting_down=True) == Refusal(
        "the instance is shutting down", exitcodes.SHUTDOWN
    )


def test_shared_key_may_not_take_a_rank_held_by_flub() -> None:
    flub = Standing(4, connected=True)
    assert shared(hello(3, 0), {3: flub}) == Refusal(
        "rank 3 is held by a broker that joined by FLUB", exitcodes.REFUSED
    )


def test_a_second_broker_with_the_key_of_a_welcomed_one_is_refused() -> None:
    """Two processes started with one certificate hold one key, so both pass ZAP as (3, 1). The
    first welcomed keeps the rank; the same broker saying hello again (on a new connection) is
    welcomed again."""
    held = Parent(1, TOPOLOGY, {3: Standing(1, connected=True, broker=("node3", 1111))})
    assert judge_hello(hello(), CHILD, held) == Refusal(
        "rank 3 incarnation 1 is held by another broker (pid 1111 on node3)", exitcodes.REFUSED
    )
    assert judge_hello({**hello(), "pid": 1111}, CHILD, held) == Welcome(CHILD)
    elsewhere = {**hello(), "pid": 1111, "hostname": "node9"}
    assert isinstance(judge_hello(elsewhere, CHILD, held), Refusal)
    awaited = Parent(1, TOPOLOGY, {3: Standing(1)})  # authorized, nobody welcomed yet
    assert judge_hello(hello(), CHILD, awaited) == Welcome(CHILD)


def test_an_ended_incarnation_is_told_so_before_anything_else() -> None:
    lost = Standing(1, ended="was lost: silent for 61.0s")
    judgement = judge_hello(hello(version=9), CHILD, Parent(1, TOPOLOGY, {3: lost}))
    assert judgement == Refusal("rank 3 incarnation 1 was lost: silent for 61.0s", exitcodes.LOST)
    retired = Parent(1, TOPOLOGY, {3: Standing(2)}, retired=frozenset({CHILD}))
    assert judge_hello(hello(version=9), CHILD, retired) == Refusal(
        "retired: rank 3 incarnation 1 has retired", exitcodes.SHUTDOWN
    )


# --- stale messages: from a peer with no live session ------------------------------------------


def test_stale_messages_from_an_ended_or_superseded_incarnation_are_refused() -> None:
    lost = Standing(1, ended="was lost: connection lost")
    assert judge_stale(CHILD, Parent(1, TOPOLOGY, {3: lost})) == Refusal(
        "rank 3 incarnation 1 was lost: connection lost", exitcodes.LOST
    )
    revoked = Standing(1, ended="was revoked: expired", end_code=exitcodes.REFUSED)
    assert judge_stale(CHILD, Parent(1, TOPOLOGY, {3: revoked})) == Refusal(
        "rank 3 incarnation 1 was revoked: expired", exitcodes.REFUSED
    )
    assert judge_stale(CHILD, Parent(1, TOPOLOGY, {3: Standing(2)})) == Refusal(
        "superseded: rank 3 is now incarnation 2", exitcodes.REFUSED
    )
    retired = Parent(1, TOPOLOGY, {3: Standing(2)}, retired=frozenset({CHILD}))
    assert judge_stale(CHILD, retired) == Refusal(
        "retired: rank 3 incarnation 1 has retired", exitcodes.SHUTDOWN
    )


def test_stale_messages_from_the_current_incarnation_are_only_dropped() -> None:
    assert judge_stale(CHILD, Parent(1, TOPOLOGY, {3: Standing(1)})) is None
    assert judge_stale(CHILD, Parent(1, TOPOLOGY, {})) is None
    assert judge_stale(Identity(3, 5), Parent(1, TOPOLOGY, {3: Standing(1)})) is None


identities = st.builds(Identity, st.integers(0, 9), st.integers(0, 3))
standings = st.builds(
    Standing,
    incarnation=st.integers(0, 3),
    ended=st.sampled_from(["", "was lost: connection lost", "has departed"]),
    end_code=st.sampled_from([exitcodes.LOST, exitcodes.REFUSED, exitcodes.SHUTDOWN]),
    connected=st.booleans(),
    shared=st.booleans(),
    broker=st.sampled_from([None, ("node3", 4242), ("node3", 1111), ("", 0)]),
)


@given(
    payload=st.dictionaries(
        st.sampled_from(["rank", "incarnation", "version", "hostname", "pid", "x"]), json_values
    ),
    key=st.none() | identities,
    parent_rank=st.integers(0, 6),
    children=st.dictionaries(st.integers(0, 9), standings),
    retired=st.frozensets(identities, max_size=3),
    shutting_down=st.booleans(),
)
@FAST
def test_one_judge_for_both_kinds_of_key(
    payload: dict[str, Any],
    key: Identity | None,
    parent_rank: int,
    children: dict[int, Standing],
    retired: frozenset[Identity],
    shutting_down: bool,
) -> None:
    """The judge against an oracle: who is welcomed, who goes to rank 0, who is refused how."""
    judgement = judge_hello(
        payload, key, Parent(parent_rank, TOPOLOGY, children, retired, shutting_down)
    )
    claimed = payload.get("rank")
    rank = key.rank if key is not None else claimed
    valid = isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
    mine = valid and rank < TOPOLOGY.size and TOPOLOGY.parent(rank) == parent_rank
    standing = children.get(rank) if valid else None
    speaks = payload.get("version") == PROTOCOL_VERSION
    if key is None:
        flub = standing is not None and standing.connected and not standing.shared
        if speaks and mine and not shutting_down and not flub:
            ended = standing.incarnation if standing is not None else 0
            replaces = standing is not None and standing.connected
            assert judgement == AskRankZero(rank, ended, replaces)
        else:
            assert isinstance(judgement, Refusal)
        return
    ended = standing is not None and standing.incarnation == key.incarnation and standing.ended
    pid = payload.get("pid")
    said_by = str(payload.get("hostname", "")), pid if type(pid) is int else 0
    if key in retired:
        assert judgement == Refusal(
            f"retired: rank {key.rank} incarnation {key.incarnation} has retired",
            exitcodes.SHUTDOWN,
        )
    elif ended:
        assert standing is not None
        assert isinstance(judgement, Refusal) and judgement.exit_code == standing.end_code
    elif (
        speaks
        and (claimed, payload.get("incarnation")) == (key.rank, key.incarnation)
        and mine
        and standing is not None
        and standing.incarnation == key.incarnation
        and standing.broker in (None, said_by)
        and not shutting_down
    ):
        assert judgement == Welcome(key)
    else:
        assert isinstance(judgement, Refusal)
        assert judgement.exit_code in (exitcodes.REFUSED, exitcodes.SHUTDOWN)
    if isinstance(judgement, Refusal):
        assert judgement.reason and "\n" not in judgement.reason


# --- the judge's word carried out by Children, and which connection a session is on ------------

ACCEPTED, CLOSED = zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED


def bare_children(topology: Topology, rank: int) -> tuple[Children, list[Message]]:
    """A Children with no sockets, recording what it would send: enough to drive `_hello`.
    Connection events are fed to it as the socket monitor would (`_connection_event`)."""
    children = object.__new__(Children)
    children._start(rank, topology, broker_config({"hostname": "test"}))
    children.keyring = KeyRing()
    sent: list[Message] = []
    children._send_raw = lambda _routing_id, message: sent.append(message) or True  # type: ignore[method-assign]
    return children, sent


def said_goodbye(children: Children, routing_id: bytes) -> list[Event]:
    """The child on `routing_id` says goodbye; what its parent reports."""
    inbound = Inbound()
    children._feed(Goodbye(routing_id), 1.0, inbound)
    return inbound.reports


def hello_message(identity: Identity) -> Message:
    return Message(Kind.CONTROL, "hello", hello(identity.rank, identity.incarnation))


def test_hello_is_welcomed_through_children() -> None:
    children, sent = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(Identity(3, 1), parent=1)
    inbound = Inbound()
    children._hello(b"id3", 11, Identity(3, 1), hello_message(Identity(3, 1)), 0.0, inbound)
    assert [(m.topic, m.payload) for m in sent] == [
        ("welcome", {"rank": 3, "size": 7, "incarnation": 1, "lineage": []})
    ]
    assert inbound.reports == [Online(3, 1, "node3", 4242, 1)]


def test_a_child_welcomed_while_this_broker_seeks_is_told_how_long_right_after() -> None:
    """docs/protocol.md §5.6: a child welcomed after the search began hears its deadline too."""
    children, sent = bare_children(TOPOLOGY, 1)
    children.seeking_for = lambda now: 15.0 - now
    children.sessions[3] = ChildSession(Identity(3, 1), parent=1)
    children._hello(b"id3", 11, Identity(3, 1), hello_message(Identity(3, 1)), 2.5, Inbound())
    assert [(m.topic, m.payload.get("for")) for m in sent] == [("welcome", None), ("seeking", 12.5)]


def test_hello_from_an_ended_incarnation_is_told_it_was_lost() -> None:
    children, sent = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(Identity(3, 1), Ended("was lost: silent for 61.0s"))
    inbound = Inbound()
    children._hello(b"id3", 11, Identity(3, 1), hello_message(Identity(3, 1)), 0.0, inbound)
    assert inbound.reports == []
    assert [m.topic for m in sent] == ["refuse"]
    assert sent[0].payload["exit_code"] == exitcodes.LOST
    assert "was lost" in sent[0].payload["reason"]


def test_a_retiring_child_that_leaves_is_retired_for_good() -> None:
    children, sent = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(Identity(3, 1), retiring=True, parent=1)
    welcomed_on(children, b"id3", 11)
    sent.clear()
    assert said_goodbye(children, b"id3") == [Departed(3, 1, 1)]
    children.sessions[3] = ChildSession(Identity(3, 2), parent=1)  # the rank is filled again afresh
    inbound = Inbound()
    children._hello(b"id3", 11, Identity(3, 1), hello_message(Identity(3, 1)), 0.0, inbound)
    assert inbound.reports == []
    assert [(m.topic, m.payload["exit_code"]) for m in sent] == [("refuse", exitcodes.SHUTDOWN)]
    assert sent[0].payload["reason"] == "retired: rank 3 incarnation 1 has retired"


def test_a_retiring_child_lost_is_retired_too() -> None:
    children, _ = bare_children(TOPOLOGY, 1)
    session = ChildSession(Identity(3, 1), retiring=True, parent=1)
    children.sessions[3] = session
    welcomed_on(children, b"id3", 11)
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]
    assert (session.ended, session.end_code) == ("has retired", exitcodes.SHUTDOWN)


def welcomed_on(children: Children, routing_id: bytes, fd: int, now: float = 0.0) -> Inbound:
    """Child (3, 1) connects on `fd` and says hello."""
    children._connection_event(ACCEPTED, fd)
    inbound = Inbound()
    children._hello(routing_id, fd, CHILD, hello_message(CHILD), now, inbound)
    return inbound


def test_a_child_saying_hello_again_on_a_new_connection_moves_there() -> None:
    """Its old, half-dead connection closing later is stale: it must not end the live session.
    The new connection closing is what ends it."""
    children, sent = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    welcomed_on(children, b"old", 11)
    again = welcomed_on(children, b"new", 12, now=5.0)
    assert again.reports == [Online(3, 1, "node3", 4242, 1)]
    assert [m.topic for m in sent] == ["welcome", "welcome"]
    children._connection_event(CLOSED, 11)
    assert children.settle() == []
    assert children.connected() == [3]
    assert children.sessions[3].routing_id == b"new"
    children._connection_event(CLOSED, 12)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]
    assert children.connected() == []


def test_a_stale_close_noted_before_the_new_hello_is_read_ends_nothing() -> None:
    """The old connection's close is drained, then the new hello read, before `settle`."""
    children, _ = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    welcomed_on(children, b"old", 11)
    children._connection_event(CLOSED, 11)
    welcomed_on(children, b"new", 11)  # the new connection even got the same descriptor
    assert children.settle() == []
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]


def test_a_lost_incarnation_is_welcomed_back_only_as_its_own_broker() -> None:
    """Once its only connection is seen closed, the incarnation is lost; its own broker saying
    hello later (a partition healed) is welcomed again, and rank 0 decides whether that
    incarnation is still current. Another process with the same key is told it was lost."""
    children, sent = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    welcomed_on(children, b"old", 11)
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]
    children._connection_event(ACCEPTED, 12)
    other = Inbound()
    impostor = hello_message(CHILD)
    impostor.payload["pid"] = 999
    children._hello(b"other", 12, CHILD, impostor, 1.0, other)
    assert other.reports == []
    assert (sent[-1].topic, sent[-1].payload["exit_code"]) == ("refuse", exitcodes.LOST)
    assert welcomed_on(children, b"new", 13).reports == [Online(3, 1, "node3", 4242, 1)]
    assert sent[-1].topic == "welcome"


def test_a_first_hello_on_a_connection_already_closed_is_lost_at_once() -> None:
    children, _ = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    children._connection_event(ACCEPTED, 12)
    children._connection_event(CLOSED, 12)
    inbound = Inbound()
    children._hello(b"new", 12, CHILD, hello_message(CHILD), 1.0, inbound)
    assert inbound.reports == [Online(3, 1, "node3", 4242, 1), Lost(3, 1, "connection dropped", 1)]


def test_a_hello_again_on_a_connection_already_closed_is_not_news() -> None:
    """The broker welcomed before left that connection already (it sought a parent, and another
    took it): the hello says nothing of where it is. Its session stays where it was."""
    children, _ = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    welcomed_on(children, b"old", 11)
    children._connection_event(ACCEPTED, 12)
    children._connection_event(CLOSED, 12)
    inbound = Inbound()
    children._hello(b"new", 12, CHILD, hello_message(CHILD), 1.0, inbound)
    assert inbound.reports == []
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]


def test_a_goodbye_makes_the_close_that_follows_no_news() -> None:
    children, _ = bare_children(TOPOLOGY, 1)
    session = ChildSession(CHILD, parent=1)
    children.sessions[3] = session
    welcomed_on(children, b"id3", 11)
    assert said_goodbye(children, b"id3") == [Departed(3, 1, 1)]
    children._connection_event(CLOSED, 11)
    assert children.settle() == []


def test_a_superseded_incarnation_is_still_lost_when_its_connection_closes() -> None:
    """The ledger holds sessions: one displaced by a newer incarnation is ended by its own
    connection's close (rank 0 ignores the report: it is not the current incarnation)."""
    children, _ = bare_children(TOPOLOGY, 1)
    children.sessions[3] = ChildSession(CHILD, parent=1)
    welcomed_on(children, b"old", 11)
    children.authorize(3, 2, public_key(3))
    children._connection_event(CLOSED, 11)
    assert children.settle() == [Lost(3, 1, "connection dropped", 1)]
    assert children.sessions[3].identity == Identity(3, 2) and not children.sessions[3].ended


def test_a_rejoin_is_tied_to_the_connection_its_hello_came_on() -> None:
    """Rank 0 answers a rejoin later: if the hello's connection closed meanwhile and another
    peer got its descriptor, the welcomed broker is gone, not tied to the other peer."""
    children, _ = bare_children(TOPOLOGY, 1)
    children._connection_event(ACCEPTED, 11)
    inbound = Inbound()
    children._hello(b"a", 11, None, hello_message(Identity(3, 0)), 0.0, inbound)
    [rejoin] = inbound.rejoins
    assert (rejoin.rank, rejoin.incarnation, rejoin.fd, rejoin.generation) == (3, 0, 11, 1)
    children._connection_event(CLOSED, 11)
    children._connection_event(ACCEPTED, 11)
    answered = children.rejoined(rejoin, 1, "", 1.0)
    assert answered.reports == [Online(3, 1, "node3", 4242, 1), Lost(3, 1, "connection dropped", 1)]


def test_a_config_booted_broker_restarted_on_its_host_replaces_the_old_one() -> None:
    children, _ = bare_children(TOPOLOGY, 1)
    children._connection_event(ACCEPTED, 11)
    first = Inbound()
    children._hello(b"a", 11, None, hello_message(Identity(3, 0)), 0.0, first)
    assert children.rejoined(first.rejoins[0], 1, "", 0.0).reports == [
        Online(3, 1, "node3", 4242, 1)
    ]
    children._connection_event(ACCEPTED, 12)
    second = Inbound()
    children._hello(b"b", 12, None, hello_message(Identity(3, 0)), 1.0, second)
    assert second.reports == [Lost(3, 1, "its host started a new broker", 1)]
    assert children.rejoined(second.rejoins[0], 2, "", 1.0).reports == [
        Online(3, 2, "node3", 4242, 1)
    ]
    children._connection_event(CLOSED, 11)  # the old broker's connection closing ends nothing
    assert children.settle() == []
    assert children.connected() == [3]


class TwoTwins:
    """Rank 0 (table and FLUB service) and rank 1 (Children) of kary:2, wired as the broker wires
    them, for two twins: brokers started with one certificate, so one key, asking for rank 3 on
    the client connections "l0a" and "l0b". Rank 1 is vacant until `parent_joins`."""

    def __init__(self) -> None:
        self.table = started("kary:2", 7, launched=1)
        attributes = flub_attributes(2, 10, 60, 30)
        self.path = RankPath(self.table)
        flub = FlubService(0, self.table.topology, self.table, Lifecycle(), CARD, attributes)
        self.flub = AtRank0(flub, self.path)
        self.children, self.sent = bare_children(self.table.topology, 1)
        self.key, self.now = public_key(7), 200.0

    def ask(self, topic: str, hop: str, **payload: Any) -> list[Action]:
        request = Message(Kind.REQUEST, f"flub.{topic}", payload, route=[hop])
        actions: list[Action] = getattr(self.flub, topic)(request, self.now)
        for order in [a for a in actions if isinstance(a, Call)]:  # rank 1 obeys rank 0
            asked = order.request.payload
            self.children.authorize(asked["rank"], asked["incarnation"], asked["public_key"])
            actions += order.then(order.request.respond(CARD), self.now)
        return actions

    def allocate(self, hop: str) -> dict[str, Any]:
        return only_answer(self.ask("allocate", hop, public_key=self.key, hostname="n", rank=3))

    def kex(self, hop: str) -> Message:
        [answer] = [
            a.message for a in self.ask("kex", hop, **self.triple) if isinstance(a, Respond)
        ]
        return answer

    @property
    def triple(self) -> dict[str, Any]:
        return {"rank": 3, "incarnation": 1, "public_key": self.key}

    def parent_joins(self) -> None:
        self.ask("allocate", "l0c", public_key=public_key(8), hostname="node1", rank=1)
        self.report([Online(1, 1, "node1", 10)])

    def hello(self, routing_id: bytes, fd: int, pid: int) -> None:
        self.children._connection_event(ACCEPTED, fd)
        inbound = Inbound()
        said = Message(Kind.CONTROL, "hello", {**hello(3, 1), "pid": pid})
        self.children._hello(routing_id, fd, Identity(3, 1), said, self.now, inbound)
        self.report(inbound.reports)

    def report(self, events: list[Event]) -> None:
        """What rank 0 does with its children's reports (Broker.report)."""
        for event in events:
            self.now += 1
            for action in report(self.path, event, self.now):
                if isinstance(action, Send) and action.message.topic == "flub.revoke":
                    order = action.message.payload  # the revoke reaches rank 1
                    self.children.revoke(order["rank"], order["incarnation"], order["reason"])

    def online_is(self, pid: int) -> None:
        """Rank 0 and rank 1 agree: one broker, `pid`, holds rank 3."""
        entry = self.table.entry(3)
        assert (entry.state, entry.pid, entry.incarnation) == (RankState.ONLINE, pid, 1)
        assert self.children.connected() == [3]
        assert self.children.sessions[3].broker == ("node3", pid)


def test_twins_whose_parent_is_not_yet_online_leave_one_broker_online() -> None:
    """The order of events of issue 11. Both twins reserve rank 3 while its parent is vacant (one
    reservation); the parent joins; both ask for the card. It used to go on: rank 0 ordered rank 1
    twice, both connected with the one key and said hello, rank 1 welcomed both (a session moves
    to its latest hello), rank 0 refused the second Online and voided the incarnation, and rank 1
    cut both off while the table still showed the first online. Now the reservation is used only
    on the connection it was granted on: the second twin is refused there (77)."""
    twins = TwoTwins()
    first, second = twins.allocate("l0a"), twins.allocate("l0b")
    assert (first["rank"], first["incarnation"]) == (second["rank"], second["incarnation"])
    assert "parent_card" not in first and "parent_card" not in second
    twins.parent_joins()
    assert twins.kex("l0a").payload == CARD
    for asked in (twins.kex("l0b"), only_refusal(twins.ask("release", "l0b", **twins.triple))):
        assert asked.errnum == errno.EPERM
        assert asked.errstr == "rank 3 incarnation 1 was not reserved by this connection"
    twins.hello(b"first", 11, 1111)
    assert [m.topic for m in twins.sent] == ["welcome"]
    twins.online_is(1111)


def test_twins_given_the_card_at_once_leave_one_broker_online() -> None:
    """The parent is online when they ask: each answer carries its card, so both reach it and say
    hello. The first hello keeps the rank, and the parent refuses the other broker."""
    twins = TwoTwins()
    twins.parent_joins()
    cards = [twins.allocate(hop)["parent_card"] for hop in ("l0a", "l0b")]
    assert cards == [CARD, CARD]
    twins.hello(b"first", 11, 1111)
    twins.hello(b"second", 12, 2222)
    assert [m.topic for m in twins.sent] == ["welcome", "refuse"]
    assert twins.sent[1].payload == {
        "reason": "rank 3 incarnation 1 is held by another broker (pid 1111 on node3)",
        "exit_code": exitcodes.REFUSED,
    }
    twins.children._connection_event(CLOSED, 12)  # the refused twin exits
    assert twins.children.settle() == []
    twins.online_is(1111)
    assert twins.children.sessions[3].routing_id == b"first"


def test_a_second_brokers_online_reported_all_the_same_ends_the_incarnation_at_rank0() -> None:
    """A parent that did welcome a second broker (and so cut the first off): rank 0 refuses the
    second Online, voids the incarnation, and records it ended: lost, not online."""
    table = started("kary:2", 7, launched=1)
    path = RankPath(table)
    assert table.apply(Reserve(public_key(8), "node1", 1, 30.0), 200.0).applied
    assert table.apply(Online(1, 1, "node1", 10), 200.0).applied
    assert table.apply(Reserve(public_key(7), "node3", 3, 30.0), 200.0).applied
    assert table.apply(Online(3, 1, "node3", 1111), 201.0).applied
    refused = path.handle(Online(3, 1, "node3", 2222), 202.0)
    assert not refused.outcome.applied
    actions = performed(path, refused.actions, 202.0)
    assert [a.message.topic for a in actions if isinstance(a, Send)] == ["flub.revoke"]
    entry = table.entry(3)
    assert (entry.state, entry.pid) == (RankState.LOST, None)


# --- keyring ------------------------------------------------------------------------------------


def test_identity_user_id_and_parse() -> None:
    identity = Identity(12, 3)
    assert identity.user_id == "12.3"
    assert Identity.parse("12.3") == identity
    assert Identity.parse("0.0") == Identity(0, 0)


@given(st.integers(0, 2**40), st.integers(0, 2**40))
@FAST
def test_identity_round_trip(rank: int, incarnation: int) -> None:
    identity = Identity(rank, incarnation)
    assert Identity.parse(identity.user_id) == identity


@pytest.mark.parametrize(
    "text",
    ["", ".", "3", "3.", ".2", "a.1", "1.b", "-1.2", "1.-2", "1.2.3", " 1.2", "1 .2", "1.2 "],
)
def test_identity_parse_refuses(text: str) -> None:
    assert Identity.parse(text) is None


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=8))
@FAST
def test_identity_parse_never_raises_on_ascii(text: str) -> None:
    parsed = Identity.parse(text)
    assert parsed is None or Identity.parse(parsed.user_id) == parsed


def test_identity_parse_refuses_non_decimal_digits() -> None:
    assert Identity.parse("².1") is None


def test_keyring_authorize_lookup_revoke() -> None:
    ring = KeyRing()
    key3, key4 = public_key(3), public_key(4)
    assert ring.lookup(z85.decode(key3)) is None
    ring.authorize(key3, Identity(3, 1))
    ring.authorize(key4, Identity(4, 1))
    assert ring.lookup(z85.decode(key3)) == Identity(3, 1)
    assert ring.lookup(z85.decode(key4)) == Identity(4, 1)
    ring.revoke(Identity(3, 2))  # not the bound incarnation: nothing happens
    assert ring.lookup(z85.decode(key3)) == Identity(3, 1)
    ring.revoke(Identity(3, 1))
    assert ring.lookup(z85.decode(key3)) is None
    assert ring.lookup(z85.decode(key4)) == Identity(4, 1)
    ring.revoke(Identity(3, 1))  # twice is harmless


def test_keyring_new_incarnation_revokes_the_old_key() -> None:
    ring = KeyRing()
    old, new = public_key(1), public_key(2)
    ring.authorize(old, Identity(5, 1))
    ring.authorize(new, Identity(5, 2))
    assert ring.lookup(z85.decode(old)) is None
    assert ring.lookup(z85.decode(new)) == Identity(5, 2)


def test_keyring_revoke_rank() -> None:
    ring = KeyRing()
    ring.authorize(public_key(1), Identity(5, 1))
    ring.authorize(public_key(2), Identity(6, 1))
    ring.revoke_rank(5)
    assert ring.lookup(z85.decode(public_key(1))) is None
    assert ring.lookup(z85.decode(public_key(2))) == Identity(6, 1)


def test_keyring_lookup_of_an_unknown_or_odd_key() -> None:
    ring = KeyRing()
    ring.authorize(public_key(1), Identity(1, 1))
    assert ring.lookup(b"") is None
    assert ring.lookup(b"\x01" * 31) is None
    assert ring.lookup(b"\x02" * 32) is None


# --- reports ------------------------------------------------------------------------------------

events = st.one_of(
    st.builds(
        Online,
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.text(max_size=20),
        st.integers(0, 2**31),
    ),
    st.builds(Lost, st.integers(0, 10**6), st.integers(0, 10**6), st.text(max_size=40)),
    st.builds(Departed, st.integers(0, 10**6), st.integers(0, 10**6)),
    st.builds(Torpid, st.integers(0, 10**6), st.integers(0, 10**6), st.booleans()),
)


def forwarded(event: Event, sender: int, rank: int = 0) -> list[Event]:
    """What a parent of rank `rank` (kary:2 of 9) passes up of a report from child `sender`."""
    children, _sent = bare_children(Topology("kary:2", 9), rank)
    inbound = Inbound()
    children._report(Identity(sender, 1), encode_events([event]), inbound)
    return inbound.reports


def test_a_broker_s_word_on_its_own_dropped_parent_is_forwarded() -> None:
    """Rank 7, fostered by rank 0 after rank 3 (its parent) and rank 1 died, says its link to
    rank 3 dropped; rank 1's replacement would forward it from rank 3's successor too."""
    said = Dropped(7, 1, 3, "connection dropped")
    assert forwarded(said, sender=7) == [said]
    assert forwarded(said, sender=3, rank=1) == [said]  # from below: its subtree
    assert forwarded(Dropped(8, 1, 3, "connection dropped"), sender=7) == []  # not its own
    assert forwarded(Lost(7, 1, "x", parent=7), sender=7) == []  # its own word only as Dropped


@given(events)
@FAST
def test_report_round_trip(event: Online | Lost | Departed | Torpid) -> None:
    payload = encode_event(event)
    assert payload["rank"] == event.rank and payload["incarnation"] == event.incarnation
    assert decode_event(payload) == event


def test_report_payloads() -> None:
    assert encode_event(Online(3, 2, "h", 9, 1)) == {
        "event": "online",
        "rank": 3,
        "incarnation": 2,
        "host": "h",
        "pid": 9,
        "key": "",
        "parent": 1,
    }
    assert encode_event(Lost(3, 2, "why")) == {
        "event": "lost",
        "rank": 3,
        "incarnation": 2,
        "reason": "why",
    }
    assert encode_event(Departed(3, 2)) == {"event": "departed", "rank": 3, "incarnation": 2}
    assert encode_event(Torpid(3, 2, True)) == {
        "event": "torpid",
        "rank": 3,
        "incarnation": 2,
        "torpid": True,
    }


def test_encode_event_refuses_other_objects() -> None:
    with pytest.raises(TypeError):
        encode_event("online")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"rank": 1, "incarnation": 1},
        {"event": "online", "incarnation": 1, "host": "h", "pid": 1},
        {"event": "online", "rank": 1, "host": "h", "pid": 1},
        {"event": "online", "rank": "1", "incarnation": 1, "host": "h", "pid": 1},
        {"event": "online", "rank": 1, "incarnation": None, "host": "h", "pid": 1},
        {"event": "online", "rank": 1.0, "incarnation": 1, "host": "h", "pid": 1},
        {"event": "online", "rank": 1, "incarnation": 1, "pid": 1},
        {"event": "online", "rank": 1, "incarnation": 1, "host": "h"},
        {"event": "online", "rank": 1, "incarnation": 1, "host": 5, "pid": 1},
        {"event": "online", "rank": 1, "incarnation": 1, "host": "h", "pid": "1"},
        {"event": "lost", "rank": 1, "incarnation": 1},
        {"event": "lost", "rank": 1, "incarnation": 1, "reason": None},
        {"event": "torpid", "rank": 1, "incarnation": 1},
        {"event": "torpid", "rank": 1, "incarnation": 1, "torpid": 1},
        {"event": "torpid", "rank": 1, "incarnation": 1, "torpid": "yes"},
        {"event": "retired", "rank": 1, "incarnation": 1},
        {"event": None, "rank": 1, "incarnation": 1},
        {"event": ["online"], "rank": 1, "incarnation": 1},
    ],
)
def test_bad_reports_raise_message_error(payload: dict[str, Any]) -> None:
    with pytest.raises(MessageError):
        decode_event(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"event": "departed", "rank": True, "incarnation": 1},
        {"event": "departed", "rank": 1, "incarnation": False},
        {"event": "online", "rank": 1, "incarnation": 1, "host": "h", "pid": True},
    ],
)
def test_boolean_numbers_in_reports_are_refused(payload: dict[str, Any]) -> None:
    try:
        decode_event(payload)
    except MessageError:
        return
    raise AssertionError(f"accepted {payload}")


@given(
    st.dictionaries(
        st.sampled_from(["event", "rank", "incarnation", "host", "pid", "reason", "torpid"]),
        st.one_of(json_values, st.sampled_from(["online", "lost", "departed", "torpid"])),
    )
)
@FAST
def test_decode_event_raises_only_message_error(payload: dict[str, Any]) -> None:
    try:
        event = decode_event(payload)
    except MessageError:
        return
    assert isinstance(event, Online | Lost | Departed | Torpid)


# --- config -------------------------------------------------------------------------------------


def test_parse_assignments() -> None:
    assert parse_assignments([]) == {}
    assert parse_assignments(["size=4", "tbon.topo=binomial", "hostname=a=b"]) == {
        "size": "4",
        "tbon.topo": "binomial",
        "hostname": "a=b",
    }
    assert parse_assignments(["size=4", "size=8"]) == {"size": "8"}
    assert parse_assignments(["hostname="]) == {"hostname": ""}


@pytest.mark.parametrize("text", ["size", "", "=4", "tbon.topo"])
def test_parse_assignments_needs_name_equals_value(text: str) -> None:
    with pytest.raises(UsageError, match="use -S NAME=VALUE"):
        parse_assignments([text])


@pytest.mark.parametrize("name", ["sizes", "tbon.fanouts", "Size", "broker.rank2", "x"])
def test_parse_assignments_refuses_unknown_attributes(name: str) -> None:
    with pytest.raises(UsageError, match="unknown attribute") as caught:
        parse_assignments([f"{name}=1"])
    assert repr(name) in str(caught.value)
    assert "tbon.topo" in str(caught.value)  # it lists the known ones
    assert caught.value.exit_code == exitcodes.USAGE


def test_every_known_attribute_is_accepted() -> None:
    assert set(parse_assignments([f"{name}=1" for name in KNOWN])) == KNOWN


def test_broker_config_defaults() -> None:
    config = broker_config({})
    assert config.size is None
    assert config.topo == "kary:32"
    assert (config.heartbeat, config.torpid, config.timeout) == (10.0, 30.0, 60.0)
    assert config.endpoint == "tcp://%h:*"
    assert config.shutdown_timeout == 10.0
    assert config.rundir is None
    assert config.hostname == socket.gethostname()
    assert config.log_level == "warning"
    assert config.attributes == {}
    assert set(DEFAULTS) <= KNOWN


@pytest.mark.parametrize(
    ("given", "heartbeat"),
    [
        ({"tbon.timeout": "2s"}, 2 / 3),  # a third of the shorter limit
        ({"tbon.torpid": "400ms", "tbon.timeout": "5s"}, 0.4 / 3),
        ({"tbon.torpid": "0", "tbon.timeout": "0"}, 10.0),  # both off: the default
        ({"tbon.torpid": "0", "tbon.timeout": "5m"}, 10.0),
        ({"tbon.torpid": "1s", "tbon.heartbeat": "5s"}, 5.0),  # a given one is kept
    ],
)
def test_an_unset_heartbeat_follows_the_limits(given: dict[str, str], heartbeat: float) -> None:
    """An unset tbon.heartbeat is at most a third of tbon.torpid and tbon.timeout, so that
    shortening those alone cannot have a quiet child judged before it beat."""
    assert broker_config(given).heartbeat == pytest.approx(heartbeat)


def test_broker_config_values() -> None:
    attributes = {
        "size": "16",
        "tbon.topo": "binomial",
        "tbon.heartbeat": "250ms",
        "tbon.torpid": "0",
        "tbon.timeout": "5m",
        "tbon.endpoint": "tcp://127.0.0.1:5555",
        "broker.shutdown-timeout": "1.5",
        "broker.rundir": "/tmp/x",
        "hostname": "node7",
        "log-stderr-level": "DEBUG",
    }
    config = broker_config(attributes)
    assert config.size == 16
    assert config.topo == "binomial"
    assert (config.heartbeat, config.torpid, config.timeout) == (0.25, 0.0, 300.0)
    assert config.endpoint == "tcp://127.0.0.1:5555"
    assert config.shutdown_timeout == 1.5
    assert config.rundir == "/tmp/x"
    assert config.hostname == "node7"
    assert config.log_level == "debug"
    assert config.attributes == attributes
    assert config.attributes is not attributes


def test_empty_hostname_means_this_host() -> None:
    assert broker_config({"hostname": ""}).hostname == socket.gethostname()


def test_fanout_is_an_alias_for_kary() -> None:
    assert broker_config({"tbon.fanout": "4"}).topo == "kary:4"
    assert broker_config({"tbon.fanout": "0"}).topo == "kary:0"
    # an explicit tbon.topo wins over the alias
    assert broker_config({"tbon.fanout": "4", "tbon.topo": "binomial"}).topo == "binomial"


@pytest.mark.parametrize(
    ("attributes", "match"),
    [
        ({"tbon.fanout": "x"}, "tbon.fanout"),
        ({"tbon.fanout": "-2"}, "tbon.fanout"),
        ({"tbon.topo": "ring"}, "invalid topology"),
        ({"size": "0"}, "invalid size"),
        ({"size": "-3"}, "invalid size"),
        ({"size": "four"}, "invalid size"),
        ({"size": ""}, "invalid size"),
        ({"size": "1.5"}, "invalid size"),
        ({"log-stderr-level": "verbose"}, "log-stderr-level"),
        ({"log-stderr-level": ""}, "log-stderr-level"),
        ({"tbon.endpoint": "ipc:///tmp/x"}, "tbon.endpoint"),
        ({"tbon.endpoint": "tcp://host"}, "tbon.endpoint"),
        ({"tbon.endpoint": "host:5"}, "tbon.endpoint"),
        ({"tbon.heartbeat": "0"}, "tbon.heartbeat"),
        ({"tbon.heartbeat": "0ms"}, "tbon.heartbeat"),
        ({"tbon.heartbeat": "fast"}, "tbon.heartbeat"),
        ({"tbon.torpid": "-1s"}, "tbon.torpid"),
        ({"tbon.timeout": "2 minutes"}, "tbon.timeout"),
        ({"broker.shutdown-timeout": "10x"}, "broker.shutdown-timeout"),
    ],
)
def test_broker_config_refuses(attributes: dict[str, str], match: str) -> None:
    with pytest.raises(UsageError, match=match) as caught:
        broker_config(attributes)
    assert caught.value.exit_code == exitcodes.USAGE
    assert "\n" not in str(caught.value)


def test_broker_config_refuses_non_decimal_size() -> None:
    with pytest.raises(UsageError):
        broker_config({"size": "²"})


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("2s", 2.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1.5", 1.5),
        ("0", 0.0),
        (".5s", 0.5),
        ("1.", 1.0),
        (" 2 s ", 2.0),
        ("10", 10.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "s",
        "ms",
        "-1s",
        "+1s",
        "2x",
        "2ss",
        "2S",
        "1e3",
        "inf",
        "nan",
        "1.2.3",
        "2 m s",
        ".",
    ],
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_duration(text, "tbon.timeout")
    message = str(caught.value)
    assert message.startswith(f"invalid tbon.timeout {text!r}")
    assert "250ms" in message


@given(st.text(max_size=10))
@FAST
def test_parse_duration_raises_only_usage_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except UsageError:
        return
    assert seconds >= 0 and not math.isnan(seconds)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (2, "2s"), (90, "1.5m"), (7200, "2h"), (3 * 86400, "3d"), (0, "0ms")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(0.001, 10**6, allow_nan=False).filter(lambda s: not 0.9995 <= s < 1))
@FAST
def test_format_duration_parses_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=0.006)


def test_format_duration_just_under_a_second() -> None:
    assert parse_duration(format_duration(0.9996)) == pytest.approx(1.0, rel=0.001)


# --- FLUB attributes: broker.boot-server, broker.rank, broker.join-timeout ----------------------


def test_flub_attributes_are_known_and_default_off() -> None:
    assert {"broker.boot-server", "broker.rank", "broker.join-timeout"} <= KNOWN
    config = broker_config({})
    assert config.boot_server is None
    assert config.requested_rank is None
    assert config.join_timeout == 30.0
    assert parse_assignments(["broker.boot-server=local:///r/local.sock", "broker.rank=3"]) == {
        "broker.boot-server": "local:///r/local.sock",
        "broker.rank": "3",
    }


@pytest.mark.parametrize(
    "uri",
    [
        "local:///tmp/tbon-1/local.sock",
        "ssh://node7/tmp/tbon-1/local.sock",
        "ssh://alice@node7:2222/tmp/tbon-1/local.sock",
    ],
)
def test_boot_server_takes_local_and_ssh_uris(uri: str) -> None:
    config = broker_config({"broker.boot-server": uri})
    assert config.boot_server == uri
    assert config.requested_rank is None
    assert config.attributes == {"broker.boot-server": uri}


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "tcp://127.0.0.1:5555",
        "ipc:///tmp/x",
        "/tmp/tbon-1/local.sock",
        "local:/x",
        "http://h/x",
    ],
)
def test_boot_server_refuses_other_schemes(uri: str) -> None:
    with pytest.raises(UsageError, match=r"invalid broker\.boot-server") as caught:
        broker_config({"broker.boot-server": uri})
    message = str(caught.value)
    assert repr(uri) in message
    assert "local://PATH" in message and "ssh://" in message
    assert "\n" not in message
    assert caught.value.exit_code == exitcodes.USAGE


@pytest.mark.parametrize("uri", ["local://", "local://relative/local.sock", "ssh://", "ssh://h"])
def test_boot_server_refuses_malformed_uris(uri: str) -> None:
    with pytest.raises(UsageError):
        broker_config({"broker.boot-server": uri})


@pytest.mark.parametrize(("text", "rank"), [("0", 0), ("5", 5), ("007", 7), ("8191", 8191)])
def test_broker_rank(text: str, rank: int) -> None:
    config = broker_config({"broker.boot-server": "local:///r/local.sock", "broker.rank": text})
    assert config.requested_rank == rank
    assert config.boot_server == "local:///r/local.sock"


@pytest.mark.parametrize("text", ["", "-1", "x", "1.5", "²", "٣", " 3", "+3", "1e3"])
def test_broker_rank_must_be_a_decimal_rank(text: str) -> None:
    with pytest.raises(UsageError, match=r"invalid broker\.rank") as caught:
        broker_config({"broker.boot-server": "local:///r/local.sock", "broker.rank": text})
    assert repr(text) in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == exitcodes.USAGE


def test_broker_rank_needs_a_boot_server() -> None:
    with pytest.raises(UsageError, match=r"broker\.rank only makes sense with broker\.boot-server"):
        broker_config({"broker.rank": "3"})
    with pytest.raises(UsageError, match=r"broker\.rank"):
        broker_config({"broker.rank": "3", "size": "8"})


@pytest.mark.parametrize(
    ("text", "seconds"), [("250ms", 0.25), ("2", 2.0), ("5m", 300.0), ("1.5s", 1.5), ("1h", 3600.0)]
)
def test_join_timeout_is_a_duration(text: str, seconds: float) -> None:
    assert broker_config({"broker.join-timeout": text}).join_timeout == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1s", "30 seconds", "5x", "1.2.3"])
def test_join_timeout_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(UsageError, match=r"broker\.join-timeout") as caught:
        broker_config({"broker.join-timeout": text})
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == exitcodes.USAGE


# --- instance size: spare ranks ------------------------------------------------------------------


@pytest.mark.parametrize(("launched", "requested", "size"), [(4, None, 4), (1, None, 1), (4, 5, 5)])
def test_instance_size_by_pmi(launched: int, requested: int | None, size: int) -> None:
    from tbon.overlay.boot.wireup import instance_size

    assert instance_size(requested, launched) == size
    assert instance_size(requested, launched, by_pmi=True) == size
    assert instance_size(64, launched) == 64  # the rest are spares


@pytest.mark.parametrize(("launched", "requested"), [(4, 4), (4, 3), (4, 1), (1, 1), (8, 2)])
def test_instance_size_must_exceed_the_pmi_size(launched: int, requested: int) -> None:
    from tbon.overlay.boot.wireup import instance_size

    with pytest.raises(UsageError) as caught:
        instance_size(requested, launched)
    message = str(caught.value)
    assert f"size={requested}" in message
    assert f"{launched} brokers launched by PMI" in message
    assert "\n" not in message
    assert caught.value.exit_code == exitcodes.USAGE


@pytest.mark.parametrize(("requested", "size"), [(None, 1), (1, 1), (2, 2), (64, 64)])
def test_instance_size_of_a_singleton(requested: int | None, size: int) -> None:
    from tbon.overlay.boot.wireup import instance_size

    assert instance_size(requested, 1, by_pmi=False) == size
