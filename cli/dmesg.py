"""`tbon dmesg`: the brokers' recent log records, gathered through the tree, or followed.

Every broker keeps its last records in a ring (overlay/services/dmesg.py). One request goes to
each rank through the tree, WINDOW of them at a time, so that the answers coming back to this
command's broker stay few whatever the size of the instance; they are printed sorted by time,
then rank. With --follow each rank then streams what it logs, one batch in flight: each batch is
acknowledged once written out, so a reader that stops makes the brokers drop records (and say how
many), never pile them up. Rank 0's `states` view (each rank's state as idsets, a few bytes at
any size) says which ranks to read, and its updates which were lost meanwhile: one stream for
both (an older broker's `held` view instead, cli/common.py's watch_states).

-C empties the rings of the ranks named (dmesg.clear); -c reads and empties each in one request
(dmesg.get with `clear`), so that nothing logged between the two is lost unread. -H shows times
as people read them (HumanClock): the date and minute when it changes, else the seconds since
the line before.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

from tbon.cli.common import URI_HELP, StatesReader, open_client, print_json, watch_states
from tbon.errors import RANK_TROUBLE, TbonError, UsageError
from tbon.overlay.connectors.patience import ANSWER_WAIT

if TYPE_CHECKING:
    from tbon.overlay.state.statesview import RankStates

WINDOW = 16  # ranks asked at once: what they answer is at most 16 rings (about 24 MiB)
LEVELS = ("debug", "info", "warning", "error")
OPTION_VALUES = {"--level": LEVELS}  # what `tbon completion` offers after --level
READABLE = ("online", "retiring")  # states whose brokers answer


def register(app: typer.Typer) -> None:
    @app.command("dmesg")
    def dmesg(
        uri: str = typer.Argument(None, metavar="[URI]", help=URI_HELP),
        ranks: str = typer.Option(
            "all",
            "--rank",
            "-r",
            metavar="RANKS",
            help="The ranks to read: an idset like 0,3-7 or [0,3-7], or all (every online rank).",
        ),
        follow: bool = typer.Option(
            False, "--follow", "-f", help="Then print new records as they come, until Ctrl-C."
        ),
        level: str = typer.Option(
            "debug",
            "--level",
            metavar="LEVEL",
            help="Only records at or above LEVEL: debug, info, warning or error.",
        ),
        as_json: bool = typer.Option(
            False,
            "--json",
            help="Print a JSON array of records (with --follow, one JSON object a line).",
        ),
        clear: bool = typer.Option(
            False, "--clear", "-C", help="Clear the records of the ranks named; print nothing."
        ),
        read_clear: bool = typer.Option(
            False,
            "--read-clear",
            "-c",
            help="Print the records, then clear them (each rank in one step: nothing logged "
            "between is lost).",
        ),
        human: bool = typer.Option(
            False,
            "--human",
            "-H",
            help="Human-readable times: the date and minute when it changes, else +SECONDS "
            "since the line before.",
        ),
    ) -> None:
        """Print the brokers' recent log records, sorted by time: TIME rank RANK LEVEL: MESSAGE.

        Each broker keeps its last 1000 records, info and above. Exit status: 0, or 68 if a rank
        asked for does not exist, is not online, did not answer within 10s, or was lost before
        it answered (with --follow: while followed); Ctrl-C ends --follow with that status.
        """
        if level not in LEVELS:
            raise UsageError(f"invalid --level {level!r}: use one of {', '.join(LEVELS)}")
        _check_together(
            {"--clear": clear, "--read-clear": read_clear, "--follow": follow},
            {"--clear": clear, "--json": as_json},
            {"--clear": clear, "--human": human},
            {"--human": human, "--json": as_json},
        )
        mode = "clear" if clear else "read-clear" if read_clear else "read"
        with open_client(uri) as client:
            watch = client.send("status.watch", {"view": "states"}, nodeid=0)
            watch, read, states = watch_states(client, watch)
            targets, trouble = _targets(states, ranks)
            reading = Reading(client, level, follow, as_json, trouble, mode=mode)
            reading.watch, reading.read = watch, read
            reading.clock = HumanClock() if human else None
            try:
                reading.run(targets)
            except BrokenPipeError:
                raise typer.Exit(128 + signal.SIGPIPE) from None
        raise typer.Exit(RANK_TROUBLE if reading.trouble else 0)


def _check_together(*groups: dict[str, bool]) -> None:
    """A UsageError if two options of one group are both given."""
    for group in groups:
        given = [name for name, on in group.items() if on]
        if len(given) > 1:
            raise UsageError(f"{given[0]} and {given[1]} do not go together: choose one")


class HumanClock:
    """Times as `dmesg -H` shows them: `[Mar 21 10:33]` on the first line and whenever the
    minute changes (or time runs back: records of ranks read later), else `[   +0.250]`, the
    seconds since the line before. Kept across the batches of a --follow."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.minute: tuple[int, ...] | None = None

    def stamp(self, seconds: float) -> str:
        local = time.localtime(seconds)
        minute = tuple(local[:5])
        previous, self.last = self.last, seconds
        if previous is None or minute != self.minute or seconds < previous:
            self.minute = minute
            return time.strftime("[%b %d %H:%M]", local)
        return f"[{f'+{seconds - previous:.3f}':>12}]"


def _targets(states: RankStates, ranks: str) -> tuple[list[int], dict[int, str]]:
    """The ranks to read, and why some asked-for ranks cannot be (each said on stderr)."""
    from tbon.overlay.parse.idset import format_idset, parse_idset

    size = states.size
    trouble: dict[int, str] = {}
    if ranks == "all":
        chosen = sorted(r for state in READABLE for r in states.ranks(state))
        for state in ("lost", "offline", "reserved"):
            skipped = states.ranks(state)
            if skipped:
                _say(f"skipping {state} rank{'s' * (len(skipped) > 1)} {format_idset(skipped)}")
        return chosen, trouble
    chosen = []
    for rank in parse_idset(ranks):
        if rank >= size:
            trouble[rank] = f"rank {rank}: no such rank in this instance of size {size}"
        elif (state := states.state(rank)) not in READABLE:
            trouble[rank] = f"rank {rank} is {state}"
        else:
            chosen.append(rank)
    for why in trouble.values():
        _say(why)
    return chosen, trouble


@dataclass
class Reading:
    """One `tbon dmesg`: the ranks asked, those followed, and what went wrong with which."""

    client: Any
    level: str
    follow: bool
    as_json: bool
    trouble: dict[int, str]
    waiting: list[int] = field(default_factory=list)  # not asked yet, last first
    asked: dict[int, int] = field(default_factory=dict)  # tag -> rank: no answer yet
    asked_at: dict[int, float] = field(default_factory=dict)  # tag -> when it was asked
    following: dict[int, int] = field(default_factory=dict)  # tag -> rank: streaming
    acks: dict[int, int] = field(default_factory=dict)  # tag -> `next` to acknowledge
    mode: str = "read"  # or "clear" (dmesg.clear), or "read-clear" (dmesg.get with clear)
    watch: int = 0  # the tag of rank 0's status stream (watch_states)
    read: StatesReader | None = None  # how to read its updates
    clock: HumanClock | None = None  # -H

    def run(self, targets: list[int]) -> None:
        if not targets:
            if self.as_json and not self.follow and self.mode != "clear":
                print_json([])
            return
        self.waiting = sorted(targets, reverse=True)
        backlog: list[dict[str, Any]] = []
        while self.waiting or self.asked:
            self._ask()
            backlog += self._take(self.client.receive(self._patience()))
        if self.mode != "clear":
            self._write(backlog, whole=True)
        if self.follow:
            self._follow()

    def _ask(self) -> None:
        topic = "dmesg.follow" if self.follow else "dmesg.get"
        payload: dict[str, Any] = {"level": self.level}
        if self.mode == "clear":
            topic, payload = "dmesg.clear", {}
        elif self.mode == "read-clear":
            payload["clear"] = True
        while self.waiting and len(self.asked) < WINDOW:
            rank = self.waiting.pop()
            tag = self.client.send(topic, payload, nodeid=rank)
            self.asked[tag], self.asked_at[tag] = rank, time.monotonic()

    def _patience(self) -> float:
        """Seconds until the oldest question goes unanswered too long; those that have are
        given up, each rank said (a broker stopped or overloaded answers nothing)."""
        now = time.monotonic()
        for tag, when in list(self.asked_at.items()):
            if now - when >= ANSWER_WAIT and (rank := self.asked.pop(tag, None)) is not None:
                del self.asked_at[tag]
                self._trouble(rank, f"rank {rank}: no answer within {ANSWER_WAIT:g}s")
        oldest = min(self.asked_at.values(), default=now)
        return max(0.0, oldest + ANSWER_WAIT - now)

    def _follow(self) -> None:
        """Print each batch as it comes, and acknowledge it once written, until Ctrl-C (or
        SIGTERM)."""
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            while self.following:
                self._acknowledge()
                self._write(self._take(self.client.receive(None)), whole=False)
        except KeyboardInterrupt:
            return
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _acknowledge(self) -> None:
        for tag, upto in self.acks.items():
            self.client.send("dmesg.ack", {"follow": tag, "next": upto}, nodeid=self.following[tag])
        self.acks.clear()

    def _take(self, reply: Any) -> list[dict[str, Any]]:
        """The records (and lost markers) of one answer, each with its rank."""
        if reply is None:
            return []
        if reply.tag == self.watch:
            self._note_lost(reply)
            return []
        rank = self.asked.pop(reply.tag, None)
        self.asked_at.pop(reply.tag, None)
        if rank is None and reply.tag in self.following:
            rank = self.following[reply.tag]
        if rank is None:
            return []
        if reply.errnum:
            self.following.pop(reply.tag, None)
            self._trouble(rank, f"rank {rank}: {reply.errstr}")
            return []
        if self.follow and reply.streaming:
            self.following[reply.tag] = rank
            self.acks[reply.tag] = reply.payload.get("next", 0)
        taken = [{**record, "rank": rank} for record in reply.payload.get("records", [])]
        if lost := reply.payload.get("lost"):
            taken.append({"rank": rank, "lost": lost, "time": _now(taken)})
        return taken

    def _note_lost(self, reply: Any) -> None:
        """Rank 0 pushed its table: a rank being read whose broker has gone will never answer."""
        if reply.errnum:  # the instance is shutting down
            raise TbonError(f"status stream ended: {reply.errstr}")
        assert self.read is not None  # set with `watch`
        states = self.read(reply.payload)
        if states is None:
            return  # more pages of an older broker's held view to come
        gone = {r for r in self.waiting if states.state(r) not in READABLE}
        self.waiting = [r for r in self.waiting if r not in gone]
        for streams in (self.asked, self.following):
            for tag, rank in list(streams.items()):
                if states.state(rank) not in READABLE:
                    del streams[tag]
                    self.acks.pop(tag, None)
                    self.asked_at.pop(tag, None)
                    gone.add(rank)
        for rank in sorted(gone):
            state = states.state(rank)
            if state == "vacant":  # its broker left cleanly: retired, or said goodbye
                _say(f"rank {rank} is vacant: its broker left")
            else:
                self._trouble(rank, f"rank {rank} is {state}")

    def _trouble(self, rank: int, why: str) -> None:
        self.trouble[rank] = why
        _say(why)

    def _write(self, records: list[dict[str, Any]], whole: bool) -> None:
        """Records sorted by time, then rank: all at once (a JSON array, unless following), or
        as one batch of a follow (a JSON object a line)."""
        records.sort(key=lambda r: (r["time"], r["rank"], r.get("seq", -1)))
        if self.as_json and whole and not self.follow:
            print_json([_as_json(r) for r in records])
            return
        out = sys.stdout
        for record in records:
            text = json.dumps(_as_json(record), separators=(",", ":")) if self.as_json else None
            out.write((text or _line(record, self.clock)) + "\n")
        out.flush()


def _line(record: dict[str, Any], clock: HumanClock | None = None) -> str:
    from tbon.overlay.broker.logs import local_time

    when = local_time(record["time"]) if clock is None else clock.stamp(record["time"])
    rank = record["rank"]
    if "lost" in record:
        return f"{when} rank {rank}: {record['lost']} records lost (not read in time)"
    return f"{when} rank {rank} {record['level']}: {record['message']}"


def _as_json(record: dict[str, Any]) -> dict[str, Any]:
    seconds = record["time"]
    stamp = datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds")
    if "lost" in record:
        return {"time": stamp, "timestamp": seconds, "rank": record["rank"], "lost": record["lost"]}
    return {
        "time": stamp,
        "timestamp": seconds,
        "rank": record["rank"],
        "level": record["level"],
        "message": record["message"],
        "seq": record["seq"],
    }


def _now(records: list[dict[str, Any]]) -> float:
    """When a lost marker is shown: just before the records that came after the gap."""
    return min((r["time"] for r in records), default=time.time())


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(f"tbon dmesg: {text}", file=sys.stderr)
