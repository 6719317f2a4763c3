"""`tbon start`: a local instance of N brokers, for testing and for single-node jobs.

The work is done by the launcher (tbon.overlay.launch.local), a lean process that serves PMI
and forks the brokers; this command sets it up, waits, and owns the clean-up of everything it
started. With --bg, a detached keeper (cli/detach.py) does this command's part.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import typer

from tbon import tmpdir
from tbon.cli.common import duration, interactive, python_module
from tbon.errors import TbonError, UsageError
from tbon.limits import MAX_SIZE, check_size

if TYPE_CHECKING:
    from collections.abc import Callable

    from tbon.cli.detach import Announce

    Show = Callable[[int | None], None]


def register(app: typer.Typer) -> None:
    @app.command(
        "start",
        context_settings={"allow_interspersed_args": False},
    )
    def start(
        command: list[str] = typer.Argument(
            None,
            metavar="[COMMAND]...",
            help="Run on rank 0 once every broker is online, with TBON_URI set; the exit status "
            "is COMMAND's. Default: $SHELL on a terminal, else wait for a signal.",
        ),
        test_size: int = typer.Option(
            ...,
            "--test-size",
            "-s",
            min=1,
            metavar="N",
            help=f"How many local brokers to start: 1 to {MAX_SIZE}, and no more than this "
            "machine can hold (memory, tasks, file descriptors).",
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="Start N brokers even if this machine seems too small to hold them.",
        ),
        setattr_: list[str] = typer.Option(
            [],
            "--setattr",
            "-S",
            metavar="NAME=VALUE",
            help="Set a broker attribute, e.g. -S tbon.fanout=2 (repeatable).",
        ),
        broker_opts: list[str] = typer.Option(
            [],
            "--broker-opts",
            "-o",
            metavar="OPTS",
            help="Comma-separated options for every broker, e.g. -o -Stbon.topo=binomial.",
        ),
        exit_timeout: str = typer.Option(
            "10s",
            "--test-exit-timeout",
            metavar="DURATION",
            help="Once the instance is over, stop brokers still running after DURATION.",
        ),
        bg: bool = typer.Option(
            False,
            "--bg",
            help="Print the URI once every broker is online, and return; the instance runs on, "
            "detached, until `tbon shutdown URI`.",
        ),
    ) -> None:
        """Start a local instance of N brokers and run COMMAND in it."""
        from tbon.overlay.config.attributes import broker_config, parse_assignments
        from tbon.overlay.launch.capacity import check_room

        check_size(test_size, "--test-size")
        duration(exit_timeout, "--test-exit-timeout")
        attributes = list(setattr_) + _broker_attributes(broker_opts)
        if not any(a.startswith("tbon.endpoint=") for a in attributes):
            attributes.append("tbon.endpoint=tcp://127.0.0.1:*")
        broker_config(parse_assignments(attributes))  # a usage error starts nothing
        program = list(command or [])
        if bg and program:
            raise UsageError("--bg and COMMAND do not go together")
        waiting = not program
        if waiting and not bg and sys.stdin.isatty() and sys.stdout.isatty():
            program, waiting = [os.environ.get("SHELL", "/bin/sh")], False
        if not force:
            # Before anything is started; the launcher, which forks, checks again.
            check_room(test_size, "--test-size")
        if bg:
            from tbon.cli.detach import detach

            def keep(announce: Announce) -> int:
                return run(test_size, attributes, exit_timeout, [], True, force, announce)

            raise typer.Exit(detach("start", keep, f"starting {test_size} brokers"))
        raise typer.Exit(run(test_size, attributes, exit_timeout, program, waiting, force))


def _broker_attributes(options: list[str]) -> list[str]:
    """`-o -Sa=b,-Sc=d` in the style of `flux start -o`: only attribute settings are taken."""
    attributes = []
    for group in options:
        for option in filter(None, group.split(",")):
            for prefix in ("--setattr=", "-S"):
                if option.startswith(prefix) and "=" in option[len(prefix) :]:
                    attributes.append(option[len(prefix) :])
                    break
            else:
                raise UsageError(f"unsupported broker option {option!r}: use -SNAME=VALUE")
    return attributes


def run(
    size: int,
    attributes: list[str],
    exit_timeout: str,
    program: list[str],
    waiting: bool,
    force: bool = False,
    announce: Announce | None = None,
) -> int:
    """Run the instance until it ends; without a program (`waiting`), hand its URI to
    `announce` (default: print it) once every broker is online."""
    from tbon.overlay.links.local import local_uri
    from tbon.overlay.links.sweep import sweep

    rundir = tempfile.mkdtemp(prefix="tbon-start-", dir=tmpdir.parent())
    sweep(tmpdir.parent())  # what brokers killed before left there (links/sweep.py)
    argv = [
        *python_module("tbon.overlay.launch.local"),
        "--size",
        str(size),
        "--rundir",
        rundir,
        "--exit-timeout",
        exit_timeout,
        "--parent-pid",
        str(os.getpid()),
        *(["--force"] if force else []),
    ]
    for attribute in attributes:
        argv += ["-S", attribute]
    launcher = subprocess.Popen([*argv, "--", *program])
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop = _Stop(launcher)
    try:
        signal.signal(signal.SIGTERM, stop)
        if waiting:
            signal.signal(signal.SIGINT, stop)
            uri = local_uri(os.path.join(rundir, "0"))
            if _wait_with_spinner(launcher, uri, size):
                if announce is None:
                    print(uri, flush=True)
                else:
                    announce(uri)
            elif launcher.poll() is None:
                typer.echo("tbon start: lost contact with rank 0; stopping the instance", err=True)
                launcher.send_signal(signal.SIGTERM)
        else:
            # Ctrl-C on the terminal belongs to COMMAND; the instance ends when it does.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if interactive():
                _show_progress(launcher, local_uri(os.path.join(rundir, "0")), size)
        return _wait(launcher)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        shutil.rmtree(rundir, ignore_errors=True)


class _Stop:
    """On SIGTERM (or Ctrl-C while waiting), shut the instance down through the launcher."""

    def __init__(self, launcher: subprocess.Popen[bytes]) -> None:
        self.launcher = launcher

    def __call__(self, _signum: int, _frame: object) -> None:
        if self.launcher.poll() is None:
            self.launcher.send_signal(signal.SIGTERM)


def _wait(launcher: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return launcher.wait()
        except InterruptedError:
            continue


def _wait_up(
    launcher: subprocess.Popen[bytes], uri: str, size: int, show: Show = lambda _online: None
) -> bool:
    """Wait for every broker to be online, telling `show` how many are (None: no news, the
    clock only); False if the launcher gave up first, or rank 0 stopped answering."""
    from tbon.overlay.connectors.client import Client

    path = uri[len("local://") :]
    while not os.path.exists(path):
        if launcher.poll() is not None:
            return False
        show(None)
        time.sleep(0.01)  # the socket appears within the launcher's first second
    try:
        with Client(uri) as client:
            # rank 0's summary, pushed at each change: the counts, not the table
            tag = client.send("status.watch", {"view": "summary"}, nodeid=0)
            while launcher.poll() is None:
                reply = client.receive(0.5)
                if reply is None or reply.tag != tag:
                    show(None)
                    continue
                if reply.errnum:
                    return False
                counts = reply.payload["counts"]
                show(counts.get("online", 0))
                if not counts.get("offline", 0):
                    return True
    except TbonError:
        return False
    return False


def _wait_with_spinner(launcher: subprocess.Popen[bytes], uri: str, size: int) -> bool:
    """_wait_up, with a spinner on a terminal: nothing else is written meanwhile."""
    if not interactive():
        return _wait_up(launcher, uri, size)
    from rich.console import Console

    with Console(stderr=True).status(f"starting {size} brokers") as spinner:

        def show(online: int | None) -> None:
            if online is not None:
                spinner.update(f"starting {size} brokers: {online} online")

        return _wait_up(launcher, uri, size, show)


class Progress:
    """Plain lines on a COMMAND's terminal while the brokers come up, `tbon start: K of N
    brokers online`: none for a start that takes under DELAY, then one per PERIOD. Not a spinner,
    which would have to be erased just as COMMAND starts writing to the same terminal: a line,
    written whole, cannot be cut into."""

    DELAY = 1.0
    PERIOD = 1.0

    def __init__(self, size: int, now: float) -> None:
        self.size = size
        self.online = 0
        self.due = now + self.DELAY

    def line(self, online: int | None, now: float) -> str | None:
        """The line to write now, if any."""
        if online is not None:
            self.online = online
        if now < self.due or self.online >= self.size:
            return None
        self.due = now + self.PERIOD
        return f"tbon start: {self.online} of {self.size} brokers online"


def _show_progress(launcher: subprocess.Popen[bytes], uri: str, size: int) -> None:
    """While COMMAND waits for the brokers, tell its terminal how they come up."""
    progress = Progress(size, time.monotonic())

    def show(online: int | None) -> None:
        line = progress.line(online, time.monotonic())
        if line is not None:
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()

    _wait_up(launcher, uri, size, show)
