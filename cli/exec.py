"""`tbon exec`: run a command on many ranks at once, fanned out through the tree.

One request goes to rank 0; each broker starts the command if it is a target and passes the
request to the children whose subtrees hold targets. Output comes back up the same way, in whole
lines, as it is produced. The cost grows with the tree's depth, not with the number of ranks.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

import typer

from tbon.cli.common import print_json
from tbon.errors import UsageError
from tbon.overlay.parse.idset import format_idset, parse_idset

RANK_TROUBLE = 68  # a target does not exist, is not online, or was lost while running


@dataclass
class Outcome:
    """What became of the command on each target rank."""

    pending: set[int]
    status: dict[int, int] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    output: dict[int, dict[str, list[bytes]]] = field(default_factory=dict)

    def exit_status(self) -> int:
        worst = max(self.status.values(), default=0)
        return max(worst, RANK_TROUBLE) if self.errors else worst


def register(app: typer.Typer) -> None:
    @app.command("exec", context_settings={"allow_interspersed_args": False})
    def exec_(
        words: list[str] = typer.Argument(
            ...,
            metavar="[URI] COMMAND [ARGS]...",
            help="The command to run (after an optional URI).",
        ),
        uri_option: str = typer.Option(None, "--uri", hidden=True),
        ranks: str = typer.Option(
            "all",
            "--rank",
            "-r",
            metavar="RANKS",
            help="Target ranks: an idset like 0,3-7, or all (online).",
        ),
        exclude: str = typer.Option(
            None, "--exclude", "-x", metavar="RANKS", help="Ranks to leave out."
        ),
        label: bool = typer.Option(
            False, "--label", "-l", help="Prefix each output line with 'RANK: '."
        ),
        directory: str = typer.Option(
            None,
            "--dir",
            "-d",
            metavar="DIR",
            help="Run in DIR (default: each broker's directory).",
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON object: each rank's status and output."
        ),
    ) -> None:
        """Run COMMAND on a set of ranks, like pdsh or flux exec, through the tree.

        stdout and stderr are streamed in whole lines; stdin is sent to every process; SIGINT
        and SIGTERM are passed on to every process. Exit status: the largest of the commands'
        (128+N for signal N), or 68 if a target does not exist, is not online, or was lost.
        """
        from tbon.overlay.connectors.client import connect

        uri, command = _split(words)
        uri = uri or uri_option
        with connect(uri) as client:
            status = client.rpc("status.get", nodeid=0)
            targets, problems = _targets(status, ranks, exclude)
            outcome = Outcome(set(targets))
            for rank, why in problems.items():
                outcome.errors[rank] = why
                if not as_json:
                    print(f"tbon exec: rank {rank}: {why}", file=sys.stderr)
            if targets:
                _run(client, sorted(targets), command, directory, label, as_json, outcome)
        if as_json:
            print_json(
                {
                    "status": outcome.exit_status(),
                    "ranks": [
                        {
                            "rank": rank,
                            "status": outcome.status.get(rank),
                            "error": outcome.errors.get(rank),
                            "stdout": _text(outcome.output.get(rank, {}).get("stdout", [])),
                            "stderr": _text(outcome.output.get(rank, {}).get("stderr", [])),
                        }
                        for rank in sorted(set(outcome.status) | set(outcome.errors))
                    ],
                }
            )
        raise typer.Exit(outcome.exit_status())


def _text(chunks: list[bytes]) -> str:
    """Output as JSON text: bytes that are not UTF-8 as U+DC80-U+DCFF (surrogateescape)."""
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _split(words: list[str]) -> tuple[str | None, list[str]]:
    from tbon.overlay.connectors.uri import looks_like_uri

    if words and looks_like_uri(words[0]):
        uri, command = words[0], words[1:]
    else:
        uri, command = None, words
    if not command:
        raise UsageError("no COMMAND given")
    return uri, command


def _targets(
    status: dict[str, Any], ranks: str, exclude: str | None
) -> tuple[list[int], dict[int, str]]:
    """The ranks to run on, and why some asked-for ranks cannot be."""
    size, entries = status["size"], status["ranks"]
    skipped = set(parse_idset(exclude)) if exclude else set()
    problems: dict[int, str] = {}
    if ranks == "all":
        chosen = [e["rank"] for e in entries if e["state"] == "online"]
        retiring = [e["rank"] for e in entries if e["state"] == "retiring"]
        if retiring:
            print(f"tbon exec: skipping retiring ranks {format_idset(retiring)}", file=sys.stderr)
        return [r for r in chosen if r not in skipped], problems
    chosen = []
    for rank in parse_idset(ranks):
        if rank in skipped:
            continue
        if rank >= size:
            problems[rank] = f"no such rank in this instance of size {size}"
        elif entries[rank]["state"] != "online":
            problems[rank] = f"rank {rank} is {entries[rank]['state']}"
        else:
            chosen.append(rank)
    return chosen, problems


def _run(
    client: Any,
    targets: list[int],
    command: list[str],
    directory: str | None,
    label: bool,
    as_json: bool,
    outcome: Outcome,
) -> None:
    """Start the command, then pass output, input, signals and credit until every rank is done.

    Output is written as it comes and credited back once written (flow.py), so a reader that
    stops stops the jobs, as with ssh. Input is read only while every rank taking it has room."""
    from tbon.overlay.services.flow import StdinRoom, output_window

    job = uuid.uuid4().hex
    window = output_window(len(targets))
    start = {"id": job, "argv": command, "cwd": directory, "targets": targets, "window": window}
    tag = client.send("exec.start", start, nodeid=0)
    watch = client.send("status.watch", {}, nodeid=0)
    streams = Streams(client, job, window, label, as_json, outcome, StdinRoom.for_ranks(targets))

    def forward(signum: int, _frame: object) -> None:
        client.send("exec.signal", {"id": job, "signal": signum, "targets": targets}, nodeid=0)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    stdin = _stdin_fd()
    shutdown_said = False
    try:
        while outcome.pending:
            wanted = [stdin] if stdin is not None and streams.stdin.available() > 0 else []
            _, readable = client.wait(wanted, None)
            if readable:
                stdin = streams.pass_stdin(stdin)
            while outcome.pending and (reply := client.receive(0)) is not None:
                if reply.tag == tag:
                    streams.answer(reply)
                elif reply.tag == watch and not reply.errnum:
                    _note_lost(reply.payload, outcome, as_json)
                elif reply.tag == watch and not shutdown_said:
                    shutdown_said = True  # the jobs are being stopped; their exits still come
                    print(f"tbon exec: {reply.errstr}", file=sys.stderr)
            if stdin is None and streams.stdin.ranks and not streams.eof_sent:
                streams.send_eof()
    except BrokenPipeError:
        raise typer.Exit(128 + signal.SIGPIPE) from None  # as a shell's pipeline: the jobs die
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class Streams:
    """One exec's streams on the client's side: output written and credited back, input sent
    within the room the ranks have."""

    client: Any
    job: str
    window: int
    label: bool
    as_json: bool
    outcome: Outcome
    stdin: Any  # flow.StdinRoom
    returns: dict[int, Any] = field(default_factory=dict)  # rank -> flow.Returns
    eof_sent: bool = False

    def answer(self, reply: Any) -> None:
        payload = reply.payload
        rank = payload.get("rank")
        if not isinstance(rank, int) or rank not in self.outcome.pending:
            return
        if "stream" in payload:
            self._write(rank, str(payload["stream"]), reply.data)
        elif "stdin" in payload:
            amount = payload["stdin"]
            if isinstance(amount, int):
                self.stdin.read(rank, amount)
        elif "stdin_closed" in payload:
            self.stdin.done(rank)
        else:
            self.stdin.done(rank)
            _answer(payload, self.outcome, self.as_json)

    def _write(self, rank: int, stream: str, data: bytes | memoryview) -> None:
        from tbon.overlay.services.flow import MESSAGE_COST, Returns

        size = len(data)
        if self.as_json:
            self.outcome.output.setdefault(rank, {}).setdefault(stream, []).append(bytes(data))
        else:
            if self.label:
                lines = bytes(data).split(b"\n")  # newlines only: \r and friends stay inside a line
                ends = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
                prefix = f"{rank}: ".encode()
                data = b"".join(prefix + line for line in ends)
            out = sys.stderr if stream == "stderr" else sys.stdout
            out.buffer.write(data)
            out.flush()
        returns = self.returns.get(rank)
        if returns is None:
            returns = self.returns[rank] = Returns(self.window)
        if owed := returns.consumed(size + MESSAGE_COST):
            self.client.send("exec.credit", {"id": self.job, "bytes": owed}, nodeid=rank)

    def pass_stdin(self, fd: int) -> int | None:
        """Send what stdin has, as much as every rank has room for; at EOF, None."""
        from tbon.overlay.services.flow import CHUNK

        data = os.read(fd, min(CHUNK, self.stdin.available()))
        if not data:
            return None
        self.stdin.sent(len(data))
        payload = {"id": self.job, "targets": self.stdin.ranks}
        self.client.send("exec.stdin", payload, nodeid=0, data=data)
        return fd

    def send_eof(self) -> None:
        self.eof_sent = True
        payload = {"id": self.job, "targets": self.stdin.ranks, "eof": True}
        self.client.send("exec.stdin", payload, nodeid=0)


def _note_lost(status: dict[str, Any], outcome: Outcome, as_json: bool) -> None:
    for entry in status["ranks"]:
        rank = entry["rank"]
        # A retiring broker still runs what it started: its jobs finish first.
        if rank in outcome.pending and entry["state"] not in ("online", "retiring"):
            outcome.pending.discard(rank)
            outcome.errors[rank] = f"lost its broker while running ({entry['state']})"
            if not as_json:
                print(f"tbon exec: rank {rank}: {outcome.errors[rank]}", file=sys.stderr)


def _stdin_fd() -> int | None:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd


def _answer(payload: dict[str, Any], outcome: Outcome, as_json: bool) -> None:
    """A rank's last word: its exit status, or why it could not run."""
    rank = payload.get("rank")
    if not isinstance(rank, int) or rank not in outcome.pending:
        return
    if "exit" in payload:
        outcome.status[rank] = int(payload["exit"])
        outcome.pending.discard(rank)
        if "note" in payload and not as_json:
            print(f"tbon exec: rank {rank}: {payload['note']}", file=sys.stderr)
    elif "error" in payload:
        outcome.errors[rank] = str(payload["error"])
        outcome.pending.discard(rank)
        if not as_json:
            print(f"tbon exec: rank {rank}: {payload['error']}", file=sys.stderr)
