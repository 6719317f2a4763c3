"""The Typer application: one module per command, each imported only when its command runs
(or when `tbon --help` or completion lists them all): see TbonGroup in cli/commands.py.

Every command is a TbonCommand (cli/commands.py): help in tbon's layout, numbers refused in
tbon's words. `run` turns every failure into one line on stderr, `tbon COMMAND: what is wrong`,
and an exit code: 2 for usage errors, the error's own code for a `TbonError`, 1 for anything
unexpected (with the traceback only under TBON_DEBUG=1). `tbon` alone prints the help and
exits 2.
"""

# No `from __future__ import annotations`: Typer evaluates the annotations of the root's
# callback at every start, and strings it compiles and evaluates again and again (cli/status.py).

import signal
import sys

import typer
from typer._click import exceptions as click_exceptions

from tbon.cli import running
from tbon.cli.commands import TbonApp, TbonGroup

COMMAND_MODULES = (
    "start",
    "alloc",
    "broker",
    "status",
    "expand",
    "retire",
    "exec",
    "dmesg",
    "keygen",
    "uri",
    "ping",
    "attr",
    "shutdown",
    "completion",
)


class _Tbon(TbonGroup):
    command_modules = {name: f"tbon.cli.{name}" for name in COMMAND_MODULES}


app = TbonApp(
    group=_Tbon,
    name="tbon",
    help="An elastic, authenticated tree of message brokers across an allocation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"tbon {version('tbon')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """An elastic, authenticated tree of message brokers across an allocation."""


LEADING_URI = ("exec",)
"""Commands whose [URI] comes before options and a COMMAND: `tbon exec URI -r 3 hostname`."""


def _lift_uri(args: list[str]) -> list[str]:
    """Turn a leading URI into --uri, so that the options after it are still parsed as options
    (the command line of COMMAND itself must not be). Any `SCHEME://` counts: an unknown scheme
    is then refused as a bad URI, like everywhere else, instead of run as COMMAND."""
    if len(args) < 2 or args[0] not in LEADING_URI:
        return args
    from tbon.overlay.connectors.uri import looks_like_uri

    if looks_like_uri(args[1]):
        return [args[0], "--uri", args[1], *args[2:]]
    return args


def run(args: list[str]) -> int:
    """Run one command line; return its exit code instead of raising."""
    args = _lift_uri(args)
    running.prepare(args)
    return running.said(args, lambda: _main(args))


def _main(args: list[str]) -> int:
    """The command line through Typer: its own ends (Exit, Abort, usage errors) as exit codes;
    everything else is raised, for running.said to word."""
    command = typer.main.get_command(app)
    prog = "tbon"
    try:
        result = command.main(args=args, prog_name=prog, standalone_mode=False)
    except typer.Exit as exit_:
        return exit_.exit_code
    except click_exceptions.NoArgsIsHelpError as error:  # `tbon` alone: the help, no error
        print(error.format_message())
        return 2
    except typer.Abort:
        print(f"{running.command_name(args)}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except click_exceptions.UsageError as error:
        where = error.ctx.command_path if error.ctx else prog
        message = error.format_message().rstrip(".")
        print(
            f"{where}: {message[:1].lower()}{message[1:]} (try '{where} --help')", file=sys.stderr
        )
        return 2
    except click_exceptions.ClickException as error:
        print(f"{running.command_name(args)}: {error.format_message()}", file=sys.stderr)
        return error.exit_code
    return result if isinstance(result, int) else 0
