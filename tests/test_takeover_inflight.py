"""kill -9 of the root while joins and a retirement are in flight, in the sibling topology
(kary:4, K=2), with real brokers (docs/protocol.md §13.4, §13.7): whatever each request's fate,
no rank is held by two brokers, no rank is shown online whose broker is gone, every joiner
either holds a rank or left with a documented code, the retired rank never comes back, and a
second `tbon expand` through the URI list fills what is vacant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

from brokers import alive, claimed_rank, instance_brokers, instance_rundir
from conftest import Instance, start_tbon, tbon, wait_for
from test_takeover import FAILED, status_through

SIZE = 9
SPARES = 16  # -S size: ranks 9 to 15 vacant, below ranks 2 (9-12) and 3 (13-15)
RETIRED = 8  # a leaf below rank 1 (a standby)
ATTRIBUTES = (
    f"size={SPARES}",
    "tbon.standbys=2",
    "tbon.topo=kary:4",
    "tbon.heartbeat=200ms",
    "tbon.torpid=0",
    "tbon.timeout=3s",
    "broker.join-timeout=10s",
)
ASK_AGAIN = {75, 69}  # a joiner's documented ends without a rank: ask again, no rank


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return process.returncode, out, err


def one_broker_per_rank(status: dict[str, Any], ours: set[int]) -> list[str]:
    """What breaks "one rank, one broker" or the truth of status, read against /proc."""
    wrong = []
    online = [r for r in status["ranks"] if r["state"] in ("online", "retiring")]
    shown = [r["pid"] for r in online]
    if len(shown) != len(set(shown)):
        wrong.append(f"two online ranks share a pid: {shown}")
    for entry in online:
        if not alive(entry["pid"]):
            wrong.append(f"rank {entry['rank']} shown online, its broker {entry['pid']} gone")
        elif entry["pid"] not in ours:
            wrong.append(f"rank {entry['rank']} shown online with pid {entry['pid']}, not ours")
        elif claimed_rank(entry["pid"]) not in (None, entry["rank"]):
            wrong.append(f"rank {entry['rank']}'s pid {entry['pid']} claims another rank")
    claims: dict[int, list[int]] = {}
    for pid in ours:
        rank = claimed_rank(pid) if alive(pid) else None
        if rank is not None:
            claims.setdefault(rank, []).append(pid)
    wrong += [f"rank {r} claimed by {p}" for r, p in claims.items() if len(p) > 1]
    return wrong


def test_the_root_killed_with_joins_and_a_retirement_in_flight(instance) -> None:
    inst: Instance = instance(SIZE, *ATTRIBUTES)
    listed = tbon("uri", "--all", inst.uri)
    assert listed.returncode == 0, listed.stderr
    uris = listed.stdout.strip()
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"] if r["pid"]}
    rundir = instance_rundir(inst.uri)
    ours = set(before.values())

    def brokers() -> set[int]:
        found = set(instance_brokers(inst.process.pid, rundir))
        ours.update(found)
        inst.broker_pids.update(found)  # reaped and checked at the instance's stop
        return found

    expands = [start_tbon("expand", "-n", "2", "--json", "--timeout", "40s", uris) for _ in "ab"]
    retire = start_tbon("retire", uris, str(RETIRED))
    try:
        # in flight: the joiners started (brokers beyond the instance's own) and asking
        wait_for(lambda: len(brokers()) > SIZE, "expand's joiners to start")
        os.kill(before[0], signal.SIGKILL)
        seen: dict[str, Any] = {}

        def taken_over() -> bool:
            brokers()
            status = status_through(uris)
            if status is not None:
                seen.clear()
                seen.update(status)
            if status is None or status["root"] not in (1, 2):  # either standby may win
                return False
            zero = status["ranks"][0]  # lost, or already refilled by one of the joiners
            return zero["state"] == "lost" or zero["incarnation"] > 1

        try:
            wait_for(taken_over, "a standby to take over")
        except AssertionError as error:
            tail = "\n".join(inst.stderr().splitlines()[-40:])
            raise AssertionError(f"{error}; last {seen} {FAILED}; stderr:\n{tail}") from None
        ends = [finish(expand) for expand in expands]
        retire_end = finish(retire)
    finally:
        for process in [*expands, retire]:
            if process.poll() is None:
                process.kill()
                process.communicate()
    brokers()
    said = f"expands {ends}; retire {retire_end}"
    print(said)
    joined: dict[int, int] = {}  # pid -> rank, as expand saw them come online
    for code, out, _err in ends:
        assert code in (0, 1, 69), said  # documented exit codes of expand
        assert out.strip(), said
        report = json.loads(out)
        joined.update({entry["pid"]: entry["rank"] for entry in report["joined"]})
        for failed in report["failed"]:
            assert failed["exit_code"] in ASK_AGAIN, (failed, said)
    assert len(joined) + sum(len(json.loads(out)["failed"]) for _, out, _ in ends) == 4, said
    assert retire_end[0] in (0, 1), said

    # the tree settles: every rank online with a live broker, or not online and its broker gone
    final: dict[str, Any] = {}

    def settled() -> bool:
        status = status_through(uris)
        if status is None:
            return False
        final.clear()
        final.update(status)
        by_pid = {r["pid"]: r for r in status["ranks"] if r["pid"]}
        return all(
            by_pid.get(pid, {}).get("state") == "online" and by_pid[pid]["rank"] == rank
            for pid, rank in joined.items()
        ) and not one_broker_per_rank(status, ours)

    try:
        wait_for(settled, "the joiners online, one broker per rank")
    except AssertionError as error:
        raise AssertionError(
            f"{error}: {one_broker_per_rank(final, ours)}; {final}; {said}"
        ) from None
    kept = {r: pid for r, pid in before.items() if r not in (0, RETIRED)}
    assert all(final["ranks"][r]["pid"] == pid for r, pid in kept.items()), final  # no restart
    # the retired broker never comes back: its rank is vacant (retired) or a new broker's (a
    # joiner may be given it, §8.3); unless the retirement never took effect, its broker kept it
    retired = final["ranks"][RETIRED]
    gone = retire_end[0] == 0 or retired.get("retired") or retired["pid"] != before[RETIRED]
    if gone:
        assert not alive(before[RETIRED]) and retired["pid"] != before[RETIRED], (retired, said)
    else:
        assert retired["state"] == "online" and retired["pid"] == before[RETIRED], retired

    # a second expand after the takeover fills what is vacant (rank 0 left out: a joiner of
    # the first expands may have refilled it already, §13.6, or not)
    holes = [
        r["rank"]
        for r in final["ranks"]
        if r["rank"] and r["state"] in ("vacant", "lost") and not r.get("retired")
    ]
    assert holes, final  # at least rank 0's spares beyond the four joiners
    filled = tbon(
        "expand", "-r", ",".join(map(str, holes)), "--json", "--timeout", "40s", uris, timeout=90
    )
    brokers()
    assert filled.returncode == 0, (filled.stdout, filled.stderr)
    after = status_through(uris)
    assert after is not None, FAILED
    assert all(after["ranks"][r]["state"] == "online" for r in holes), after
    assert not one_broker_per_rank(after, ours), one_broker_per_rank(after, ours)
    if gone:  # never back once retired
        assert after["ranks"][RETIRED]["pid"] != before[RETIRED], after["ranks"][RETIRED]
    # the root role stays where it went; rank 0 is lost, or a new incarnation that joined
    zero = after["ranks"][0]
    assert after["root"] == seen["root"], after
    assert zero["state"] == "lost" or (zero["state"] == "online" and zero["incarnation"] > 1), zero
