"""A single-node Slurm for tests: munged, slurmctld and slurmd of Debian's slurm-wlm, run in the
foreground as children of the test process, configured in a private directory, on free ports.

It needs root (slurmd starts job steps as their user). Everything it starts is stopped, by PID,
when the `with` block ends, pass or fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")


def missing() -> list[str]:
    """What this machine lacks to run the cluster (empty if nothing)."""
    lacking = [name for name in DAEMONS if shutil.which(name) is None]
    if os.geteuid() != 0:
        lacking.append("root")
    return lacking


def _config(root: Path, node: str) -> str:
    return "\n".join(
        [
            "ClusterName=tbontest",
            f"SlurmctldHost={node}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={root}/munge.socket",
            "CredType=cred/munge",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            f"SlurmdLogFile={root}/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
            f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE",
            "",
        ]
    )


@contextmanager
def cluster(deadline: float = 30.0) -> Iterator[dict[str, str]]:
    """Start the cluster; yields the environment (SLURM_CONF) in which srun uses it."""
    root = Path(tempfile.mkdtemp(prefix="tbon-slurm-"))  # short: the munge socket path
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "slurm.conf").write_text(_config(root, node))
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    logs = open(root / "daemons.log", "wb")  # noqa: SIM115 - closed below
    started: list[subprocess.Popen[bytes]] = []

    def daemon(*argv: str) -> None:
        started.append(
            subprocess.Popen(argv, env=env, stdout=logs, stderr=logs, stdin=subprocess.DEVNULL)
        )

    try:
        daemon(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={root}/munge.socket",
            f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log",
            f"--seed-file={root}/munged.seed",
        )
        _wait(lambda: (root / "munge.socket").exists(), deadline, "munged", root)
        daemon("slurmctld", "-D", "-i")
        daemon("slurmd", "-D", "-N", node)
        _wait(lambda: _idle(env), deadline, "the Slurm node to be idle", root)
        yield env
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(started):
            try:
                process.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        logs.close()
        shutil.rmtree(root, ignore_errors=True)


def _idle(env: dict[str, str]) -> bool:
    shown = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10
    )
    return shown.returncode == 0 and shown.stdout.strip() == "idle"


def _wait(condition, deadline: float, what: str, root: Path) -> None:  # type: ignore[no-untyped-def]
    until = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > until:
            log = (root / "daemons.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"timed out after {deadline}s waiting for {what}: {log}")
        time.sleep(0.1)
