"""Test hosts on one machine: network namespaces on a private bridge, each with its own host name
(a UTS namespace) and its own sshd, reached with a key made for the test.

It needs root, iproute2, util-linux's unshare and openssh-server. Everything it makes is torn
down when the `with` block ends, pass or fail: every process left in a namespace (they are all
ours) is killed by PID, then the namespaces, links and bridge are deleted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def missing() -> list[str]:
    lacking = [name for name in ("ip", "unshare", "ssh", "ssh-keygen") if not shutil.which(name)]
    if not os.path.exists(SSHD):
        lacking.append(SSHD)
    if os.geteuid() != 0:
        lacking.append("root")
    return lacking


@dataclass(frozen=True)
class Host:
    name: str  # its host name, inside its UTS namespace
    address: str
    netns: str


@dataclass(frozen=True)
class Hosts:
    hosts: list[Host]
    env: dict[str, str]  # TBON_SSH, for the ssh launcher and ssh:// URIs

    def run_in(self, host: Host, argv: list[str], **options: object) -> subprocess.Popen[str]:
        """A process inside `host`'s network namespace (not through ssh)."""
        return subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], **options)  # type: ignore[call-overload]


def pids_in(netns: str) -> list[int]:
    """The processes living in a test host's network namespace."""
    listed = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30
    )
    return [int(pid) for pid in listed.stdout.split()]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def namespace_hosts(count: int, deadline: float = 20.0) -> Iterator[Hosts]:
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.213.{os.getpid() % 250}"
    bridge = f"tbbr{tag}"
    root = Path(tempfile.mkdtemp(prefix="tbon-hosts-"))
    hosts = [Host(f"host{i + 1}", f"{subnet}.{i + 11}", f"tbon{tag}h{i + 1}") for i in range(count)]
    sshds: list[subprocess.Popen[bytes]] = []
    made_bridge, made_netns = False, []
    try:
        for key in ("host", "client"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)],
                check=True,
                timeout=30,
            )
        (root / "authorized_keys").write_text((root / "client.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        _ip("link", "add", bridge, "type", "bridge")
        made_bridge = True
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for index, host in enumerate(hosts):
            _ip("netns", "add", host.netns)
            made_netns.append(host.netns)
            outside, inside = f"tbv{tag}x{index}", f"tbv{tag}y{index}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", host.netns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            inns = ("netns", "exec", host.netns, "ip")
            _ip(*inns, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip(*inns, "link", "set", inside, "up")
            _ip(*inns, "link", "set", "lo", "up")
            config = root / f"sshd-{host.name}"
            config.write_text(
                "\n".join(
                    [
                        f"ListenAddress {host.address}",
                        f"HostKey {root}/host",
                        f"AuthorizedKeysFile {root}/authorized_keys",
                        "PermitRootLogin prohibit-password",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        f"PidFile {root}/sshd-{host.name}.pid",
                        "",
                    ]
                )
            )
            shell = f"hostname {host.name} && exec {SSHD} -D -e -f {config}"
            sshds.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", shell],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / f"sshd-{host.name}.log", "wb"),  # noqa: SIM115
                )
            )
        ssh = (
            f"ssh -i {root}/client -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o LogLevel=ERROR -o ConnectTimeout=5"
        )
        env = {**os.environ, "TBON_SSH": ssh}
        for host in hosts:
            _wait_ssh(ssh, host, deadline, root)
        yield Hosts(hosts, env)
    finally:
        for netns in made_netns:  # whatever still runs in a test host is ours: end it
            for pid in pids_in(netns):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for sshd in sshds:
            if sshd.poll() is None:
                sshd.kill()
            sshd.wait()
        for netns in made_netns:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        if made_bridge:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _wait_ssh(ssh: str, host: Host, deadline: float, root: Path) -> None:
    until = time.monotonic() + deadline
    while True:
        probe = subprocess.run(
            [*ssh.split(), "-o", "BatchMode=yes", host.address, "hostname"],
            capture_output=True,
            text=True,
            timeout=deadline,
        )
        if probe.returncode == 0 and probe.stdout.strip() == host.name:
            return
        if time.monotonic() > until:
            log = (root / f"sshd-{host.name}.log").read_text(errors="replace")
            raise AssertionError(f"sshd on {host.address} not answering: {probe.stderr} {log}")
        time.sleep(0.1)
