"""`tbon status`: the tree of ranks and their states, once, until a state, or live.

A `--watch` view on a terminal is drawn on the alternate screen and redrawn whole at every table
rank 0 pushes and at least every second, so that its clocks tick and anything else written to
the terminal (the warnings of the brokers of a `tbon start` shell) is wiped at the next redraw
instead of shifting the view; when it ends, the last view is printed on the normal screen. Piped,
each table is printed after a line with the time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

from tbon.cli.common import URI_HELP, duration, interactive, once_healed, open_client, print_json
from tbon.errors import RankError, TbonError, UsageError
from tbon.overlay.connectors.client import RequestError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

SUBTREE_STATES = ("full", "partial", "degraded", "lost", "offline")
UP = "up"
WAIT_STATES = (*SUBTREE_STATES, UP)
EXPECTED_MISSING = ("offline", "reserved", "lost")
"""The states of a rank that is expected to have a broker online and has none: launched or in
the config file and not yet online, reserved for a joiner on its way, or lost. Vacant ranks
(spares, ranks whose broker left or retired, lapsed reservations) are expected to have none, and
a retiring rank is on its way out."""

COLORS = ("auto", "always", "never")
OPTION_VALUES = {"--color": COLORS, "--wait": WAIT_STATES}
"""What `tbon completion` offers after each of these options."""
TICK = 1.0  # seconds between redraws of a --watch view on a terminal, at most
WIPE = 0.25  # a redraw this soon after a pushed table wipes warnings that came with the change


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        uri: str = typer.Argument(None, metavar="[URI]", help=URI_HELP),
        rank: int = typer.Option(
            0, "--rank", "-r", metavar="RANK", help="Show the subtree under this rank."
        ),
        wait: str = typer.Option(
            None,
            "--wait",
            "-w",
            metavar="STATE",
            help="Wait until the subtree is in STATE: full, partial, degraded, lost or offline; "
            "or up, every rank of it that is expected to have a broker has it online (none is "
            "offline, reserved or lost; vacant spares are not expected).",
        ),
        timeout: str = typer.Option(
            None,
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Give up waiting after DURATION (e.g. 30s) and exit 1; 0: no limit. Default: "
            "10s for the answer, no limit for --wait.",
        ),
        summary: bool = typer.Option(False, "--summary", help="Show only the subtree's root."),
        errors: bool = typer.Option(
            False,
            "--errors",
            help="List the ranks that are not online, one line per distinct error with its ranks "
            "and hosts (like flux overlay errors); with -v, each rank with how long and why.",
        ),
        down: bool = typer.Option(
            False,
            "--down",
            help="List each rank that is not online with its path to the root and why.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the rank table as JSON."),
        no_pretty: bool = typer.Option(
            False, "--no-pretty", help="Indent with spaces, no tree connectors."
        ),
        verbose: bool = typer.Option(
            False,
            "--verbose",
            "-v",
            help="Add time in the state shown, incarnation and round-trip time per rank, and why "
            "each rank that is not online went.",
        ),
        watch: bool = typer.Option(
            False,
            "--watch",
            help="Keep a live view, redrawn as ranks change and every second, until Ctrl-C; "
            "piped, print each table after a line with the time.",
        ),
        color: str = typer.Option(
            "auto",
            "--color",
            metavar="WHEN",
            help="Colour the states: auto (on a terminal, unless NO_COLOR is set), always or "
            "never.",
        ),
        highlight: str = typer.Option(
            None,
            "--highlight",
            "-H",
            metavar="RANKS",
            help="Highlight these ranks (an idset like 0,3-7 or [0,3-7]) and the ranks on their "
            "way to the root in the tree: reversed in colour, marked with a trailing * without.",
        ),
    ) -> None:
        """Show the state of every rank as a tree: RANK HOST: STATE.

        An online broker shows its subtree's status: full (all online), partial (some rank below
        is offline, vacant, reserved or retiring) or degraded (some rank below is lost); other
        ranks show their own state: lost, offline, vacant, reserved, retiring.

        --errors and --down list only the ranks that are not online, with why each went.
        """
        from tbon.overlay.connectors.patience import limit_of

        if wait is not None and wait not in WAIT_STATES:
            raise UsageError(f"invalid --wait state {wait!r}: use one of {', '.join(WAIT_STATES)}")
        if color not in COLORS:
            raise UsageError(f"invalid --color {color!r}: use auto, always or never")
        views = (("summary", summary), ("errors", errors), ("down", down))
        chosen = [name for name, on in views if on]
        if len(chosen) > 1:
            raise UsageError(f"--{chosen[0]} and --{chosen[1]} do not go together: choose one")
        kind = chosen[0] if chosen else "tree"
        if highlight is not None and (kind != "tree" or as_json or wait is not None):
            shown = "--json" if as_json else "--wait" if wait is not None else f"--{kind}"
            raise UsageError(f"--highlight and {shown} do not go together: it marks the tree")
        lit = _highlight_ranks(highlight)
        given = duration(timeout, "--timeout")
        limit = None if given == 0 else given  # 0: no limit, as tbon.timeout=0
        with open_client(uri) as client:
            if wait is not None:
                table = wait_for(client, rank, wait, limit)
                if as_json:
                    print_json(table)
                return
            if watch:
                console = make_console(color)
                marks = _marks(lit, console)
                watch_live(client, rank, kind, not no_pretty, verbose, as_json, console, marks)
                return
            answer_in = limit_of(given)
            table = once_healed(
                client, lambda: client.rpc("status.get", nodeid=0, timeout=answer_in), limit
            )
            check_rank(table, rank)
            check_highlight(table, lit)
            if as_json:
                write_json(table)
                return
            rtts = round_trips(client, table, rank) if verbose and kind == "tree" else None
            console = make_console(color)
            marks = _marks(lit, console)
            show(console, table, rank, kind, not no_pretty, verbose, rtts, marks)


def write_json(table: dict[str, Any]) -> None:
    """The table as one line of compact JSON, written as it is: at 2048 ranks it is 370 kB,
    which Typer's echo would scan for colour codes to strip, in vain."""
    sys.stdout.write(json.dumps(table, separators=(",", ":")))
    sys.stdout.write("\n")


def make_console(color: str) -> Console:
    """Standard output as `--color` wants it: `auto` colours a terminal unless NO_COLOR is set
    (and only then: FORCE_COLOR and the like are not asked); `always` colours even a pipe."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    no_color = os.environ.get("NO_COLOR", "") != ""
    colored = color == "always" or (color == "auto" and tty and not no_color)
    system = None if not colored else "auto" if color == "auto" else "standard"  # always: even dumb
    return Console(
        highlight=False,
        soft_wrap=True,
        force_terminal=tty or colored,
        color_system=system,  # type: ignore[arg-type]
        no_color=not colored,
    )


def _highlight_ranks(text: str | None) -> frozenset[int]:
    from tbon.overlay.parse.idset import parse_idset

    return frozenset(parse_idset(text)) if text is not None else frozenset()


def _marks(ranks: frozenset[int], console: Console) -> Any:
    """What --highlight marks, and how: in reverse video, or with a plain `*` if no colour."""
    if not ranks:
        return None
    from tbon.cli.render import Marks

    return Marks(ranks, plain=console.color_system is None)


def check_highlight(table: dict[str, Any], ranks: frozenset[int]) -> None:
    if ranks and max(ranks) >= table["size"]:
        bad = max(ranks)
        raise UsageError(
            f"--highlight {bad}: no such rank in this instance of size {table['size']}"
        )


def check_rank(table: dict[str, Any], rank: int) -> None:
    if not 0 <= rank < table["size"]:
        raise RankError(f"--rank {rank}: no such rank in this instance of size {table['size']}")


def show(
    console: Console,
    table: dict[str, Any],
    rank: int,
    kind: str,
    pretty: bool,
    verbose: bool,
    rtts: dict[int, float] | None = None,
    marks: Any = None,
) -> None:
    from tbon.cli import render

    for text in render.view(table, rank, kind, pretty, verbose, rtts, 0.0, marks):
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


def missing(table: dict[str, Any], root: int) -> list[int]:
    """The ranks under `root` expected to have a broker online that have none (EXPECTED_MISSING):
    `--wait up` waits until there are none."""
    from tbon.cli import render

    ranks = table["ranks"]
    return [r for r in render.subtree(table, root) if ranks[r]["state"] in EXPECTED_MISSING]


def wait_for(client: Any, rank: int, state: str, limit: float | None) -> dict[str, Any]:
    """Follow the pushed status until `rank`'s subtree is in `state` (or, for `up`, has no rank
    missing); TbonError on timeout."""
    deadline = None if limit is None else time.monotonic() + limit
    from rich.console import Console

    console = Console(stderr=True)
    now_state = ""
    spinner = console.status(f"waiting for rank {rank} to be {state}") if interactive() else None
    with spinner if spinner is not None else nullcontext():
        for table in _stream_until(client, deadline, retry=True, spinner=spinner):
            check_rank(table, rank)
            now_state = table["ranks"][rank]["subtree"]
            if state == UP:
                if not (gone := missing(table, rank)):
                    return table
                now_state += f"; not online: {_listed(table, gone)}"
            elif now_state == state:
                return table
    assert limit is not None  # without one, the stream ends only by raising
    if not now_state:
        raise TbonError(
            f"timed out after {limit:g}s waiting for rank {rank} to be {state} (no "
            "status came from rank 0)"
        )
    raise TbonError(
        f"timed out after {limit:g}s waiting for rank {rank} to be {state} (it is {now_state})"
    )


def _listed(table: dict[str, Any], ranks: list[int], most: int = 8) -> str:
    """`3 lost, 5 offline`, the first `most` of them."""
    shown = [f"{r} {table['ranks'][r]['state']}" for r in ranks[:most]]
    more = f" and {len(ranks) - most} more" if len(ranks) > most else ""
    return ", ".join(shown) + more


def _stream_until(
    client: Any, deadline: float | None, retry: bool = False, spinner: Status | None = None
) -> Any:
    """Status updates as rank 0 pushes them, until `deadline`. With `retry`, a first request
    that a healing tree could not route is sent once more (once_healed); a stream that ends
    after a table came is not."""

    def first() -> tuple[Iterator[dict[str, Any]], dict[str, Any] | None]:
        stream = client.watch_status(deadline)
        return stream, next(stream, None)

    try:
        if not retry:
            yield from client.watch_status(deadline)
            return
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        stream, table = once_healed(client, first, left, spinner)
        if table is not None:
            yield table
            yield from stream
    except RequestError as error:
        raise TbonError(f"status stream ended: {error}") from None


def ticking(client: Any, tick: float = TICK) -> Iterator[tuple[dict[str, Any], float]]:
    """(table, age) as rank 0 pushes tables (age 0), and between them at least every `tick`
    seconds (the same table, `age` seconds older), so that a view's clocks keep running."""
    tag = client.send("status.watch", {}, nodeid=0)
    table: dict[str, Any] | None = None
    received = next_draw = 0.0
    while True:
        reply = client.receive(None if table is None else max(0.0, next_draw - time.monotonic()))
        now = time.monotonic()
        if reply is None:
            assert table is not None
            next_draw = now + tick
            yield table, now - received
            continue
        if reply.tag != tag:
            continue
        if reply.errnum:
            raise TbonError(f"status stream ended: {reply.errstr or os.strerror(reply.errnum)}")
        table, received, next_draw = reply.payload, now, now + WIPE
        yield table, 0.0


def watch_live(
    client: Any,
    rank: int,
    kind: str,
    pretty: bool,
    verbose: bool,
    as_json: bool,
    console: Console,
    marks: Any = None,
) -> None:
    """Show the view until Ctrl-C: rank 0 pushes each change (we never poll it)."""
    from tbon.cli import render

    try:
        if as_json:  # one JSON object a line, for scripts
            for table in _stream_until(client, None):
                print_json(table)
                sys.stdout.flush()
        elif sys.stdout.isatty():
            _watch_screen(client, rank, kind, pretty, verbose, console, marks)
        else:
            for table in _stream_until(client, None):
                check_rank(table, rank)
                console.print(datetime.now().astimezone().isoformat(timespec="milliseconds"))
                for text in render.view(table, rank, kind, pretty, verbose, None, 0.0, marks):
                    console.print(text)
                console.print()
                console.file.flush()
    except KeyboardInterrupt:
        return


def _watch_screen(
    client: Any,
    rank: int,
    kind: str,
    pretty: bool,
    verbose: bool,
    console: Console,
    marks: Any = None,
) -> None:
    from rich.console import Group
    from rich.live import Live

    from tbon.cli import render

    shown: list[Any] = []
    try:
        with Live(console=console, screen=True, auto_refresh=False) as live:
            for table, age in ticking(client):
                check_rank(table, rank)
                shown = render.view(table, rank, kind, pretty, verbose, None, age, marks)
                live.update(Group(*fit(shown, console.size.height)), refresh=True)
    finally:
        if shown:  # the last view stays on the normal screen
            console.print(Group(*shown))


def fit(lines: list[Any], height: int) -> list[Any]:
    """At most `height` lines: the alternate screen shows no more, so say what is cut."""
    if len(lines) <= height:
        return lines
    from rich.text import Text

    kept = max(0, height - 1)
    more = Text(f"... {len(lines) - kept} more lines: a taller terminal, --rank, or --down")
    return [*lines[:kept], more]
