"""`tbon broker` under real PMI servers: MPICH's Hydra `mpiexec` (in both of its PMI modes) and
Slurm's `srun --mpi=pmi2` on a single-node cluster started for these tests (tests/slurm.py).

Hydra comes from Debian's mpich and Slurm from slurm-wlm and munge, which .ci/run installs; where
they are missing these tests are skipped, unless TBON_REQUIRE_LAUNCHERS=1 (set by .ci/run) makes
that a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest
import slurm
from conftest import DEADLINE, TBON, child_env

MPIEXEC = shutil.which("mpiexec.hydra") or shutil.which("mpiexec")
REQUIRED = os.environ.get("TBON_REQUIRE_LAUNCHERS") == "1"

hydra = pytest.mark.skipif(
    MPIEXEC is None and not REQUIRED,
    reason="MPICH's Hydra mpiexec is not installed (.ci/run installs Debian's mpich)",
)
with_slurm = pytest.mark.skipif(
    bool(slurm.missing()) and not REQUIRED,
    reason=f"no single-node Slurm here (missing: {', '.join(slurm.missing())})",
)


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    assert not slurm.missing(), f"TBON_REQUIRE_LAUNCHERS=1 but missing {slurm.missing()}"
    with slurm.cluster() as env:
        yield env


def mpiexec(
    count: int, *broker_args: str, pmi_port: bool = False, timeout: float = 2 * DEADLINE
) -> subprocess.CompletedProcess[str]:
    """`mpiexec -n COUNT tbon broker ARGS...`"""
    assert MPIEXEC is not None, "mpiexec not found, but TBON_REQUIRE_LAUNCHERS=1"
    argv = [MPIEXEC, *(["-pmi-port"] if pmi_port else []), "-n", str(count), TBON, "broker"]
    return launch([*argv, *broker_args], child_env(), timeout)


def srun(
    env: dict[str, str], count: int, *broker_args: str, timeout: float = 2 * DEADLINE
) -> subprocess.CompletedProcess[str]:
    """`srun --mpi=pmi2 -n COUNT tbon broker ARGS...` (overcommitting this machine's cores)."""
    argv = ["srun", "--mpi=pmi2", "--overcommit", "-n", str(count), TBON, "broker"]
    return launch([*argv, *broker_args], {**child_env(), "SLURM_CONF": env["SLURM_CONF"]}, timeout)


def launch(
    argv: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a launcher in a session of its own: if it hangs, its whole process group (its
    helpers and every broker) is killed, by its id, and reaped."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"{argv[0]} did not finish within {timeout}s: {err}") from None
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def tbon_in(script: str) -> list[str]:
    """An initial program: a shell script that may call `tbon` (found on PATH)."""
    return ["sh", "-c", script]


@hydra
@pytest.mark.parametrize("pmi_port", [False, True], ids=["PMI_FD", "PMI_PORT"])
def test_hydra_wires_up_4_brokers_with_spares(pmi_port: bool) -> None:
    result = mpiexec(
        4, "-S", "tbon.fanout=2", "-S", "size=6", TBON, "status", "--json", pmi_port=pmi_port
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert (status["size"], status["topo"]) == (6, "kary:2")
    states = [(r["rank"], r["state"], r["host"]) for r in status["ranks"]]
    assert [s[1] for s in states] == ["online"] * 4 + ["vacant"] * 2
    assert [s[2] for s in states[4:]] == ["extra0", "extra1"]
    assert len({r["pid"] for r in status["ranks"][:4]}) == 4


@hydra
def test_spares_of_a_hydra_instance_fill_by_flub_and_take_work() -> None:
    script = (
        "tbon expand -n 2 --json && tbon exec -r all -l sh -c 'echo $TBON_RANK' && "
        "tbon status --json"
    )
    result = mpiexec(2, "-S", "size=4", *tbon_in(script))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    joined = json.loads(lines[0])
    assert sorted(j["rank"] for j in joined["joined"]) == [2, 3] and not joined["failed"]
    assert sorted(lines[1:5]) == ["0: 0", "1: 1", "2: 2", "3: 3"]
    status = json.loads(lines[5])
    assert [r["state"] for r in status["ranks"]] == ["online"] * 4


@hydra
def test_the_initial_programs_status_is_mpiexecs() -> None:
    result = mpiexec(3, *tbon_in("tbon exec -r all true && exit 7"))
    assert result.returncode == 7, result.stderr


@hydra
def test_a_size_below_the_launched_count_is_a_clear_error_on_every_rank() -> None:
    result = mpiexec(3, "-S", "size=2", "true")
    assert result.returncode != 0
    # A usage error at boot reads as any command's does: `tbon broker: MESSAGE`, one line.
    errors = [line for line in result.stderr.splitlines() if line.startswith("tbon broker: ")]
    assert errors, result.stderr
    assert all("size=2 must exceed the 3 brokers launched by PMI" in line for line in errors)
    assert "Traceback" not in result.stderr


@with_slurm
def test_srun_wires_up_4_brokers_with_spares(slurm_env: dict[str, str]) -> None:
    result = srun(slurm_env, 4, "-S", "tbon.fanout=2", "-S", "size=6", TBON, "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert (status["size"], status["topo"]) == (6, "kary:2")
    assert [r["state"] for r in status["ranks"]] == ["online"] * 4 + ["vacant"] * 2
    assert len({r["pid"] for r in status["ranks"][:4]}) == 4


@with_slurm
def test_spares_of_an_srun_instance_fill_by_flub_and_take_work(slurm_env: dict[str, str]) -> None:
    script = "tbon expand --fill --json && tbon exec -r all -l sh -c 'echo $TBON_RANK'"
    result = srun(slurm_env, 2, "-S", "size=3", *tbon_in(script))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [j["rank"] for j in json.loads(lines[0])["joined"]] == [2]
    assert sorted(lines[1:]) == ["0: 0", "1: 1", "2: 2"]


@hydra
def test_alloc_with_mpiexec_runs_the_command_with_tbon_uri() -> None:
    result = subprocess.run(
        [TBON, "alloc", "-N", "3", "--size", "4", "--launcher", "mpiexec", "sh", "-c",
         "tbon status --json; exit 5"],
        capture_output=True, text=True, env=child_env(), timeout=2 * DEADLINE,
    )  # fmt: skip
    assert result.returncode == 5, result.stderr
    status = json.loads(result.stdout)
    assert [r["state"] for r in status["ranks"]] == ["online"] * 3 + ["vacant"]


@hydra
def test_alloc_with_mpiexec_in_the_background() -> None:
    started = subprocess.run(
        [TBON, "alloc", "-N", "2", "--launcher", "mpiexec", "--bg"],
        capture_output=True, text=True, env=child_env(), timeout=2 * DEADLINE,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    uri = started.stdout.strip()
    try:
        shown = subprocess.run(
            [TBON, "status", uri, "--json"], capture_output=True, text=True, env=child_env()
        )
        assert [r["state"] for r in json.loads(shown.stdout)["ranks"]] == ["online"] * 2
    finally:
        done = subprocess.run([TBON, "shutdown", uri], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@with_slurm
def test_alloc_with_srun(slurm_env: dict[str, str]) -> None:
    result = subprocess.run(
        [TBON, "alloc", "-N", "1", "--size", "3", "--launcher", "srun", "sh", "-c",
         "tbon expand --fill --json >/dev/null && tbon status --json"],
        capture_output=True, text=True, timeout=2 * DEADLINE,
        env={**child_env(), "SLURM_CONF": slurm_env["SLURM_CONF"]},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert [r["state"] for r in status["ranks"]] == ["online"] * 3
