"""`tbon status`: the tree of ranks and their states, once, until a state, or live."""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from typing import Any

import typer

from tbon.cli.common import URI_HELP, duration, interactive, print_json
from tbon.errors import TbonError, UsageError
from tbon.overlay.connectors.client import RequestError

SUBTREE_STATES = ("full", "partial", "degraded", "lost", "offline")


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        uri: str = typer.Argument(None, metavar="[URI]", help=URI_HELP),
        rank: int = typer.Option(0, "--rank", "-r", help="Show the subtree under this rank."),
        wait: str = typer.Option(
            None,
            "--wait",
            "-w",
            metavar="STATE",
            help="Wait until the subtree is in STATE (full, partial, degraded, lost, offline).",
        ),
        timeout: str = typer.Option(
            None,
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Give up waiting after DURATION (e.g. 30s) and exit 1.",
        ),
        summary: bool = typer.Option(False, "--summary", help="Show only the subtree's root."),
        as_json: bool = typer.Option(False, "--json", help="Print the rank table as JSON."),
        no_pretty: bool = typer.Option(
            False, "--no-pretty", help="Indent with spaces, no tree connectors."
        ),
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Add time in state and round-trip time per rank."
        ),
        watch: bool = typer.Option(
            False, "--watch", help="Keep a live view, redrawn as ranks change, until Ctrl-C."
        ),
    ) -> None:
        """Show the state of every rank as a tree: RANK HOST: STATE.

        An online broker shows its subtree's status: full (all online), partial (some rank below
        is offline, vacant, reserved or retiring) or degraded (some rank below is lost); other
        ranks show their own state: lost, offline, vacant, reserved, retiring.
        """
        from tbon.overlay.connectors.client import connect

        if wait is not None and wait not in SUBTREE_STATES:
            raise UsageError(
                f"invalid --wait state {wait!r}: use one of {', '.join(SUBTREE_STATES)}"
            )
        limit = duration(timeout, "--timeout")
        with connect(uri) as client:
            if wait is not None:
                table = wait_for(client, rank, wait, limit)
                if as_json:
                    print_json(table)
                return
            if watch:
                watch_live(client, rank, not no_pretty, verbose, summary, as_json)
                return
            table = client.rpc("status.get", nodeid=0, timeout=30.0 if limit is None else limit)
            check_rank(table, rank)
            if as_json:
                print_json(table)
                return
            rtts = round_trips(client, table, rank) if verbose else None
            show(table, rank, not no_pretty, verbose, summary, rtts)


def check_rank(table: dict[str, Any], rank: int) -> None:
    if not 0 <= rank < table["size"]:
        raise UsageError(f"--rank {rank}: no such rank in this instance of size {table['size']}")


def lines(
    table: dict[str, Any],
    rank: int,
    pretty: bool,
    verbose: bool,
    summary: bool,
    rtts: dict[int, float] | None = None,
) -> list[Any]:
    from tbon.cli import render

    if summary:
        return [render.summary(table, rank)]
    return render.tree(table, rank, pretty, verbose, rtts)


def show(
    table: dict[str, Any],
    rank: int,
    pretty: bool,
    verbose: bool,
    summary: bool,
    rtts: dict[int, float] | None = None,
) -> None:
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    for text in lines(table, rank, pretty, verbose, summary, rtts):
        console.print(text)


def round_trips(client: Any, table: dict[str, Any], root: int) -> dict[int, float]:
    """Ping every online rank under `root` at once; rank -> seconds."""
    from tbon.cli import render

    wanted = render.subtree(table, root)
    sent: dict[int, tuple[int, float]] = {}
    for rank in wanted:
        if table["ranks"][rank]["state"] == "online":
            sent[client.send("broker.ping", {}, nodeid=rank)] = (rank, time.monotonic())
    rtts: dict[int, float] = {}
    deadline = time.monotonic() + 5.0
    while sent and time.monotonic() < deadline:
        reply = client.receive(deadline - time.monotonic())
        if reply is None:
            break
        if reply.tag in sent and not reply.errnum:
            rank, started = sent.pop(reply.tag)
            rtts[rank] = time.monotonic() - started
    return rtts


def wait_for(client: Any, rank: int, state: str, limit: float | None) -> dict[str, Any]:
    """Follow the pushed status until `rank`'s subtree is in `state`; TbonError on timeout."""
    deadline = None if limit is None else time.monotonic() + limit
    from rich.console import Console

    console = Console(stderr=True)
    now_state = "unknown"
    with (
        console.status(f"waiting for rank {rank} to be {state}") if interactive() else nullcontext()
    ):
        for table in _stream_until(client, deadline):
            check_rank(table, rank)
            now_state = table["ranks"][rank]["subtree"]
            if now_state == state:
                return table
    raise TbonError(
        f"timed out after {limit:g}s waiting for rank {rank} to be {state} (it is {now_state})"
    )


def _stream_until(client: Any, deadline: float | None) -> Any:
    """Status updates as rank 0 pushes them, until `deadline`."""
    try:
        yield from client.watch_status(deadline)
    except RequestError as error:
        raise TbonError(f"status stream ended: {error}") from None


def watch_live(
    client: Any, rank: int, pretty: bool, verbose: bool, summary: bool, as_json: bool = False
) -> None:
    """Redraw on every pushed change (rank 0 pushes; we never poll) until Ctrl-C."""
    from rich.console import Console, Group
    from rich.live import Live

    console = Console(highlight=False)
    try:
        if as_json:  # one JSON object a line, for scripts
            for table in _stream_until(client, None):
                print_json(table)
                sys.stdout.flush()
        elif console.is_terminal:
            with Live(console=console, auto_refresh=False, transient=False) as live:
                for table in _stream_until(client, None):
                    check_rank(table, rank)
                    live.update(Group(*lines(table, rank, pretty, verbose, summary)), refresh=True)
        else:
            for table in _stream_until(client, None):
                check_rank(table, rank)
                for text in lines(table, rank, pretty, verbose, summary):
                    console.print(text)
                console.print()
                console.file.flush()
    except KeyboardInterrupt:
        return
