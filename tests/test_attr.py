"""`tbon attr get/list`: each broker's attributes with their values and where they came from.

First the table a broker works out (overlay/services/attr.py) and its service, without sockets;
then what a user sees through real instances, a broker that joined by FLUB among them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import tbon

from tbon.overlay.config.attributes import DEFAULTS, KNOWN, broker_config, parse_assignments
from tbon.overlay.services.actions import Respond
from tbon.overlay.services.attr import SOURCES, AttrService, describe
from tbon.overlay.services.ping import Whoami
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message


def table(*assignments: str, size: int = 4, rank: int = 0, endpoint: str = "", **config: Any):
    attributes = parse_assignments(list(assignments))
    settings = broker_config(attributes, config.pop("config_file", None))
    if config:
        settings = settings.replaced(**config)
    me = Whoami(
        rank, settings.hostname, 1, "local:///run/tbon-x/local", endpoint, "key", attributes
    )
    return describe(me, settings, Topology(settings.topo, size))


def test_every_attribute_is_described_with_a_known_source() -> None:
    found = table()
    assert set(found) == KNOWN and list(found) == sorted(KNOWN)
    assert all(a.source in SOURCES for a in found.values())
    for name, default in DEFAULTS.items():
        if name != "tbon.topo":
            assert (found[name].value, found[name].source) == (default, "default"), name
    assert (found["size"].value, found["size"].source) == ("4", "bootstrap")
    assert found["broker.cert"].value is None and found["broker.cert"].source == "unset"
    assert (found["broker.rundir"].value, found["broker.rundir"].source) == (
        "/run/tbon-x",
        "default",
    )
    assert (found["broker.reattach-timeout"].value, found["broker.reattach-timeout"].source) == (
        "1m",  # follows tbon.timeout
        "default",
    )


def test_setattr_values_are_shown_as_given_and_said_to_come_from_s() -> None:
    found = table("tbon.fanout=2", "tbon.timeout=90s", "size=8", "broker.cert=/k.cert")
    assert (found["tbon.topo"].value, found["tbon.topo"].source) == ("kary:2", "-S")
    assert (found["tbon.timeout"].value, found["tbon.timeout"].source) == ("90s", "-S")
    assert (found["size"].value, found["size"].source) == ("4", "-S")  # the instance's own
    assert (found["broker.cert"].value, found["broker.cert"].source) == ("/k.cert", "-S")


def test_a_listening_broker_shows_its_endpoint_and_a_launched_one_its_launcher() -> None:
    found = table(endpoint="tcp://10.0.0.1:4000", rundir="/run/tbon-x")
    assert (found["tbon.endpoint"].value, found["tbon.endpoint"].source) == (
        "tcp://10.0.0.1:4000",
        "default",
    )
    assert found["broker.rundir"].source == "launcher"


def test_an_unset_heartbeat_shows_the_period_worked_out_from_the_limits() -> None:
    found = table("tbon.timeout=2s", "tbon.torpid=0")
    assert (found["tbon.heartbeat"].value, found["tbon.heartbeat"].source) == ("667ms", "default")


def test_a_joiner_takes_its_size_tree_and_liveness_from_the_boot_server() -> None:
    found = table("broker.boot-server=local:///x/local", "tbon.heartbeat=5s", heartbeat=0.25)
    for name in ("size", "tbon.topo", "tbon.heartbeat", "tbon.torpid", "broker.join-timeout"):
        assert found[name].source == "boot server", name
    assert found["tbon.heartbeat"].value == "250ms"  # the instance's, not its own -S
    assert found["broker.boot-server"].source == "-S"


def test_a_config_files_tree_and_endpoint_come_from_the_file() -> None:
    found = table(config_file="/etc/tbon.toml", topo="parents:0,1,1")
    assert (found["tbon.topo"].value, found["tbon.topo"].source) == ("parents:0,1,1", "config file")
    assert found["size"].source == "config file" and found["tbon.endpoint"].source == "config file"


def request(topic: str, payload: dict[str, Any] | None = None) -> Message:
    return Message(Kind.REQUEST, topic, payload or {}, nodeid=0, tag=7, route=["l0a"])


def test_the_service_answers_one_or_every_attribute_and_refuses_other_names() -> None:
    service = AttrService(2, table())
    [got] = service.get(request("attr.get", {"name": "tbon.torpid"}), 0.0)
    assert isinstance(got, Respond)
    assert got.message.payload == {
        "rank": 2,
        "name": "tbon.torpid",
        "value": "30s",
        "source": "default",
    }
    for bad in ({"name": "frob"}, {"name": 3}, {}):
        [refused] = service.get(request("attr.get", bad), 0.0)
        assert isinstance(refused, Respond) and refused.message.errnum == 2  # ENOENT
        assert refused.message.errstr.startswith("unknown attribute")
    [listed] = service.list(request("attr.list"), 0.0)
    assert isinstance(listed, Respond)
    assert [a["name"] for a in listed.message.payload["attributes"]] == sorted(KNOWN)


# --- through real instances -------------------------------------------------------------------


def attr(inst, *args: str):
    return tbon("attr", inst.uri, *args)


def test_list_shows_every_attribute_of_each_broker_asked(instance) -> None:
    inst = instance(3, "tbon.fanout=2")
    shown = attr(inst, "list")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    rows = [re.split(r"\s{2,}", line) for line in shown.stdout.splitlines()]
    assert [row[0] for row in rows] == sorted(KNOWN)
    assert all(len(row) == 3 and row[2] in SOURCES for row in rows), rows
    by_name = {row[0]: row for row in rows}
    assert by_name["tbon.fanout"][1:] == ["2", "-S"]
    assert by_name["size"][1:] == ["3", "bootstrap"]
    assert by_name["broker.cert"][1:] == ["-", "unset"]
    two = json.loads(attr(inst, "-r", "2", "list", "--json").stdout)
    assert two["rank"] == 2
    rundir = next(a for a in two["attributes"] if a["name"] == "broker.rundir")
    assert rundir["value"].endswith("/2") and rundir["source"] == "launcher"


def test_get_prints_the_value_alone_and_json_says_where_it_came_from(instance) -> None:
    inst = instance(2, "tbon.torpid=7s")
    got = attr(inst, "get", "tbon.torpid")
    assert (got.returncode, got.stdout, got.stderr) == (0, "7s\n", "")
    assert json.loads(attr(inst, "get", "tbon.heartbeat", "--json", "-r", "1").stdout) == {
        "rank": 1,
        "name": "tbon.heartbeat",
        "value": "2.33s",  # a third of tbon.torpid, as it is set
        "source": "default",
    }


def test_a_joiner_says_it_took_the_instances_settings(instance) -> None:
    inst = instance(2, "size=3", "tbon.heartbeat=500ms")
    inst.join()
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "online", "the joiner online")
    got = json.loads(attr(inst, "-r", "2", "get", "tbon.heartbeat", "--json").stdout)
    assert (got["value"], got["source"]) == ("500ms", "boot server")


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["get", "frob"], 2, "tbon attr: unknown attribute 'frob': 'tbon attr list' lists them"),
        (["get"], 2, "tbon attr: get takes one attribute NAME"),
        (["list", "size"], 2, "tbon attr: list takes no NAME: 'size'"),
        (["show"], 2, "tbon attr: invalid action 'show': use get NAME or list"),
        ([], 2, "tbon attr: missing action: use get NAME or list"),
        (["get", "broker.cert"], 1, "tbon attr: broker.cert is not set on rank 0"),
        (["-r", "9", "list"], 68, "tbon attr: no rank 9 in this instance of size 2"),
        (["-r", "x", "list"], 2, "tbon attr: invalid --rank 'x'"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    instance, args: list[str], code: int, words: str
) -> None:
    inst = instance(2) if code in (1, 68) else None
    result = tbon("attr", inst.uri if inst else "local:///nonexistent/socket", *args)
    assert result.returncode == code, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(words), result.stderr
