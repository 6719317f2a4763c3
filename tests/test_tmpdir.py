"""Where run directories are made (tbon/tmpdir.py): $TMPDIR wins, else memory, else /tmp."""

from __future__ import annotations

import os

import pytest
from conftest import child_env, tbon

from tbon import tmpdir


def test_tmpdir_set_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/")
    assert tmpdir.parent() == str(tmp_path)


def test_runtime_dir_before_shared_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert tmpdir.parent() == str(tmp_path)


def test_unusable_runtime_dir_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", os.path.join(tmp_path, "missing"))
    monkeypatch.setattr(tmpdir, "SHARED_MEMORY", os.path.join(tmp_path, "no-shm"))
    assert tmpdir.parent() == "/tmp"


def test_shared_memory_when_nothing_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tmpdir, "SHARED_MEMORY", str(tmp_path))
    assert tmpdir.parent() == str(tmp_path)


def test_tbon_start_makes_its_run_directory_there(tmp_path: os.PathLike[str]) -> None:
    """The instance's URI (TBON_URI, as its program sees it) lies under the chosen parent, and
    the directory is gone once the instance has ended."""
    env = child_env(XDG_RUNTIME_DIR=str(tmp_path))
    env.pop("TMPDIR", None)
    done = tbon("start", "--test-size=2", "--", "sh", "-c", 'echo "$TBON_URI"', env=env)
    assert done.returncode == 0, done.stderr
    uri = done.stdout.strip()
    assert uri.startswith(f"local://{tmp_path}/tbon-start-"), uri
    assert os.listdir(tmp_path) == []


def test_tbon_alloc_here_makes_its_run_directories_there(tmp_path: os.PathLike[str]) -> None:
    """`tbon alloc` with the local launcher puts its brokers' run directories where `tbon start`
    puts its own: under $TMPDIR, and nothing is left there once the instance has ended."""
    done = tbon(
        "alloc",
        "-N",
        "2",
        "--launcher",
        "local",
        "sh",
        "-c",
        'echo "$TBON_URI"',
        env=child_env(TMPDIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    uri = done.stdout.strip()
    assert uri.startswith(f"local://{tmp_path}/tbon-alloc-"), uri
    assert os.listdir(tmp_path) == []
