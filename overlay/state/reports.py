"""Rank-table events as they travel up the tree, from a parent to rank 0, in batches.

Only the parent of a rank sees its broker come and go; it reports each change in a `report`
control message, a list of events, and every broker on the way up puts what it reads into its
own next report, in the order it read them. One event is a broker's word on itself: Dropped,
its connection to its old parent dropped (sent once welcomed again).

Batching is the tree's own job (docs/protocol.md §5.4): a `Batcher` holds a broker's events for
at most REPORT_INTERVAL after its last report (joins alone, also after the first of them), so
rank 0 reads one message per child per interval, not one per rank that changed, and applies each
in one pass (services/rankpath.py).
The order of the events about one rank is kept on the way (each broker's queue is first in,
first out, and a link delivers in order); incarnations make a late one harmless all the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.rankevents import Departed, Dropped, Event, Lost, Moved, Online, Torpid
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


def encode_events(events: list[Event]) -> dict[str, Any]:
    """A report's payload: the events in the order they happened."""
    return {"events": [encode_event(event) for event in events]}


def decode_events(payload: dict[str, Any]) -> list[Reported]:
    """The events of a report, or MessageError if it is not a list of at most MAX_EVENTS
    events or any of them is bad (the whole report is dropped: it came from one child)."""
    events = payload.get("events")
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_EVENTS:
        raise MessageError(f"report without a list of 1 to {MAX_EVENTS} events")
    return [decode_event(event) for event in events]


def decode_event(payload: dict[str, Any]) -> Reported:
    """The event in a report payload, or MessageError if any field is missing or mistyped."""
    if type(payload) is dict and payload.get("event") == "online":
        # the event rank 0 reads once for every rank: its checks inline, without calls.
        # `type(x) is int` is is_int of a value JSON decoded (an int, or a bool, which it
        # refuses); anything this does not accept is judged below, which names the fault
        rank, incarnation = payload.get("rank"), payload.get("incarnation")
        host, pid, parent = payload.get("host"), payload.get("pid"), payload.get("parent")
        key = payload.get("key", "")
        if (
            type(rank) is int
            and type(incarnation) is int
            and (parent is None or type(parent) is int)
            and type(host) is str
            and type(pid) is int
            and type(key) is str
            and len(key) in (0, 40)
        ):
            return Online(rank, incarnation, host, pid, parent, key)
    if not isinstance(payload, dict):
        raise MessageError("report with an event that is not an object")
    try:
        kind, rank, incarnation = payload["event"], payload["rank"], payload["incarnation"]
        _require(type(rank) is int and type(incarnation) is int, "rank and incarnation")
        parent = payload.get("parent")
        _require(parent is None or type(parent) is int, "parent")
        if kind == "online":
            host, pid, key = payload["host"], payload["pid"], payload.get("key", "")
            _require(isinstance(host, str) and type(pid) is int, "host and pid")
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


# --- batching: one report per short interval ------------------------------------------------------

REPORT_INTERVAL = 0.005
"""Seconds a broker's reports wait for company (docs/protocol.md §5.4): what one turn of the loop
read goes up at once after a quiet spell, unless it is only joins (Onlines), which wait
REPORT_INTERVAL from the first for the joins that follow it (a subtree wiring up says its hellos
within milliseconds of each other); what comes within REPORT_INTERVAL of the last report sent
waits for it, so that a busy subtree sends its parent at most one report per interval, whatever
its size, and a join or a loss is held a few milliseconds at most on each level."""
MAX_EVENTS = 1024
"""Events in one report at most: a flood of changes goes up in several, and a broker refuses a
report that lists more (a child that does is not an honest broker)."""
MAX_BYTES = 1 << 20
"""What a report's events may weigh at most (`weight`), a quarter of the 4 MiB frame limit: a
host name or a reason is a string of any length."""


def weight(event: Event) -> int:
    """A bound on the bytes `event` takes in a report: its fields' JSON with room for the names
    (a string may grow sixfold as JSON escapes, "\\u0001"; a character beyond the BMP, one
    of a Python string's length, twelvefold: "\\ud800\\udc00")."""
    strings = 0
    match event:
        case Online(host=host, key=key):
            strings = _escaped(host) + _escaped(key)
        case Lost(reason=reason) | Dropped(reason=reason):
            strings = _escaped(reason)
    return 160 + strings


def _escaped(text: str) -> int:
    """A bound on the length of `text` as JSON escapes it (ensure_ascii)."""
    return 6 * len(text) if text.isascii() else 12 * len(text)


class Batcher:
    """The reports a broker holds for its parent: events in, in the order they came, out as
    batches when one is due. Pure: the loop says the time, and sends what `take` returns.

    Bounded: a batch is taken as soon as it holds MAX_EVENTS events or MAX_BYTES, so the queue
    never holds more than one batch's worth, and never waits past `deadline`."""

    def __init__(
        self,
        interval: float = REPORT_INTERVAL,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.interval = interval
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._queue: list[Event] = []
        self._bytes = 0
        self._full: list[list[Event]] = []  # batches that filled up, to go at the next take
        self._last_sent = float("-inf")
        self._first = 0.0  # when the queue's first event came
        self._joins = False  # the queue holds Onlines only: it waits for company

    def __len__(self) -> int:
        return len(self._queue) + sum(len(batch) for batch in self._full)

    def add(self, events: Sequence[Event], now: float) -> None:
        for event in events:
            size = weight(event)
            if self._queue and (
                len(self._queue) >= self.max_events or self._bytes + size > self.max_bytes
            ):
                self._full.append(self._queue)
                self._queue, self._bytes = [], 0
            if not self._queue:
                self._first, self._joins = now, True
            self._queue.append(event)
            self._bytes += size
            self._joins = self._joins and type(event) is Online

    def deadline(self) -> float | None:
        """When what is held must go: now if a batch is full, else an interval after the last
        report sent (and, for joins only, after the first of them came); None when nothing is
        held."""
        if self._full:
            return float("-inf")
        if not self._queue:
            return None
        return self._queue_due()

    def _queue_due(self) -> float:
        due = self._last_sent + self.interval
        return max(due, self._first + self.interval) if self._joins else due

    def take(self, now: float, force: bool = False) -> list[list[Event]]:
        """The batches to send now (oldest first): every full one, and what else is held once
        its `deadline` has come, or if `force` (the broker is about to say goodbye)."""
        due = self._full
        self._full = []
        if self._queue and (force or now >= self._queue_due()):
            due.append(self._queue)
            self._queue, self._bytes = [], 0
        if due:
            self._last_sent = now
        return due
