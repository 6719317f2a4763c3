"""Config-file bootstrap (`tbon broker -c FILE`): real brokers on loopback, one per "host"."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import DEADLINE, TBON, child_env, free_port, tbon, wait_for

from tbon.errors import UsageError
from tbon.overlay.boot.config_file import parse_bootconfig
from tbon.overlay.connectors.client import Client
from tbon.overlay.parse.hostlist import expand_hostlist


class ConfigInstance:
    """Brokers booted from one config file, each told which host it is with -S hostname."""

    def __init__(self, root: Path, hosts: int, extra: str = "", *attributes: str) -> None:
        self.root = root
        self.cert = root / "instance.cert"
        assert tbon("keygen", str(self.cert)).returncode == 0
        lines = [
            "[bootstrap]",
            f'curve_cert = "{self.cert}"',
            'default_bind = "tcp://127.0.0.1:%p"',
            'default_connect = "tcp://127.0.0.1:%p"',
            "hosts = [",
        ]
        for index in range(hosts):
            port = free_port()  # one machine: each "host" listens on a port of its own
            uri = f"tcp://127.0.0.1:{port}"
            lines.append(f'  {{ host = "node{index}", bind = "{uri}", connect = "{uri}" }},')
        lines += ["]", extra]
        self.file = root / "tbon.toml"
        self.file.write_text("\n".join(lines) + "\n")
        self.attributes = list(attributes)
        self.uri = f"local://{root}/rank0/local"
        self.brokers: dict[int, subprocess.Popen[str]] = {}
        self.extra: list[subprocess.Popen[str]] = []
        self._starts = itertools.count()

    def start(self, index: int, *more: str) -> subprocess.Popen[str]:
        argv = [TBON, "broker", "-c", str(self.file), "-S", f"hostname=node{index}"]
        for attribute in [*self.attributes, *more]:
            argv += ["-S", attribute]
        # Rank 0's at a known place; every other one under root too, fresh for each start, so
        # that a broker the test kills leaves nothing behind in the shared temporary directory.
        rundir = "rank0" if index == 0 else f"node{index}.{next(self._starts)}"
        argv += ["-S", f"broker.rundir={self.root}/{rundir}"]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        if index in self.brokers:
            self.extra.append(self.brokers[index])
        self.brokers[index] = process
        return process

    def status(self) -> dict[str, Any]:
        with Client(self.uri) as client:
            return client.rpc("status.get", nodeid=0)

    def wait_status(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        wait_for(lambda: os.path.exists(self.uri[len("local://") :]), "rank 0's socket")
        with Client(self.uri) as client:
            for status in client.watch_status(deadline=_deadline()):
                if predicate(status):
                    return status
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        """Shut down from rank 0, then make sure every broker we started is gone (by PID)."""
        if self.brokers.get(0) is not None and self.brokers[0].poll() is None:
            tbon("shutdown", self.uri)
        for process in [*self.brokers.values(), *self.extra]:
            try:
                process.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()


def _deadline() -> float:
    return time.monotonic() + DEADLINE


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[Callable[..., ConfigInstance]]:
    made: list[ConfigInstance] = []

    def make(hosts: int, *attributes: str, extra: str = "") -> ConfigInstance:
        made.append(ConfigInstance(tmp_path, hosts, extra, *attributes))
        return made[-1]

    yield make
    for instance in made:
        instance.stop()


def up(instance: ConfigInstance, hosts: int) -> dict[str, Any]:
    for index in range(hosts):
        instance.start(index)
    return instance.wait_status(
        lambda s: all(r["state"] == "online" for r in s["ranks"][:hosts]), "every host online"
    )


# --- real brokers ------------------------------------------------------------------------------


def test_four_hosts_boot_from_the_file_with_spares_that_flub_fills(configured) -> None:
    instance = configured(4, "tbon.fanout=2", "size=6")
    status = up(instance, 4)
    assert [r["host"] for r in status["ranks"]] == [f"node{i}" for i in range(4)] + [
        "extra0",
        "extra1",
    ]
    assert [r["state"] for r in status["ranks"][4:]] == ["vacant", "vacant"]
    assert status["ranks"][3]["parent"] == 1
    result = tbon("expand", instance.uri, "--fill", "--json")
    assert result.returncode == 0, result.stderr
    ran = tbon("exec", instance.uri, "-r", "all", "-l", "sh", "-c", "echo $TBON_RANK")
    assert sorted(ran.stdout.splitlines()) == [f"{r}: {r}" for r in range(6)]


def test_a_host_can_name_its_parent(configured, tmp_path: Path) -> None:
    instance = configured(4, "tbon.fanout=2")
    text = instance.file.read_text().replace(
        '{ host = "node3",', '{ host = "node3", parent = "node2",'
    )
    instance.file.write_text(text)
    status = up(instance, 4)
    assert status["ranks"][3]["parent"] == 2
    assert status["ranks"][2]["children"] == [3]


def test_a_config_rank_that_dies_is_offline_and_comes_back_with_a_new_incarnation(
    configured,
) -> None:
    instance = configured(3, "tbon.heartbeat=200ms")
    up(instance, 3)
    old = instance.brokers[2]
    old.kill()
    old.wait()
    instance.wait_status(lambda s: s["ranks"][2]["state"] == "offline", "rank 2 offline")
    joiner = subprocess.run(
        [TBON, "broker", "-S", f"broker.boot-server={instance.uri}", "-S", "broker.rank=2"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=DEADLINE,
    )
    assert joiner.returncode == 69, joiner.stderr  # a config rank is never handed to FLUB
    assert "rank 2 is taken: offline" in joiner.stderr
    back = instance.start(2)
    status = instance.wait_status(
        lambda s: s["ranks"][2]["pid"] == back.pid, "the restarted broker online"
    )
    assert status["ranks"][2]["incarnation"] == 2
    assert status["ranks"][2]["host"] == "node2"


def test_a_retired_config_rank_restarted_is_refused_77(configured) -> None:
    instance = configured(2)
    up(instance, 2)
    first = instance.brokers[1]
    assert tbon("retire", instance.uri, "1").returncode == 0
    first.wait(timeout=DEADLINE)
    assert first.returncode == 0
    again = instance.start(1)
    _, err = again.communicate(timeout=DEADLINE)
    assert again.returncode == 77
    assert "rank 1 was retired: a retired broker does not come back" in err
    entry = instance.status()["ranks"][1]
    assert (entry["state"], entry.get("retired")) == ("vacant", True)


def test_a_world_readable_certificate_is_refused(configured) -> None:
    instance = configured(1)
    instance.cert.chmod(0o644)
    broker = instance.start(0)
    _, err = broker.communicate(timeout=DEADLINE)
    assert broker.returncode == 2
    assert err.count("\n") == 1 and "curve_cert:" in err and "readable" in err


def test_an_unknown_host_is_a_usage_error(configured) -> None:
    instance = configured(2)
    broker = instance.start(7)
    _, err = broker.communicate(timeout=DEADLINE)
    assert broker.returncode == 2
    assert err.count("\n") == 1
    assert "host 'node7' is not in [bootstrap] hosts (node0, node1)" in err


def test_a_bad_uri_template_is_a_usage_error(configured) -> None:
    instance = configured(1, extra="")
    instance.file.write_text(
        instance.file.read_text().replace(
            'default_connect = "tcp://127.0.0.1:%p"', 'default_connect = "udp://%h"'
        )
    )
    broker = instance.start(0)
    _, err = broker.communicate(timeout=DEADLINE)
    assert broker.returncode == 2
    assert "bootstrap.default_connect: 'udp://%h' is not a URI template like tcp://%h:%p" in err


def test_a_config_file_with_a_boot_server_is_a_usage_error(tmp_path: Path) -> None:
    result = tbon("broker", "-c", str(tmp_path / "x.toml"), "-S", "broker.boot-server=local:///x")
    assert result.returncode == 2
    assert "do not go together" in result.stderr


# --- the file, checked without brokers ---------------------------------------------------------


def boot(**table: Any) -> Any:
    return parse_bootconfig({"bootstrap": {"curve_cert": "/c", **table}}, "t.toml")


def test_hosts_expand_and_templates_fill_in() -> None:
    config = boot(hosts=[{"host": "n[01-02]"}, {"host": "login", "connect": "tcp://gw:9"}])
    assert [(h.host, h.bind, h.connect) for h in config.hosts] == [
        ("n01", "tcp://*:8050", "tcp://n01:8050"),
        ("n02", "tcp://*:8050", "tcp://n02:8050"),
        ("login", "tcp://*:8050", "tcp://gw:9"),
    ]
    assert config.rank_of("n02") == 1


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"hosts": []}, "bootstrap.hosts must be a non-empty array"),
        ({"hosts": [{"host": "a"}, {"host": "a"}]}, "host 'a' appears twice"),
        ({"hosts": [{"host": "a", "port": 1}]}, "unknown key bootstrap.hosts[0].port"),
        ({"hosts": [{"host": "a"}], "colour": 1}, "unknown key bootstrap.colour"),
        ({"hosts": [{"host": "a["}]}, "'[' without ']'"),
        ({"hosts": [{"host": "a"}], "default_port": 0}, "default_port must be a port number"),
        ({"hosts": [{"host": "a", "bind": "tcp://*"}]}, "bootstrap.hosts[0].bind: 'tcp://*'"),
        ({"hosts": [{"host": "a", "parent": "b"}, {"host": "b"}]}, "rank 0, the root"),
        ({"hosts": [{"host": "a"}, {"host": "b", "parent": "z"}]}, "names parent 'z'"),
    ],
)
def test_bad_files_are_one_line_errors(table: dict[str, Any], problem: str) -> None:
    with pytest.raises(UsageError) as caught:
        boot(**table)
    assert problem in str(caught.value) and str(caught.value).startswith("t.toml: ")
    assert "\n" not in str(caught.value)


def test_parents_that_form_a_cycle_are_refused() -> None:
    config = boot(hosts=[{"host": "a"}, {"host": "b", "parent": "c"}, {"host": "c", "parent": "b"}])
    with pytest.raises(UsageError, match="form a cycle"):
        config.topology("kary:2", 3)


def test_a_missing_certificate_key_is_an_error() -> None:
    with pytest.raises(UsageError, match="curve_cert must name"):
        parse_bootconfig({"bootstrap": {"hosts": [{"host": "a"}]}}, "t.toml")


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("login,node[0-1]", ["login", "node0", "node1"]),
    ],
)
def test_host_lists(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["", "a,,b", "n[", "n]", "n[3-1]", "n[a]", "a b", "node [1-2]", "n[1-2] x"]
)
def test_bad_host_lists(text: str) -> None:
    with pytest.raises(UsageError, match="invalid host list"):
        expand_hostlist(text)


def test_ranks_come_back_whichever_restarts_first(configured) -> None:
    """A chain 0-1-2: rank 2 restarts, then its parent dies: rank 2 lives on, fostered by rank
    0, and goes home when rank 1's host restarts its broker; each restart takes a new
    incarnation that rank 0 gives."""
    instance = configured(3, "tbon.fanout=1", "tbon.heartbeat=200ms")
    up(instance, 3)
    instance.brokers[2].kill()
    instance.brokers[2].wait()
    instance.wait_status(lambda s: s["ranks"][2]["state"] == "offline", "rank 2 offline")
    back = instance.start(2)
    instance.wait_status(lambda s: s["ranks"][2]["pid"] == back.pid, "rank 2 back")
    instance.brokers[1].kill()
    instance.brokers[1].wait()
    instance.wait_status(
        lambda s: (
            [r["state"] for r in s["ranks"]] == ["online", "offline", "online"]
            and s["ranks"][2]["attached_to"] == 0
        ),
        "rank 1 offline, rank 2 fostered by rank 0",
    )
    parent = instance.start(1)
    seen = instance.wait_status(
        lambda s: (
            [r["pid"] for r in s["ranks"][1:]] == [parent.pid, back.pid]
            and s["ranks"][2]["attached_to"] == 1
        ),
        "rank 1 back, rank 2 home",
    )
    assert [r["incarnation"] for r in seen["ranks"]] == [1, 2, 2]


def test_a_retired_config_rank_filled_by_flub_is_an_ordinary_rank(configured) -> None:
    instance = configured(2, "tbon.heartbeat=200ms")
    up(instance, 2)
    assert tbon("retire", instance.uri, "1").returncode == 0
    joiner = subprocess.Popen(
        [  # killed below: its run directory is under the test's, so nothing is left behind
            *(TBON, "broker", "-S", f"broker.boot-server={instance.uri}"),
            *("-S", f"broker.rundir={instance.root}/joiner"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    try:
        instance.wait_status(lambda s: s["ranks"][1]["pid"] == joiner.pid, "the joiner online")
    finally:
        joiner.kill()
        joiner.wait()
    seen = instance.wait_status(lambda s: s["ranks"][1]["state"] != "online", "rank 1 gone")
    assert seen["ranks"][1]["state"] == "lost"  # free for FLUB again, not offline for ever
    refused = instance.start(1)
    _, err = refused.communicate(timeout=DEADLINE)
    assert refused.returncode == 77
    assert "rank 1 is not held by config bootstrap" in err


def test_a_child_listed_before_its_parent_rolls_up_when_killed(configured) -> None:
    """node1 names node2, listed after it, as its parent: 0 - 2 - 1. When node1's broker is
    killed, its rank is offline and both its parent and rank 0 read partial, whatever order the
    file numbers them in (the roll-up walks the tree, not the rank numbers)."""
    instance = configured(3, "tbon.heartbeat=200ms")
    text = instance.file.read_text().replace(
        '{ host = "node1",', '{ host = "node1", parent = "node2",'
    )
    instance.file.write_text(text)
    status = up(instance, 3)
    assert [r["parent"] for r in status["ranks"]] == [None, 2, 0]
    assert [r["subtree"] for r in status["ranks"]] == ["full"] * 3
    victim = instance.brokers[1]
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=DEADLINE) == -signal.SIGKILL
    instance.wait_status(lambda s: s["ranks"][1]["state"] == "offline", "rank 1 offline")
    shown = tbon("status", instance.uri, "--json")
    assert shown.returncode == 0, shown.stderr
    ranks = json.loads(shown.stdout)["ranks"]
    assert [(r["state"], r["subtree"]) for r in ranks] == [
        ("online", "partial"),
        ("offline", "offline"),
        ("online", "partial"),
    ]


def test_a_config_instance_with_standbys_survives_its_root(configured) -> None:
    """tbon.standbys=2 under a config file: ranks 1 and 2 are leaves side by side, and bind at
    their hosts' `bind` all the same (docs/protocol.md §13.4, "Cards"), so that with rank 0
    killed they reach each other, elect, and the new root serves status and exec."""
    instance = configured(4, "tbon.standbys=2", "tbon.timeout=30s")
    up(instance, 4)
    listed = tbon("uri", "--all", instance.uri)
    assert listed.returncode == 0, listed.stderr
    # each "host" is this machine: the list's ssh://nodeK/PATH is local://PATH here
    listed_uris = listed.stdout.strip().split(",")
    assert len(listed_uris) == 3, listed_uris
    uris = ",".join("local://" + u[u.index("/", len("ssh://")) :] for u in listed_uris)
    pids = {rank: instance.brokers[rank].pid for rank in range(4)}
    instance.brokers[0].send_signal(signal.SIGKILL)
    instance.brokers[0].wait()
    env = {**child_env(), "TBON_URI": uris}
    seen: dict[str, Any] = {}

    def taken_over() -> bool:
        done = tbon("status", "--json", env=env)
        if done.returncode != 0:
            return False
        seen.clear()
        seen.update(json.loads(done.stdout))
        ranks = seen["ranks"]
        return (
            seen["root"] in (1, 2)
            and ranks[0]["state"] != "online"
            and all(ranks[r]["state"] == "online" and ranks[r]["pid"] == pids[r] for r in (1, 2, 3))
            # an adrift rank (online, no link yet) is not reached by exec: wait for its link
            and all(ranks[r].get("attached_to") is not None for r in (1, 2, 3) if r != seen["root"])
        )

    try:
        wait_for(taken_over, "a standby to take over the config-booted instance")
    except AssertionError as error:
        raise AssertionError(f"{error}; last status {seen}") from None
    assert f"rank {seen['root']} took over in term" in seen["ranks"][0]["reason"], seen
    ran = tbon("exec", "-r", "1-3", "true", env=env)
    assert ran.returncode == 0, ran.stderr
    done = tbon("shutdown", env=env)  # the new root ends the instance
    assert done.returncode == 0, done.stderr
