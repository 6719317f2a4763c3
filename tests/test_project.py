"""The project's own promises: lint-clean code, README commands that CI really runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    text = (ROOT / "README.md").read_text()
    commands = readme_commands()
    assert text.index("```sh") < 20, "README must open with the commands"
    assert len(commands) >= 2
    assert "tbon start --test-size=4" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci, ".ci/run must run exactly README's test command"


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is part of the test extra"
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_broker_imports_neither_typer_nor_rich() -> None:
    code = (
        "import sys; import tbon.cli.main, tbon.overlay.broker.broker, tbon.overlay.launch.local; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_installed_package_runs_an_instance(tmp_path: Path) -> None:
    """`pip install .` (not editable) maps cli/, overlay/, keys/ to tbon.* and the CLI works."""
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    assert (target / "tbon" / "overlay" / "broker" / "broker.py").exists()
    assert (target / "tbon" / "errors.py").exists()
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tbon.cli.main import main; "
            "sys.exit(main(['start', '--test-size=2', sys.executable, '-c', "
            "'import tbon.overlay.broker.broker as b; print(b.__file__)']))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith(str(target))
