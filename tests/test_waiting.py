"""Commands never hang without a word: a bounded wait for an answer, a line at a terminal while
something legitimately takes long, and an end at once on SIGTERM (overlay/connectors/patience.py).
A stopped broker (SIGSTOP) is the broker that answers nothing."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import DEADLINE, TBON, child_env, start_exec, tbon, wait_for
from test_terminal import Terminal

from tbon.overlay.connectors.patience import (
    ANSWER_WAIT,
    PROBE_AFTER,
    PROBE_MOST,
    Patience,
    Silence,
    limit_of,
)

# --- the decisions, without a process --------------------------------------------------------


def test_a_timeout_of_0_is_no_limit_and_none_is_the_answer_wait() -> None:
    assert limit_of(None) == ANSWER_WAIT
    assert limit_of(0.0) is None
    assert limit_of(2.5) == 2.5


def test_patience_gives_up_at_its_limit_and_says_so_every_second_meanwhile() -> None:
    patience = Patience("rank 0", 3.0, started=100.0, progress=True)
    assert patience.line(100.5) is None and not patience.expired(100.5)
    assert patience.wait(100.5) == 0.5  # the first line is due at 101
    assert patience.line(101.0) == "waiting for rank 0: no answer for 1 s"
    assert patience.line(101.5) is None
    assert patience.line(102.2) == "waiting for rank 0: no answer for 2 s"
    assert patience.expired(103.0)
    assert patience.failure() == ("no answer from rank 0 within 3s (is it stopped or overloaded?)")


def test_patience_without_a_terminal_or_a_limit_sleeps_until_the_answer() -> None:
    patience = Patience("rank 0", None, started=0.0, progress=False)
    assert patience.wait(50.0) is None and patience.line(50.0) is None
    assert not patience.expired(1e9)


def test_silence_pings_quiet_ranks_and_names_those_whose_broker_does_not_answer() -> None:
    silence = Silence.of([2, 3], now=0.0)
    assert silence.probes(0.1) == []
    assert silence.probes(PROBE_AFTER) == [2, 3]
    silence.hear(2, PROBE_AFTER + 0.01)  # rank 2's broker answered its ping
    assert silence.line(2 * PROBE_AFTER) == "waiting for rank 3: no answer for 1 s"
    silence.done(3)
    assert silence.line(3.0) == ""  # nobody silent any more: the line is wiped


def test_silence_pings_at_most_a_round_a_second_however_many_ranks() -> None:
    silence = Silence.of(list(range(1000)), now=0.0)
    first = silence.probes(PROBE_AFTER)
    assert len(first) == PROBE_MOST
    assert silence.probes(PROBE_AFTER + 0.1) == []
    assert len(silence.probes(PROBE_AFTER + 1.0)) == PROBE_MOST
    assert silence.wait(PROBE_AFTER + 1.0) is not None


# --- real brokers, stopped ---------------------------------------------------------------------


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The broker `pid` (ours) stopped while the block runs, and woken whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def processes_naming(text: str) -> list[int]:
    """The processes whose command line holds `text` (a path unique to one test)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if text.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_status_gives_up_on_a_stopped_rank_0_after_its_answer_wait(instance) -> None:
    inst = instance(2)
    with stopped(inst.pid(0)):
        result = tbon("status", inst.uri)
        paged = tbon("status", inst.uri, "--json", "--timeout", "1s")  # its first page
    assert result.returncode == 1, result
    assert result.stderr == (
        f"tbon status: no answer from rank 0 within {ANSWER_WAIT:g}s (is it stopped or "
        "overloaded?)\n"
    )
    # --json, which streams the table in pages, prints nothing only with a reason and status 1
    assert (paged.returncode, paged.stdout) == (1, ""), paged
    assert paged.stderr.startswith("tbon status: no answer from rank 0 within 1s"), paged


def test_ping_gives_up_on_a_stopped_leaf_after_its_timeout(instance) -> None:
    inst = instance(3)
    with stopped(inst.pid(2)):
        result = tbon("ping", inst.uri, "2", "--timeout", "1s")
    assert result.returncode == 1, result
    assert result.stderr.startswith("tbon ping: no answer from rank 2 within 1s")


def test_exec_ends_at_once_on_sigterm_and_leaves_no_job_behind(instance, tmp_path: Path) -> None:
    inst = instance(4)
    job = "import os, sys, time; open(sys.argv[1] + os.environ['TBON_RANK'], 'w'); time.sleep(600)"
    mark = f"{tmp_path}/ran-"
    with stopped(inst.pid(3)):
        running = start_exec(inst.uri, "-r", "2,3", sys.executable, "-c", job, mark)
        try:
            wait_for(lambda: os.path.exists(mark + "2"), "the job on rank 2 to start")
            running.send_signal(signal.SIGTERM)
            _, err = running.communicate(timeout=DEADLINE)
        finally:
            if running.poll() is None:
                running.kill()
                running.communicate()
    assert running.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "tbon exec: ended by SIGTERM", err
    # Rank 3, woken, reads what was sent to it meanwhile (the job, its signal, its client gone)
    # before it answers this ping: then no job of this exec may be left on any rank.
    with inst.client() as client:
        client.rpc("broker.ping", nodeid=3, timeout=DEADLINE)
    wait_for(lambda: not processes_naming(mark), "every job of the exec to end")


def test_a_waiting_command_at_a_terminal_says_whom_it_waits_for(instance) -> None:
    inst = instance(4)
    with stopped(inst.pid(3)):
        term = Terminal([TBON, "exec", inst.uri, "-r", "2,3", "true"], child_env(TERM="dumb"))
        try:
            term.expect(r"tbon exec: waiting for rank 3: no answer for \d+ s")
            os.killpg(term.process.pid, signal.SIGTERM)
        finally:
            code = term.close()
    assert code == 128 + signal.SIGTERM
    assert "Traceback" not in term.screen


def test_status_at_a_terminal_says_it_waits_for_rank_0(instance) -> None:
    inst = instance(2)
    with stopped(inst.pid(0)):
        term = Terminal([TBON, "status", inst.uri], child_env(TERM="dumb"))
        try:
            term.expect(r"tbon status: waiting for rank 0: no answer for 1 s")
            os.killpg(term.process.pid, signal.SIGHUP)
        finally:
            code = term.close()
    assert code == 128 + signal.SIGHUP
    assert "Traceback" not in term.screen
