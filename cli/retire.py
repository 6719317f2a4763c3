"""`tbon retire`: remove brokers gracefully, leaves first, and wait until their ranks are vacant.

Rank 0 decides: it records each rank `retiring` before its broker is told, and refuses what is
unsafe (rank 0, a rank with children still in use, a rank with nothing to retire). This command
only orders the requests (deepest ranks first, each level at once) and shows what happens.

With standbys the root may change while a rank retires (docs/protocol.md §13.4). An answer that
says the root cannot answer for now (`ask_again`: grants paused, a root superseded, the way to
the root being healed), a connection lost with a URI list left to try, or a silence after which
status names another root than the one asked (`root_of`), makes this command ask the root of
now again, for at most ASK_AGAIN_FOR seconds per wave: a repeat is safe (a rank already
retiring is waited for, one retired is answered so).
"""

from __future__ import annotations

import errno
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import typer

from tbon.cli.common import interactive, print_json
from tbon.errors import RANK_TROUBLE, UsageError
from tbon.overlay.parse.idset import format_idset, parse_idset

REFUSED = 1  # some rank could not be retired (each is named)

ASK_AGAIN_FOR = 60.0
"""Seconds, from a wave's first request, in which an answer of `ask_again` is asked again."""

SILENCE = 5.0
"""Seconds without an answer after which this command checks that the root it asked still is."""


def ask_again(errnum: int) -> bool:
    """Whether an error answer to retire.rank means "no root can answer now, ask again":
    ETIMEDOUT (grants paused, or the root superseded while it held the request: protocol
    §13.2, §13.3) or EHOSTUNREACH (the broker asked cannot reach the root: it is reattaching,
    perhaps while the root group elects)."""
    return errnum in (errno.ETIMEDOUT, errno.EHOSTUNREACH)


def root_of(status: dict[str, Any]) -> tuple[int, int]:
    """The root and its term, as a status answer names them (rank 0 in term 1 without
    standbys)."""
    group = status.get("group") or {}
    return int(status.get("root", 0)), int(group.get("term", 1))


@dataclass
class Result:
    """What became of one rank."""

    rank: int
    result: str = "pending"  # retired, refused
    already: bool = False
    seconds: float | None = None
    killed: int = 0
    lost: bool = False
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"rank": self.rank, "result": self.result}
        if self.result == "retired":
            answer.update(already=self.already, killed=self.killed, lost=self.lost)
            if self.seconds is not None:
                answer["seconds"] = self.seconds
        else:
            answer["reason"] = self.reason
        return answer


def register(app: typer.Typer) -> None:
    @app.command("retire")
    def retire(
        words: list[str] = typer.Argument(
            ..., metavar="[URI] RANKS", help="The instance (default: $TBON_URI) and an idset."
        ),
        timeout: str = typer.Option(
            None,
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Let running work finish for at most DURATION, then kill it (default: wait).",
        ),
        force: bool = typer.Option(
            False, "--force", help="Kill running work at once instead of letting it finish."
        ),
        subtree: bool = typer.Option(
            False, "--subtree", help="Retire each rank's whole subtree too, leaves first."
        ),
        as_json: bool = typer.Option(False, "--json", help="Report as JSON."),
    ) -> None:
        """Retire brokers: each takes no new work, lets what it runs finish, and leaves; its
        rank becomes vacant, and that broker never comes back.

        Exit status: 0 if every rank is retired (or already was), 1 if some were refused, 68
        if some are not in the instance.
        """
        from tbon.cli.common import duration, fetch_status, open_client

        uri, ranks = _split(words)
        wanted = _parse_ranks(ranks)
        drain = duration(timeout, "--timeout")
        asker = _Asker(uri, open_client, fetch_status)
        try:
            status = asker.status()
            waves = plan(status, wanted, subtree)
            results = _retire(asker, status, waves, force, drain, as_json)
        finally:
            asker.close()
        ordered = sorted(results.values(), key=lambda r: r.rank)
        if as_json:
            print_json({"ranks": [r.as_dict() for r in ordered]})
        raise typer.Exit(exit_status(ordered, status["size"]))


def exit_status(results: list[Result], size: int) -> int:
    """0 if every rank is retired; 68 if some are not in the instance (as for every command),
    else 1 if rank 0 refused some."""
    failed = [r.rank for r in results if r.result != "retired"]
    if any(rank >= size for rank in failed):
        return RANK_TROUBLE
    return REFUSED if failed else 0


def _split(words: list[str]) -> tuple[str | None, str]:
    from tbon.overlay.connectors.uri import looks_like_uri

    if len(words) == 2 and looks_like_uri(words[0]):  # a bad one is then refused as a URI
        return words[0], words[1]
    if len(words) == 1:
        return None, words[0]
    raise UsageError("expected [URI] RANKS, e.g. `tbon retire 3,5-7`")


def _parse_ranks(text: str) -> list[int]:
    try:
        return parse_idset(text)
    except ValueError as error:
        raise UsageError(f"RANKS: {error}") from None


def plan(status: dict[str, Any], wanted: list[int], subtree: bool) -> list[list[int]]:
    """The ranks to retire, in waves: deepest first, so that children leave before parents.
    With `subtree`, each rank's descendants that are online or retiring are added."""
    entries = status["ranks"]
    size = len(entries)
    chosen = set(wanted)
    if subtree:
        stack = [r for r in wanted if r < size]
        while stack:
            for child in entries[stack.pop()]["children"]:
                if entries[child]["state"] in ("online", "retiring") and child not in chosen:
                    chosen.add(child)
                    stack.append(child)

    def depth(rank: int) -> int:
        level = 0
        while rank < size and entries[rank]["parent"] is not None:
            rank, level = entries[rank]["parent"], level + 1
        return level

    by_depth: dict[int, list[int]] = {}
    for rank in sorted(chosen):
        by_depth.setdefault(depth(rank), []).append(rank)
    return [by_depth[d] for d in sorted(by_depth, reverse=True)]


class _Asker:
    """The connection this command asks through, opened again (through the URI list, its first
    live entry) when its broker goes."""

    def __init__(self, uri: str | None, opener: Any, fetch: Any) -> None:
        self.uri, self.opener, self.fetch = uri, opener, fetch
        self.client = opener(uri)

    def status(self) -> dict[str, Any]:
        return dict(self.fetch(self.client))

    def root(self) -> tuple[int, int] | None:
        """The root of now and its term, or None while status cannot say (no root reached)."""
        from tbon.errors import TbonError

        try:
            return root_of(self.status())
        except TbonError:
            return None

    def reopen(self) -> None:
        """A new connection; TbonError if no URI answers."""
        self.close()
        self.client = self.opener(self.uri)

    def close(self) -> None:
        self.client.close()


def _retire(
    asker: _Asker,
    status: dict[str, Any],
    waves: list[list[int]],
    force: bool,
    drain: float | None,
    as_json: bool,
) -> dict[int, Result]:
    from rich.console import Console

    from tbon.cli.common import wait_healed
    from tbon.errors import TbonError

    say = (lambda text: None) if as_json else (lambda text: print(text, file=sys.stderr))
    results: dict[int, Result] = {}
    console = Console(stderr=True)
    spinner = console.status("retiring") if interactive() and not as_json else nullcontext()

    def ask(rank: int) -> int:
        request: dict[str, Any] = {"rank": rank, "force": force, "timeout": drain}
        if rank < status["size"]:  # the incarnation we saw: never retire a newer one
            request["incarnation"] = status["ranks"][rank]["incarnation"]
        return int(asker.client.send("retire.rank", request, nodeid=0))

    with spinner as shown:
        for wave in waves:
            tags: dict[int, Result] = {}
            for rank in wave:
                results[rank] = Result(rank)
                tags[ask(rank)] = results[rank]
            until = time.monotonic() + ASK_AGAIN_FOR
            asked_of = root_of(status)

            def again(why: str) -> None:
                """Ask the root of now for every rank of the wave still pending."""
                nonlocal tags
                pending = [r for r in tags.values() if r.result == "pending"]
                say(
                    f"tbon retire: {why}; asking the root again for rank(s) "
                    f"{format_idset([r.rank for r in pending])}"
                )
                tags = {ask(r.rank): r for r in pending}

            while any(r.result == "pending" for r in tags.values()):
                if shown is not None:
                    pending = [r.rank for r in tags.values() if r.result == "pending"]
                    shown.update(f"retiring rank(s) {format_idset(pending)}")
                left = until - time.monotonic()
                try:
                    reply = asker.client.receive(SILENCE if left > 0 else None)
                    if reply is None:  # silent: does the root we asked still lead?
                        now_root = asker.root()
                        if now_root is not None and now_root != asked_of:
                            asked_of = now_root
                            again(f"rank {now_root[0]} is the root now")
                        continue
                except TbonError as error:
                    if left <= 0 or "lost the connection" not in str(error):
                        raise
                    asker.reopen()  # the next URI of the list that answers, or TbonError
                    asked_of = asker.root() or asked_of
                    again(str(error))
                    continue
                if reply.tag not in tags:
                    continue
                if reply.errnum and ask_again(reply.errnum) and left > 0:
                    wait_healed(asker.client, min(left, 10.0))
                    time.sleep(min(0.2, left))  # however heal.wait ended: never a busy loop
                    asked_of = asker.root() or asked_of
                    again(f"rank {tags[reply.tag].rank}: {reply.errstr}")
                    continue
                _take(reply, tags[reply.tag], as_json)
    return results


def _take(reply: Any, result: Result, as_json: bool) -> None:
    """Fold one answer from rank 0 into `result`, telling the user as it goes."""
    say = (lambda text: None) if as_json else (lambda text: print(text, file=sys.stderr))
    rank = result.rank
    if reply.errnum:
        result.result, result.reason = "refused", str(reply.errstr)
        say(f"tbon retire: rank {rank}: {reply.errstr}")
        return
    news = reply.payload
    event = news.get("event")
    if event == "retiring" and news.get("already"):
        result.already = True
    elif event == "draining":
        say(f"rank {rank}: waiting for {news.get('running')} running job(s) to finish")
    elif event == "killed":
        result.killed = int(news.get("killed", 0))
        say(f"rank {rank}: killed {result.killed} running job(s) ({news.get('why')})")
    elif event == "unreachable":
        why = news.get("reason")
        say(f"rank {rank}: not reachable ({why}); waiting for it to be declared lost")
    elif event == "retired":
        result.result = "retired"
        result.already = result.already or bool(news.get("already"))
        result.seconds, result.lost = news.get("seconds"), bool(news.get("lost"))
        if as_json:
            return
        if result.seconds is None:
            print(f"rank {rank}: already retired")
        elif result.lost:
            print(
                f"rank {rank}: retired (declared lost before it acknowledged; should it wake, "
                "it is told it is retired)"
            )
        else:
            already = "already retiring; " if result.already else ""
            print(f"rank {rank}: {already}retired in {result.seconds:.3f}s")
    if not reply.streaming and result.result == "pending":
        result.result, result.reason = "refused", f"unexpected answer {news!r}"
