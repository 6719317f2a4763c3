"""`tbon alloc`: an instance of one broker per node, started by the launcher the user has.

With ssh (or `local`), each broker runs under `tbon relay --pmi` in a session of its own and
this command serves their PMI (overlay/ssh_launch.py); with mpiexec or srun, the launcher does.
Either way it waits until the instance is online, runs COMMAND here with TBON_URI set (an
ssh:// URI when rank 0 is on another host), shuts the instance down and exits with COMMAND's
status; `--bg` leaves a keeper process in charge and prints the URI instead.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import threading
import time
from contextlib import nullcontext

import typer

from tbon.cli.common import duration, interactive
from tbon.overlay.errors import TbonError, UsageError

LAUNCHERS = ("ssh", "mpiexec", "srun", "local")
FAILED = 1  # a host unreachable, a broker that failed to start, or the instance not up in time


def register(app: typer.Typer) -> None:
    @app.command(
        "alloc", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True}
    )
    def alloc(
        command: list[str] = typer.Argument(
            None, metavar="[COMMAND]...", help="Run this here once the instance is online."
        ),
        nodes: int = typer.Option(
            ..., "--nodes", "-N", min=1, help="Brokers to start, one per node."
        ),
        size: int = typer.Option(
            None, "--size", min=1, help="Ranks in the instance (more than NODES: spares)."
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
        chosen = _launcher(launcher, hosts)
        limit = duration(timeout, "--timeout") or 60.0
        if size is not None and size < nodes:
            raise UsageError(f"--size {size} is smaller than -N {nodes}")
        attributes = list(setattr_)
        if size is not None and size > nodes:
            attributes.append(f"size={size}")
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
    from tbon.overlay.hostlist import expand_hostlist

    assert hosts is not None
    names = expand_hostlist(hosts)
    if len(names) < nodes:
        raise UsageError(f"-N {nodes} but --hosts {hosts} names {len(names)} host(s)")
    return names[:nodes]


# --- the allocations: brokers started one way or another, watched the same way -----------------


class Allocation:
    """The brokers of one `tbon alloc`: how they were started is the subclass's business;
    waiting for them, shutting them down and making sure nothing is left are shared."""

    uri: str
    nodes: int

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def failures(self) -> list[str]:
        """Why the instance cannot come up (a host, a launcher), if it cannot."""
        raise NotImplementedError

    def progress(self) -> str:
        return f"starting {self.nodes} brokers"

    def wired(self) -> bool:
        """Whether rank 0's socket may be asked yet."""
        return True

    def quiet(self) -> None:
        """Drop the brokers' output (a keeper has no terminal)."""

    def hang_up(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def wait_up(self, limit: float) -> None:
        """Until every broker is online (shown on a terminal); a clear error otherwise."""
        from rich.console import Console

        from tbon.overlay.client import Client

        deadline = time.monotonic() + limit
        console = Console(stderr=True)
        spinner = console.status(self.progress()) if interactive() else nullcontext()
        with spinner as shown:
            while not self.wired():
                self._check(deadline, limit)
                if shown is not None:
                    shown.update(self.progress())
                time.sleep(0.05)
            while True:  # rank 0's socket is there, or about to be
                self._check(deadline, limit)
                try:
                    with Client(self.uri) as client:
                        for status in client.watch_status(deadline):
                            ranks = status["ranks"][: self.nodes]
                            online = sum(r["state"] == "online" for r in ranks)
                            if shown is not None:
                                shown.update(f"{online} of {self.nodes} brokers online")
                            if online == self.nodes:
                                return
                            self._check(deadline, limit)
                except TbonError:
                    time.sleep(0.1)

    def _check(self, deadline: float, limit: float) -> None:
        failed = self.failures()
        if failed:
            raise TbonError("; ".join(failed))
        if time.monotonic() > deadline:
            raise TbonError(f"the instance was not online within {limit:g}s")

    def shut_down(self, grace: float = 30.0) -> None:
        """Ask rank 0 to shut the instance down, then make sure everything has ended."""
        from tbon.overlay.client import Client

        try:
            with Client(self.uri) as client:
                client.rpc("instance.shutdown", nodeid=0, timeout=10)
        except TbonError:
            pass
        self.end(grace)

    def end(self, grace: float = 15.0) -> None:
        for step in (lambda: None, self.hang_up):
            step()
            deadline = time.monotonic() + grace
            while self.running and time.monotonic() < deadline:
                time.sleep(0.05)
        self.kill()


class SessionAllocation(Allocation):
    """ssh and local: one `tbon relay --pmi` session per broker, PMI served here, the sessions
    pumped by a thread of their own."""

    def __init__(self, launcher: str, hosts: list[str], attributes: list[str]) -> None:
        from tbon.overlay.ssh_launch import HostLaunch

        token = secrets.token_hex(4)
        self.rundirs = [f"/tmp/tbon-alloc-{token}-{rank}" for rank in range(len(hosts))]
        self.nodes = len(hosts)
        remote = launcher == "ssh"

        def broker_args(rank: int) -> list[str]:
            args = ["-S", f"broker.rundir={self.rundirs[rank]}"]
            if remote and _is_address(hosts[rank]) and not _endpoint_set(attributes):
                args += ["-S", f"tbon.endpoint=tcp://{hosts[rank]}:*"]  # where peers reach it
            for attribute in attributes:
                args += ["-S", attribute]
            return args

        socket_path = f"{self.rundirs[0]}/local"
        self.uri = f"ssh://{hosts[0]}{socket_path}" if remote else f"local://{socket_path}"
        self.launch = HostLaunch(hosts, broker_args, ssh=remote)
        self._pump = threading.Thread(target=self._run, daemon=True)
        self._pump.start()

    def _run(self) -> None:
        while self.launch.running:
            self.launch.step(0.2)

    @property
    def running(self) -> bool:
        return self.launch.running

    def wired(self) -> bool:
        return self.launch.wired == self.nodes

    def progress(self) -> str:
        return f"starting {self.nodes} brokers: {self.launch.wired} wired up"

    def quiet(self) -> None:
        self.launch.output = lambda _rank, _data: None

    def failures(self) -> list[str]:
        """Hosts that failed: unreachable, or whose broker ended before the instance was up."""
        found = []
        for session in self.launch.sessions:
            why = session.failure
            if not why and session.status is not None:
                last = f": {session.said[-1]}" if session.said else ""
                why = f"its broker exited with status {session.status}{last}"
            if why:
                found.append(f"host {session.host} (rank {session.rank}): {why}")
        return found

    def hang_up(self) -> None:
        self.launch.hang_up()  # each relay terminates its broker

    def kill(self) -> None:
        self._pump.join(timeout=1)
        self.launch.kill()


class LauncherAllocation(Allocation):
    """mpiexec and srun: the launcher serves PMI; every broker gets a run directory of its own
    (broker.rundir with %r), so that rank 0's socket is known in advance."""

    def __init__(self, launcher: str, nodes: int, attributes: list[str]) -> None:
        import subprocess

        from tbon.overlay.ssh import remote_tbon

        if launcher == "mpiexec":
            head = [shutil.which("mpiexec.hydra") or "mpiexec", "-n", str(nodes)]
        else:
            head = ["srun", "--mpi=pmi2", "-N", str(nodes), "--ntasks-per-node=1"]
        if shutil.which(head[0]) is None:
            raise TbonError(f"--launcher {launcher}: {head[0]} is not on PATH")
        rundir = f"/tmp/tbon-alloc-{secrets.token_hex(4)}-%r"
        argv = [*head, remote_tbon(), "broker", "-S", f"broker.rundir={rundir}"]
        for attribute in attributes:
            argv += ["-S", attribute]
        self.launcher, self.nodes = launcher, nodes
        socket_path = f"{rundir.replace('%r', '0')}/local"
        first = _first_node(launcher)
        self.uri = f"ssh://{first}{socket_path}" if first else f"local://{socket_path}"
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def failures(self) -> list[str]:
        code = self.process.poll()
        if code is None:
            return []
        return [f"{self.launcher} exited with status {code} before the instance was up"]

    def hang_up(self) -> None:
        if self.running:
            self.process.terminate()  # the launcher passes SIGTERM on to the brokers

    def kill(self) -> None:
        if self.running:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _first_node(launcher: str) -> str:
    """Where rank 0 runs, if not here: srun puts it on the job's first node."""
    import socket

    from tbon.overlay.hostlist import expand_hostlist

    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if launcher != "srun" or not nodelist:
        return ""
    first = expand_hostlist(nodelist)[0]
    return "" if first == socket.gethostname().split(".")[0] else first


def _allocate(launcher: str, hosts: list[str], attributes: list[str]) -> Allocation:
    if launcher in ("mpiexec", "srun"):
        return LauncherAllocation(launcher, len(hosts), attributes)
    return SessionAllocation(launcher, hosts, attributes)


def _foreground(
    launcher: str, hosts: list[str], attributes: list[str], limit: float, command: list[str]
) -> int:
    import subprocess

    allocation = _allocate(launcher, hosts, attributes)
    try:
        allocation.wait_up(limit)
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
    """Fork a keeper that runs the allocation until the instance is shut down; print the URI
    once it is up (or the keeper's error) and return."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the keeper: detached from the terminal, reporting once through the pipe
        os.close(reader)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        code = _keep(launcher, hosts, attributes, limit, writer)
        os._exit(code)
    os.close(writer)
    with os.fdopen(reader) as report:
        line = report.readline().rstrip("\n")
    if line.startswith("uri "):
        print(line[4:])
        return 0
    os.waitpid(pid, 0)
    raise TbonError(line[6:] if line.startswith("error ") else "the instance did not start")


def _keep(launcher: str, hosts: list[str], attributes: list[str], limit: float, fd: int) -> int:
    def report(text: str) -> None:
        os.write(fd, (text.replace("\n", " ") + "\n").encode())
        os.close(fd)

    try:
        allocation = _allocate(launcher, hosts, attributes)
        allocation.quiet()
        try:
            allocation.wait_up(limit)
        except TbonError as error:
            allocation.end(grace=2.0)
            report(f"error {error}")
            return FAILED
        report(f"uri {allocation.uri}")
        while allocation.running:
            time.sleep(0.2)
        allocation.end(grace=1.0)
        return 0
    except Exception as error:  # the keeper has no terminal: its one report is all
        report(f"error {error}")
        return FAILED


def _write_config(path: str, hosts: list[str]) -> None:
    """A [bootstrap] table for `hosts` (rank = position), and a new shared certificate."""
    import tomli_w

    from tbon.keys.cert import new_certificate, write_certificate

    cert_path = os.path.abspath(f"{path}.cert")
    for existing in (path, cert_path):
        if os.path.exists(existing):
            raise TbonError(f"{existing} already exists: remove it first, or choose another FILE")
    write_certificate(cert_path, new_certificate("tbon instance"))
    table = {
        "bootstrap": {
            "curve_cert": cert_path,
            "default_port": 8050,
            "default_bind": "tcp://*:%p",
            "default_connect": "tcp://%h:%p",
            "hosts": [{"host": host} for host in hosts],
        }
    }
    with open(path, "wb") as file:
        tomli_w.dump(table, file)
    print(f"tbon alloc: wrote {path} ({len(hosts)} hosts) and its certificate {cert_path}")


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _endpoint_set(attributes: list[str]) -> bool:
    return any(a.startswith("tbon.endpoint=") for a in attributes)
