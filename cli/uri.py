"""`tbon uri`: print the URI of an instance, from a URI, a run directory or a process id."""

from __future__ import annotations

import os

import typer

from tbon.errors import TbonError, UsageError


def register(app: typer.Typer) -> None:
    @app.command("uri")
    def uri(
        target: str = typer.Argument(
            None,
            metavar="[TARGET]",
            help="A URI, a broker's run directory, or pid:PID (a broker, a process running in "
            "an instance, or `tbon start`). Default: $TBON_URI.",
        ),
        local: bool = typer.Option(False, "--local", help="Print the local:// form."),
        remote: bool = typer.Option(
            False, "--remote", help="Print the ssh:// form, usable from another host."
        ),
    ) -> None:
        """Print the URI of an instance, for TBON_URI or for commands' URI argument."""
        from tbon.overlay.connectors.uri import parse_uri, resolve_target, to_local, to_remote

        if local and remote:
            raise UsageError("--local and --remote exclude each other")
        if target is None:
            text = os.environ.get("TBON_URI")
            if not text:
                raise TbonError("no TARGET given and TBON_URI is not set", exit_code=2)
            found = parse_uri(text)
        else:
            found = resolve_target(target)
        if remote:
            found = to_remote(found)
        elif local:
            found = to_local(found)
        typer.echo(str(found))
