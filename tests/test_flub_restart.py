"""A supervised joiner that dies while it waits gets its reservation back (issue 25), with real
brokers: the restart, with the same certificate, proves that it holds the key and comes online
in the reserved rank; a holder of the public key alone is still refused; the restart may give the
rank back at once; and an old process that is still alive is refused as a second holder."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

from conftest import Instance, tbon, wait_for

from tbon.keys.cert import generate_keypair, load_certificate
from tbon.keys.proof import decode_nonce, prove, statement
from tbon.overlay.connectors.client import Client, RequestError

NEVER_AGAIN = (0, 2, 69, 77)
"""Exit codes after which a supervisor does not start the broker again (docs/design.md §9)."""


class Supervisor:
    """A shell loop's `until` in Python: start the broker again, with the same arguments, when
    it ends by a signal or with a code that asks for it. It acts when `tick` is called (from a
    wait's condition), so the test decides when it looks."""

    def __init__(self, inst: Instance, logs: Path, *attributes: str) -> None:
        self.inst, self.logs, self.attributes = inst, logs, attributes
        self.started: list[subprocess.Popen[str]] = []
        self.start()

    def start(self) -> None:
        log = self.log(len(self.started))
        self.started.append(self.inst.join(*self.attributes, log=log))

    def log(self, index: int) -> Path:
        return self.logs / f"joiner.{index}.log"

    @property
    def current(self) -> subprocess.Popen[str]:
        return self.started[-1]

    def said(self) -> str:
        return self.log(len(self.started) - 1).read_text()

    def tick(self) -> None:
        code = self.current.poll()
        if code is not None and code not in NEVER_AGAIN:
            self.start()


def keygen(tmp_path: Path) -> Path:
    cert = tmp_path / "joiner.cert"
    result = tbon("keygen", str(cert))
    assert result.returncode == 0, result.stderr
    return cert


def waiting_for(joiner: Supervisor | Path, parent: int) -> bool:
    text = joiner.said() if isinstance(joiner, Supervisor) else joiner.read_text()
    return f"waiting for parent rank {parent}" in text


def test_a_supervised_joiner_killed_while_waiting_comes_back_at_its_reserved_rank(
    instance, tmp_path
) -> None:
    """Rank 3 is reserved for the certificate's key while its parent, rank 1, is vacant, and a
    joiner for rank 7 waits for rank 3. Killed -9 and started again by its supervisor, the
    joiner for rank 3 comes online there when rank 1 does, with the same incarnation: the
    reservation never lapsed, and the joiner waiting on it joins too."""
    inst = instance(1, "size=8", "tbon.fanout=2", "broker.join-timeout=60s")
    cert = keygen(tmp_path)
    supervisor = Supervisor(inst, tmp_path, "broker.rank=3", f"broker.cert={cert}")
    below = inst.join("broker.rank=7", log=tmp_path / "below.log")
    wait_for(lambda: waiting_for(supervisor, 1), "the joiner to reserve rank 3 and wait")
    wait_for(lambda: waiting_for(tmp_path / "below.log", 3), "rank 7's joiner to wait")
    first = supervisor.current
    os.kill(first.pid, signal.SIGKILL)

    def restarted_and_waiting() -> bool:
        supervisor.tick()
        return len(supervisor.started) == 2 and waiting_for(supervisor, 1)

    wait_for(restarted_and_waiting, "the supervisor to restart the joiner, which waits again")
    assert first.returncode == -signal.SIGKILL
    restart = supervisor.current
    parent = inst.join("broker.rank=1")

    def all_online(status: dict) -> bool:
        supervisor.tick()
        return all(status["ranks"][r]["state"] == "online" for r in (1, 3, 7))

    status = inst.wait_status(all_online, "ranks 1, 3 and 7 online")
    assert len(supervisor.started) == 2 and restart.poll() is None, supervisor.said()
    ranks = status["ranks"]
    assert [ranks[r]["pid"] for r in (1, 3, 7)] == [parent.pid, restart.pid, below.pid]
    assert [ranks[r]["incarnation"] for r in (1, 3, 7)] == [1, 1, 1]  # no lease ran out
    inst.stop()
    assert "expired" not in inst.stderr(), inst.stderr()
    assert restart.returncode == 0 and below.returncode == 0


def test_a_holder_of_the_public_key_alone_is_refused_on_another_connection(
    instance, tmp_path
) -> None:
    """It may ask for the same reservation and for a challenge, but not answer it: neither its
    key exchange nor its release is obeyed, and the joiner still comes online."""
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=60s")
    cert = keygen(tmp_path)
    public = load_certificate(cert).public
    joiner = inst.join("broker.rank=3", f"broker.cert={cert}", log=tmp_path / "joiner.log")
    wait_for(lambda: waiting_for(tmp_path / "joiner.log", 1), "the joiner to wait for rank 1")
    triple = {"rank": 3, "incarnation": 1, "public_key": public}
    with Client(inst.uri) as hostile:
        asked = {"public_key": public, "hostname": "hostile", "rank": 3}
        grant = hostile.rpc("flub.allocate", asked, nodeid=0)
        assert (grant["rank"], grant["incarnation"], grant["held"]) == (3, 1, False)
        challenge = hostile.rpc("flub.challenge", triple, nodeid=0)
        nonce = decode_nonce(challenge["challenge"])
        assert nonce is not None
        forged = prove(generate_keypair()[1], challenge["key"], nonce, statement(3, 1, public))
        attempts = [
            ("flub.kex", triple, "was not reserved by this connection"),
            ("flub.release", triple, "was not reserved by this connection"),
            ("flub.kex", {**triple, "proof": forged}, "was not made with the secret key"),
            ("flub.release", {**triple, "proof": forged}, "no challenge is open"),  # spent
        ]
        for topic, payload, why in attempts:
            try:
                hostile.rpc(topic, payload, nodeid=0)
            except RequestError as error:
                assert error.errnum == errno.EPERM and why in str(error), (topic, str(error))
            else:
                raise AssertionError(f"{topic} from a holder of the public key was obeyed")
        assert inst.status()["ranks"][3]["state"] == "reserved"
    inst.join("broker.rank=1")
    status = inst.wait_status(lambda s: s["ranks"][3]["state"] == "online", "rank 3 online")
    assert status["ranks"][3]["pid"] == joiner.pid and status["ranks"][3]["incarnation"] == 1


def test_a_restarted_joiner_that_fails_gives_the_rank_back_at_once(instance, tmp_path) -> None:
    """The restart proves its key in its release too: the rank is vacant at once, not when
    the lease (300 s) runs out."""
    inst = instance(1, "size=8", "tbon.fanout=2", "broker.join-timeout=300s")
    cert = keygen(tmp_path)
    first = inst.join("broker.rank=3", f"broker.cert={cert}", log=tmp_path / "first.log")
    wait_for(lambda: waiting_for(tmp_path / "first.log", 1), "the joiner to wait for rank 1")
    first.kill()
    first.wait()
    # rank 3 has a child, rank 7: the restart binds its socket, at an address it does not have
    restart = inst.join(
        "broker.rank=3",
        f"broker.cert={cert}",
        "tbon.endpoint=tcp://192.0.2.1:*",
        log=tmp_path / "restart.log",
    )
    wait_for(lambda: restart.poll() is not None, "the restart to fail")
    said = (tmp_path / "restart.log").read_text()
    assert restart.returncode == 75, said
    assert "FLUB: released rank 3 incarnation 1" in said, said
    entry = inst.status()["ranks"][3]
    assert (entry["state"], entry["incarnation"], entry["host"]) == ("vacant", 1, "extra2")


def test_the_old_process_if_alive_is_refused_as_a_second_holder(instance, tmp_path) -> None:
    """Stopped while it waits, and restarted beside itself: the restart takes the rank, and
    the old process, woken, is refused (77) rather than sent back to its supervisor."""
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=60s")
    cert = keygen(tmp_path)
    old = inst.join("broker.rank=3", f"broker.cert={cert}", log=tmp_path / "old.log")
    wait_for(lambda: waiting_for(tmp_path / "old.log", 1), "the joiner to wait for rank 1")
    os.kill(old.pid, signal.SIGSTOP)
    try:
        new = inst.join("broker.rank=3", f"broker.cert={cert}", log=tmp_path / "new.log")
        wait_for(lambda: waiting_for(tmp_path / "new.log", 1), "the restart to wait")
        inst.join("broker.rank=1")
        status = inst.wait_status(lambda s: s["ranks"][3]["state"] == "online", "rank 3 online")
        assert status["ranks"][3]["pid"] == new.pid and status["ranks"][3]["incarnation"] == 1
    finally:
        os.kill(old.pid, signal.SIGCONT)
    wait_for(lambda: old.poll() is not None, "the old process to be refused")
    said = (tmp_path / "old.log").read_text()
    assert old.returncode == 77, said
    assert "rank 3 incarnation 1 is held by another broker" in said, said
    assert inst.status()["ranks"][3]["pid"] == new.pid
