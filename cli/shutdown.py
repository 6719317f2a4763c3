"""`tbon shutdown`: stop an instance cleanly, leaves first, and wait until it is gone."""

from __future__ import annotations

import os
import time
from contextlib import nullcontext

import typer

from tbon.cli.common import URI_HELP, duration, interactive, open_client
from tbon.errors import TbonError
from tbon.overlay.connectors.uri import Uri


def register(app: typer.Typer) -> None:
    @app.command("shutdown")
    def shutdown(
        uri: str = typer.Argument(None, metavar="[URI]", help=URI_HELP),
        timeout: str = typer.Option(
            "60s",
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Give up waiting after DURATION and exit 1; 0: no limit.",
        ),
        no_wait: bool = typer.Option(
            False,
            "--no-wait",
            help="Return once the root (rank 0, or the standby that took over) has agreed.",
        ),
    ) -> None:
        """Shut the instance down: every broker stops its children, then itself."""
        given = duration(timeout, "--timeout")
        limit = None if given == 0 else 60.0 if given is None else given  # 0: no limit
        with open_client(uri) as client:
            # Wait on the root's own socket, whichever broker URI names: rank 0's, or after a
            # takeover the member's that leads (docs/protocol.md §13.4); the summary names it.
            summary = client.rpc("status.summary", {"rank": 0}, nodeid=0, timeout=limit)
            leader = int(summary["entry"]["rank"])
            root = client.rpc("broker.info", nodeid=leader, timeout=limit)["uri"]
            path = root[len("local://") :]
            # Through ssh, rank 0's socket is not here to watch: ask until nobody answers.
            remote = client.uri if client.uri.scheme == "ssh" else None
            client.rpc("instance.shutdown", nodeid=0, timeout=limit)
        if no_wait:
            return
        from rich.console import Console

        deadline = None if limit is None else time.monotonic() + limit
        console = Console(stderr=True)
        with (
            console.status("waiting for the instance to shut down")
            if interactive()
            else nullcontext()
        ):
            # Rank 0 removes its socket as the very last thing it does.
            while _still_there(remote, path, leader):
                if deadline is not None and time.monotonic() > deadline:
                    raise TbonError(f"the instance did not shut down within {limit:g}s")
                time.sleep(0.02)


def _still_there(remote: Uri | None, path: str, leader: int) -> bool:
    """Whether the root is still up: its socket here, or an answer through the ssh:// URI."""
    if remote is None:
        return os.path.exists(path)
    from tbon.overlay.connectors.client import Client

    try:
        with Client(remote) as client:
            client.rpc("broker.info", nodeid=leader, timeout=5)
    except TbonError:
        return False
    return True
