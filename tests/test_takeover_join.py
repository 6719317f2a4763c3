"""A FLUB join started while the root group elects (docs/protocol.md §13.4; docs/flub.md §2):
the standby it asks answers that it cannot reach the root for now, and the joiner tries its
boot servers again within its own broker.join-timeout instead of exiting 75, and comes online
under the root that took over.

The window is held open for as long as the test needs: with rank 0 killed and the other standby
stopped (SIGSTOP), rank 1 has no majority to be elected by, so it answers every join
"reattaching" until the stopped standby is woken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from conftest import TBON, child_env, process_gone, wait_for
from test_takeover import FAILED, status_through
from test_takeover_siblings import KARY4, uris_of


def test_a_join_started_during_a_takeover_waits_it_out_and_comes_online(
    instance, tmp_path: Path
) -> None:
    inst = instance(5, "size=6", *KARY4)  # the spare rank 5 hangs under rank 1
    uris = uris_of(inst)
    boot = uris.split(",")[:2]  # rank 0's URI (dead: passed over), then rank 1's
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    log = tmp_path / "joiner.log"
    os.kill(before[2], signal.SIGSTOP)
    try:
        os.kill(before[0], signal.SIGKILL)
        joiner = inst.join("broker.rank=5", "broker.join-timeout=300s", boot=boot, log=log)
        wait_for(
            lambda: "trying the boot servers again" in log.read_text() or joiner.poll() is not None,
            "the joiner to be told the root is out of reach, and to try again",
            60,
        )
        said = log.read_text()
        assert joiner.poll() is None, said
        assert "is reattaching to the tree" in said, said
    finally:
        os.kill(before[2], signal.SIGCONT)
    seen: dict = {}

    def joined() -> bool:
        status = status_through(uris)
        if status is None or joiner.poll() is not None:
            return joiner.poll() is not None
        seen.clear()
        seen.update(status)
        return status["root"] in (1, 2) and status["ranks"][5]["state"] == "online"

    try:
        wait_for(joined, "a standby to take over and the joiner to come online", 60)
    except AssertionError as error:
        raise AssertionError(f"{error}; last {seen} {FAILED}; {log.read_text()}") from None
    said = log.read_text()
    assert joiner.poll() is None, said  # joined, not gone: 75 was what it did before
    assert seen["ranks"][5]["pid"] == joiner.pid, seen["ranks"][5]
    assert process_gone(before[0])
    assert all(seen["ranks"][r]["pid"] == before[r] for r in range(1, 5)), seen


def test_expand_started_during_a_takeover_waits_it_out(instance, tmp_path: Path) -> None:
    """`tbon expand` through a URI list while no root can answer yet (rank 0 killed, the other
    standby stopped: rank 1 cannot be elected): it asks again through the list, rather than
    end with no report, and its joiner comes online once a standby took over."""
    inst = instance(5, "size=6", *KARY4)
    uris = uris_of(inst)
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    err = tmp_path / "expand.err"
    os.kill(before[2], signal.SIGSTOP)
    os.kill(before[0], signal.SIGKILL)
    with open(err, "w") as sink:
        expand = subprocess.Popen(
            [TBON, "expand", "-r", "5", "--json", "--timeout", "90s", uris],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            env=child_env(),
        )
    try:
        try:
            wait_for(
                lambda: (
                    "asking again through the URI list" in err.read_text()
                    or expand.poll() is not None
                ),
                "expand to be told no root answers yet, and to ask again",
                60,
            )
            assert expand.poll() is None, err.read_text()
        finally:
            os.kill(before[2], signal.SIGCONT)
        out, _ = expand.communicate(timeout=120)
    finally:
        if expand.poll() is None:
            expand.kill()
            expand.communicate()
    said = f"{expand.returncode} {out!r} {err.read_text()}"
    assert expand.returncode == 0, said
    report = json.loads(out)
    assert [entry["rank"] for entry in report["joined"]] == [5], said
    inst.broker_pids.add(report["joined"][0]["pid"])
