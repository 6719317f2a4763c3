"""Rank-table events as they travel up the tree, from a parent to rank 0.

Only the parent of a rank sees its broker come and go; it reports each change as a `report`
control message that every broker on the way up forwards unchanged. One event is a broker's
word on itself: Dropped, its connection to its old parent dropped (sent once welcomed again).
"""

from __future__ import annotations

from typing import Any

from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.ranktable import Departed, Dropped, Event, Lost, Moved, Online, Torpid
from tbon.overlay.wire.message import MessageError

Reported = Online | Lost | Departed | Torpid | Moved | Dropped
"""The events a report carries: what a parent sees of its children (each names that parent),
and what a broker saw of its own link up (Dropped, which names the broker itself)."""


def encode_event(event: Event) -> dict[str, Any]:
    shown: dict[str, Any]
    match event:
        case Online(host=host, pid=pid, key=key):
            shown = {"event": "online", "host": host, "pid": pid, "key": key}
        case Lost(reason=reason):
            shown = {"event": "lost", "reason": reason}
        case Departed():
            shown = {"event": "departed"}
        case Torpid(torpid=torpid):
            shown = {"event": "torpid", "torpid": torpid}
        case Moved(to=to):
            shown = {"event": "moved", "to": to}
        case Dropped(gone=gone, reason=reason):
            shown = {"event": "dropped", "gone": gone, "reason": reason}
        case _:
            raise TypeError(f"not a rank table event: {event!r}")
    shown |= {"rank": event.rank, "incarnation": event.incarnation}
    if event.parent is not None:
        shown["parent"] = event.parent
    return shown


def decode_event(payload: dict[str, Any]) -> Reported:
    """The event in a report payload, or MessageError if any field is missing or mistyped."""
    try:
        kind, rank, incarnation = payload["event"], payload["rank"], payload["incarnation"]
        _require(is_int(rank) and is_int(incarnation), "rank and incarnation")
        parent = payload.get("parent")
        _require(parent is None or is_int(parent), "parent")
        if kind == "online":
            host, pid, key = payload["host"], payload["pid"], payload.get("key", "")
            _require(isinstance(host, str) and is_int(pid), "host and pid")
            _require(isinstance(key, str) and len(key) in (0, 40), "key")
            return Online(rank, incarnation, host, pid, parent, key)
        if kind == "lost":
            reason = payload["reason"]
            _require(isinstance(reason, str), "reason")
            return Lost(rank, incarnation, reason, parent)
        if kind == "departed":
            return Departed(rank, incarnation, parent)
        if kind == "moved":
            to = payload["to"]
            _require(is_int(to), "to")
            return Moved(rank, incarnation, parent, to)
        if kind == "dropped":
            gone, reason = payload["gone"], payload["reason"]
            _require(is_int(gone) and isinstance(reason, str), "gone or reason")
            _require(parent == rank, "parent: a broker's own word names itself")
            return Dropped(rank, incarnation, gone, reason)
        if kind == "torpid":
            torpid = payload["torpid"]
            _require(isinstance(torpid, bool), "torpid")
            return Torpid(rank, incarnation, torpid, parent)
    except KeyError as missing:
        raise MessageError(f"report without {missing}") from None
    raise MessageError(f"unknown report {kind!r}")


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise MessageError(f"report with bad {what}")
