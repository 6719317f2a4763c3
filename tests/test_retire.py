"""`tbon retire` with real brokers: drained, gone for good, and never resurrected."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import (
    DEADLINE,
    child_env,
    process_gone,
    start_exec,
    start_tbon,
    tbon,
    wait_for,
)

from tbon.overlay.connectors.client import Client, RequestError

MAN_BROKER = Path(__file__).resolve().parent.parent / "man" / "tbon-broker.1"


def finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=DEADLINE)
    return process.returncode, out, err


def start_retire(*args: str) -> subprocess.Popen[str]:
    return start_tbon("retire", *args)


def retired(status: dict, rank: int) -> bool:
    entry = status["ranks"][rank]
    return entry["state"] == "vacant" and entry.get("retired", False)


def wait_line(stream, text: str) -> None:  # type: ignore[no-untyped-def]
    """Read `stream` until a line containing `text` (the process is ours and bounded)."""
    for line in stream:
        if text in line:
            return
    raise AssertionError(f"{text!r} never came")


# --- the plain cases ---------------------------------------------------------------------------


def test_retiring_a_leaf_leaves_it_vacant_and_its_broker_gone(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    pid = inst.pid(3)
    result = tbon("retire", inst.uri, "3")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"rank 3: retired in \d+\.\d{3}s\n", result.stdout)
    wait_for(lambda: process_gone(pid), "the retired broker to exit")
    status = inst.status()
    assert retired(status, 3)
    assert [r["state"] for r in status["ranks"][:3]] == ["online"] * 3
    shown = tbon("status", inst.uri).stdout
    assert "3 " in shown and "vacant (retired)" in shown


def test_a_retired_joiner_exits_0_and_its_rank_can_be_filled_afresh(instance) -> None:
    inst = instance(1, "size=2")
    joiner = inst.join()
    inst.wait_status(lambda s: s["ranks"][1]["pid"] == joiner.pid, "the joiner online")
    assert tbon("retire", inst.uri, "1").returncode == 0
    code, _, err = finished(joiner)
    assert code == 0, err
    assert retired(inst.status(), 1)
    fresh = inst.join()
    seen = inst.wait_status(lambda s: s["ranks"][1]["pid"] == fresh.pid, "a fresh join")
    assert seen["ranks"][1]["incarnation"] == 2 and "retired" not in seen["ranks"][1]


def test_retire_again_says_so_and_succeeds(instance) -> None:
    inst = instance(3)
    assert tbon("retire", inst.uri, "2").returncode == 0
    again = tbon("retire", inst.uri, "2")
    assert again.returncode == 0
    assert again.stdout == "rank 2: already retired\n"
    as_json = json.loads(tbon("retire", inst.uri, "2", "--json").stdout)
    assert as_json == {"ranks": [{"rank": 2, "result": "retired", "already": True, "killed": 0,
                                  "lost": False}]}  # fmt: skip


def test_concurrent_retires_of_different_leaves_all_succeed(instance) -> None:
    inst = instance(9, "tbon.fanout=8")
    retires = [start_retire(inst.uri, str(rank)) for rank in range(1, 9)]
    outcomes = [finished(process) for process in retires]
    assert [code for code, _, _ in outcomes] == [0] * 8, outcomes
    status = inst.status()
    assert all(retired(status, rank) for rank in range(1, 9))
    assert status["ranks"][0]["state"] == "online"


def test_ranks_named_together_leave_children_first(instance) -> None:
    inst = instance(4, "tbon.fanout=2")  # 1 is the parent of 3
    result = tbon("retire", inst.uri, "1,3", "--json")
    assert result.returncode == 0, result.stderr
    assert [r["rank"] for r in json.loads(result.stdout)["ranks"]] == [1, 3]
    status = inst.status()
    assert retired(status, 1) and retired(status, 3)
    assert status["ranks"][2]["state"] == "online"


def test_subtree_retires_the_whole_subtree_leaves_first(instance) -> None:
    inst = instance(7, "tbon.fanout=2")
    result = tbon("retire", inst.uri, "--subtree", "1")
    assert result.returncode == 0, result.stderr
    status = inst.status()
    assert [retired(status, rank) for rank in range(7)] == [
        False, True, False, True, True, False, False
    ]  # fmt: skip
    assert [status["ranks"][r]["state"] for r in (0, 2, 5, 6)] == ["online"] * 4


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "reason", "code"),
    [
        ("0", "rank 0 cannot retire: shut the instance down instead", 1),
        ("1", "rank 1 has children that are online, reserved or retiring (3, 4): retire them", 1),
        ("5", "rank 5 is vacant: nothing to retire", 1),
        ("9", "no rank 9 in this instance of size 6", 68),  # as for every command
    ],
)
def test_unsafe_retires_are_refused_and_change_nothing(
    instance, rank: str, reason: str, code: int
) -> None:
    inst = instance(5, "size=6", "tbon.fanout=2")
    before = inst.status()
    result = tbon("retire", inst.uri, rank)
    assert result.returncode == code
    assert result.stdout == ""
    assert f"tbon retire: rank {rank}: {reason}" in result.stderr
    after = inst.status()
    for old, new in zip(before["ranks"], after["ranks"], strict=True):
        assert (old["state"], old["incarnation"], old["pid"]) == (
            new["state"],
            new["incarnation"],
            new["pid"],
        )


def test_a_lost_rank_has_nothing_to_retire(instance) -> None:
    inst = instance(3)
    os.kill(inst.pid(2), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
    result = tbon("retire", inst.uri, "2", "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "ranks": [{"rank": 2, "result": "refused", "reason": "rank 2 is lost: nothing to retire"}]
    }
    assert inst.status()["ranks"][2]["state"] == "lost"


def test_a_stale_incarnation_never_retires_the_current_broker(instance) -> None:
    inst = instance(2)
    with Client(inst.uri) as client, pytest.raises(RequestError, match="incarnation 7 is not"):
        client.rpc("retire.rank", {"rank": 1, "incarnation": 7, "force": False, "timeout": None}, 0)
    assert inst.status()["ranks"][1]["state"] == "online"


def test_only_rank_0_may_order_a_retirement(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    with Client(inst.uri) as client:
        order = {"rank": 3, "incarnation": 1, "force": True, "timeout": None}
        with pytest.raises(RequestError, match=r"retire\.order comes from the root only"):
            client.rpc("retire.order", order, nodeid=1)
    assert tbon("ping", inst.uri, "3").returncode == 0
    assert inst.status()["ranks"][3]["state"] == "online"


# --- work in progress --------------------------------------------------------------------------


def test_running_work_finishes_before_the_broker_leaves(instance, tmp_path: Path) -> None:
    inst = instance(2)
    go = tmp_path / "go"
    script = f"echo started; while [ ! -e {go} ]; do sleep 0.02; done; echo finished"
    job = start_exec(inst.uri, "-r", "1", "sh", "-c", script)
    assert job.stdout is not None
    wait_line(job.stdout, "started")
    retire = start_retire(inst.uri, "1")
    inst.wait_status(lambda s: s["ranks"][1]["state"] == "retiring", "rank 1 retiring")
    refused = tbon("exec", inst.uri, "-r", "1", "true")
    assert refused.returncode == 68
    assert "rank 1 is retiring" in refused.stderr
    skipped = tbon("exec", inst.uri, "-r", "all", "true")
    assert skipped.returncode == 0
    assert "skipping retiring ranks 1" in skipped.stderr
    assert retire.poll() is None
    go.touch()
    code, _, err = finished(retire)
    assert code == 0, err
    assert "rank 1: waiting for 1 running job(s) to finish" in err
    job_out, job_err = job.communicate(timeout=DEADLINE)
    assert job.returncode == 0, job_err
    assert "finished" in job_out
    assert retired(inst.status(), 1)


@pytest.mark.parametrize(
    ("options", "why"), [(["--force"], "--force"), (["--timeout", "300ms"], "the drain timeout")]
)
def test_force_or_the_drain_timeout_kills_running_work_and_says_so(
    instance, options: list[str], why: str
) -> None:
    inst = instance(2)
    job = start_exec(inst.uri, "-r", "1", "sh", "-c", "echo started; exec sleep 60")
    assert job.stdout is not None
    wait_line(job.stdout, "started")
    code, _, err = finished(start_retire(inst.uri, "1", *options))
    assert code == 0, err
    assert f"rank 1: killed 1 running job(s) ({why}" in err
    _, job_err = job.communicate(timeout=DEADLINE)
    assert job.returncode == 128 + signal.SIGKILL
    assert f"tbon exec: rank 1: killed: rank 1 retired ({why}" in job_err
    assert retired(inst.status(), 1)


# --- never resurrected -------------------------------------------------------------------------


def supervisor_loop() -> str:
    """The shell-loop recipe exactly as tbon-broker(1) gives it."""
    page = MAN_BROKER.read_text()
    blocks = re.findall(r"^\.EX\n(.*?)^\.EE", page, flags=re.S | re.M)
    recipe = next(block for block in blocks if block.startswith("while :; do"))
    return recipe.replace("\\e", "\\")


def test_the_man_page_supervisor_loop_does_not_restart_a_retired_broker(instance) -> None:
    """Retire under the documented loop, many times, with heartbeats racing the retirement."""
    inst = instance(1, "size=2", "tbon.heartbeat=10ms", "tbon.torpid=2s", "tbon.timeout=5s")
    recipe = supervisor_loop()
    for round_ in range(8):
        loop = subprocess.Popen(
            ["sh", "-c", recipe],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(URI=inst.uri),
            start_new_session=True,  # its brokers are ours to kill, by process group, on failure
        )
        try:
            seen = inst.wait_status(
                lambda s: s["ranks"][1]["state"] == "online", f"round {round_}: rank 1 online"
            )
            assert seen["ranks"][1]["incarnation"] == round_ + 1
            result = tbon("retire", inst.uri, "1")
            assert result.returncode == 0, result.stderr
            code, _, err = finished(loop)
        finally:
            if loop.poll() is None:
                os.killpg(loop.pid, signal.SIGKILL)
                loop.wait()
        assert code == 0, f"round {round_}: the loop went on or failed: {err}"
        status = inst.status()
        assert retired(status, 1), status["ranks"][1]


def test_a_stopped_broker_stays_retiring_until_it_acknowledges(instance) -> None:
    inst = instance(1, "size=2", "tbon.heartbeat=50ms", "tbon.torpid=200ms", "tbon.timeout=30s")
    joiner = inst.join()
    inst.wait_status(lambda s: s["ranks"][1]["pid"] == joiner.pid, "the joiner online")
    os.kill(joiner.pid, signal.SIGSTOP)
    try:
        retire = start_retire(inst.uri, "1")
        seen = inst.wait_status(
            lambda s: s["ranks"][1]["state"] == "retiring" and s["ranks"][1]["torpid"],
            "rank 1 retiring and silent",
        )
        assert seen["ranks"][1]["pid"] == joiner.pid
        grab = {"public_key": "0" * 40, "hostname": "x", "rank": 1}
        with Client(inst.uri) as client, pytest.raises(RequestError, match="taken: retiring"):
            client.rpc("flub.allocate", grab, 0)  # FLUB cannot have it
        assert retire.poll() is None
    finally:
        os.kill(joiner.pid, signal.SIGCONT)
    code, out, err = finished(retire)
    assert code == 0, err
    assert "rank 1: retired in" in out
    joiner_code, _, joiner_err = finished(joiner)
    assert joiner_code == 0, joiner_err
    assert retired(inst.status(), 1)


def test_a_broker_lost_while_retiring_is_told_it_is_retired_when_it_wakes(instance) -> None:
    inst = instance(1, "size=2", "tbon.heartbeat=50ms", "tbon.torpid=200ms", "tbon.timeout=1s")
    joiner = inst.join("log-stderr-level=info")
    inst.wait_status(lambda s: s["ranks"][1]["pid"] == joiner.pid, "the joiner online")
    os.kill(joiner.pid, signal.SIGSTOP)
    try:
        code, out, err = finished(start_retire(inst.uri, "1"))
        assert code == 0, err
        assert "declared lost before it acknowledged" in out
        assert inst.status()["ranks"][1]["state"] == "lost"
    finally:
        os.kill(joiner.pid, signal.SIGCONT)
    joiner_code, _, joiner_err = finished(joiner)
    assert joiner_code == 0, joiner_err
    # It reads the order it missed, or is told on its first word: either way, retired.
    assert re.search(r"retired: leaving|refused by the parent: retired", joiner_err), joiner_err


def test_a_retired_broker_restarted_with_its_key_is_refused_77(instance, tmp_path: Path) -> None:
    """A careless supervisor restarts a retired broker as it was, certificate and all: it is
    turned away every time and the rank stays vacant; a new broker may still take it."""
    inst = instance(1, "size=2")
    cert = tmp_path / "node1.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    first = inst.join(f"broker.cert={cert}")
    inst.wait_status(lambda s: s["ranks"][1]["pid"] == first.pid, "rank 1 online")
    assert tbon("retire", inst.uri, "1").returncode == 0
    assert finished(first)[0] == 0
    for _ in range(3):
        code, _, err = finished(inst.join(f"broker.cert={cert}"))
        assert code == 77, err
        assert "this broker's key was retired from rank 1" in err
        assert retired(inst.status(), 1)
    fresh = inst.join()
    inst.wait_status(lambda s: s["ranks"][1]["pid"] == fresh.pid, "a new broker on rank 1")


def test_a_broker_cert_that_is_not_private_is_a_usage_error(instance, tmp_path: Path) -> None:
    inst = instance(1, "size=2")
    cert = tmp_path / "open.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    cert.chmod(0o644)
    code, _, err = finished(inst.join(f"broker.cert={cert}"))
    assert code == 2
    assert err.count("\n") == 1 and "broker.cert:" in err and str(cert) in err
