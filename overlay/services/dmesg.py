"""`tbon dmesg`, the brokers' side: each broker's recent log records, kept in a ring and served
to a client that asks for them (dmesg.get) or follows them (dmesg.follow), and emptied on request
(dmesg.clear; dmesg.get with `clear`, which reads and empties in one turn of the loop, so that no
record logged between the two is lost unread).

The ring is the only buffer. It keeps the last RING_RECORDS records, fewer if their messages add
up to more than RING_CHARS characters, each message cut to MESSAGE_CHARS: so a whole ring fits in
one message under the 4 MiB limit even if every character had to be written as a JSON escape
pair (12 bytes), and one answer, or one batch, is always one message.

A follower is a few numbers, not a queue: where it is in the ring, and whether its last batch is
still unread. Like a status watcher it has one batch in flight: the client acknowledges each one
once it has written it out (dmesg.ack), and only then is sent what was logged meanwhile, in one
batch. What the ring dropped before a slow follower got it is not kept for it: the next batch
says how many records it missed (`lost`). A client that went away with a batch unread never
acknowledges it, so a follower with records waiting and a batch unread for PROBE seconds is sent
an empty batch: if its client is gone, that answer cannot be delivered, the broker the client was
connected to says so (client.disconnect), and the follower is forgotten.
"""

from __future__ import annotations

import errno
import logging
from collections import deque
from itertools import islice
from typing import Any

from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.actions import Action, Respond
from tbon.overlay.wire.message import Message
from tbon.record import Record

RING_RECORDS = 1000
"""Records a broker keeps, at most."""

RING_CHARS = 128 * 1024
"""Characters of message text a broker keeps, at most: 1.5 MiB once encoded, at the very worst."""

MESSAGE_CHARS = 512
"""A longer message is cut to this many characters, the last one an ellipsis."""

PROBE = 10.0
"""Seconds a batch may stay unacknowledged, with records waiting, before the follower's client is
probed with an empty batch."""

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
"""What `level` may ask for: records at or above it."""


def level_name(levelno: int) -> str:
    return logging.getLevelName(levelno).lower() if levelno % 10 == 0 else f"level {levelno}"


class Entry(Record):
    """One log record, as kept: `seq` counts the records this broker has kept since it started."""

    __slots__ = __match_args__ = ("seq", "time", "levelno", "message")

    def __init__(self, seq: int, time: float, levelno: int, message: str) -> None:
        self.seq, self.time, self.levelno, self.message = seq, time, levelno, message  # time: epoch

    def wire(self) -> dict[str, Any]:
        level = level_name(self.levelno)
        return {
            "seq": self.seq,
            "time": round(self.time, 3),
            "level": level,
            "message": self.message,
        }


class LogRing:
    """The last records of this broker's log, bounded in records and in characters."""

    def __init__(self, records: int = RING_RECORDS, chars: int = RING_CHARS) -> None:
        self.max_records = records
        self.max_chars = chars
        self.next_seq = 0
        self._entries: deque[Entry] = deque()
        self._chars = 0
        self._kept: dict[int, int] = {}  # records ever kept, by level number

    def append(self, when: float, levelno: int, message: str) -> None:
        if len(message) > MESSAGE_CHARS:
            message = message[: MESSAGE_CHARS - 1] + "\u2026"
        self._entries.append(Entry(self.next_seq, when, levelno, message))
        self.next_seq += 1
        self._chars += len(message)
        self._kept[levelno] = self._kept.get(levelno, 0) + 1
        while len(self._entries) > self.max_records or self._chars > self.max_chars:
            self._chars -= len(self._entries.popleft().message)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> int:
        """Forget every record kept; how many there were. Sequence numbers and the counts of
        records ever kept go on, so a follower's place stays valid."""
        cleared = len(self._entries)
        self._entries.clear()
        self._chars = 0
        return cleared

    @property
    def first_seq(self) -> int:
        """The oldest record still kept (next_seq if none is)."""
        return self._entries[0].seq if self._entries else self.next_seq

    def since(self, seq: int, levelno: int) -> list[Entry]:
        """The records kept from `seq` on, at or above `levelno`."""
        start = max(0, seq - self.first_seq)
        return [e for e in islice(self._entries, start, None) if e.levelno >= levelno]

    def kept(self, levelno: int) -> int:
        """How many records at or above `levelno` were ever kept (dropped since, or not)."""
        return sum(count for level, count in self._kept.items() if level >= levelno)


class Follower:
    __slots__ = ("kept", "levelno", "next", "request", "sent_at", "unread")

    def __init__(self, request: Message, levelno: int, next: int, kept: int) -> None:
        self.request = request  # the dmesg.follow: its route and tag address every batch
        self.levelno = levelno
        self.next = next  # the seq of the first record not yet sent
        self.kept = kept  # ring.kept(levelno) when `next` was reached: the rest were sent or lost
        self.unread = False  # a batch is in flight: the next waits for its acknowledgement
        self.sent_at = 0.0


class DmesgService:
    def __init__(self, rank: int, ring: LogRing) -> None:
        self.rank = rank
        self.ring = ring
        self.followers: list[Follower] = []

    def get(self, request: Message, now: float) -> list[Action]:
        """dmesg.get: every record kept, at or above `level`, in one answer; with `clear`
        true, the ring is then emptied (every record, whatever `level` showed)."""
        levelno = _level(request.payload)
        clear = request.payload.get("clear", False)
        if levelno is None or not isinstance(clear, bool):
            return [Respond(_bad(request))]
        records = [e.wire() for e in self.ring.since(self.ring.first_seq, levelno)]
        payload = {"rank": self.rank, "records": records, "next": self.ring.next_seq}
        if clear:
            payload["cleared"] = self._clear()
        return [Respond(request.respond(payload))]

    def clear(self, request: Message, now: float) -> list[Action]:
        """dmesg.clear: empty the ring; answers how many records it held."""
        return [Respond(request.respond({"rank": self.rank, "cleared": self._clear()}))]

    def _clear(self) -> int:
        """Empty the ring. A follower is not sent what was cleared before it got it, and is
        not told those records were lost either: they were cleared on purpose. (Its `next`
        stays, so that the acknowledgement of the batch in flight still matches it.)"""
        for follower in self.followers:
            follower.kept += len(self.ring.since(follower.next, follower.levelno))
        return self.ring.clear()

    def follow(self, request: Message, now: float) -> list[Action]:
        """dmesg.follow: a stream whose first batch is what the ring holds (unless `backlog` is
        false), and each later one what was logged since."""
        levelno = _level(request.payload)
        backlog = request.payload.get("backlog", True)
        if levelno is None or not isinstance(backlog, bool):
            return [Respond(_bad(request))]
        ring = self.ring
        start = ring.first_seq if backlog else ring.next_seq
        follower = Follower(request, levelno, start, ring.kept(levelno))
        follower.kept -= len(ring.since(start, levelno))  # those are sent now, not lost
        self.followers.append(follower)
        return [Respond(self._batch(follower, now))]

    def ack(self, request: Message, now: float) -> list[Action]:
        """dmesg.ack: the follower whose dmesg.follow had tag `follow` (from the same client:
        the same route) has written out the batch that ended before `next`. What was logged
        meanwhile goes now. One-way: nothing is answered, and an ack that matches no follower,
        or an older batch, is dropped."""
        tag, upto = request.payload.get("follow"), request.payload.get("next")
        if not is_int(upto):
            return []
        for follower in self.followers:
            if follower.request.tag == tag and follower.request.route == request.route:
                if upto < follower.next:
                    return []  # an older batch, or an empty probe's answer
                follower.unread = False
                if self._waiting(follower):
                    return [Respond(self._batch(follower, now))]
                return []
        return []

    def pushes(self, now: float) -> list[Action]:
        """Asked by the loop after each batch of input: a batch for each follower with records
        waiting and none in flight, and a probe for each whose batch has been unread too long."""
        actions: list[Action] = []
        for follower in self.followers:
            if not self._waiting(follower):
                continue
            if not follower.unread:
                actions.append(Respond(self._batch(follower, now)))
            elif now - follower.sent_at >= PROBE:
                follower.sent_at = now
                probe = {"rank": self.rank, "records": [], "next": follower.next}
                actions.append(Respond(follower.request.respond(probe, streaming=True)))
        return actions

    def next_deadline(self) -> float | None:
        """When `pushes` probes a follower next: one with records waiting and its batch unread
        (what a turn logged is pushed by that turn itself)."""
        if not self.followers:  # asked every busy turn: most brokers have no follower
            return None
        return min(
            (f.sent_at + PROBE for f in self.followers if f.unread and self._waiting(f)),
            default=None,
        )

    def disconnect(self, request: Message, now: float) -> list[Action]:
        """client.disconnect: the client whose answers travel along this route has gone."""
        self.followers = [f for f in self.followers if f.request.route != request.route]
        return []

    def _waiting(self, follower: Follower) -> bool:
        return self.ring.kept(follower.levelno) != follower.kept

    def _batch(self, follower: Follower, now: float) -> Message:
        """Everything at the follower's level since its last batch, and how much of it the
        ring has dropped before it could be sent."""
        ring = self.ring
        entries = ring.since(follower.next, follower.levelno)
        kept = ring.kept(follower.levelno)
        lost = kept - follower.kept - len(entries)
        follower.next, follower.kept = ring.next_seq, kept
        follower.unread, follower.sent_at = True, now
        payload: dict[str, Any] = {
            "rank": self.rank,
            "records": [e.wire() for e in entries],
            "next": follower.next,
        }
        if lost:
            payload["lost"] = lost
        return follower.request.respond(payload, streaming=True)


def _level(payload: dict[str, Any]) -> int | None:
    name = payload.get("level", "debug")
    return LEVELS.get(name) if isinstance(name, str) else None


def _bad(request: Message) -> Message:
    why = f"{request.topic}: level must be one of {', '.join(LEVELS)}"
    if request.topic == "dmesg.follow":
        why += "; backlog true or false"
    if request.topic == "dmesg.get":
        why += "; clear true or false"
    return request.fail(errno.EINVAL, why)
