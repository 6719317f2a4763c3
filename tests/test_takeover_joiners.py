"""An instance whose every launched broker has gone lives on in the brokers that joined it
(docs/protocol.md §13.4): with both standbys refilled by `tbon expand` and rank 0 killed, a
joiner leads; `tbon start` keeps running, and its run directory, which holds the joiners'
sockets, with it, until it is told to stop, when it asks a joiner to shut the instance down.
Before, it ended as soon as its own brokers had, removed the joiners' sockets, and left them
running unreachable (seen in the churn soak, tests/test_churn_root.py)."""

from __future__ import annotations

import json
import os
import signal

from conftest import process_gone, tbon, wait_for
from test_takeover import wait_through
from test_takeover_members import state
from test_takeover_siblings import uris_of

ATTRIBUTES = ("tbon.standbys=2", "tbon.heartbeat=200ms", "tbon.torpid=0", "tbon.timeout=2s")


def test_the_instance_lives_on_in_joiners_once_every_launched_broker_is_gone(instance) -> None:
    inst = instance(3, *ATTRIBUTES)
    joined: dict[int, int] = {}
    for rank in (1, 2):
        os.kill(inst.pid(rank), signal.SIGKILL)
        inst.wait_status(lambda s, r=rank: state(s, r) == "lost", f"rank {rank} lost")
        filled = tbon("expand", "-r", str(rank), "--json", "--timeout", "30s", inst.uri)
        assert filled.returncode == 0, (filled.stdout, filled.stderr)
        pid = json.loads(filled.stdout)["joined"][0]["pid"]
        inst.broker_pids.add(pid)  # checked gone at the instance's stop
        joined[rank] = pid

        def standing_by(status: dict, r: int = rank) -> bool:
            group = status.get("group") or {}
            acked = {e["rank"]: e["acked"] for e in group.get("standbys", [])}
            return (
                state(status, r) == "online"
                and acked.get(r, -1) >= group["commit"]
                and not group["paused"]
            )

        inst.wait_status(standing_by, f"the refilled rank {rank} to hold the whole log")
    uris = uris_of(inst)  # taken again: it names the joiners' sockets
    os.kill(inst.pid(0), signal.SIGKILL)

    def taken(s: dict) -> bool:
        return s["root"] in (1, 2) and state(s, 0) == "lost"

    last = wait_through(inst, uris, taken, "a refilled standby to take over")
    assert {r: last["ranks"][r]["pid"] for r in (1, 2)} == joined, last
    assert inst.process.poll() is None, inst.stderr()[-3000:]
    assert "the instance lives on in brokers that joined" in inst.stderr()
    # told to stop, tbon start asks a joiner to shut the instance down, and every joiner leaves
    inst.process.send_signal(signal.SIGTERM)
    wait_for(lambda: all(process_gone(pid) for pid in joined.values()), "the joiners to leave")
