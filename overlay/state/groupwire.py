"""The root group's messages as they travel on the tree (docs/protocol.md §13.2): JSON payloads
of one-way requests, and the log's payload, a rank-table event with the clock of the root that
proposed it.

Each entry carries the proposing root's `now`: the table reads no clock of its own, so a member
that applies the entry with that time computes the same deadlines (leases, graces) as the root
did, whatever its own clock says. Pure: records in, dicts out, and back; a payload that is not
one is MessageError (the service says it in the log and drops it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.grouptopics import APPEND, APPEND_REPLY, VOTE, VOTE_REPLY
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
from tbon.overlay.state.ranktable import Event
from tbon.overlay.state.replicalog import Entry
from tbon.overlay.state.terms import MAX_TERM
from tbon.overlay.wire.message import MessageError
from tbon.record import Record

MAX_ENTRIES = 4096
"""The most entries one group.append may carry (the root sends at most Timing.batch)."""
MAX_COUNT = MAX_TERM
"""The largest term, index, rank or incarnation a member message may carry: a term past it is
refused on every order (§13.3), and no log grows near it."""


class Proposal(Record):
    """A log entry's payload: one rank-table event, and the proposing root's clock."""

    __slots__ = __match_args__ = ("event", "now")

    def __init__(self, event: Event | Reserve, now: float) -> None:
        self.event = event
        self.now = now


_EVENTS: dict[str, type[Record]] = {
    cls.__name__.lower(): cls
    for cls in (
        Online,
        Lost,
        Departed,
        Torpid,
        Moved,
        Dropped,
        Expire,
        Release,
        Retire,
        Reboot,
        Void,
        Reserve,
    )
}


def encode_proposal(proposal: Proposal) -> dict[str, Any]:
    event = proposal.event
    fields = {name: getattr(event, name) for name in event.__slots__}
    if isinstance(event, Dropped):
        del fields["parent"]  # always the rank itself
    return {"event": type(event).__name__.lower(), "now": proposal.now, **fields}


def decode_proposal(payload: Any) -> Proposal:
    if not isinstance(payload, dict):
        raise MessageError("an entry must be an object")
    fields = dict(payload)
    kind, now = fields.pop("event", None), fields.pop("now", None)
    cls = _EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"an entry of an unknown event {kind!r}")
    if not _number(now):
        raise MessageError(f"a {kind} entry with a bad now")
    try:
        event = cls(**fields)
    except TypeError as error:
        raise MessageError(f"a bad {kind} entry: {error}") from None
    for name, value in fields.items():
        if not _FIELDS[name](value) or (name == "rank" and value is None and cls is not Reserve):
            raise MessageError(f"a {kind} entry with a bad {name}")
    return Proposal(event, float(now))  # type: ignore[arg-type]


def encode_entry(entry: Entry[Proposal]) -> list[Any]:
    """[term] for a root's mark, [term, proposal] otherwise."""
    if entry.payload is None:
        return [entry.term]
    return [entry.term, encode_proposal(entry.payload)]


def decode_entry(item: Any) -> Entry[Proposal]:
    if not isinstance(item, list) or len(item) not in (1, 2) or not _count(item[0]):
        raise MessageError("an entry must be [term] or [term, event]")
    return Entry(item[0], decode_proposal(item[1]) if len(item) == 2 else None)


def encode(
    message: AppendEntries[Proposal] | AppendReply | VoteRequest | VoteReply,
) -> dict[str, Any]:
    """The payload of `message` (its topic is `topic_of`)."""
    match message:
        case AppendEntries():
            return {
                "sender": message.sender,
                "term": message.term,
                "prev": message.prev,
                "prev_term": message.prev_term,
                "entries": [encode_entry(e) for e in message.entries],
                "commit": message.commit,
                "sent_at": message.sent_at,
                "voter": message.voter,
                "floor": message.floor,
            }
        case AppendReply():
            return {
                "sender": message.sender,
                "incarnation": message.incarnation,
                "term": message.term,
                "ok": message.ok,
                "match": message.match,
                "sent_at": message.sent_at,
                "voter": message.voter,
            }
        case VoteRequest():
            return {
                "sender": message.sender,
                "term": message.term,
                "last": message.last,
                "last_term": message.last_term,
                "sent_at": message.sent_at,
                "pre": message.pre,
            }
        case VoteReply():
            return {
                "sender": message.sender,
                "incarnation": message.incarnation,
                "term": message.term,
                "granted": message.granted,
                "sent_at": message.sent_at,
                "pre": message.pre,
            }


def topic_of(message: AppendEntries[Proposal] | AppendReply | VoteRequest | VoteReply) -> str:
    if isinstance(message, AppendEntries):
        return APPEND
    if isinstance(message, AppendReply):
        return APPEND_REPLY
    return VOTE if isinstance(message, VoteRequest) else VOTE_REPLY


def decode(
    topic: str, payload: dict[str, Any]
) -> AppendEntries[Proposal] | AppendReply | VoteRequest | VoteReply:
    """The member message in a request of `topic`; MessageError if it is not one."""
    try:
        sender, term, sent_at = payload["sender"], payload["term"], payload["sent_at"]
        _require(_count(sender) and _count(term) and _number(sent_at), "sender, term or sent_at")
        if topic == APPEND:
            prev, prev_term, commit = payload["prev"], payload["prev_term"], payload["commit"]
            entries, voter = payload["entries"], payload.get("voter", False)
            floor = payload.get("floor", 0)
            _require(_count(prev) and _count(prev_term) and _count(commit), "indexes")
            _require(_count(floor), "floor")
            _require(isinstance(entries, list) and len(entries) <= MAX_ENTRIES, "entries")
            _require(isinstance(voter, bool), "voter")
            decoded = tuple(decode_entry(e) for e in entries)
            return AppendEntries(
                sender, term, prev, prev_term, decoded, commit, sent_at, voter, floor
            )
        incarnation = payload["incarnation"] if topic in (APPEND_REPLY, VOTE_REPLY) else 0
        _require(_count(incarnation), "incarnation")
        if topic == APPEND_REPLY:
            ok, match = payload["ok"], payload["match"]
            # a reply that does not say it votes renews no lease (leadership.py, AppendReply)
            voter = payload.get("voter", False)
            _require(isinstance(ok, bool) and _count(match), "ok or match")
            _require(isinstance(voter, bool), "voter")
            return AppendReply(sender, incarnation, term, ok, match, sent_at, voter)
        pre = payload.get("pre", False)
        _require(isinstance(pre, bool), "pre")
        if topic == VOTE:
            last, last_term = payload["last"], payload["last_term"]
            _require(_count(last) and _count(last_term), "last or last_term")
            return VoteRequest(sender, term, last, last_term, sent_at, pre)
        if topic == VOTE_REPLY:
            granted = payload["granted"]
            _require(isinstance(granted, bool), "granted")
            return VoteReply(sender, incarnation, term, granted, sent_at, pre)
    except KeyError as missing:
        raise MessageError(f"{topic} without {missing}") from None
    raise MessageError(f"not a group message: {topic!r}")


def _count(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_COUNT


def _optional_int(value: Any) -> bool:
    return value is None or is_int(value)


_FIELDS: dict[str, Callable[[Any], bool]] = {
    "rank": _optional_int,  # None for a Reserve of any rank only (checked above)
    "incarnation": is_int,
    "pid": is_int,
    "parent": _optional_int,
    "to": is_int,
    "gone": is_int,
    "torpid": lambda value: isinstance(value, bool),
    "host": lambda value: isinstance(value, str),
    "key": lambda value: isinstance(value, str),
    "public_key": lambda value: isinstance(value, str),
    "reason": lambda value: isinstance(value, str),
    "lease": lambda value: _number(value),
}
"""Each event field's type. Only the type: the numbers an event carries are whatever its source
took (a report's or a request's integers, of any size), which the table refuses alike at every
member; a standby that refused an entry the root holds could never hold the rest of the log."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise MessageError(f"a group message with bad {what}")
