"""`tbon broker` as Typer lists it; the console script runs it before Typer loads (cli/main.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "broker",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "help_option_names": [],
        },
        add_help_option=False,
    )
    def broker(ctx: typer.Context) -> None:
        """Run one broker of an instance (see `tbon broker --help` and tbon-broker(1))."""
        from tbon.overlay.broker.main import main

        raise typer.Exit(main(list(ctx.args)))
