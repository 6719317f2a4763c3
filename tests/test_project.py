"""The project's own promises: lint-clean code, README commands that CI really runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
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


def test_ci_checks_lint_and_types_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    tests = ci.index(readme_commands()[1])
    assert ci.index(".venv/bin/ruff check .") < tests
    assert ci.index(".venv/bin/python .ci/typecheck") < tests


def test_types_check() -> None:
    """mypy over the package as it is imported (tbon.cli is cli/...): see .ci/typecheck."""
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "typecheck")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_broker_imports_neither_typer_nor_rich() -> None:
    code = (
        "import sys; import tbon.cli.main, tbon.overlay.broker.broker, tbon.overlay.launch.local, "
        "tbon.overlay.broker.main, tbon.helptext, tbon.proctitle; "
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


def test_pip_install_puts_the_man_pages_where_man_finds_them(tmp_path: Path) -> None:
    """A wheel built from this tree, installed into a new virtual environment: every page of
    man/ lands in VENV/share/man, which man-db finds from PATH (VENV/bin) alone. The wheel is
    built by this environment's pip and installed by pip into the new one only, so nothing here
    changes the environment the tests run in, and nothing is downloaded."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    steps = [
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = wheels.glob("tbon-*.whl")
    target = [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps"]
    done = subprocess.run([*target, str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (venv / "bin" / "tbon").exists()
    for page in sorted((ROOT / "man").glob("*.[15]")):
        installed = venv / "share" / "man" / f"man{page.suffix[1:]}" / page.name
        assert installed.read_bytes() == page.read_bytes(), installed
    man = shutil.which("man")
    if man is None:
        return  # man-db is not installed here: the files are where it would look
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    found = subprocess.run([man, "-w", "tbon-status"], capture_output=True, text=True, env=env)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(venv / "share" / "man" / "man1" / "tbon-status.1")


def _dependencies_of_this_environment(into: Path) -> Path:
    """A folder of links to everything this test environment has installed but tbon itself
    (neither its editable finder nor its metadata, nor any .pth file): what a new environment
    needs to install and run tbon without a package index."""
    site = Path(sysconfig.get_paths()["purelib"])
    into.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(("tbon", "__editable__", "__pycache__")) or entry.suffix == ".pth":
            continue
        (into / entry.name).symlink_to(entry)
    return into


def _copy_working_tree(clone: Path) -> None:
    """This checkout's changes not yet committed, copied over the clone: the files git tracks
    or would track (nothing it ignores, such as .venv or build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        cwd=ROOT,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)


def test_readme_first_command_runs_in_a_fresh_clone_root(tmp_path: Path) -> None:
    """README's first command, in the root of a fresh clone, with tbon installed by `pip install
    .` (not editable): the clone's own top-level tbon/ folder, first on sys.path for `python -m`
    run from there, must not hide the installed package from the processes tbon starts. The
    dependencies and the build backend come from this environment (no package index: a .pth
    file in the new environment names a folder of links to them), and pip is run as a module of
    the new environment's interpreter; the last step is README's, word for word. The clone has this
    checkout's uncommitted changes too, so that the test checks the tree it runs in."""
    git = shutil.which("git")
    assert git, "git is needed to clone the checkout"
    clone = tmp_path / "clone"
    venv = clone / ".venv"
    done = subprocess.run(
        [git, "clone", "--quiet", str(ROOT), str(clone)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    _copy_working_tree(clone)
    done = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    deps = _dependencies_of_this_environment(tmp_path / "deps")
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "dependencies.pth").write_text(f"{deps}\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    install = [*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", "."]
    done = subprocess.run(install, capture_output=True, text=True, cwd=clone, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (venv / "bin" / "tbon").exists()
    assert list(site.glob("tbon/overlay/launch/local.py")), "installed as files, not editable"

    command = readme_commands()[0].split("&&")[-1].strip()
    assert command == "PATH=$PWD/.venv/bin:$PATH tbon start --test-size=4 tbon status"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TBON_", "PMI_", "PYTHON"))}
    env.update(PWD=str(clone), PATH="/usr/bin:/bin")
    run = subprocess.Popen(
        command,
        shell=True,
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, err
    assert "Error while finding module" not in err
    ranks = re.findall(r"^\W*(\d+) \S+: full$", out, flags=re.MULTILINE)
    assert sorted(ranks) == ["0", "1", "2", "3"], out
