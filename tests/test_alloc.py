"""`tbon alloc`: here (local), and over real ssh on test hosts (tests/hosts.py), where `tbon
expand --hosts` then fills spares from other hosts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import hosts
import pytest
from conftest import DEADLINE, child_env, tbon, wait_for

REQUIRED = os.environ.get("TBON_REQUIRE_LAUNCHERS") == "1"
needs_hosts = pytest.mark.skipif(
    bool(hosts.missing()) and not REQUIRED,
    reason=f"no test hosts here (missing: {', '.join(hosts.missing())})",
)


def alloc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return tbon("alloc", *args, env=env, timeout=3 * DEADLINE)


# --- here ---------------------------------------------------------------------------------------


def test_local_alloc_runs_the_command_with_tbon_uri_and_returns_its_status() -> None:
    script = "echo $TBON_URI; tbon status --json; exit 3"
    result = alloc("-N", "3", "--size", "4", "sh", "-c", script)
    assert result.returncode == 3, result.stderr
    uri, status = result.stdout.splitlines()[0], json.loads(result.stdout.splitlines()[1])
    assert uri.startswith("local:///")
    assert [r["state"] for r in status["ranks"]] == ["online"] * 3 + ["vacant"]
    assert not Path(uri[len("local://") :]).exists()  # shut down, cleaned up


def test_local_alloc_in_the_background_lives_until_shut_down() -> None:
    result = alloc("-N", "2", "--bg")
    assert result.returncode == 0, result.stderr
    uri = result.stdout.strip()
    try:
        shown = tbon("status", uri, "--json")
        assert [r["state"] for r in json.loads(shown.stdout)["ranks"]] == ["online"] * 2
    finally:
        assert tbon("shutdown", uri).returncode == 0
    assert not Path(uri[len("local://") :]).exists()


def test_alloc_refuses_bad_combinations() -> None:
    for args, said in [
        (["-N", "2", "--launcher", "ssh"], "--launcher ssh needs --hosts HOSTLIST"),
        (["-N", "2", "--launcher", "pbs"], "--launcher 'pbs': use one of"),
        (["-N", "3", "--size", "2"], "--size 2 is smaller than -N 3"),
        (["-N", "3", "--hosts", "h[1-2]"], "-N 3 but --hosts h[1-2] names 2 host(s)"),
        (["-N", "2", "--bg", "true"], "--bg and COMMAND do not go together"),
    ]:
        result = alloc(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert said in result.stderr and result.stderr.count("\n") == 1, result.stderr


# --- across hosts -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab() -> Iterator[hosts.Hosts]:
    assert not hosts.missing(), f"TBON_REQUIRE_LAUNCHERS=1 but missing {hosts.missing()}"
    with hosts.namespace_hosts(6) as made:
        yield made


def addresses(lab: hosts.Hosts, first: int, last: int) -> str:
    return ",".join(host.address for host in lab.hosts[first : last + 1])


@needs_hosts
def test_alloc_over_ssh_then_expand_from_other_hosts(lab: hosts.Hosts) -> None:
    """4 hosts, size 8; then 2 spares filled from two more hosts: every rank where it should be."""
    script = (
        f"tbon expand --hosts {addresses(lab, 4, 5)} -n 2 --json >&2 && "
        "tbon exec -r all -l hostname && tbon status --json"
    )
    env = {**child_env(), **{"TBON_SSH": lab.env["TBON_SSH"]}}
    result = alloc(
        "-N", "4", "--size", "8", "--hosts", addresses(lab, 0, 3), "sh", "-c", script, env=env
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    placed = dict(line.split(": ", 1) for line in lines[:6])
    assert placed == {
        "0": "host1", "1": "host2", "2": "host3", "3": "host4", "4": "host5", "5": "host6",
    }  # fmt: skip
    status = json.loads(lines[6])
    assert [r["state"] for r in status["ranks"]] == ["online"] * 6 + ["vacant"] * 2
    assert [r["host"] for r in status["ranks"][:6]] == [f"host{i}" for i in range(1, 7)]
    for host in lab.hosts:  # nothing left running on any host but its sshd
        wait_for(lambda host=host: only_sshd(host), f"{host.name} to be empty")


def only_sshd(host: hosts.Host) -> bool:
    names = []
    for pid in hosts.pids_in(host.netns):
        with contextlib.suppress(FileNotFoundError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return all(name == "sshd" for name in names)


@needs_hosts
def test_an_unreachable_host_is_named_and_nothing_is_left_running(lab: hosts.Hosts) -> None:
    nowhere = lab.hosts[0].address.rsplit(".", 1)[0] + ".250"
    env = {**child_env(), "TBON_SSH": lab.env["TBON_SSH"]}
    result = alloc("-N", "3", "--hosts", f"{addresses(lab, 0, 1)},{nowhere}", "true", env=env)
    assert result.returncode == 1
    assert f"host {nowhere} (rank 2): ssh: connect to host {nowhere}" in result.stderr
    assert "Traceback" not in result.stderr
    for host in lab.hosts[:2]:
        wait_for(lambda host=host: only_sshd(host), f"{host.name} to be empty")


def test_write_config_makes_a_file_brokers_can_boot_from(tmp_path: Path) -> None:
    from tbon.keys.cert import load_certificate
    from tbon.overlay.boot.config_file import load_bootconfig

    path = tmp_path / "instance.toml"
    result = alloc("-N", "3", "--hosts", "node[1-4]", "--write-config", str(path))
    assert result.returncode == 0, result.stderr
    config = load_bootconfig(str(path))
    assert [h.host for h in config.hosts] == ["node1", "node2", "node3"]
    assert config.hosts[0].connect == "tcp://node1:8050"
    assert load_certificate(config.curve_cert).secret is not None  # 0600, or it would not load
    again = alloc("-N", "3", "--hosts", "node[1-4]", "--write-config", str(path))
    assert again.returncode == 1 and "already exists" in again.stderr


def test_a_broker_that_fails_to_start_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.cert"  # well formed, so only the brokers can find it missing
    result = alloc("-N", "2", "-S", f"broker.cert={missing}", "true")
    assert result.returncode == 1
    # Whichever broker is seen to fail first is named (both do, here).
    assert re.search(
        r"host localhost \(rank [01]\): its broker exited with status 2", result.stderr
    )
    assert f"broker.cert: {missing}: no such file" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_attribute_is_refused_before_any_broker_starts() -> None:
    result = alloc("-N", "2", "-S", "tbon.fanout=many", "true")
    assert result.returncode == 2
    assert result.stderr == "tbon alloc: invalid tbon.fanout 'many': use a whole number K >= 0\n"
