"""What `tbon ping` and `tbon status --summary` load: each is bound by its own start (the
interpreter, its imports, one round trip), so what a command that only asks and prints has no
use for is kept out of it (issue 26: `status --summary` within 0.2 s at 262,144 ranks).

Each command runs in a fresh interpreter against a real instance, then lists what it loaded.
Modules, not milliseconds: what is loaded does not depend on the machine's load.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import child_env

NEVER = (
    "tbon.overlay.wire.flow",  # exec's windows
    "tbon.cli.render",  # the tree view's
    "tbon.overlay.connectors.ssh",  # a local:// URI
    "rich",
    "pydantic",  # Typer's own conversion of values: PlainValue does (cli/commands.py)
)

RUN = """
import gc, json, sys
from tbon.cli.main import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(sys.modules), gc.isenabled()]))
"""


@pytest.mark.parametrize("args", [["ping", "{uri}", "0"], ["status", "{uri}", "--summary"]])
def test_a_command_that_asks_and_prints_loads_nothing_it_has_no_use_for(
    instance, args: list[str]
) -> None:
    inst = instance(2)
    argv = [word.format(uri=inst.uri) for word in args]
    result = subprocess.run(
        [sys.executable, "-c", RUN, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    code, loaded, collecting = json.loads(result.stdout.splitlines()[-1])
    assert code == 0, result.stdout + result.stderr
    assert "tbon.overlay.connectors.client" in loaded  # it did talk to the instance
    assert sorted(m for m in loaded if m in NEVER or m.startswith(("rich.", "pydantic."))) == []
    assert collecting  # the collector, off while Typer is imported (cli/app.py), is back on
