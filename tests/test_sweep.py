"""Run directories left by brokers killed -9 are swept, and nothing else is (links/sweep.py):
the decision from facts alone, then real directories, then real brokers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DEADLINE, tbon, wait_for
from hypothesis import given
from hypothesis import strategies as st

from tbon.overlay.links.sweep import Facts, Socket, named_pid, run_directory_name, sweep, verdict

ME = os.getuid()
DEAD = "tbon-4242-0123456789ab"


def facts(**changes: object) -> Facts:
    """A broker's run directory of ours whose broker is gone: swept, unless `changes` say
    otherwise."""
    base = {
        "name": DEAD,
        "directory": True,
        "owner": ME,
        "me": ME,
        "alive": False,
        "socket": Socket.REFUSING,
    }
    return Facts(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "swept"),
    [
        ({}, True),
        ({"alive": True}, False),  # its broker lives
        ({"socket": Socket.LISTENING}, False),  # a broker listens (another PID namespace)
        ({"socket": Socket.ABSENT}, False),  # still starting, as far as anyone can tell
        ({"socket": Socket.UNKNOWN}, False),
        ({"owner": ME + 1}, False),  # another user's
        ({"directory": False}, False),  # a symbolic link, or a file
        ({"name": "tbon-start-abc"}, False),  # not a broker's: tbon start's, or anything else
        ({"name": "tbon-4242-0123456789ab.old"}, False),
        ({"name": "tbon-0-0123456789ab"}, False),
        ({"name": DEAD + ".swept-77", "socket": Socket.ABSENT}, True),  # its sweeper died
        ({"name": DEAD + ".swept-77", "alive": True}, False),  # its sweeper is at work
        ({"name": DEAD + ".swept-77", "owner": ME + 1}, False),
    ],
)
def test_a_directory_is_swept_only_if_every_fact_says_its_broker_is_gone(changes, swept) -> None:
    assert verdict(facts(**changes)) is swept


@given(
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(list(Socket)),
    st.sampled_from([DEAD, DEAD + ".swept-9", "tbon-x", "tbon-12-abc"]),
)
def test_a_sweep_needs_all_of_its_reasons(directory, ours, alive, probe, name) -> None:
    got = facts(name=name, directory=directory, owner=ME if ours else ME + 1, alive=alive)
    got = Facts(got.name, got.directory, got.owner, got.me, got.alive, probe)
    if verdict(got):
        assert named_pid(name) is not None and directory and ours and not alive
        assert probe is Socket.REFUSING or ".swept-" in name


def test_names_carry_the_pid_of_the_broker_or_of_its_sweeper() -> None:
    name = run_directory_name(1234)
    assert named_pid(name) == 1234 and verdict(facts(name=name))
    assert named_pid(name + ".swept-99") == 99 and named_pid("tbon-start-x") is None


# --- real directories -----------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def rundir(parent: Path, pid: int, listening: bool | None) -> tuple[Path, socket.socket | None]:
    """A run directory named for `pid`, with a socket that listens (True), one whose listener
    has closed (False: it refuses), or none (None)."""
    path = parent / run_directory_name(pid)
    path.mkdir(mode=0o700)
    if listening is None:
        return path, None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path / "local"))
    listener.listen()
    if listening:
        return path, listener
    listener.close()  # the file stays: a broker killed -9
    return path, None


@pytest.fixture
def parent() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sw", dir="/tmp") as path:
        yield Path(path)


def test_only_the_dead_brokers_directories_go(parent: Path) -> None:
    dead = dead_pid()
    gone, _ = rundir(parent, dead, listening=False)
    live, listener = rundir(parent, os.getpid(), listening=True)
    starting, _ = rundir(parent, dead, listening=None)
    namespaced, other = rundir(parent, dead, listening=True)  # a PID from elsewhere, listening
    target, _ = rundir(parent, dead, listening=False)
    link = parent / run_directory_name(dead)
    link.symlink_to(target)  # a link named like a dead broker's: never followed, never removed
    (parent / "tbon-start-x").mkdir()
    try:
        removed = sweep(str(parent))
    finally:
        for held in (listener, other):
            assert held is not None
            held.close()
    assert sorted(removed) == sorted([gone.name, target.name])
    assert not gone.exists() and not target.exists()
    assert live.exists() and starting.exists() and namespaced.exists() and link.is_symlink()
    assert (parent / "tbon-start-x").exists()


def _sweep_into(parent: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    results.put(sweep(parent))


def test_two_sweepers_at_once_remove_each_directory_once(parent: Path) -> None:
    dead = dead_pid()
    made = {rundir(parent, dead, listening=False)[0].name for _ in range(40)}
    for path in list(parent.iterdir())[:10]:  # deep enough that removal takes a while
        (path / "a" / "b").mkdir(parents=True)
        (path / "a" / "b" / "f").write_text("x")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    sweepers = [context.Process(target=_sweep_into, args=(str(parent), results)) for _ in range(2)]
    for sweeper in sweepers:
        sweeper.start()
    got = [results.get(timeout=DEADLINE) for _ in sweepers]
    for sweeper in sweepers:
        sweeper.join(DEADLINE)
        assert sweeper.exitcode == 0
    assert sorted(got[0] + got[1]) == sorted(made)  # each once, by one sweeper or the other
    assert list(parent.iterdir()) == []


# --- real brokers ---------------------------------------------------------------------------


def test_a_killed_joiners_run_directory_is_swept_by_the_next_broker(
    instance, monkeypatch, parent: Path
) -> None:
    """Two brokers join (their run directories in $TMPDIR); one is killed -9 and leaves its
    directory; the next broker that starts there sweeps it, and the live one's stays."""
    monkeypatch.setenv("TMPDIR", str(parent))
    inst = instance(4, "size=6")
    first, second = inst.join(), inst.join()
    inst.wait_status(lambda s: sum(r["state"] == "online" for r in s["ranks"]) == 6, "joined")

    def rundir_of(pid: int) -> Path:
        [path] = parent.glob(f"tbon-{pid}-*")
        return path

    killed, kept = rundir_of(first.pid), rundir_of(second.pid)
    first.send_signal(signal.SIGKILL)
    first.wait(DEADLINE)
    assert killed.exists()  # nobody removed it
    third = inst.join()  # joins a rank freed by the kill, or is refused: either way it starts
    wait_for(lambda: not killed.exists(), "the killed joiner's run directory swept")
    assert kept.exists() and rundir_of(third.pid).exists()
    assert tbon("status", inst.uri).returncode == 0
