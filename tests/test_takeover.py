"""The takeover (docs/protocol.md §13.4), with real brokers: rank 0 killed, a standby is elected,
takes the table over and answers `tbon status` through its own URI, with the dead root marked
lost through the log."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from conftest import DEADLINE, Instance, child_env, process_gone, tbon, wait_for

from tbon.overlay.connectors.client import Client

# a chain: the standbys (ranks 1 and 2) reach each other by links that outlive rank 0
CHAIN = ("tbon.standbys=2", "tbon.topo=kary:1", "tbon.timeout=30s")


FAILED: list[Any] = []


def status_through(uris: str) -> dict[str, Any] | None:
    """`tbon status --json` with TBON_URI set to a list, or None while it fails."""
    env = {**child_env(), "TBON_URI": uris}
    done = tbon("status", "--json", env=env)
    if done.returncode != 0:
        FAILED[:] = [done.returncode, done.stderr]
        return None
    return json.loads(done.stdout)


def all_uris(inst: Instance) -> str:
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0, listed.stderr
    uris = listed.stdout.strip()
    assert len(uris.split(",")) == 3, uris  # the root and its two standbys
    return uris


def wait_through(
    inst: Instance, uris: str, ok: Any, what: str, timeout: float = DEADLINE, lines: int = 60
) -> dict[str, Any]:
    """The first `tbon status --json` through the URI list that satisfies `ok`; on timeout, the
    last status read and the instance's last `lines` lines of stderr."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        status = status_through(uris)
        if status is None:
            return False
        seen.clear()
        seen.update(status)
        return bool(ok(status))

    try:
        wait_for(check, what, timeout)
    except AssertionError as error:
        tail = "\n".join(inst.stderr().splitlines()[-lines:])
        raise AssertionError(f"{error}; last status {seen} {FAILED}; stderr:\n{tail}") from None
    return seen


def wait_taken_over(inst: Instance, uris: str) -> dict[str, Any]:
    """Wait until the URI list answers with rank 1 as the root and rank 0 lost."""

    def taken_over(status: dict[str, Any]) -> bool:
        return status["root"] == 1 and status["ranks"][0]["state"] == "lost"

    what = "rank 1 to answer as the root, rank 0 lost"
    return wait_through(inst, uris, taken_over, what, lines=40)


def test_a_standby_takes_over_when_the_root_is_killed(instance) -> None:
    inst = instance(5, *CHAIN)
    uris = all_uris(inst)
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    os.kill(before[0], signal.SIGKILL)
    seen = wait_taken_over(inst, uris)
    assert "the root died; rank 1 took over in term" in seen["ranks"][0]["reason"], seen
    assert seen["standbys"] == [0, 2]
    new_root = uris.split(",")[1]

    def replicas_agree() -> bool:  # rank 2 applied the same log, the dead root's Lost too
        with Client(new_root) as client:
            states = [client.rpc("group.state", nodeid=r) for r in (1, 2)]
        return states[0]["digest"] == states[1]["digest"] and states[0]["root"]

    wait_for(replicas_agree, "rank 2's replica to equal the new root's")
    # any broker's URI serves the table's requests: rank 3 heard the new root's lineage
    elsewhere = status_through(new_root.replace("/1/local", "/3/local"))
    assert elsewhere is not None and elsewhere["root"] == 1, FAILED
    after = {r["rank"]: (r["state"], r["pid"]) for r in elsewhere["ranks"]}
    assert all(after[r] == ("online", before[r]) for r in range(1, 5)), after
    ran = tbon("exec", "-r", "1-4", "true", env={**child_env(), "TBON_URI": uris})
    assert ran.returncode == 0, ran.stderr


def test_a_stopped_root_grants_nothing_and_leaves_superseded(instance) -> None:
    inst = instance(5, "size=6", *CHAIN, "broker.join-timeout=6s")
    uris = all_uris(inst)
    old = inst.pid(0)
    os.kill(old, signal.SIGSTOP)
    try:
        wait_taken_over(inst, uris)
        joiner = inst.join()  # asks the stopped root (its URI) for a rank
    finally:
        os.kill(old, signal.SIGCONT)
    wait_for(lambda: process_gone(old), "the woken root to leave")
    assert joiner.wait(timeout=60) != 0  # never granted: the woken root has no lease
    assert "superseded: rank 1 is the root in term " in inst.stderr(), inst.stderr()
    assert "rank 0 (pid" in inst.stderr() and "status 77" in inst.stderr(), inst.stderr()
    status = status_through(uris)
    assert status is not None and status["root"] == 1
    assert status["ranks"][5]["state"] == "vacant", status["ranks"][5]
