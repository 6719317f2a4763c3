"""Many ranks' last answers to one `tbon exec` in one message (docs/protocol.md §7.1, merged
exits): what an interior broker sends up in place of one exit answer per rank below it, and
how either end reads it back into the per-rank answers it stands for.

A merged answer is a streaming response to `exec.start` whose payload is `{"exits": GROUPS}`:
each group is the ranks (an idset, `0-31,40`) that ended alike, with the `exit`, `seq`, and
`signal` and `note` where they have them, that each of those ranks' own answer had. So 1024
ranks that ran `true` are one group, `{"ranks": "0-1023", "exit": 0, "seq": 0}`, and splitting
it gives back exactly the 1024 answers the ranks sent, seq and all: the client takes each as it
takes any answer (exactly once, in order: resend.py), and its broker acknowledges each.

Only an answer that may stand for itself in a group is merged: a rank's exit with its `seq`.
Output, input counts and errors (which carry no `seq`) travel one per message as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tbon.limits import MAX_SIZE
from tbon.overlay.parse.numbers import is_int
from tbon.record import Record

GROUP_BYTES = 1 << 20
"""Bytes of groups (estimated: 64 for a group and its idset, plus its note) in one merged answer
at most: a flush that would need more is cut into several, far below the 4 MiB message limit
whatever the notes say and however the ranks ended."""

EXIT_KEYS = frozenset({"rank", "seq", "exit", "signal", "note"})


class BadExits(ValueError):
    """A merged answer that is not one: the only error decoding raises."""


class Exit(Record):
    """One rank's last answer to a job, as it said it: its status, its `seq`, and the signal that
    ended it and the broker's note, where there were any."""

    __slots__ = __match_args__ = ("rank", "seq", "status", "signal", "note")

    def __init__(
        self, rank: int, seq: int, status: int, signal: int | None = None, note: str | None = None
    ) -> None:
        self.rank, self.seq, self.status, self.signal, self.note = rank, seq, status, signal, note

    def payload(self) -> dict[str, Any]:
        """The answer as the rank itself sends it."""
        said: dict[str, Any] = {"rank": self.rank, "exit": self.status, "seq": self.seq}
        if self.signal is not None:
            said["signal"] = self.signal
        if self.note is not None:
            said["note"] = self.note
        return said


def exit_of(payload: dict[str, Any]) -> Exit | None:
    """The rank's exit that `payload` is, if it is one that may be merged: a rank, a `seq`, an
    integer `exit`, and nothing else than a signal number and a note."""
    if "exit" not in payload or not EXIT_KEYS.issuperset(payload):
        return None
    rank, seq, status = payload.get("rank"), payload.get("seq"), payload["exit"]
    signum, note = payload.get("signal"), payload.get("note")
    if not (is_int(rank) and is_int(seq) and is_int(status)) or rank < 0 or seq < 0:
        return None
    if not _optional(signum, note):
        return None
    return Exit(rank, seq, status, signum, note)


def encode(exits: Iterable[Exit]) -> list[list[dict[str, Any]]]:
    """The groups of merged answers that carry `exits`: ranks that ended alike share a group.
    Usually one answer; more only past GROUP_BYTES."""
    alike: dict[tuple[int, int, int | None, str | None], list[int]] = {}
    for one in exits:
        alike.setdefault((one.status, one.seq, one.signal, one.note), []).append(one.rank)
    answers: list[list[dict[str, Any]]] = [[]]
    size = 0
    for (status, seq, signum, note), ranks in alike.items():
        group: dict[str, Any] = {"ranks": _idset(ranks), "exit": status, "seq": seq}
        if signum is not None:
            group["signal"] = signum
        if note is not None:
            group["note"] = note
        cost = 64 + len(group["ranks"]) + len(note or "")
        if answers[-1] and size + cost > GROUP_BYTES:
            answers.append([])
            size = 0
        answers[-1].append(group)
        size += cost
    return answers if answers[-1] else []


def decode(groups: object, size: int = MAX_SIZE) -> list[Exit]:
    """The per-rank exits a merged answer's `exits` stands for, each rank below `size`; BadExits
    if it is not a list of groups as `encode` makes them. Work is bounded by `size`: the groups
    may name no more ranks in all than the instance has."""
    if not isinstance(groups, list):
        raise BadExits("exits must be a list of groups")
    exits: list[Exit] = []
    for group in groups:
        if not isinstance(group, dict):
            raise BadExits("an exits group must be an object")
        status, seq = group.get("exit"), group.get("seq")
        signum, note = group.get("signal"), group.get("note")
        if not is_int(status) or not is_int(seq) or seq < 0:
            raise BadExits("an exits group needs an integer exit and seq")
        if not _optional(signum, note):
            raise BadExits("an exits group's signal is a number, its note a string")
        for rank in _ranks(group.get("ranks"), size, size - len(exits)):
            exits.append(Exit(rank, seq, status, signum, note))
    return exits


def answers_of(payload: dict[str, Any], size: int = MAX_SIZE) -> list[dict[str, Any]]:
    """The per-rank answers one response to exec.start stands for: itself, or, for a merged
    answer, each rank's exit as that rank sent it (none if it cannot be read: dropped, as any
    answer that is not one)."""
    if "exits" not in payload:
        return [payload]
    try:
        return [one.payload() for one in decode(payload["exits"], size)]
    except BadExits:
        return []


def _optional(signum: object, note: object) -> bool:
    """Whether an exit's optional fields are as they must be: a signal number, a note's text."""
    return (signum is None or is_int(signum)) and (note is None or type(note) is str)


def _idset(ranks: list[int]) -> str:
    parts: list[str] = []
    ordered = sorted(set(ranks))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def _ranks(text: object, size: int, room: int) -> list[int]:
    """The ranks of an idset such as `_idset` writes, each below `size`, and no more than `room`
    of them (checked before any range is expanded)."""
    if not isinstance(text, str) or not text:
        raise BadExits("an exits group needs its ranks as an idset")
    spans: list[tuple[int, int]] = []
    count = 0
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or not part.isascii():
            raise BadExits(f"bad idset in exits: {text[:64]!r}")
        if len(low) > 7 or len(high) > 7:  # no instance has a rank of eight digits
            raise BadExits(f"a rank out of range in exits: {text[:64]!r}")
        first = int(low)
        last = int(high) if dash else first
        if not first <= last < size:
            raise BadExits(f"a rank out of range in exits: {text[:64]!r}")
        count += last - first + 1
        if count > room:
            raise BadExits("exits name more ranks than the instance has")
        spans.append((first, last))
    return [rank for first, last in spans for rank in range(first, last + 1)]
