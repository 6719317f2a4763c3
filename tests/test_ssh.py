"""ssh:// URIs across real test hosts (tests/hosts.py): `tbon relay` over real ssh, commands on
an instance of another host, and a broker on a third host joining it by FLUB through ssh."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator

import hosts
import pytest
from conftest import DEADLINE, TBON, tbon

REQUIRED = os.environ.get("TBON_REQUIRE_LAUNCHERS") == "1"
pytestmark = pytest.mark.skipif(
    bool(hosts.missing()) and not REQUIRED,
    reason=f"no test hosts here (missing: {', '.join(hosts.missing())})",
)


@pytest.fixture(scope="module")
def lab() -> Iterator[hosts.Hosts]:
    assert not hosts.missing(), f"TBON_REQUIRE_LAUNCHERS=1 but missing {hosts.missing()}"
    with hosts.namespace_hosts(3) as made:
        yield made


def over_ssh(lab: hosts.Hosts, host: hosts.Host, *argv: str) -> list[str]:
    """argv run on `host` through ssh, with TBON_SSH set there too."""
    remote = f"TBON_SSH={shlex.quote(lab.env['TBON_SSH'])} " + " ".join(map(shlex.quote, argv))
    return [*lab.env["TBON_SSH"].split(), "-T", "-o", "BatchMode=yes", host.address, remote]


@pytest.fixture
def remote_instance(lab: hosts.Hosts) -> Iterator[str]:
    """`tbon start` on host1 (3 ranks, 2 launched); yields its ssh:// URI."""
    host = lab.hosts[0]
    start = subprocess.Popen(
        over_ssh(
            lab,
            host,
            TBON,
            "start",
            "--test-size=2",
            "-S",
            "size=3",
            "-S",
            f"tbon.endpoint=tcp://{host.address}:*",
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert start.stdout is not None
        local = start.stdout.readline().strip()
        assert local.startswith("local://"), start.stderr.read() if start.stderr else ""
        uri = f"ssh://{host.address}{local[len('local://') :]}"
        yield uri
        result = tbon("shutdown", uri, env=lab.env)
        assert result.returncode == 0, result.stderr
        start.wait(timeout=DEADLINE)
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()


def test_status_and_exec_through_an_ssh_uri(lab: hosts.Hosts, remote_instance: str) -> None:
    status = tbon("status", remote_instance, "--json", env=lab.env)
    assert status.returncode == 0, status.stderr
    ranks = json.loads(status.stdout)["ranks"]
    assert [(r["state"], r["host"]) for r in ranks] == [
        ("online", "host1"),
        ("online", "host1"),
        ("vacant", "extra0"),
    ]
    ran = tbon("exec", remote_instance, "-r", "all", "-l", "hostname", env=lab.env)
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.splitlines()) == ["0: host1", "1: host1"]


def test_a_broker_on_another_host_joins_through_an_ssh_boot_server(
    lab: hosts.Hosts, remote_instance: str
) -> None:
    host = lab.hosts[1]
    joiner = subprocess.Popen(
        over_ssh(lab, host, TBON, "broker", "-S", f"broker.boot-server={remote_instance}"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waited = tbon("status", remote_instance, "--wait", "full", "--timeout", "20s", env=lab.env)
        assert waited.returncode == 0, waited.stderr
        ran = tbon("exec", remote_instance, "-r", "2", "hostname", env=lab.env)
        assert ran.stdout == "host2\n", ran.stderr
    finally:
        if joiner.poll() is None:  # the instance's shutdown ends it; if not, ours to end
            try:
                joiner.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                joiner.kill()
                joiner.wait()


def test_an_unreachable_host_is_one_clear_line(lab: hosts.Hosts) -> None:
    address = lab.hosts[0].address.rsplit(".", 1)[0] + ".250"  # nobody there
    result = tbon("status", f"ssh://{address}/tmp/nothing/local", env=lab.env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"tbon status: cannot reach ssh://{address}/tmp/nothing/local")
    assert result.stderr.count("\n") == 1


def test_an_ssh_uri_with_no_broker_says_so(lab: hosts.Hosts) -> None:
    address = lab.hosts[2].address
    result = tbon("status", f"ssh://{address}/tmp/nothing/local", env=lab.env)
    assert result.returncode == 1
    assert "cannot connect to local:///tmp/nothing/local: no such socket" in result.stderr
