"""`tbon uri`: print the URI of an instance, from a URI, a run directory or a process id; with
`--all`, the URIs of its root and its standbys, a list for TBON_URI that outlives the root."""

from __future__ import annotations

import os
from typing import Any

import typer

from tbon.cli.common import print_json
from tbon.errors import TbonError, UsageError

ALL_WAIT = 5.0
"""Seconds `--all` waits for each standby to say where its socket is; one that does not say
is left out of the list (and named on stderr): a broker too busy to answer would serve badly."""


def register(app: typer.Typer) -> None:
    @app.command("uri")
    def uri(
        target: str = typer.Argument(
            None,
            metavar="[TARGET]",
            help="A URI (or a comma-separated list of them), a broker's run directory, or "
            "pid:PID (a broker, a process running in an instance, or `tbon start`). Default: "
            "$TBON_URI.",
        ),
        local: bool = typer.Option(False, "--local", help="Print the local:// form."),
        remote: bool = typer.Option(
            False, "--remote", help="Print the ssh:// form, usable from another host."
        ),
        every: bool = typer.Option(
            False,
            "--all",
            help="Ask the instance, and print the URIs of its root and then of each standby "
            "(tbon.standbys), separated by commas: a TBON_URI whose commands survive the loss "
            "of the root. A broker on another host is named by its ssh:// form.",
        ),
        as_json: bool = typer.Option(False, "--json", help="With --all: print a JSON list."),
    ) -> None:
        """Print the URI of an instance, for TBON_URI or for commands' URI argument.

        A list of URIs is printed as a list, each in the form asked for. With --all, the
        instance is asked (through the first URI of TARGET that answers) which rank is the root
        and which ranks stand by, and each of those brokers where its socket is.
        """
        from tbon.overlay.connectors.uri import (
            Uri,
            parse_uri_list,
            resolve_target,
            to_local,
            to_remote,
        )

        if local and remote:
            raise UsageError("--local and --remote exclude each other")
        if every and local:
            raise UsageError(
                "--all and --local do not go together: brokers on other hosts are named by ssh://"
            )
        if as_json and not every:
            raise UsageError("--json goes with --all")
        if target is None:
            text = os.environ.get("TBON_URI")
            if not text:
                raise TbonError("no TARGET given and TBON_URI is not set", exit_code=2)
            found = parse_uri_list(text)
        elif "://" in target:
            found = parse_uri_list(target)
        else:
            found = [resolve_target(target)]
        if every:
            listed = [str(u) for u in instance_uris(found, remote)]
            if as_json:
                print_json(listed)
            else:
                typer.echo(",".join(listed))
            return
        shown: list[Uri] = [to_remote(u) if remote else to_local(u) if local else u for u in found]
        typer.echo(",".join(str(u) for u in shown))


def instance_uris(given: list[Any], remote: bool) -> list[Any]:
    """The URIs of the root and of each standby, in that order (the root's status service says
    which ranks they are; broker.info, where each one's socket is), reached from here."""
    import sys

    from tbon.cli.common import COMMAND, TerminalLine, interactive
    from tbon.overlay.connectors.client import Client, first_answering
    from tbon.overlay.connectors.uri import reach

    progress = TerminalLine() if interactive() else None
    client = first_answering(given, progress) if len(given) > 1 else Client(given[0], progress)
    with client:
        summary = client.rpc("status.summary", {"rank": 0}, nodeid=0)
        root = int(summary.get("root", 0))
        standbys = [int(rank) for rank in summary.get("standbys", [])]
        found: list[Any] = []
        for rank in [root, *standbys]:
            try:
                info = client.rpc("broker.info", nodeid=rank, timeout=ALL_WAIT, quiet=True)
            except TbonError as error:
                if rank == root:
                    raise
                sys.stderr.write(f"{COMMAND} uri: standby rank {rank} left out: {error}\n")
                continue
            uri = reach(info["uri"], info["hostname"], client.uri, remote)
            if "," in str(uri):
                raise TbonError(f"{uri}: a URI with a comma in it cannot be put in a list")
            if uri not in found:
                found.append(uri)
    return found
