"""The job-life machine (overlay/state/joblife.py) and the CLI's pure pieces for how jobs end
(cli/failures.py, cli/interrupts.py), without sockets or processes."""

from __future__ import annotations

import signal

from hypothesis import given
from hypothesis import strategies as st

from tbon.cli.failures import failure_lines
from tbon.cli.interrupts import Interrupts
from tbon.overlay.state.joblife import Finish, JobLife, Life, ReadFreely, SignalGroup

KILL = SignalGroup(signal.SIGKILL)


def test_the_group_is_killed_when_the_main_process_ends_and_the_job_is_done_at_eof() -> None:
    life = JobLife()
    assert life.stream_closed() == []  # stderr closed early: the command still runs
    assert life.exited() == [KILL]
    assert life.life is Life.ENDED
    assert life.stream_closed() == [Finish()]
    assert life.life is Life.DONE


def test_a_job_whose_output_closed_first_is_done_as_it_ends() -> None:
    life = JobLife()
    life.stream_closed()
    life.stream_closed()
    assert life.exited() == [KILL, Finish()]


def test_a_running_job_keeps_its_window_even_abandoned() -> None:
    life = JobLife()
    assert life.signalled(signal.SIGKILL) == [KILL]
    assert life.abandoned and not life.may_read(credit_left=False)  # a live flood stays metered
    assert life.exited() == [KILL, ReadFreely()]
    assert life.may_read(credit_left=False)


def test_a_kill_after_the_end_frees_a_stalled_job() -> None:
    """The job ended while stalled for credit; then its client went (SIGKILL from its broker)."""
    life = JobLife()
    life.exited()
    assert not life.may_read(credit_left=False)
    assert life.signalled(signal.SIGKILL) == [ReadFreely()]
    assert life.may_read(credit_left=False)
    assert life.signalled(signal.SIGKILL) == []  # said once


def test_other_signals_are_passed_on_and_abandon_only_from_the_broker() -> None:
    life = JobLife()
    assert life.signalled(signal.SIGINT) == [SignalGroup(signal.SIGINT)]
    assert not life.abandoned
    assert life.signalled(signal.SIGTERM, by_broker=True) == [SignalGroup(signal.SIGTERM)]
    assert life.abandoned
    life.exited()
    assert life.signalled(signal.SIGINT) == []  # the group is dead already


EVENTS = st.lists(
    st.sampled_from(["exit", "close", "kill", "int", "broker"]), min_size=0, max_size=12
)


@given(EVENTS)
def test_finish_comes_once_and_only_after_the_end_and_both_streams(events: list[str]) -> None:
    life = JobLife()
    exited = closed = finishes = 0
    for event in events:
        if event == "exit":
            done = life.exited()
            exited = 1
        elif event == "close":
            if closed == 2:
                continue  # a pipe ends once
            done = life.stream_closed()
            closed += 1
        elif event == "kill":
            done = life.signalled(signal.SIGKILL)
        elif event == "int":
            done = life.signalled(signal.SIGINT)
        else:
            done = life.signalled(signal.SIGTERM, by_broker=True)
        if Finish() in done:
            finishes += 1
            assert exited and closed == 2
        if life.life is not Life.RUNNING:
            assert SignalGroup(signal.SIGINT) not in done  # none after the group was killed
    assert finishes == (1 if exited and closed == 2 else 0)


def test_failures_alike_share_a_line_in_rank_order() -> None:
    status = {0: 0, 1: 1, 2: 1, 3: 137, 4: 127, 5: 1, 7: 130}
    signals = {3: signal.SIGKILL, 7: signal.SIGINT}
    notes = {4: "x: command not found"}
    assert failure_lines(status, signals, notes) == [
        "ranks 1-2,5: exit 1",
        "rank 3: killed by SIGKILL",
        "rank 4: x: command not found",
        "rank 7: killed by SIGINT",
    ]
    # a signal tbon exec passed on is what the user asked for: not named
    assert failure_lines(status, signals, notes, passed={signal.SIGINT})[-1] == (
        "rank 4: x: command not found"
    )
    assert failure_lines({0: 0, 1: 0}, {}, {}) == []


def test_ctrl_c_climbs_within_a_second_and_starts_again_after() -> None:
    presses = Interrupts()
    assert presses.press(10.0) == signal.SIGINT
    assert presses.press(10.5) == signal.SIGTERM
    assert presses.press(11.4) == signal.SIGKILL
    slow = Interrupts()
    assert [slow.press(t) for t in (0.0, 1.5, 3.0)] == [signal.SIGINT] * 3
    assert slow.press(3.2) == signal.SIGTERM
