"""What a broker started on its own loads: its memory is mostly the modules it imports (issue 14,
section 3: at most 20 MB for one broker per node), so the modules it has no use for are kept out.

One singleton broker runs a whole life in a fresh interpreter (boot, local socket, its initial
program, shutdown) and then lists what it loaded. Modules, not megabytes: what is loaded does not
depend on the machine's load, so the test cannot be flaky.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEADLINE, child_env, free_port, tbon, wait_for

from tbon.errors import UsageError
from tbon.overlay.broker.main import parse_args
from tbon.overlay.connectors.client import Client

NEVER = (
    "typer",  # the CLI: `tbon broker` is dispatched before it loads (cli/main.py)
    "click",
    "rich",
    "argparse",  # the broker parses its own few options (overlay/broker/main.py)
    "gettext",
    "ctypes",  # the process title is written through /proc (tbon/proctitle.py)
    "tbon.overlay.links.children",  # a rank without children: the ROUTER side
    "tbon.overlay.links.hello",
    "tbon.overlay.links.sessions",
    "tbon.overlay.links.parent",  # rank 0: no link up
    "tbon.overlay.links.uplink",
    "tbon.overlay.links.upward",
    "tbon.overlay.boot.flub",  # bootstraps it did not use
    "tbon.overlay.boot.config_file",
    "tbon.overlay.state.leadership",  # no standbys: no member of the root group
    "tbon.overlay.state.groupwire",
    "dataclasses",  # its value classes are Records or plain classes (tbon/record.py) ...
    "inspect",  # ... so neither it nor what it imports is loaded
    "ast",
    "dis",
)

RUN = """
import json, sys
from tbon.cli.main import main
code = main(["broker", "-S", "broker.rundir=" + sys.argv[1], "true"])
print(json.dumps([code, sorted(sys.modules)]))
"""


def test_a_singleton_broker_loads_neither_the_cli_nor_what_it_has_no_use_for(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    code, loaded = json.loads(result.stdout.splitlines()[-1])
    assert code == 0, result.stderr  # it ran `true` as its initial program, and shut down
    assert "tbon.overlay.broker.broker" in loaded
    assert "tbon.overlay.services.status" in loaded  # rank 0 serves status
    assert sorted(set(NEVER) & set(loaded)) == []


MEMBER_MACHINE = ("tbon.overlay.state.leadership", "tbon.overlay.state.groupwire")
TABLE = "tbon.overlay.state.ranktable"  # the table's rules: rank 0 and members only
DATACLASSES = "dataclasses"  # a leaf's links up define none; the links down and members' do

RUN_CONFIGURED = """
import json, sys
from tbon.cli.main import main
code = main(["broker", *sys.argv[1:]])
print(json.dumps([code, sorted(m for m in sys.modules if m in MEMBERS)]))
""".replace("MEMBERS", repr((*MEMBER_MACHINE, TABLE, DATACLASSES)))


@pytest.mark.parametrize("standbys", [0, 2])
def test_only_the_root_groups_members_load_its_machine(tmp_path: Path, standbys: int) -> None:
    """Four brokers started on their own, as srun or a config file starts them (no launcher
    loads anything for them): with no standbys none loads the member machine; with two, the
    root and its standbys do, and the one other broker does not. Only the root and members
    load the rank table's rules: the links of the others take its events from rankevents.py.
    Nor does a leaf that is no member load dataclasses: its links up define Records.
    Then a `tbon shutdown`."""
    cert = tmp_path / "instance.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    hosts = [f"tcp://127.0.0.1:{free_port()}" for _ in range(4)]
    config = tmp_path / "tbon.toml"
    config.write_text(
        f'[bootstrap]\ncurve_cert = "{cert}"\nhosts = [\n'
        + "".join(
            f'  {{ host = "node{i}", bind = "{u}", connect = "{u}" }},\n'
            for i, u in enumerate(hosts)
        )
        + "]\n"
    )

    def start(index: int) -> subprocess.Popen[str]:
        argv = ["-c", str(config), "-S", f"hostname=node{index}", "-S", f"tbon.standbys={standbys}"]
        argv += ["-S", f"broker.rundir={tmp_path}/rank{index}"]
        return subprocess.Popen(
            [sys.executable, "-c", RUN_CONFIGURED, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )

    brokers = [start(index) for index in range(4)]
    socket = tmp_path / "rank0" / "local"
    try:
        wait_for(socket.exists, "rank 0's socket")
        with Client(f"local://{socket}") as client:
            for status in client.watch_status(deadline=time.monotonic() + DEADLINE):
                if all(rank["state"] == "online" for rank in status["ranks"]):
                    break
            else:
                raise AssertionError("the four brokers never were all online")
        assert status["standbys"] == ([1, 2] if standbys else [])
        assert tbon("shutdown", f"local://{socket}").returncode == 0
        outputs = [broker.communicate(timeout=DEADLINE) for broker in brokers]
    finally:
        for broker in brokers:  # whatever failed above, no broker of this test is left
            if broker.poll() is None:
                broker.kill()
                broker.communicate()
    loaded: dict[int, list[str]] = {}
    for rank, (out, err) in enumerate(outputs):
        code, loaded[rank] = json.loads(out.splitlines()[-1])
        assert code == 0, err
    members = {0, 1, 2} if standbys else set()  # the root and its standbys
    expected = {rank: sorted(MEMBER_MACHINE) if rank in members else [] for rank in range(4)}
    for rank in members | {0}:
        expected[rank] = sorted([*expected[rank], TABLE, DATACLASSES])
    assert loaded == expected


TABLE_HOLDERS_ONLY = (
    "dataclasses",  # no value class of a broker is a dataclass (tbon/record.py)
    "tbon.overlay.services.status",  # rank 0 serves status
    "tbon.overlay.services.rankpath",
    "tbon.overlay.state.ranktable",  # the table's rules: rank 0 and the root group's members
    "tbon.overlay.state.rankentries",
    "tbon.overlay.state.snapshot",
    "tbon.overlay.state.statusviews",
)


def test_importing_the_broker_does_not_load_what_only_a_table_holder_uses() -> None:
    """A broker that holds no rank table needs the events it reports (state/rankevents.py),
    not the table's rules: those are imported where rank 0 or a member builds its table.
    Nor does it load dataclasses (with inspect, dis and ast): its value classes are Records."""
    code = (
        "import sys; import tbon.overlay.broker.broker, tbon.overlay.broker.dispatch; "
        f"print(sorted(m for m in sys.modules if m in {TABLE_HOLDERS_ONLY!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["-S", "a=1", "-Sb=2", "--setattr", "c=3", "--setattr=d=4"],
            (["a=1", "b=2", "c=3", "d=4"], None, []),
        ),
        (["-c", "f", "sh", "-c", "x"], ([], "f", ["sh", "-c", "x"])),
        (["--config-file=f", "--", "-S", "x"], ([], "f", ["-S", "x"])),
        (["-cf", "-S=a=1", "cmd", "--", "x"], (["a=1"], "f", ["cmd", "--", "x"])),
    ],
)
def test_broker_options_come_before_its_initial_program(argv, expected) -> None:
    """The broker's own parser (argparse is not loaded) takes what argparse took."""
    args = parse_args(argv)
    assert (args.setattr, args.config_file, args.command) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--frob"], "no such option: --frob"),
        (["-x", "cmd"], "no such option: -x"),
        (["--help=1"], "no such option: --help=1"),
        (["-S"], "option '-S' requires an argument"),
        (["--config-file"], "option '-c' requires an argument"),
    ],
)
def test_broker_usage_errors_are_worded_as_the_other_commands(argv, message) -> None:
    with pytest.raises(UsageError, match=f"^{message}$"):
        parse_args(argv)
