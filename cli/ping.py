"""`tbon ping`: round-trip times to a rank, through the tree."""

# No `from __future__ import annotations`: Typer reads a command's annotations at every
# start, and strings it compiles and evaluates four times over.

import errno
import time
from functools import partial

import typer

from tbon.cli.common import URI_HELP, duration, limit, once_healed, open_client, print_json
from tbon.errors import RankError, UsageError
from tbon.overlay.parse.numbers import is_decimal


def register(app: typer.Typer) -> None:
    @app.command("ping")
    def ping(
        words: list[str] = typer.Argument(
            ...,
            metavar="[URI] RANK",
            help=f"{URI_HELP} Then the rank to ping.",
        ),
        count: int = typer.Option(1, "--count", "-c", min=1, help="How many pings to send."),
        interval: str = typer.Option(
            "0s", "--interval", "-i", metavar="DURATION", help="Pause between pings (e.g. 100ms)."
        ),
        timeout: str = typer.Option(
            "10s",
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Give up on a ping after DURATION and exit 1; 0: no limit.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    ) -> None:
        """Send a request to RANK and report how long the answer took, and how many hops.

        A ping that finds no route (EHOSTUNREACH: a broker on the way was lost) is sent once
        more after the tree heals; once per command, and only for that error. A RANK not in the
        instance, or whose broker is not online, exits 68.
        """
        from tbon.overlay.connectors.client import RequestError

        if len(words) > 2:
            raise UsageError("expected [URI] RANK")
        uri, rank_text = (None, words[0]) if len(words) == 1 else (words[0], words[1])
        if not is_decimal(rank_text):
            raise UsageError(f"invalid rank {rank_text!r}: use a whole number")
        rank = int(rank_text)
        pause = duration(interval, "--interval") or 0.0
        wait = limit(timeout)
        times: list[float] = []
        reply: dict = {}
        sent = 0
        with open_client(uri) as client:

            def one(seq: int) -> dict:
                """One ping, timed from its own start (a retry's, not the failed try's)."""
                nonlocal sent
                sent += 1
                started = time.perf_counter()
                answer = client.rpc("broker.ping", {"seq": seq}, nodeid=rank, timeout=wait)
                times.append(time.perf_counter() - started)
                return answer

            for seq in range(count):
                if seq and pause:
                    time.sleep(pause)  # the user asked for this pace
                ask = partial(one, seq)
                spent = sent > seq  # the one retry went to an earlier ping
                try:
                    reply = ask() if spent else once_healed(client, ask, wait)
                except RequestError as error:
                    if error.errnum in (errno.ENOENT, errno.EHOSTUNREACH):
                        raise RankError(str(error)) from None
                    raise
                if not as_json:
                    typer.echo(
                        f"rank {rank} ({reply['hostname']}): seq={seq} "
                        f"time={times[-1] * 1000:.3f} ms hops={reply['hops']}"
                    )
        result = {
            "rank": rank,
            "host": reply["hostname"],
            "hops": reply["hops"],
            "rtt_ms": [round(t * 1000, 3) for t in times],
            "min_ms": round(min(times) * 1000, 3),
            "avg_ms": round(sum(times) / len(times) * 1000, 3),
            "max_ms": round(max(times) * 1000, 3),
        }
        if as_json:
            print_json(result)
        elif count > 1:
            typer.echo(
                f"{count} pings: min/avg/max = {result['min_ms']:.3f}/"
                f"{result['avg_ms']:.3f}/{result['max_ms']:.3f} ms"
            )
