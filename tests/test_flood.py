"""A connection flood on rank 0's tree port never locks local users out (docs/design.md §14).

The brokers run with RLIMIT_NOFILE lowered to 256 and the flood holds 400 connections from
127.0.0.2 (another address of this host): half of them silent, half greeting-only (a ZMTP 3
greeting for CURVE, then nothing), each one the broker closes opened again. Without the caps on
strangers rank 0 runs out of descriptors and refuses its local clients. With them, status, exec
on every rank and a FLUB join (from 127.0.0.1) go through while the flood lasts, and the flood
is logged by interval, not by connection.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from conftest import DEADLINE, TBON, Instance, child_env, tbon, wait_for
from flooder import Flooder

NOFILE = 256
FLOOD = 400  # connections held at once: past the limit


def during(flood: Flooder, *argv: str) -> tuple[int, str, str]:
    """Run `tbon ARGV` to its end while the flood goes on: (exit code, stdout, stderr)."""
    process = subprocess.Popen(
        [TBON, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        deadline = time.monotonic() + 3 * DEADLINE
        while process.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"tbon {' '.join(argv)} did not end within the deadline")
            flood.pump(0.01)
        out, err = process.communicate()
        return process.returncode, out, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def tree_port(inst: Instance) -> int:
    result = tbon("attr", inst.uri, "get", "tbon.endpoint")
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().rsplit(":", 1)[1])


def test_a_flood_past_the_descriptor_limit_locks_no_local_user_out(instance) -> None:
    inst = instance(2, "size=3", "tbon.endpoint=tcp://127.0.0.1:*", nofile=NOFILE)
    rank0 = inst.pid(0)
    with Flooder(("127.0.0.1", tree_port(inst)), FLOOD, source="127.0.0.2") as flood:
        deadline = time.monotonic() + DEADLINE
        # it has hit: rank 0 closed some past its caps, or holds all the descriptors it may
        while flood.closed_by_peer == 0 and len(os.listdir(f"/proc/{rank0}/fd")) < NOFILE - 1:
            assert time.monotonic() < deadline, f"flood: {flood.opened} opened, none closed"
            flood.pump(0.01)

        code, out, err = during(flood, "status", inst.uri, "--json")
        assert code == 0, err
        assert [r["state"] for r in json.loads(out)["ranks"]] == ["online", "online", "vacant"]
        code, out, err = during(flood, "exec", "-r", "all", inst.uri, "echo", "hi")
        assert (code, out.count("hi")) == (0, 2), err
        code, out, err = during(flood, "expand", inst.uri, "-n", "1")
        assert code == 0, err
        assert flood.opened > FLOOD  # it went on all along

    status = inst.status()
    assert [r["state"] for r in status["ranks"]] == ["online"] * 3
    lines = [line for line in inst.stderr().splitlines() if "connection flood" in line]
    assert 1 <= len(lines) <= 5, lines  # by interval, not by connection


def test_the_end_of_a_flood_is_logged_on_time_by_an_idle_broker(instance) -> None:
    """The flood's next line is a deadline set from connection events: it wakes the broker.
    Rank 0, alone and beating nobody for an hour, says the flood is over about an interval
    (10 s) after it ends, not at its next wake-up for anything else."""
    endpoint = "tbon.endpoint=tcp://127.0.0.1:*"
    inst = instance(1, "size=2", "tbon.heartbeat=1h", endpoint, nofile=NOFILE)
    with Flooder(("127.0.0.1", tree_port(inst)), FLOOD, source="127.0.0.2") as flood:
        deadline = time.monotonic() + DEADLINE
        while "connection flood on the tree port" not in inst.stderr():
            assert time.monotonic() < deadline, f"flood: {flood.opened} opened, no line logged"
            flood.pump(0.01)
    wait_for(
        lambda: "the connection flood on the tree port is over" in inst.stderr(),
        "the end of the flood logged",
        timeout=60.0,
    )
