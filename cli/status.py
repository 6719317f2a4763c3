"""`tbon status`: the tree of ranks and their states, once, until a state, or live.

Every view is computed at rank 0 (status.summary, status.errors, status.tree) and `--json` is
read in pages, so that no message and no process holds the whole table of a large instance.
A `--watch` view on a terminal is drawn on the alternate screen and redrawn whole at every change
rank 0 reports (it pushes a summary, and the view is fetched then) and at least every second, so
that its clocks tick and anything else written to the terminal (the warnings of the brokers of a
`tbon start` shell) is wiped at the next redraw instead of shifting the view; when it ends, the
last view is printed on the normal screen. Piped, each view is printed after a line with the
time.
"""

# No `from __future__ import annotations`: Typer reads a command's annotations at every
# start, and strings it compiles and evaluates four times over (~1 ms of this command's start).

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

from tbon.cli.common import URI_HELP, duration, interactive, once_healed, open_client
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
        depth: int = typer.Option(
            None,
            "--depth",
            "-d",
            metavar="N",
            min=0,
            help="Draw the tree N levels below its root at most; ' ...' marks a rank whose "
            "ranks below are hidden.",
        ),
        summary: bool = typer.Option(
            False, "--summary", help="Show only the subtree's root, and its ranks by state."
        ),
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
        if depth is not None and (kind != "tree" or as_json or wait is not None):
            shown = "--json" if as_json else "--wait" if wait is not None else f"--{kind}"
            raise UsageError(f"--depth and {shown} do not go together: it cuts the tree")
        lit = _highlight_ranks(highlight)
        given = duration(timeout, "--timeout")
        limit = None if given == 0 else given  # 0: no limit, as tbon.timeout=0
        answer_in = limit_of(given)
        with open_client(uri) as client:
            if wait is not None:
                wait_for(client, rank, wait, limit)
                if as_json:
                    write_pages(client, rank, answer_in, limit)
                return
            if as_json and not watch:
                write_pages(client, rank, answer_in, limit)
                return
            view = View(client, rank, kind, depth, verbose, lit, answer_in, limit)
            if kind == "summary" and not watch and not colored(color):
                print_plain(view.fetch())  # Rich is not loaded for one plain line
                return
            console = make_console(color)
            marks = _marks(lit, console)
            if watch:
                watch_live(client, view, not no_pretty, as_json, console, marks)
                return
            answer = view.fetch()
            check_highlight(answer, lit)
            rtts = round_trips(client, answer) if verbose and kind == "tree" else None
            for text in draw(answer, kind, not no_pretty, verbose, rtts, 0.0, marks):
                console.print(text)


class View:
    """What one view of the table is asked of rank 0 (docs/protocol.md §7): `--summary`
    status.summary, `--errors` and `--down` status.errors (with `each` for `-v` and `--down`),
    the tree status.tree, runs of ranks that read the same drawn as one line (not with `-v` or
    `-H`, which tell ranks apart)."""

    def __init__(
        self,
        client: Any,
        rank: int,
        kind: str,
        depth: int | None,
        verbose: bool,
        lit: frozenset[int],
        answer_in: float | None,
        limit: float | None,
    ) -> None:
        self.client, self.rank, self.kind, self.verbose = client, rank, kind, verbose
        self.answer_in, self.limit = answer_in, limit
        self.payload: dict[str, Any]
        if kind == "summary":
            self.topic, self.payload = "status.summary", {"rank": rank}
        elif kind in ("errors", "down"):
            each = verbose or kind == "down"
            self.topic, self.payload = "status.errors", {"rank": rank, "each": each}
        else:
            merge = not verbose and not lit
            self.topic = "status.tree"
            self.payload = {"rank": rank, "depth": depth, "merge": merge}

    def fetch(self) -> dict[str, Any]:
        def ask() -> dict[str, Any]:
            answer: dict[str, Any] = self.client.rpc(
                self.topic, self.payload, nodeid=0, timeout=self.answer_in
            )
            return answer

        try:
            return once_healed(self.client, ask, self.limit)
        except RequestError as error:
            raise _rank_error(error, self.rank) from None


def _rank_error(error: RequestError, rank: int) -> TbonError:
    """A view's refusal of --rank (ENOENT) as the RankError every command gives (exit 68)."""
    import errno

    if error.errnum == errno.ENOENT:
        return RankError(f"--rank {rank}: {error}")
    return error


def draw(
    answer: dict[str, Any],
    kind: str,
    pretty: bool,
    verbose: bool,
    rtts: dict[int, float] | None = None,
    age: float = 0.0,
    marks: Any = None,
) -> list[Any]:
    """The lines of a view that rank 0 computed."""
    from tbon.cli import render

    if kind == "summary":
        return [render.summary_of(answer)]
    if kind in ("errors", "down"):
        return render.errors_of(answer, paths=kind == "down", verbose=verbose, age=age)
    return render.tree_of(answer, pretty, verbose, rtts, age, marks)


def write_pages(client: Any, rank: int, timeout: float | None, limit: float | None) -> None:
    """`--json`: the table as one line of compact JSON, written a page at a time as rank 0
    sends them (status.get with `start`): neither this process nor any message holds it whole,
    and the object is the one a single status.get gives a smaller instance. The first page is
    asked for again once if the tree was healing (once_healed); a later page is not, as the
    line has begun."""

    def first() -> tuple[Iterator[tuple[dict[str, Any], bytes]], tuple[dict[str, Any], bytes]]:
        pages = client.table_pages(timeout)
        return pages, next(pages)

    pages, (header, data) = once_healed(client, first, limit)
    check_rank(header, rank)
    out = sys.stdout
    head = {k: v for k, v in header.items() if k not in ("start", "next")}  # size, topo, root..
    out.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"ranks":[')
    while True:
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()
        following = next(pages, None)
        if following is None:
            break
        out.write(",")
        header, data = following
    out.write("]}\n")
    out.flush()


def colored(color: str) -> bool:
    """Whether `--color` colours standard output: `auto` colours a terminal unless NO_COLOR is
    set (and only then: FORCE_COLOR and the like are not asked); `always` colours even a pipe."""
    no_color = os.environ.get("NO_COLOR", "") != ""
    return color == "always" or (color == "auto" and sys.stdout.isatty() and not no_color)


def print_plain(answer: dict[str, Any]) -> None:
    """`--summary` without colour, as cli/lines.py words it: the line Rich would print, without
    loading Rich (issue 26: a command's whole time at 262,144 ranks is ~0.2 s, Rich ~40 ms)."""
    from tbon.cli.lines import summary_parts

    sys.stdout.write("".join(words for words, _ in summary_parts(answer)) + "\n")
    sys.stdout.flush()


def make_console(color: str) -> "Console":
    """Standard output as `--color` wants it (colored())."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    on = colored(color)
    system = None if not on else "auto" if color == "auto" else "standard"  # always: even dumb
    return Console(
        highlight=False,
        soft_wrap=True,
        force_terminal=tty or on,
        color_system=system,  # type: ignore[arg-type]
        no_color=not on,
    )


def _highlight_ranks(text: str | None) -> frozenset[int]:
    from tbon.overlay.parse.idset import parse_idset

    return frozenset(parse_idset(text)) if text is not None else frozenset()


def _marks(ranks: frozenset[int], console: "Console") -> Any:
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


def round_trips(client: Any, tree: dict[str, Any]) -> dict[int, float]:
    """Ping every online rank drawn in a status.tree answer at once; rank -> seconds."""
    sent: dict[int, tuple[int, float]] = {}
    for item in tree["items"]:
        entry = item["entry"]
        if entry["state"] == "online" and "ranks" not in item:
            rank = entry["rank"]
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
    """Follow rank 0's summary of `rank`'s subtree (status.watch of the `summary` view) until
    that subtree is in `state` (or, for `up`, has no rank missing); TbonError on timeout."""
    deadline = None if limit is None else time.monotonic() + limit
    from rich.console import Console

    console = Console(stderr=True)
    now_state = ""
    spinner = console.status(f"waiting for rank {rank} to be {state}") if interactive() else None
    view = {"view": "summary", "rank": rank}
    with spinner if spinner is not None else nullcontext():
        for answer in _stream_until(client, deadline, view, rank, retry=True, spinner=spinner):
            now_state = answer["entry"]["subtree"]
            if state == UP:
                if not answer["missing"]:
                    return answer
                now_state += f"; not online: {_listed(answer)}"
            elif now_state == state:
                return answer
    assert limit is not None  # without one, the stream ends only by raising
    if not now_state:
        raise TbonError(
            f"timed out after {limit:g}s waiting for rank {rank} to be {state} (no "
            "status came from rank 0)"
        )
    raise TbonError(
        f"timed out after {limit:g}s waiting for rank {rank} to be {state} (it is {now_state})"
    )


def missing(table: dict[str, Any], root: int) -> list[int]:
    """The ranks under `root` of a whole table expected to have a broker online that have none
    (EXPECTED_MISSING): what rank 0's summary counts as `missing` (statusviews.py)."""
    from tbon.cli import render

    ranks = table["ranks"]
    return [r for r in render.subtree(table, root) if ranks[r]["state"] in EXPECTED_MISSING]


def _listed(summary: dict[str, Any]) -> str:
    """`3 lost, 5 offline`, the first ones rank 0 named, and how many more."""
    named = summary["missing_ranks"]
    shown = [f"{rank} {state}" for rank, state in named]
    more = summary["missing"] - len(named)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _stream_until(
    client: Any,
    deadline: float | None,
    view: dict[str, Any],
    rank: int,
    retry: bool = False,
    spinner: "Status | None" = None,
) -> Any:
    """Status updates of `view` as rank 0 pushes them, until `deadline`. With `retry`, a first
    request that a healing tree could not route is sent once more (once_healed); a stream that
    ends after an update came is not."""

    def first() -> tuple[Iterator[dict[str, Any]], dict[str, Any] | None]:
        stream = client.watch_status(deadline, view)
        return stream, next(stream, None)

    try:
        if not retry:
            yield from client.watch_status(deadline, view)
            return
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        stream, answer = once_healed(client, first, left, spinner)
        if answer is not None:
            yield answer
            yield from stream
    except RequestError as error:
        if isinstance(refused := _rank_error(error, rank), RankError):
            raise refused from None
        raise TbonError(f"status stream ended: {error}") from None


def changes(client: Any, rank: int, tick: float | None = TICK) -> Iterator[float]:
    """0 at once and after each change rank 0 reports (it pushes a summary of `rank`'s subtree
    whenever the table changed, one at a time), and, with `tick`, the seconds since the last
    change at least every `tick` seconds between them, for a view whose clocks run."""
    tag = client.send("status.watch", {"view": "summary", "rank": rank}, nodeid=0)
    received = next_draw = 0.0
    started = False
    while True:
        wait = None if not started or tick is None else max(0.0, next_draw - time.monotonic())
        if started and tag in client.missed:  # a change came while a view was fetched
            client.missed.discard(tag)
            wait = 0.0
            received = next_draw = time.monotonic()
            yield 0.0
            continue
        reply = client.receive(wait)
        now = time.monotonic()
        if reply is None:
            assert tick is not None
            next_draw = now + tick
            yield now - received
            continue
        if reply.tag != tag:
            continue
        if reply.errnum:
            if isinstance(refused := _rank_error(_error(reply), rank), RankError):
                raise refused
            raise TbonError(f"status stream ended: {reply.errstr or os.strerror(reply.errnum)}")
        started, received, next_draw = True, now, now + WIPE
        yield 0.0


def _error(reply: Any) -> RequestError:
    return RequestError(reply.errnum, reply.errstr or os.strerror(reply.errnum))


def watch_live(
    client: Any, view: View, pretty: bool, as_json: bool, console: "Console", marks: Any = None
) -> None:
    """Show the view until Ctrl-C: rank 0 tells of each change (we never poll it), and the view
    is fetched again then."""
    try:
        if as_json:  # the table on one line after each change, for scripts
            for _age in changes(client, view.rank, None):
                write_pages(client, view.rank, view.answer_in, view.limit)
        elif sys.stdout.isatty():
            _watch_screen(client, view, pretty, console, marks)
        else:
            for _age in changes(client, view.rank, None):
                answer = view.fetch()
                console.print(datetime.now().astimezone().isoformat(timespec="milliseconds"))
                for text in draw(answer, view.kind, pretty, view.verbose, None, 0.0, marks):
                    console.print(text)
                console.print()
                console.file.flush()
    except KeyboardInterrupt:
        return


def _watch_screen(
    client: Any, view: View, pretty: bool, console: "Console", marks: Any = None
) -> None:
    from rich.console import Group
    from rich.live import Live

    shown: list[Any] = []
    answer: dict[str, Any] = {}
    try:
        with Live(console=console, screen=True, auto_refresh=False) as live:
            for age in changes(client, view.rank):
                if age == 0.0 or not answer:
                    answer = view.fetch()
                shown = draw(answer, view.kind, pretty, view.verbose, None, age, marks)
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
