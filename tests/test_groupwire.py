"""The root group's codec (overlay/state/groupwire.py, docs/protocol.md §13.2): the four
member messages and the log's entries survive a trip through JSON unchanged, and anything that
is not one of them is a MessageError (a clear line in the log), never another exception, and
never a structure built before it is checked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.state import groupwire
from tbon.overlay.state.grouptopics import APPEND, APPEND_REPLY, TOPICS, VOTE, VOTE_REPLY
from tbon.overlay.state.groupwire import (
    MAX_COUNT,
    MAX_ENTRIES,
    Proposal,
    decode,
    decode_entry,
    decode_proposal,
    encode,
    encode_entry,
    encode_proposal,
    topic_of,
)
from tbon.overlay.state.leadership import AppendEntries, AppendReply, VoteReply, VoteRequest
from tbon.overlay.state.rankevents import (
    Departed,
    Dropped,
    Expire,
    Lost,
    Moved,
    Online,
    Reboot,
    Release,
    Reserve,
    Retire,
    Torpid,
    Void,
)
from tbon.overlay.state.replicalog import Entry
from tbon.overlay.wire.message import MessageError

FAST = settings(max_examples=150, deadline=None)

counts = st.integers(0, MAX_COUNT)
ranks = st.integers(0, 262_143)
incs = st.integers(1, 1 << 40)
text = st.text(max_size=30)
keys = st.sampled_from(["", "k" * 40])
parents = st.none() | ranks
times = st.floats(0, 1e9, allow_nan=False, allow_infinity=False)

events = st.one_of(
    st.builds(Online, ranks, incs, text, st.integers(1, 1 << 22), parents, keys),
    st.builds(Lost, ranks, incs, text, parents),
    st.builds(Departed, ranks, incs, parents),
    st.builds(Torpid, ranks, incs, st.booleans(), parents),
    st.builds(Moved, ranks, incs, parents, ranks),
    st.builds(Dropped, ranks, incs, ranks, text),
    st.builds(Expire, ranks, incs),
    st.builds(Release, ranks, incs, keys),
    st.builds(Retire, ranks, incs),
    st.builds(Reboot, ranks, st.integers(0, 1 << 40)),
    st.builds(Void, ranks, incs, text),
    st.builds(Reserve, keys, text, st.none() | ranks, times),
)
proposals = st.builds(Proposal, events, times)
entries = st.builds(Entry, st.integers(1, MAX_COUNT), st.none() | proposals)

messages = st.one_of(
    st.builds(
        AppendEntries,
        ranks,
        counts,
        counts,
        counts,
        st.lists(entries, max_size=5).map(tuple),
        counts,
        times,
        st.booleans(),
        counts,  # floor
    ),
    # voter: a reply that drops it renews a lease it must not (leadership.py, AppendReply)
    st.builds(AppendReply, ranks, counts, counts, st.booleans(), counts, times, st.booleans()),
    st.builds(VoteRequest, ranks, counts, counts, counts, times, st.booleans()),
    st.builds(VoteReply, ranks, counts, counts, st.booleans(), times, st.booleans()),
)


def through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def same_entry(a: Entry[Proposal], b: Entry[Proposal]) -> bool:
    if a.term != b.term or (a.payload is None) != (b.payload is None):
        return False
    return a.payload is None or (a.payload.event, a.payload.now) == (
        b.payload.event,  # type: ignore[union-attr]
        b.payload.now,  # type: ignore[union-attr]
    )


# --- round trips --------------------------------------------------------------------------------


@given(proposals)
@FAST
def test_every_event_kind_round_trips_with_the_roots_clock(proposal: Proposal) -> None:
    back = decode_proposal(through_json(encode_proposal(proposal)))
    assert type(back.event) is type(proposal.event)
    assert back.event == proposal.event
    assert back.now == proposal.now


@given(entries)
@FAST
def test_entries_round_trip_and_the_mark_is_a_bare_term(entry: Entry[Proposal]) -> None:
    encoded = through_json(encode_entry(entry))
    assert same_entry(decode_entry(encoded), entry)
    if entry.payload is None:
        assert encoded == [entry.term]


@given(messages)
@FAST
def test_every_member_message_round_trips(message: Any) -> None:
    topic = topic_of(message)
    assert topic in TOPICS
    back = decode(topic, through_json(encode(message)))
    assert type(back) is type(message)
    if isinstance(message, AppendEntries):
        assert back == AppendEntries(  # entries compared one by one below
            message.sender,
            message.term,
            message.prev,
            message.prev_term,
            back.entries,  # type: ignore[union-attr]
            message.commit,
            message.sent_at,
            message.voter,
            message.floor,
        )
        assert len(back.entries) == len(message.entries)  # type: ignore[union-attr]
        assert all(map(same_entry, back.entries, message.entries))  # type: ignore[union-attr]
    else:
        assert back == message


def test_each_kind_of_event_by_name() -> None:
    """The names on the wire: what a reader of a log line sees, and what another version must
    send (the mark is [term] alone)."""
    named = {
        "online": Online(3, 2, "node3", 77, 1, "k" * 40),
        "lost": Lost(3, 2, "silent", None),
        "departed": Departed(3, 2, 1),
        "torpid": Torpid(3, 2, True, 1),
        "moved": Moved(3, 2, 1, 0),
        "dropped": Dropped(3, 2, 1, "reset"),
        "expire": Expire(3, 2),
        "release": Release(3, 2, "k" * 40),
        "retire": Retire(3, 2),
        "reboot": Reboot(3, 2),
        "void": Void(3, 2, "superseded"),
        "reserve": Reserve("k" * 40, "node9", None, 30.0),
    }
    for name, event in named.items():
        encoded = encode_proposal(Proposal(event, 12.5))
        assert encoded["event"] == name and encoded["now"] == 12.5
        assert decode_proposal(encoded).event == event
    assert "parent" not in encode_proposal(Proposal(named["dropped"], 0.0))
    assert encode_entry(Entry(7, None)) == [7]
    assert decode_entry([7]) == Entry(7, None)


# --- refusals -----------------------------------------------------------------------------------

ONLINE = {"event": "online", "now": 5.0, "rank": 1, "incarnation": 1, "host": "h", "pid": 9}
ONLINE |= {"parent": None, "key": ""}


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        "online",
        {},
        {"event": "online"},  # no now, no fields
        {**ONLINE, "event": "nonsense"},
        {**ONLINE, "event": 5},
        {**ONLINE, "event": "__class__"},
        {**ONLINE, "now": "5"},
        {**ONLINE, "now": True},
        {**ONLINE, "now": float("nan")},
        {**ONLINE, "now": float("inf")},
        {k: v for k, v in ONLINE.items() if k != "host"},  # a field missing
        {**ONLINE, "extra": 1},  # a field the event has not
        {**ONLINE, "rank": "1"},
        {**ONLINE, "rank": 1.0},
        {**ONLINE, "rank": True},
        {**ONLINE, "rank": None},  # None is "any rank", for a Reserve only
        {"event": "mark", "now": 1},
        {"event": "reserve", "now": 1, "public_key": "k", "host": "h", "rank": None},
        {**ONLINE, "incarnation": "x"},
        {**ONLINE, "host": 5},
        {**ONLINE, "host": ["h"]},
        {**ONLINE, "pid": "9"},
        {**ONLINE, "parent": "0"},
        {**ONLINE, "key": None},
        {"event": "torpid", "now": 1, "rank": 1, "incarnation": 1, "torpid": 1, "parent": None},
        {"event": "moved", "now": 1, "rank": 1, "incarnation": 1, "parent": None, "to": "0"},
        {"event": "dropped", "now": 1, "rank": 1, "incarnation": 1, "gone": 0, "reason": 3},
        {
            "event": "dropped",
            "now": 1,
            "rank": 1,
            "incarnation": 1,
            "gone": 0,
            "reason": "",
            "parent": 1,
        },  # Dropped's parent is the rank itself: never on the wire
        {"event": "lost", "now": 1, "rank": 1, "incarnation": 1, "reason": None, "parent": None},
        {"event": "release", "now": 1, "rank": 1, "incarnation": 1, "public_key": 7},
        {"event": "void", "now": 1, "rank": 1, "incarnation": 1, "reason": ["x"]},
        {"event": "reserve", "now": 1, "public_key": "k", "host": "h", "rank": "any", "lease": 30},
        {"event": "reserve", "now": 1, "public_key": "k", "host": "h", "rank": None, "lease": "30"},
        {
            "event": "reserve",
            "now": 1,
            "public_key": "k",
            "host": "h",
            "rank": None,
            "lease": float("nan"),
        },
        {"event": "reserve", "now": 1, "public_key": None, "host": "h", "rank": None, "lease": 30},
    ],
)
def test_a_bad_proposal_is_a_message_error(payload: Any) -> None:
    with pytest.raises(MessageError):
        decode_proposal(payload)


@pytest.mark.parametrize("number", [-1, -(10**30), 10**30, 2**64])
def test_any_integer_in_an_event_decodes_and_the_table_refuses_it(number: int) -> None:
    """An event's numbers are whatever its source took: a report's incarnation, a joiner's
    rank, of any size. The root proposes the event and its table refuses it; a standby must
    decode the entry too (and refuse it the same way), or it could never hold the rest of the
    log, and with two such standbys no grant would ever commit again."""
    from tables import started

    for event in (
        Online(1, number, "h", number, number, ""),
        Moved(1, number, number, number),
        Dropped(1, number, number, "reset"),
        Reboot(1, number),
        Reserve("k" * 40, "h", number, 30.0),
        Lost(number, 1, "gone"),
    ):
        back = decode_proposal(through_json(encode_proposal(Proposal(event, 1.0)))).event
        assert back == event
        table = started("kary:2", 4)
        outcome = table.apply(back, 101.0)
        assert not outcome.applied and outcome.changed == (), (event, outcome)


@pytest.mark.parametrize(
    "item",
    [
        None,
        7,
        "7",
        [],
        [7, ONLINE, 1],  # three items
        ["7"],
        [True],
        [-1],
        [10**30],
        [7.0],
        [7, "online"],
        [7, [ONLINE]],
        [7, {**ONLINE, "rank": None}],
    ],
)
def test_a_bad_entry_is_a_message_error(item: Any) -> None:
    with pytest.raises(MessageError):
        decode_entry(item)


def payload_of(message: Any) -> dict[str, Any]:
    return through_json(encode(message))


GOOD = {
    APPEND: payload_of(AppendEntries(0, 1, 0, 0, (Entry(1, Proposal(Expire(3, 2), 4.0)),), 0, 1.0)),
    APPEND_REPLY: payload_of(AppendReply(1, 1, 1, True, 4, 1.0)),
    VOTE: payload_of(VoteRequest(1, 2, 4, 1, 1.0, True)),
    VOTE_REPLY: payload_of(VoteReply(2, 1, 2, True, 1.0, True)),
}
NUMBERS = {
    APPEND: ("sender", "term", "prev", "prev_term", "commit", "floor"),
    APPEND_REPLY: ("sender", "incarnation", "term", "match"),
    VOTE: ("sender", "term", "last", "last_term"),
    VOTE_REPLY: ("sender", "incarnation", "term"),
}
FLAGS = {
    APPEND: ("voter",),
    APPEND_REPLY: ("ok", "voter"),
    VOTE: ("pre",),
    VOTE_REPLY: ("granted", "pre"),
}


def bad_payloads() -> list[tuple[str, str, dict[str, Any]]]:
    """Every required field missing, every number as a string, negative, huge or a float, every
    flag as a number, and the clock as text or not finite, for each of the four topics."""
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for topic, good in GOOD.items():
        for field in good:
            if field not in ("voter", "pre", "floor"):  # optional: False, or floor 0
                cases.append((topic, f"no {field}", {k: v for k, v in good.items() if k != field}))
        for field in NUMBERS[topic]:
            for bad in ("1", -1, 10**30, MAX_COUNT + 1, 1.5, True, None, [1]):
                cases.append((topic, f"{field}={bad!r}", {**good, field: bad}))
        for field in FLAGS[topic]:
            for bad in (1, "true", None):
                cases.append((topic, f"{field}={bad!r}", {**good, field: bad}))
        for bad in ("1.0", None, True, float("nan"), float("inf")):
            cases.append((topic, f"sent_at={bad!r}", {**good, "sent_at": bad}))
    return cases


@pytest.mark.parametrize(("topic", "what", "payload"), bad_payloads())
def test_a_bad_member_message_is_a_message_error(
    topic: str, what: str, payload: dict[str, Any]
) -> None:
    with pytest.raises(MessageError):
        decode(topic, payload)


def test_the_good_payloads_above_do_decode() -> None:
    """So that each refusal above is for its one bad field."""
    for topic, good in GOOD.items():
        decode(topic, good)


@pytest.mark.parametrize(
    "entries",
    [
        "[]",  # a string where a list is expected
        {"0": [1]},
        None,
        7,
        [[1]] * (MAX_ENTRIES + 1),
        [[1]] * 1_000_000,
        [[1], "x"],
        [[1], [1, {"event": "online"}]],
    ],
)
def test_an_append_with_bad_entries_is_a_message_error(entries: Any) -> None:
    with pytest.raises(MessageError):
        decode(APPEND, {**GOOD[APPEND], "entries": entries})


def test_a_million_entries_are_refused_before_any_is_decoded(monkeypatch) -> None:
    """The length is checked first: an append of a million marks builds nothing."""
    seen: list[Any] = []
    real = groupwire.decode_entry

    def counting(item: Any) -> Entry[Proposal]:
        seen.append(item)
        return real(item)

    monkeypatch.setattr(groupwire, "decode_entry", counting)
    with pytest.raises(MessageError, match="entries"):
        decode(APPEND, {**GOOD[APPEND], "entries": [[1]] * 1_000_000})
    assert seen == []
    decode(APPEND, {**GOOD[APPEND], "entries": [[1]] * MAX_ENTRIES})
    assert len(seen) == MAX_ENTRIES


def test_an_unknown_topic_is_a_message_error() -> None:
    with pytest.raises(MessageError, match="not a group message"):
        decode("group.state", GOOD[APPEND_REPLY])


def test_the_errors_say_what_is_wrong() -> None:
    with pytest.raises(MessageError, match="without 'match'"):
        decode(APPEND_REPLY, {k: v for k, v in GOOD[APPEND_REPLY].items() if k != "match"})
    with pytest.raises(MessageError, match="indexes"):
        decode(APPEND, {**GOOD[APPEND], "prev": -1})
    with pytest.raises(MessageError, match="unknown event 'nonsense'"):
        decode_proposal({**ONLINE, "event": "nonsense"})


@given(
    st.dictionaries(
        st.sampled_from(sorted({f for g in GOOD.values() for f in g})),
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text()
        | st.lists(st.integers(), max_size=3),
    ),
    st.sampled_from(TOPICS),
)
@FAST
def test_any_payload_decodes_or_is_a_message_error(payload: dict[str, Any], topic: str) -> None:
    try:
        message = decode(topic, payload)
    except MessageError:
        return
    assert topic_of(message) == topic
