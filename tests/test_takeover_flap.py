"""A root that took over is itself stopped past tbon.timeout while the other members elect
another (K=4, docs/protocol.md §13.4, §13.5): its subtree moves to the root of the later term
with every pid kept; woken, it is passed over by a URI list (it says it is adrift) and leaves
superseded (77)."""

from __future__ import annotations

import os
import signal
import time

from conftest import child_env, process_gone, tbon, wait_for
from test_takeover import status_through, wait_through
from test_takeover_members import state

STALL = 2.0
"""Seconds the root is stopped: past its lease and quiet (0.4 + 0.5 s) and a canvass, well short
of tbon.timeout (4 s), so no link is judged lost."""

FOUR = ("tbon.standbys=4", "tbon.topo=kary:4", "tbon.heartbeat=200ms", "tbon.torpid=0")


def test_a_stalled_root_that_is_replaced_keeps_its_subtree(instance) -> None:
    inst = instance(13, *FOUR, "tbon.timeout=3s")
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0, listed.stderr
    uris = listed.stdout.strip()
    os.kill(inst.pid(0), signal.SIGKILL)
    taken = wait_through(inst, uris, lambda s: s["root"] not in (None, 0), "a first takeover")
    first = taken["root"]
    pid = {r["rank"]: r["pid"] for r in taken["ranks"] if r["pid"]}
    os.kill(pid[first], signal.SIGSTOP)
    try:
        wait_through(
            inst, uris, lambda s: s["root"] not in (None, 0, first), "a second root elected"
        )
    finally:
        os.kill(pid[first], signal.SIGCONT)
    # woken with its lease long over, the old root says it is adrift: the list passes over it
    # to a broker that reaches the root of the later term, never to its stale table
    woken = status_through(uris)
    assert woken is None or woken["root"] != first, woken["root"]
    others = [r for r in range(1, 13) if r != first]

    def settled(s: dict) -> bool:
        return s["root"] not in (0, first) and all(state(s, r) == "online" for r in others)

    last = wait_through(inst, uris, settled, "every other rank online under the second root")
    for r in others:
        assert last["ranks"][r]["pid"] == pid[r], (r, last["ranks"][r])
    # woken, the stalled root hears of the later term and leaves superseded; its rank is lost
    wait_for(lambda: process_gone(pid[first]), f"rank {first}'s broker to leave")
    said = f"tbon-broker[{first}]: error: superseded: rank {last['root']} is the root in term"
    assert said in inst.stderr(), inst.stderr()[-4000:]
    wait_through(inst, uris, lambda s: state(s, first) == "lost", f"rank {first} lost")
    env = {**child_env(), "TBON_URI": uris}
    ranks = ",".join(map(str, others))
    wait_for(lambda: tbon("exec", "-r", ranks, "true", env=env).returncode == 0, "exec")


def test_a_root_that_took_over_and_stalls_briefly_stays_the_root(instance) -> None:
    """K=2 with rank 0 dead: the root that took over and the other standby are the only
    majority. The root stalls past its lease (not past tbon.timeout): it steps down, and must
    not help elect the other standby, whose win would make it leave (77) with the group's
    majority, and its subtree with it (75). It is elected again; no broker leaves."""
    inst = instance(
        9,
        "tbon.standbys=2",
        "tbon.topo=kary:4",
        "tbon.heartbeat=200ms",
        "tbon.torpid=0",
        "tbon.timeout=4s",
    )
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0, listed.stderr
    uris = listed.stdout.strip()
    os.kill(inst.pid(0), signal.SIGKILL)

    def whole(s: dict) -> bool:
        return s["root"] in (1, 2) and all(state(s, r) == "online" for r in range(1, 9))

    taken = wait_through(inst, uris, whole, "a takeover, every rank online under it")
    pid = {r["rank"]: r["pid"] for r in taken["ranks"] if r["pid"]}
    os.kill(pid[taken["root"]], signal.SIGSTOP)
    try:
        time.sleep(STALL)  # the stimulus: a stall past the lease and quiet, short of the timeout
    finally:
        os.kill(pid[taken["root"]], signal.SIGCONT)
    last = wait_through(inst, uris, whole, "every rank online after the stall")
    for r in range(1, 9):
        assert not process_gone(pid[r]), (r, inst.stderr()[-4000:])
        assert last["ranks"][r]["pid"] == pid[r], (r, last["ranks"][r])
    env = {**child_env(), "TBON_URI": uris}
    wait_for(lambda: tbon("exec", "-r", "1-8", "true", env=env).returncode == 0, "exec")
    assert "error: superseded" not in inst.stderr(), inst.stderr()[-4000:]
