"""The brokers of one `tbon alloc`, however they were started, watched the same way.

ssh and local: one `tbon relay --pmi` session per broker, PMI served here (ssh_launch.py).
mpiexec and srun: the launcher serves PMI, and every broker gets a run directory of its own
(broker.rundir with %r), so that rank 0's socket, and so the instance's URI, is known in advance.
Either way: wait until every broker is online, shut the instance down, and make sure that
nothing is left running.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from tbon import tmpdir
from tbon.errors import TbonError
from tbon.overlay.connectors.client import Client
from tbon.overlay.connectors.ssh import endpoint_on, remote_tbon
from tbon.overlay.launch.ssh import HostLaunch
from tbon.overlay.parse.hostlist import expand_hostlist


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

    def wait_up(self, limit: float, show: Callable[[str], None] = lambda _text: None) -> None:
        """Until every broker is online, telling `show` how it goes; a clear error otherwise."""
        deadline = time.monotonic() + limit
        while not self.wired():
            self._check(deadline, limit)
            show(self.progress())
            time.sleep(0.05)
        while True:  # rank 0's socket is there, or about to be
            self._check(deadline, limit)
            try:
                with Client(self.uri) as client:
                    summary = {"view": "summary"}  # the counts, not the table
                    for status in client.watch_status(deadline, summary):
                        online = status["counts"].get("online", 0)
                        show(f"{online} of {self.nodes} brokers online")
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
        token = secrets.token_hex(4)
        parent = rundir_parent(launcher)
        self.rundirs = [f"{parent}/tbon-alloc-{token}-{rank}" for rank in range(len(hosts))]
        self.nodes = len(hosts)
        remote = launcher == "ssh"

        def broker_args(rank: int) -> list[str]:
            args = ["-S", f"broker.rundir={self.rundirs[rank]}"]
            for attribute in [
                *(endpoint_on(hosts[rank], attributes) if remote else []),
                *attributes,
            ]:
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
        if launcher == "mpiexec":
            head = [shutil.which("mpiexec.hydra") or "mpiexec", "-n", str(nodes)]
        else:
            head = ["srun", "--mpi=pmi2", "-N", str(nodes), "--ntasks-per-node=1"]
        if shutil.which(head[0]) is None:
            raise TbonError(f"--launcher {launcher}: {head[0]} is not on PATH")
        rundir = f"{rundir_parent(launcher)}/tbon-alloc-{secrets.token_hex(4)}-%r"
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


def rundir_parent(launcher: str) -> str:
    """Where the brokers' run directories go. Here (`local`), wherever `tbon start` puts its
    own (tbon/tmpdir.py: $TMPDIR, else in memory); under mpiexec and srun, $TMPDIR as this
    command sees it (the launcher passes the environment on), else /tmp; over ssh, /tmp on
    every host, whose own temporary directories are not known here."""
    if launcher == "local":
        return tmpdir.parent().rstrip("/") or "/"
    if launcher == "ssh":
        return "/tmp"
    return (os.environ.get("TMPDIR") or "/tmp").rstrip("/") or "/"


def _first_node(launcher: str) -> str:
    """Where rank 0 runs, if not here: srun puts it on the job's first node."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if launcher != "srun" or not nodelist:
        return ""
    first = expand_hostlist(nodelist)[0]
    return "" if first == socket.gethostname().split(".")[0] else first


def allocate(launcher: str, hosts: list[str], attributes: list[str]) -> Allocation:
    if launcher in ("mpiexec", "srun"):
        return LauncherAllocation(launcher, len(hosts), attributes)
    return SessionAllocation(launcher, hosts, attributes)
