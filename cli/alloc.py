"""`tbon alloc`: an instance of one broker per node, started by the launcher the user has.

With ssh (or `local`), each broker runs under `tbon relay --pmi` in a session of its own and
this command serves their PMI (overlay/launch/ssh.py); with mpiexec or srun, the launcher does.
Either way it waits until the instance is online, runs COMMAND here with TBON_URI set (an
ssh:// URI when rank 0 is on another host), shuts the instance down and exits with COMMAND's
status; `--bg` leaves a keeper process in charge and prints the URI instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

import typer

from tbon.cli.common import duration, interactive
from tbon.errors import TbonError, UsageError
from tbon.limits import MAX_SIZE, check_size

if TYPE_CHECKING:
    from tbon.overlay.launch.allocation import Allocation

LAUNCHERS = ("ssh", "mpiexec", "srun", "local")


def register(app: typer.Typer) -> None:
    @app.command(
        "alloc", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
    )
    def alloc(
        command: list[str] = typer.Argument(
            None, metavar="[COMMAND]...", help="Run this here once the instance is online."
        ),
        nodes: int = typer.Option(
            ..., "--nodes", "-N", min=1, help=f"Brokers to start, one per node (1 to {MAX_SIZE})."
        ),
        size: int = typer.Option(
            None,
            "--size",
            min=1,
            help=f"Ranks in the instance (more than NODES: spares; at most {MAX_SIZE}).",
        ),
        launcher: str = typer.Option(
            None,
            "--launcher",
            metavar="ssh|mpiexec|srun|local",
            help="How to start the brokers (default: srun in a Slurm job, ssh with --hosts, "
            "else local).",
        ),
        hosts: str = typer.Option(
            None, "--hosts", metavar="HOSTLIST", help="Hosts for ssh, e.g. node[1-4,7]."
        ),
        setattr_: list[str] = typer.Option(
            [], "--setattr", "-S", metavar="NAME=VALUE", help="Broker attribute (repeatable)."
        ),
        bg: bool = typer.Option(
            False, "--bg", help="Print the URI once the instance is up, and return."
        ),
        timeout: str = typer.Option(
            "60s", "--timeout", "-t", metavar="DURATION", help="Give up if not online by then."
        ),
        write_config: str = typer.Option(
            None,
            "--write-config",
            metavar="FILE",
            help="With ssh: write a config file (tbon-config(5)) for these hosts, and its "
            "certificate as FILE.cert, instead of starting anything.",
        ),
    ) -> None:
        """Start an instance of one broker per node, run COMMAND with TBON_URI set, then shut
        the instance down.

        Exit status: COMMAND's; 1 if a host cannot be reached or a broker fails to start
        (naming the host), 2 for a usage error.
        """
        from tbon.overlay.config.attributes import broker_config, parse_assignments

        check_size(nodes, "-N")
        if size is not None:
            check_size(size, "--size")
        chosen = _launcher(launcher, hosts)
        limit = duration(timeout, "--timeout") or 60.0
        if size is not None and size < nodes:
            raise UsageError(f"--size {size} is smaller than -N {nodes}")
        attributes = list(setattr_)
        if size is not None and size > nodes:
            attributes.append(f"size={size}")
        broker_config(parse_assignments(attributes))  # a usage error starts nothing
        names = _hosts(chosen, hosts, nodes)
        if write_config is not None:
            if chosen != "ssh" or command or bg:
                raise UsageError("--write-config goes with --launcher ssh alone (no COMMAND, --bg)")
            _write_config(write_config, names)
            return
        if bg:
            if command:
                raise UsageError("--bg and COMMAND do not go together")
            raise typer.Exit(_background(chosen, names, attributes, limit))
        raise typer.Exit(_foreground(chosen, names, attributes, limit, command or []))


def _launcher(launcher: str | None, hosts: str | None) -> str:
    if launcher is None:
        if hosts is not None:
            return "ssh"
        return "srun" if os.environ.get("SLURM_JOB_ID") else "local"
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if launcher == "ssh" and hosts is None:
        raise UsageError("--launcher ssh needs --hosts HOSTLIST")
    if launcher != "ssh" and hosts is not None:
        raise UsageError(f"--hosts goes with --launcher ssh, not {launcher}")
    return launcher


def _hosts(launcher: str, hosts: str | None, nodes: int) -> list[str]:
    if launcher != "ssh":
        return ["localhost"] * nodes  # the launcher places them
    from tbon.overlay.parse.hostlist import expand_hostlist

    assert hosts is not None
    names = expand_hostlist(hosts)
    if len(names) < nodes:
        raise UsageError(f"-N {nodes} but --hosts {hosts} names {len(names)} host(s)")
    return names[:nodes]


def _wait_up(allocation: Allocation, limit: float) -> None:
    """Wait for the instance, with a spinner telling how it goes on a terminal."""
    if not interactive():
        allocation.wait_up(limit)
        return
    from rich.console import Console

    with Console(stderr=True).status(allocation.progress()) as shown:
        allocation.wait_up(limit, shown.update)


def _foreground(
    launcher: str, hosts: list[str], attributes: list[str], limit: float, command: list[str]
) -> int:
    import subprocess

    from tbon.overlay.launch.allocation import allocate

    allocation = allocate(launcher, hosts, attributes)
    try:
        _wait_up(allocation, limit)
    except (TbonError, KeyboardInterrupt):
        allocation.end(grace=2.0)
        raise
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM,)}
    try:
        if command:
            env = {**os.environ, "TBON_URI": allocation.uri}
            try:
                return _status(subprocess.run(command, env=env).returncode)
            except FileNotFoundError:
                print(f"tbon alloc: {command[0]}: command not found", file=sys.stderr)
                return 127
            except KeyboardInterrupt:
                return 130
        print(allocation.uri, flush=True)  # no COMMAND: serve until shut down or signalled
        try:
            while allocation.running and not stop.is_set():
                stop.wait(0.2)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        allocation.shut_down()


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def _background(launcher: str, hosts: list[str], attributes: list[str], limit: float) -> int:
    """Leave the allocation to a detached keeper (cli/detach.py) that runs it until the
    instance is shut down; print the URI once every broker is online (or say why not), and
    return."""
    from tbon.cli.detach import Announce, detach

    def keep(announce: Announce) -> int:
        from tbon.overlay.launch.allocation import allocate

        allocation = allocate(launcher, hosts, attributes)
        allocation.quiet()
        try:
            allocation.wait_up(limit)
        except TbonError:
            allocation.end(grace=2.0)
            raise
        announce(allocation.uri)
        while allocation.running:
            time.sleep(0.2)
        allocation.end(grace=1.0)
        return 0

    return detach("alloc", keep, f"starting {len(hosts)} brokers")


def _write_config(path: str, hosts: list[str]) -> None:
    """A [bootstrap] table for `hosts` (rank = position), and a new shared certificate."""
    import tomli_w

    from tbon.keys.cert import new_certificate, write_certificate
    from tbon.overlay.boot.config_file import bootstrap_table

    cert_path = os.path.abspath(f"{path}.cert")
    for existing in (path, cert_path):
        if os.path.exists(existing):
            raise TbonError(f"{existing} already exists: remove it first, or choose another FILE")
    write_certificate(cert_path, new_certificate("tbon instance"))
    with open(path, "wb") as file:
        tomli_w.dump(bootstrap_table(hosts, cert_path), file)
    print(f"tbon alloc: wrote {path} ({len(hosts)} hosts) and its certificate {cert_path}")
