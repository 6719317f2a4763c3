"""Rank-table events as they travel up the tree, from a parent to rank 0.

Only the parent of a rank sees its broker come and go; it reports each change as a `report`
control message that every broker on the way up forwards unchanged.
"""

from __future__ import annotations

from typing import Any

from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.ranktable import Departed, Event, Lost, Online, Torpid
from tbon.overlay.wire.message import MessageError


def encode_event(event: Event) -> dict[str, Any]:
    match event:
        case Online(rank, incarnation, host, pid):
            return {
                "event": "online",
                "rank": rank,
                "incarnation": incarnation,
                "host": host,
                "pid": pid,
            }
        case Lost(rank, incarnation, reason):
            return {"event": "lost", "rank": rank, "incarnation": incarnation, "reason": reason}
        case Departed(rank, incarnation):
            return {"event": "departed", "rank": rank, "incarnation": incarnation}
        case Torpid(rank, incarnation, torpid):
            return {"event": "torpid", "rank": rank, "incarnation": incarnation, "torpid": torpid}
    raise TypeError(f"not a rank table event: {event!r}")


def decode_event(payload: dict[str, Any]) -> Event:
    """The event in a report payload, or MessageError if any field is missing or mistyped."""
    try:
        kind, rank, incarnation = payload["event"], payload["rank"], payload["incarnation"]
        _require(is_int(rank) and is_int(incarnation), "rank and incarnation")
        if kind == "online":
            host, pid = payload["host"], payload["pid"]
            _require(isinstance(host, str) and is_int(pid), "host and pid")
            return Online(rank, incarnation, host, pid)
        if kind == "lost":
            reason = payload["reason"]
            _require(isinstance(reason, str), "reason")
            return Lost(rank, incarnation, reason)
        if kind == "departed":
            return Departed(rank, incarnation)
        if kind == "torpid":
            torpid = payload["torpid"]
            _require(isinstance(torpid, bool), "torpid")
            return Torpid(rank, incarnation, torpid)
    except KeyError as missing:
        raise MessageError(f"report without {missing}") from None
    raise MessageError(f"unknown report {kind!r}")


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise MessageError(f"report with bad {what}")
