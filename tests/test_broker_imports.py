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

import pytest

from tbon.errors import UsageError
from tbon.overlay.broker.main import parse_args

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


def test_importing_the_broker_does_not_load_the_rank0_status_service() -> None:
    code = (
        "import sys; import tbon.overlay.broker.broker, tbon.overlay.broker.dispatch; "
        "print(sorted(m for m in sys.modules if m.startswith('tbon.overlay.services.status')))"
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
