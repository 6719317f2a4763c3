"""How any command line runs, through Typer (cli/app.py) or before it (`tbon exec`, cli/main.py):
the command's name for progress lines, SIGTERM and SIGHUP ending it with 128+N, and every
failure said on one line of stderr, `tbon COMMAND: what is wrong`, with its exit code (the
error's own for a `TbonError`, 130 for Ctrl-C, 1 for anything unexpected, with the traceback only
under TBON_DEBUG=1)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from tbon.cli.common import end_by_signal
from tbon.errors import Signalled, TbonError, debugging

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a command at once with 128+N (SIGINT does too, as KeyboardInterrupt).
What a command started in the instance is its brokers' to end: they kill a client's jobs and
streams once its connection closes."""


def _end(signum: int, _frame: object) -> None:
    end_by_signal(signum)


def command_name(args: list[str]) -> str:
    words = [a for a in args if not a.startswith("-")]
    return f"tbon {words[0]}" if words else "tbon"


def prepare(args: list[str]) -> None:
    """Before the command runs: its name for progress lines, and the signals that end it."""
    from tbon.cli import common

    common.COMMAND = command_name(args)
    for signum in ENDING_SIGNALS:
        signal.signal(signum, _end)


def said(args: list[str], call: Callable[[], int]) -> int:
    """Run `call` and return its exit code, any failure said on one line instead of raised."""
    try:
        return call()
    except TbonError as error:
        print(f"{command_name(args)}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{command_name(args)}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Signalled as ended:
        if ended.signum != signal.SIGINT:  # Ctrl-C needs no word: its person typed it
            name = signal.Signals(ended.signum).name
            print(f"{command_name(args)}: ended by {name}", file=sys.stderr)
        return 128 + ended.signum
    except Exception as error:  # never leak a traceback to a user
        if debugging():
            raise
        print(f"{command_name(args)}: internal error: {error!r}", file=sys.stderr)
        return 1
