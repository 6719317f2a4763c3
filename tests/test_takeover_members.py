"""The root group's members in the sibling topology (kary:4, K=2: ranks 1 and 2 are the root's
children side by side), with real brokers (docs/protocol.md §13.4 to §13.6): a partition of the
root (SIGSTOP past tbon.timeout, a takeover, SIGCONT: the old root grants nothing and leaves
77), and the death of a standby alone (grants go on, its rank is refilled, and the new broker
is a standby again)."""

from __future__ import annotations

import os
import signal
from typing import Any

from conftest import DEADLINE, Instance, child_env, process_gone, tbon, wait_for
from test_takeover import all_uris, wait_through

SIBLINGS = ("tbon.standbys=2", "tbon.topo=kary:4")
SHORT = ("tbon.heartbeat=200ms", "tbon.torpid=0", "tbon.timeout=2s")


def state(status: dict, rank: int) -> str:
    return status["ranks"][rank]["state"]


def stop_the_root_until_taken_over(inst: Instance, uris: str, tmp_path) -> tuple[int, Any, Any]:
    """SIGSTOP rank 0 past tbon.timeout until rank 1 has taken over; a FLUB join through the
    new root (rank 9) granted meanwhile, and a joiner of the stopped root's URI only (rank 10)
    started; then SIGCONT. Returns the old root's pid and the two joiners."""
    old_root_uri = uris.split(",")[0]
    old = inst.pid(0)
    os.kill(old, signal.SIGSTOP)
    try:
        taken = wait_through(  # rank 1 canvasses first; under load rank 2 may win: right too
            inst,
            uris,
            lambda s: s["root"] in (1, 2) and state(s, 0) == "lost",
            "a standby to take over from the stopped root",
        )
        root = taken["root"]
        new_root_uri = uris.split(",")[root]
        why = f"the root died; rank {root} took over in term "
        assert why in taken["ranks"][0]["reason"], taken
        joiner = inst.join("broker.rank=9", boot=[new_root_uri], log=tmp_path / "joiner.log")
        try:
            wait_through(inst, uris, lambda s: state(s, 9) == "online", "rank 9 granted")
        except AssertionError as error:
            said = (tmp_path / "joiner.log").read_text()
            raise AssertionError(f"{error}; joiner: {said}") from None
        stale_joiner = inst.join("broker.rank=10", boot=[old_root_uri])
    finally:
        os.kill(old, signal.SIGCONT)
    return old, joiner, stale_joiner


STOPPED = ("size=11", *SIBLINGS, *SHORT, "broker.join-timeout=6s")


def test_a_stopped_root_among_sibling_standbys_grants_nothing_once_woken(
    instance, tmp_path
) -> None:
    inst = instance(9, *STOPPED)
    uris = all_uris(inst)
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"] if r["pid"]}
    _, joiner, stale_joiner = stop_the_root_until_taken_over(inst, uris, tmp_path)
    # the woken root has no lease: its joiner is refused (75: grants paused, ask again)
    code = stale_joiner.wait(timeout=60)
    assert stale_joiner.stderr is not None
    said = stale_joiner.stderr.read()
    assert code == 75, (code, said)
    # asked through the new root's URI: until the woken root has left (superseded, the test
    # below), it is the first live entry of the list, and answers from its table as of its pause
    status = wait_through(
        inst,
        uris.split(",")[1],
        lambda s: all(state(s, r) == "online" for r in range(1, 10)),
        "ranks 1 to 9 online under the new root",
    )
    assert status["root"] in (1, 2) and state(status, 0) == "lost", status
    assert state(status, 10) == "vacant", status["ranks"][10]  # the old root granted nothing
    assert all(status["ranks"][r]["pid"] == pid for r, pid in before.items() if r), status
    assert joiner.poll() is None and status["ranks"][9]["pid"] == joiner.pid


def test_a_stopped_root_among_sibling_standbys_leaves_superseded_once_woken(
    instance, tmp_path
) -> None:
    """Woken with no link to any member (they all dropped it on electing another), the old root
    steps down when its lease lapses, finds nothing attached, and asks the members whose cards
    it holds: the one that took over refuses it with its term, and it leaves superseded (77),
    having granted nothing (docs/protocol.md §13.5)."""
    inst = instance(9, *STOPPED)
    uris = all_uris(inst)
    old, _, stale_joiner = stop_the_root_until_taken_over(inst, uris, tmp_path)
    try:
        wait_for(lambda: process_gone(old), "the woken root to leave", 30)
    finally:
        stale_joiner.wait(timeout=60)
    err = inst.stderr()
    assert "superseded: rank " in err and " is the root in term " in err, err
    assert f"rank 0 (pid {old}) exited with status 77" in err, err
    status = wait_through(
        inst, uris, lambda s: s["root"] in (1, 2), "the URI list to answer from the new root"
    )
    assert state(status, 10) == "vacant", status["ranks"][10]  # the old root granted nothing
    assert all(state(status, r) == "online" for r in range(1, 10)), status["ranks"]


def test_a_dead_standby_does_not_stop_grants_and_its_refill_stands_by_again(
    instance, tmp_path
) -> None:
    # kary:4 with 5 ranks: rank 2 has no children; the spare rank 5 is below rank 1
    inst = instance(5, "size=6", *SIBLINGS, *SHORT)
    old = inst.pid(2)
    os.kill(old, signal.SIGKILL)
    lost = inst.wait_status(lambda s: state(s, 2) == "lost", "rank 2 lost")
    assert lost["root"] == 0 and lost["standbys"] == [1, 2], lost
    # grants go on: the root and rank 1 are a majority of three
    joiner = inst.join("broker.rank=5", log=tmp_path / "joiner.log")
    try:
        inst.wait_status(lambda s: state(s, 5) == "online", "rank 5 granted")
    except AssertionError as error:
        said = (tmp_path / "joiner.log").read_text()
        raise AssertionError(f"{error}; joiner: {said}") from None
    assert joiner.poll() is None
    # the lost standby's rank is refilled by expand, and the new broker holds the log again
    filled = tbon("expand", "-r", "2", "--json", "--timeout", "30s", inst.uri)
    assert filled.returncode == 0, (filled.stdout, filled.stderr)
    new_pid = inst.pid(2)
    inst.broker_pids.add(new_pid)
    assert new_pid != old
    # an event after the refill: the new rank 2 must acknowledge it like rank 1 does
    retired = tbon("retire", inst.uri, "5")
    assert retired.returncode == 0, retired.stderr
    assert joiner.wait(timeout=DEADLINE) == 0

    def standing_by(status: dict) -> bool:
        group = status.get("group") or {}
        acked = {entry["rank"]: entry["acked"] for entry in group.get("standbys", [])}
        return (
            state(status, 2) == "online"
            and status["ranks"][2]["incarnation"] == 2
            and status["standbys"] == [1, 2]
            and acked.get(2, -1) >= group["commit"]
            and not group["paused"]
        )

    inst.wait_status(standing_by, "the refilled rank 2 to hold the whole log")
    with inst.client() as client:  # its replica equals the root's
        wait_for(
            lambda: (
                client.rpc("group.state", nodeid=2)["digest"]
                == client.rpc("group.state", nodeid=0)["digest"]
            ),
            "rank 2's replica to equal the root's",
        )
    # and it is a standby in earnest: with the root killed now, a takeover still happens
    uris = all_uris(inst)
    os.kill(inst.pid(0), signal.SIGKILL)

    def attached(s: dict) -> bool:  # an adrift rank (no link yet) is not reached by exec
        return (
            s["root"] in (1, 2)
            and state(s, 0) == "lost"
            and all(
                s["ranks"][r].get("attached_to") is not None for r in range(1, 5) if r != s["root"]
            )
        )

    taken = wait_through(inst, uris, attached, "a takeover, ranks 1-4 attached under it")
    assert taken["ranks"][2]["pid"] == new_pid and state(taken, 2) == "online", taken
    ran = tbon("exec", "-r", "1-4", "true", env={**child_env(), "TBON_URI": uris})
    assert ran.returncode == 0, ran.stderr
