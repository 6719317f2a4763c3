"""`tbon retire` across a takeover (docs/protocol.md §13.4, cli/retire.py): a retirement the dead
root recorded, waiting for the rank's job to end, is asked again of the root that took over,
which waits for it as for any rank already retiring, and the command ends 0 with the rank
vacant. Through a URI list (the connection to rank 0 is lost: the next URI is asked), and
through another broker (its request held by the dead root: the silence is checked against
status's root)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import TBON, child_env, wait_for
from test_takeover import FAILED, status_through
from test_takeover_siblings import KARY4, uris_of

RETIRED = 7  # a leaf under rank 1, a standby: alive whichever member wins


@pytest.mark.parametrize("through", ["list", "rank 3"])
def test_a_retirement_in_flight_when_the_root_dies_ends_under_the_new_root(
    instance, tmp_path: Path, through: str
) -> None:
    inst = instance(9, *KARY4)
    uris = uris_of(inst)
    rank3 = uris.split(",")[1].replace("/1/local", "/3/local")
    before = {r["rank"]: r["pid"] for r in inst.status()["ranks"]}
    out = tmp_path / "job.out"
    with open(out, "w") as sink:  # the job runs before the retirement asks (a loaded machine)
        job = subprocess.Popen(
            [TBON, "exec", "-r", str(RETIRED), "sh", "-c", "echo started; exec sleep 20"],
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            env={**child_env(), "TBON_URI": rank3},
        )
    wait_for(lambda: "started" in out.read_text() or job.poll() is not None, "the job to start")
    assert job.poll() is None, job.communicate()
    said = tmp_path / "retire.err"
    with open(said, "w") as err:
        retire = subprocess.Popen(
            [TBON, "retire", str(RETIRED)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**child_env(), "TBON_URI": uris if through == "list" else rank3},
        )
    try:
        wait_for(
            lambda: "waiting for 1 running job" in said.read_text() or retire.poll() is not None,
            "the retirement to wait for the job",
            60,
        )
        assert retire.poll() is None, said.read_text()
        os.kill(before[0], signal.SIGKILL)
        code = retire.wait(timeout=120)
        text = said.read_text()
        assert code == 0, text + inst.stderr()[-3000:]
        assert "asking the root again for rank(s) 7" in text, text
    finally:
        for process in (retire, job):
            if process.poll() is None:
                process.kill()
            process.communicate()
    status = status_through(uris)
    assert status is not None, FAILED
    assert status["root"] in (1, 2) and status["ranks"][RETIRED]["state"] == "vacant", status
    assert job.returncode == 0, job.stderr
