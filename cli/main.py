"""The `tbon` console script.

`tbon broker` and `tbon relay` are dispatched before Typer is imported, so that they start with
nothing but pyzmq and PyNaCl loaded, and so is `tbon exec` when Typer would read its command line
alike (cli/execargs.py); `tbon expand` starts its brokers' forker first (launch/forker.py), so
that its imports overlap the CLI's. Every other command goes through the Typer app in
`tbon.cli.app`. Broker and relay each show in `ps` by what they are (tbon/proctitle.py): `tbon
broker rank R/N ...`, `tbon relay ...`. `tbon relay --pmi` (the far end of `tbon alloc
--launcher ssh`) is launch/pmi_shim.py, not the relay: a connector does not import the launcher
(docs/design.md §13).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["broker"]:
        from tbon.overlay.broker.main import main as broker_main

        return broker_main(args[1:])
    if args[:1] == ["relay"]:  # started by ssh for an ssh:// URI: as lean as a broker
        from tbon.proctitle import set_title

        # Shown without the broker command that `tbon alloc` has it run, so that
        # `pgrep -f "tbon broker"` finds brokers alone.
        shown = args[: args.index("--")] if "--" in args else args
        set_title(" ".join(["tbon", *shown]), b"tbon-relay")
        if args[1:2] == ["--pmi"]:  # a broker of tbon alloc --launcher ssh, PMI over this session
            from tbon.overlay.launch.pmi_shim import main as shim_main

            return shim_main(args[2:])
        from tbon.overlay.connectors.relay import main as relay_main

        return relay_main(args[1:])
    if args[:1] == ["exec"]:  # the command run at scale: before Typer if Typer would take it so
        from tbon.cli.execargs import parse

        if (asked := parse(args[1:])) is not None:
            from tbon.cli import running
            from tbon.cli.exec import run_exec

            running.prepare(args)
            return running.said(args, lambda: _exec(asked, run_exec))
    if args[:1] == ["expand"]:  # its brokers' forker imports while the CLI does (expand.py)
        from tbon.overlay.launch.forker import cancel_early, start_early

        start_early()
        try:
            return _run(args)
        finally:
            cancel_early()
    return _run(args)


def _run(args: list[str]) -> int:
    """Through Typer. Its import makes thousands of objects that live as long as the process, and
    the cyclic collector passes over them some 20 times meanwhile, for no garbage (2-4 ms of a
    `tbon ping`): it is off for the import, and back on for the command."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        from tbon.cli.app import run
    finally:
        if collecting:
            gc.enable()
    return run(args)


def _exec(asked: Any, run_exec: Callable[[Any], int]) -> int:
    """`tbon exec` without Typer, ending as Typer's main would end it: Ctrl-C before the jobs
    take it, 130 without a word; a closed output, 1."""
    try:
        return run_exec(asked)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except EOFError:
        print(file=sys.stderr)
        raise KeyboardInterrupt from None  # said as Typer's Abort is: `tbon exec: interrupted`
    except BrokenPipeError:
        return 1


def _entry() -> None:
    """Run, flush, and leave without tearing the interpreter down: a command's output is all
    written by then, and the teardown of Typer, Rich and pydantic costs ~50 ms per command."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a closed pipe: nothing more can be said
            code = code or 1
    os._exit(code)


if __name__ == "__main__":
    _entry()
