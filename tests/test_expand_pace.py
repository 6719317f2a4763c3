"""The window of `tbon expand` (overlay/launch/pace.py): never more booting than the window,
every joiner started once, in order, and an expand of more brokers than its window whose
brokers all join (a real instance)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import start_tbon, tbon, wait_for
from hypothesis import given
from hypothesis import strategies as st

from tbon.overlay.launch.pace import Pace, default_window


def test_the_first_batch_fills_the_window_and_each_settled_joiner_makes_room_for_one() -> None:
    pace = Pace(waiting=10, window=4)
    assert pace.due() == 4
    assert pace.due() == 0  # full: nothing more until one settles
    pace.settled(1)
    assert pace.due() == 1
    pace.settled(3)
    assert pace.due() == 3
    assert (pace.waiting, pace.booting) == (2, 4)


def test_a_window_of_zero_starts_every_joiner_at_once() -> None:
    pace = Pace(waiting=1000, window=0)
    assert pace.due() == 1000
    assert pace.due() == 0


def test_abandoned_joiners_are_never_started_and_the_pace_ends_once_the_booting_settle() -> None:
    pace = Pace(waiting=5, window=2)
    assert pace.due() == 2
    assert pace.abandon() == 3
    assert pace.due() == 0
    assert not pace.over
    pace.settled(2)
    assert pace.over


def test_more_settled_than_booting_is_a_fault_of_the_caller() -> None:
    pace = Pace(waiting=3, window=2)
    pace.due()
    with pytest.raises(ValueError):
        pace.settled(3)


def test_the_default_window_is_per_cpu_and_never_zero() -> None:
    assert default_window() >= 1


@given(
    st.integers(0, 200),
    st.integers(0, 20),
    st.lists(st.tuples(st.integers(0, 30), st.booleans()), max_size=60),
)
def test_never_more_booting_than_the_window_and_every_joiner_started_once(
    total: int, window: int, steps: list[tuple[int, bool]]
) -> None:
    """Random settlements (and an abandon now and then): what is started never exceeds the
    window while booting, and started + abandoned is the total, once it is over."""
    pace = Pace(waiting=total, window=window)
    started = abandoned = 0
    for settle, give_up in [*steps, *[(10**6, False)] * (total + 1)]:
        started += pace.due()
        if window:
            assert pace.booting <= window
        if give_up:
            abandoned += pace.abandon()
        pace.settled(min(settle, pace.booting))
    started += pace.due()
    pace.settled(pace.booting)
    assert pace.over
    assert started + abandoned == total


def test_an_expand_larger_than_its_window_brings_every_broker_online(instance) -> None:
    """A window of 2 for 5 brokers: the window is refilled as they come online, and each one
    joins, as without a window."""
    inst = instance(1, "size=6")
    ran = tbon("expand", inst.uri, "-n", "5", "--window", "2", "--json", timeout=120)
    assert ran.returncode == 0, ran.stderr
    said = json.loads(ran.stdout)
    assert sorted(j["rank"] for j in said["joined"]) == [1, 2, 3, 4, 5]
    assert said["failed"] == []


def test_a_negative_window_is_a_usage_error(instance) -> None:
    inst = instance(1, "size=3")
    ran = tbon("expand", inst.uri, "-n", "1", "--window", "-1")
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr


def _joiners_of(boot_dir: str) -> list[int]:
    """PIDs of the brokers running with this instance's run directory as their boot server's
    (their titles name it: tbon/proctitle.py), rank 0's own excluded."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                said = cmdline.read().decode(errors="replace")
        except OSError:
            continue
        if "broker.boot-server=local://" + boot_dir in said and "tbon expand" not in said:
            found.append(int(pid))
    return found


def test_an_interrupted_paced_expand_leaves_no_broker_that_has_not_joined(instance) -> None:
    """Ctrl-C while a window of 1 holds back the rest: the broker booting is killed with the
    command, those not started never start, and any left running is online."""
    inst = instance(1, "size=6")
    boot_dir = os.path.dirname(inst.uri[len("local://") :])
    expand = start_tbon("expand", inst.uri, "-n", "5", "--window", "1")
    try:
        wait_for(lambda: bool(_joiners_of(boot_dir)), "the first joiner to start")
        expand.send_signal(signal.SIGINT)  # ours, by PID
        expand.communicate(timeout=60)
    finally:
        if expand.poll() is None:
            expand.kill()
            expand.communicate()
    assert expand.returncode == 128 + signal.SIGINT
    left = set(_joiners_of(boot_dir))
    ranks = json.loads(tbon("status", inst.uri, "--json").stdout)["ranks"]
    online = {r["pid"] for r in ranks if r["state"] == "online"}
    assert left <= online, (left, ranks)
