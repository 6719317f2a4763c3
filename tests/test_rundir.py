"""A broker's run directory (broker/startup.py `Rundir`): removed at its end if it made it, empty
or not, and left alone if it did not."""

from __future__ import annotations

from pathlib import Path

from tbon.overlay.broker.startup import Rundir


def test_a_run_directory_the_broker_made_is_removed_empty_or_not(tmp_path: Path) -> None:
    empty = Rundir.make(str(tmp_path / "r%r"), 3)
    assert empty.created and empty.path == str(tmp_path / "r3")
    full = Rundir.make(str(tmp_path / "full"), 0)
    (Path(full.path) / "left").write_text("a file the broker did not remove itself")
    (Path(full.path) / "sub").mkdir()
    empty.remove()
    full.remove()
    assert not Path(empty.path).exists() and not Path(full.path).exists()


def test_a_run_directory_that_was_there_before_is_kept(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    kept = Rundir.make(str(tmp_path / "mine"), 0)
    assert not kept.created
    kept.remove()
    assert (tmp_path / "mine").is_dir()
