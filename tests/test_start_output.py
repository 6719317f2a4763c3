"""What `tbon start` says on stderr: each thing once, in whole lines, and nothing about a command's
own exit status (issue 22)."""

from __future__ import annotations

import os
import re
import signal

from conftest import DEADLINE, process_gone, tbon, wait_for

from tbon.overlay.parse.idset import parse_idset

WHOLE_LINE = re.compile(r"^(tbon start: |\S+ tbon-broker\[\d+\]: )")
"""Every line on tbon start's stderr is its own or a broker's log line, never a mix of the two."""


def start_lines(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    pieces = [line for line in lines if not WHOLE_LINE.match(line)]
    assert not pieces, f"lines written in pieces or mixed: {pieces}"
    return [line for line in lines if line.startswith("tbon start: ")]


def ranks_named(line: str) -> list[int]:
    found = re.match(r"tbon start: (?:stopping )?(?:rank (\d+) \(pid \d+\)|ranks ([\d,-]+))", line)
    assert found, line
    return [int(found[1])] if found[1] else parse_idset(found[2])


def test_a_commands_own_exit_status_adds_no_line() -> None:
    """The initial program's status is tbon start's: no `rank 0 ... exited with status 3`."""
    result = tbon("start", "--test-size=2", "sh", "-c", "exit 3")
    assert result.returncode == 3
    assert result.stderr == ""
    signalled = tbon("start", "--test-size=2", "sh", "-c", "kill -KILL $$")
    assert signalled.returncode == 128 + signal.SIGKILL
    assert signalled.stderr == ""


def test_after_rank_0_is_killed_each_rank_is_named_once(instance) -> None:
    """kill -9 of rank 0: one line says so; the brokers left are stopped (SIGTERM) once and named
    once, and rank 2, stopped with SIGSTOP so that SIGTERM cannot end it, gets one SIGKILL a
    grace later, with nothing more said."""
    inst = instance(3, "tbon.fanout=2", exit_timeout="1s")
    rank0, rank2 = inst.pid(0), inst.pid(2)
    os.kill(rank2, signal.SIGSTOP)
    os.kill(rank0, signal.SIGKILL)
    code = inst.process.wait(timeout=DEADLINE)
    wait_for(lambda: process_gone(rank2), "the stopped rank 2 to be killed")
    assert code == 128 + signal.SIGKILL
    said = start_lines(inst.stderr())
    assert said[0] == f"tbon start: rank 0 (pid {rank0}) killed by signal SIGKILL", said
    named = [rank for line in said for rank in ranks_named(line)]
    assert sorted(named) == sorted(set(named)), said
    assert 2 in named, said
    assert len(said) <= 3, said
