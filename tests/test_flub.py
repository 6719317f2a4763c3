"""Spare ranks, FLUB joins, replacement and `tbon expand`, with real brokers."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess

import zmq
from conftest import DEADLINE, TBON, child_env, launcher_said, process_gone, tbon, wait_for

from tbon.keys.cert import generate_keypair
from tbon.overlay.connectors.client import Client, RequestError


def finished(joiner: subprocess.Popen[str]) -> tuple[int, str]:
    """A joiner's exit status and what it said on stderr."""
    _, err = joiner.communicate(timeout=DEADLINE)
    return joiner.returncode, err


def states(status: dict) -> list[str]:
    return [r["state"] for r in status["ranks"]]


def online(*ranks: int):
    return lambda s: all(s["ranks"][r]["state"] == "online" for r in ranks)


# --- spare ranks ---------------------------------------------------------------------------


def test_spare_ranks_start_vacant_with_placeholder_hosts(instance) -> None:
    inst = instance(2, "size=6", "tbon.fanout=2")
    status = inst.status()
    assert status["size"] == 6
    assert states(status) == ["online", "online", "vacant", "vacant", "vacant", "vacant"]
    assert [r["host"] for r in status["ranks"][2:]] == ["extra0", "extra1", "extra2", "extra3"]
    assert [r["incarnation"] for r in status["ranks"]] == [1, 1, 0, 0, 0, 0]
    assert status["ranks"][0]["subtree"] == "partial"
    shown = tbon("status", inst.uri).stdout
    assert re.search(r"^└─ 2,5 extra: vacant$", shown, re.M), shown  # spares: one run


def test_the_command_runs_once_the_launched_brokers_are_online() -> None:
    result = tbon("start", "--test-size=2", "-S", "size=5", "tbon", "status", "--summary")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"0 \S+: partial \(5 ranks: 2 online, 3 vacant\)\n", result.stdout)


def test_size_not_above_the_launched_brokers_is_refused() -> None:
    result = tbon("start", "--test-size=3", "-S", "size=3", "true")
    assert result.returncode == 2
    assert "size=3 must exceed the 3 brokers launched by PMI" in result.stderr
    assert "Traceback" not in result.stderr


# --- joining -------------------------------------------------------------------------------


def test_spares_fill_one_by_one_then_all_at_once(instance) -> None:
    inst = instance(1, "size=8", "tbon.fanout=2")
    for expected in (1, 2):
        result = tbon("expand", inst.uri, "-n", "1", "--json")
        assert result.returncode == 0, result.stderr
        joined = json.loads(result.stdout)["joined"]
        assert [j["rank"] for j in joined] == [expected]  # lowest vacant rank first
    result = tbon("expand", inst.uri, "--fill")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "joined: 5 brokers, ranks 3-7"
    status = inst.status()
    assert states(status) == ["online"] * 8
    assert status["ranks"][0]["subtree"] == "full"
    assert all(not r["host"].startswith("extra") for r in status["ranks"])
    assert [r["incarnation"] for r in status["ranks"]] == [1] * 8
    assert (
        tbon("expand", inst.uri, "--fill").stdout.strip() == "no available ranks: nothing to fill"
    )


def test_a_joined_broker_serves_requests_and_leaves_with_the_instance(instance) -> None:
    inst = instance(1, "size=3", "tbon.fanout=2")
    joiner = inst.join("broker.rank=2")
    inst.wait_status(online(2), "rank 2 online")
    ping = json.loads(tbon("ping", inst.uri, "2", "--json").stdout)
    assert ping["hops"] == 1
    assert inst.status()["ranks"][2]["pid"] == joiner.pid
    inst.stop()
    assert joiner.returncode == 0


def test_interior_rank_may_join_after_its_children(instance) -> None:
    inst = instance(1, "size=7", "tbon.fanout=2")
    leaves = [inst.join(f"broker.rank={rank}") for rank in (3, 4)]
    waiting = inst.wait_status(
        lambda s: s["ranks"][3]["state"] == s["ranks"][4]["state"] == "reserved",
        "ranks 3 and 4 reserved",
    )
    assert waiting["ranks"][3]["joiner"].startswith("SHA256:")
    assert "reserved (joiner SHA256:" in tbon("status", inst.uri).stdout
    assert all(leaf.poll() is None for leaf in leaves)
    inst.join("broker.rank=1")
    status = inst.wait_status(online(1, 3, 4), "ranks 1, 3, 4 online")
    assert status["ranks"][1]["subtree"] == "full"


def test_six_joiners_race_for_four_vacancies(instance) -> None:
    inst = instance(1, "size=5", "tbon.fanout=2")
    result = tbon("expand", inst.uri, "-n", "6", "--json")
    assert result.returncode == 69, result.stderr
    report = json.loads(result.stdout)
    assert sorted(j["rank"] for j in report["joined"]) == [1, 2, 3, 4]
    assert [f["exit_code"] for f in report["failed"]] == [69, 69]
    assert all("no available ranks" in f["reason"] for f in report["failed"])
    status = inst.status()
    assert states(status) == ["online"] * 5
    assert len({r["pid"] for r in status["ranks"]}) == 5


def test_concurrent_expands_never_over_fill(instance) -> None:
    inst = instance(1, "size=6", "tbon.fanout=2")
    before = inst.status()["ranks"][0]["pid"]
    runs = [
        subprocess.Popen(
            [TBON, "expand", inst.uri, "--fill", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for _ in range(3)
    ]
    reports = []
    for run in runs:
        out, err = run.communicate(timeout=DEADLINE * 3)
        assert run.returncode in (0, 69), err
        reports.append(json.loads(out))
    joined = [j["rank"] for report in reports for j in report["joined"]]
    assert sorted(joined) == [1, 2, 3, 4, 5]  # each rank exactly once
    failed = [f for report in reports for f in report["failed"]]
    assert all(f["exit_code"] == 69 for f in failed)
    status = inst.status()
    assert states(status) == ["online"] * 6 and status["ranks"][0]["pid"] == before


def test_requesting_a_taken_rank_names_its_holder(instance) -> None:
    inst = instance(3)
    joiner = inst.join("broker.rank=1")
    code, err = finished(joiner)
    assert code == 69
    pid = inst.status()["ranks"][1]["pid"]
    assert "rank 1 is taken: online (host " in err and f"pid {pid})" in err
    assert states(inst.status()) == ["online"] * 3


def test_no_vacancy_exits_69(instance) -> None:
    inst = instance(2)
    code, err = finished(inst.join())
    assert code == 69 and "no available ranks" in err


def test_unreachable_boot_server_is_a_clear_error(tmp_path) -> None:
    result = tbon("broker", "-S", f"broker.boot-server=local://{tmp_path}/nothing")
    assert result.returncode == 75  # perhaps not up yet: a supervisor may retry
    assert result.stderr.strip().endswith("no such socket (is the instance running?)")
    unusable = tbon("broker", "-S", "broker.boot-server=ssh://nosuchhost.invalid/tmp/x/local")
    assert unusable.returncode == 75
    assert "FLUB: cannot reach ssh://nosuchhost.invalid/tmp/x/local: ssh: " in unusable.stderr


# --- replacement ---------------------------------------------------------------------------


def test_killed_leaf_is_replaced_with_a_new_incarnation(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    os.kill(inst.pid(3), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")
    result = tbon("expand", inst.uri, "-n", "1", "--json")
    assert result.returncode == 0, result.stderr
    assert [j["rank"] for j in json.loads(result.stdout)["joined"]] == [3]
    status = inst.status()
    assert states(status) == ["online"] * 4
    assert status["ranks"][3]["incarnation"] == 2
    assert status["ranks"][0]["subtree"] == "full"


def test_killed_interior_broker_is_replaced_and_its_children_go_home(instance) -> None:
    inst = instance(7, "tbon.fanout=2", "tbon.timeout=0")
    children = [inst.pid(3), inst.pid(4)]
    os.kill(inst.pid(1), signal.SIGKILL)
    inst.wait_status(
        lambda s: (
            s["ranks"][1]["state"] == "lost"
            and [s["ranks"][r].get("attached_to") for r in (3, 4)] == [0, 0]
        ),
        "rank 1 lost, ranks 3 and 4 fostered",
    )
    result = tbon("expand", inst.uri, "--fill")
    assert result.returncode == 0, result.stderr
    status = inst.wait_status(
        lambda s: [s["ranks"][r].get("attached_to") for r in (3, 4)] == [1, 1], "3 and 4 home"
    )
    assert states(status) == ["online"] * 7
    assert [status["ranks"][r]["incarnation"] for r in (1, 3, 4)] == [2, 1, 1]
    assert [status["ranks"][r]["pid"] for r in (3, 4)] == children


def test_joiner_killed_after_reservation_gives_the_rank_back(instance) -> None:
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=1s")
    joiner = inst.join("broker.rank=3")  # its parent, rank 1, is vacant: it waits
    inst.wait_status(lambda s: s["ranks"][3]["state"] == "reserved", "rank 3 reserved")
    joiner.kill()
    joiner.wait()
    status = inst.wait_status(
        lambda s: s["ranks"][3]["state"] == "vacant", "the reservation to expire"
    )
    assert status["ranks"][3]["incarnation"] == 1 and status["ranks"][3]["host"] == "extra2"
    result = tbon("expand", inst.uri, "--ranks", "1,3")
    assert result.returncode == 0, result.stderr
    assert inst.status()["ranks"][3]["incarnation"] == 2


def test_joiner_that_fails_after_reservation_releases_it_at_once(instance) -> None:
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=300s")
    # rank 1 has children: the joiner binds their socket, to an address it does not have
    joiner = inst.join("broker.rank=1", "tbon.endpoint=tcp://192.0.2.1:*")
    rank = 1
    code, err = finished(joiner)
    assert code != 0 and f"FLUB: released rank {rank} incarnation 1" in err, err
    # vacant again long before the lease (300 s) would have run out
    status = inst.wait_status(lambda s: s["ranks"][rank]["state"] == "vacant", "the release")
    assert status["ranks"][rank]["incarnation"] == 1
    assert status["ranks"][rank]["host"] == f"extra{rank - 1}"
    result = tbon("expand", inst.uri, "--ranks", "1,3")
    assert result.returncode == 0, result.stderr
    assert inst.status()["ranks"][rank]["incarnation"] == 2


def test_one_client_holds_at_most_four_reservations(instance) -> None:
    inst = instance(1, "size=8", "tbon.fanout=7", "broker.join-timeout=300s")

    def ask(client: Client, key: str) -> dict:
        request = {"public_key": key, "hostname": "hoarder", "rank": None}
        return client.rpc("flub.allocate", request, nodeid=0)

    keys = [generate_keypair()[0] for _ in range(6)]
    with Client(inst.uri) as hoarder:
        grants = [ask(hoarder, key) for key in keys[:4]]
        assert [g["rank"] for g in grants] == [1, 2, 3, 4]
        try:
            ask(hoarder, keys[4])
        except RequestError as error:
            assert error.errnum == errno.EAGAIN
            assert "this connection already holds 4 reservations" in str(error)
        else:
            raise AssertionError("a fifth reservation was granted to one client")
        # other clients are not held back: expand runs one broker, one connection, each
        result = tbon("expand", inst.uri, "-n", "2", "--json")
        assert result.returncode == 0, result.stderr
        assert sorted(j["rank"] for j in json.loads(result.stdout)["joined"]) == [5, 6]
        # giving one back frees the rank at once, and the slot with it
        one = {"rank": 2, "incarnation": grants[1]["incarnation"], "public_key": keys[1]}
        assert hoarder.rpc("flub.release", one, nodeid=0) == {}
        assert inst.status()["ranks"][2]["state"] == "vacant"
        try:
            hoarder.rpc("flub.release", one, nodeid=0)
        except RequestError as error:
            assert error.errnum == errno.ESTALE and "is not reserved" in str(error)
        else:
            raise AssertionError("a reservation was released twice")
        assert ask(hoarder, keys[5])["rank"] == 2
    status = inst.status()
    assert [status["ranks"][r]["state"] for r in range(1, 5)] == ["reserved"] * 4


def test_stopped_broker_woken_after_replacement_exits_77(instance) -> None:
    inst = instance(3, "tbon.heartbeat=100ms", "tbon.torpid=300ms", "tbon.timeout=1s")
    old = inst.pid(2)
    os.kill(old, signal.SIGSTOP)
    try:
        inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
        new = inst.join("broker.rank=2")
        replaced = inst.wait_status(online(2), "the replacement online")
        assert replaced["ranks"][2]["pid"] == new.pid
        assert replaced["ranks"][2]["incarnation"] == 2
    finally:
        os.kill(old, signal.SIGCONT)
    wait_for(lambda: process_gone(old), "the superseded broker to exit")
    status = inst.status()
    assert status["ranks"][2]["pid"] == new.pid and status["ranks"][2]["state"] == "online"
    assert tbon("ping", inst.uri, "2").returncode == 0
    inst.stop()
    assert launcher_said(inst.stderr(), 2, old, "exited with status 77")
    assert new.returncode == 0


# --- hostile requests ----------------------------------------------------------------------


def test_hostile_key_exchange_for_someone_elses_rank_is_refused(instance) -> None:
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=30s")
    owner = inst.join("broker.rank=1")
    inst.wait_status(online(1), "rank 1 online")
    waiting = inst.join("broker.rank=3")
    inst.wait_status(online(3), "rank 3 online")
    hostile_key = generate_keypair()[0]
    with Client(inst.uri) as client:
        # A vacant rank's reservation belongs to the key that asked for it.
        grant = client.rpc(
            "flub.allocate",
            {"public_key": generate_keypair()[0], "hostname": "elsewhere", "rank": 2},
            nodeid=0,
        )
        # Only rank 0 hands out a parent's card, and only for its current reservation.
        attempts = [
            (
                {"rank": 2, "incarnation": grant["incarnation"], "public_key": hostile_key},
                "reserved for another key",
            ),
            ({"rank": 3, "incarnation": 1, "public_key": hostile_key}, "is not reserved"),
            ({"rank": 3, "incarnation": 2, "public_key": hostile_key}, "is not reserved"),
            ({"rank": 1, "incarnation": 1, "public_key": hostile_key}, "is not reserved"),
        ]
        for payload, why in attempts:
            try:
                client.rpc("flub.kex", payload, nodeid=0)
            except RequestError as error:
                assert why in str(error), (payload, str(error))
            else:
                raise AssertionError(f"kex {payload} was accepted")
        # A parent admits a key only on rank 0's own order, whoever relays a forged one.
        for parent, rank in ((1, 3), (0, 1), (1, 4)):
            order = {"rank": rank, "incarnation": 2, "public_key": hostile_key}
            try:
                client.rpc("flub.authorize", order, nodeid=parent)
            except RequestError as error:
                assert "flub.authorize comes from the root only" in str(error), str(error)
            else:
                raise AssertionError(f"a forged order to rank {parent} was obeyed")
    status = inst.status()
    assert states(status)[:2] == ["online", "online"] and states(status)[3] == "online"
    assert status["ranks"][1]["pid"] == owner.pid and status["ranks"][3]["pid"] == waiting.pid
    assert [status["ranks"][r]["incarnation"] for r in (1, 3)] == [1, 1]


def test_only_the_joiners_own_connection_may_use_its_reservation(instance) -> None:
    """A public key is no secret: another client naming the joiner's (rank, incarnation, key)
    exactly may neither exchange keys for it nor give it back. The joiner's connection may."""
    inst = instance(1, "size=3", "tbon.fanout=2", "broker.join-timeout=300s")
    key = generate_keypair()[0]
    with Client(inst.uri) as joiner, Client(inst.uri) as other:
        asked = {"public_key": key, "hostname": "joiner", "rank": 1}
        grant = joiner.rpc("flub.allocate", asked, nodeid=0)
        assert grant["parent_card"]["endpoint"]  # rank 0 is online: the card came at once
        incarnation = grant["incarnation"]
        triple = {"rank": 1, "incarnation": incarnation, "public_key": key}
        why = f"rank 1 incarnation {incarnation} was not reserved by this connection"
        for topic in ("flub.kex", "flub.release"):
            try:
                other.rpc(topic, triple, nodeid=0)
            except RequestError as error:
                assert error.errnum == errno.EPERM and str(error).endswith(why), str(error)
            else:
                raise AssertionError(f"{topic} from another connection was obeyed")
        assert inst.status()["ranks"][1]["state"] == "reserved"
        card = joiner.rpc("flub.kex", triple, nodeid=0)
        assert card["endpoint"] == grant["parent_card"]["endpoint"] and card["public_key"]
        assert joiner.rpc("flub.release", triple, nodeid=0) == {}
    assert inst.status()["ranks"][1]["state"] == "vacant"


def test_hostile_hello_with_an_unauthorized_key_is_refused(instance) -> None:
    inst = instance(1, "size=2")
    with Client(inst.uri) as client:
        info = client.rpc("broker.info", nodeid=0)
        client.rpc(
            "flub.allocate",
            {"public_key": generate_keypair()[0], "hostname": "x", "rank": 1},
            nodeid=0,
        )
    public, secret = generate_keypair()  # not the key rank 1 was reserved for
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.linger = 0
    monitor = rogue.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED
    )
    rogue.curve_publickey, rogue.curve_secretkey = public.encode(), secret.encode()
    rogue.curve_serverkey = info["public_key"].encode()
    rogue.connect(info["endpoint"])
    try:
        assert monitor.poll(DEADLINE * 1000)
        from zmq.utils.monitor import recv_monitor_message

        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    finally:
        rogue.disable_monitor()
        monitor.close()
        rogue.close()
        context.term()
    assert inst.status()["ranks"][1]["state"] == "reserved"


def test_replacement_for_a_torpid_broker_waits_for_the_verdict(instance) -> None:
    inst = instance(3, "tbon.heartbeat=100ms", "tbon.torpid=300ms", "tbon.timeout=2s")
    old = inst.pid(2)
    os.kill(old, signal.SIGSTOP)
    try:
        inst.wait_status(lambda s: s["ranks"][2]["torpid"], "rank 2 torpid")
        new = inst.join("broker.rank=2")  # the old one is silent but not yet lost
        seen = inst.wait_status(
            lambda s: s["ranks"][2]["state"] != "online" or new.poll() is not None,
            "rank 2 to change hands",
        )
        assert seen["ranks"][2]["state"] in ("lost", "reserved", "online"), seen["ranks"][2]
        replaced = inst.wait_status(lambda s: s["ranks"][2]["pid"] == new.pid, "the replacement")
        assert replaced["ranks"][2]["incarnation"] == 2
    finally:
        os.kill(old, signal.SIGCONT)
    wait_for(lambda: process_gone(old), "the superseded broker to exit")
    assert inst.status()["ranks"][2]["pid"] == new.pid


def test_only_rank_0_may_revoke_an_incarnation(instance) -> None:
    inst = instance(4, "tbon.fanout=2")
    before = inst.status()
    with Client(inst.uri) as client:
        try:  # a client of rank 0 forging rank 0's order to rank 3's parent
            client.rpc("flub.revoke", {"rank": 3, "incarnation": 1, "reason": "forged"}, nodeid=1)
        except RequestError as error:
            assert "flub.revoke comes from the root only" in str(error)
        else:
            raise AssertionError("a forged flub.revoke was obeyed")
    assert tbon("ping", inst.uri, "3").returncode == 0
    after = inst.status()
    assert states(after) == ["online"] * 4
    assert [r["pid"] for r in after["ranks"]] == [r["pid"] for r in before["ranks"]]


def test_requesting_a_rank_beyond_the_instance_exits_69(instance) -> None:
    inst = instance(1, "size=3")
    code, err = finished(inst.join("broker.rank=7"))
    assert code == 69 and "no rank 7 in this instance of size 3" in err
    assert "Traceback" not in err and "internal error" not in err


# --- two brokers, one key ------------------------------------------------------------------


def join_logged(inst, log, *attributes: str) -> subprocess.Popen[str]:
    """A joiner like `inst.join`, whose stderr goes to the file `log` so that the test can read
    what it said while it runs (reaped by the instance's stop())."""
    argv = [TBON, "broker", "-S", f"broker.boot-server={inst.uri}"]
    argv += ["-S", "tbon.endpoint=tcp://127.0.0.1:*"]
    for attribute in attributes:
        argv += ["-S", attribute]
    with open(log, "w") as stderr:
        joiner = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            env=child_env(),
        )
    inst.joiners.append(joiner)
    return joiner


def settle_twins(inst, twins: list[subprocess.Popen[str]]) -> dict:
    """Wait until one twin is shown online and the other has exited, or both have exited; then
    check that `tbon status --json` and `tbon ping` agree with which processes are alive, and
    return rank 3 as status shows it."""

    def settled() -> bool:
        alive = [twin for twin in twins if twin.poll() is None]
        if len(alive) != 1:
            return not alive
        entry = inst.status()["ranks"][3]
        return entry["state"] == "online" and entry["pid"] == alive[0].pid

    try:
        wait_for(settled, "one twin online and the other gone, or both gone")
    except AssertionError as error:
        ranks = [(r["rank"], r["state"], r["pid"]) for r in inst.status()["ranks"]]
        raise AssertionError(f"{error}; ranks {ranks}; twins {[t.pid for t in twins]}") from None
    shown = json.loads(tbon("status", inst.uri, "--json").stdout)["ranks"][3]
    alive = {twin.pid for twin in twins if twin.poll() is None}
    ping = tbon("ping", inst.uri, "3")
    if shown["state"] == "online":
        assert shown["pid"] in alive, f"rank 3 shown online with pid {shown['pid']}, gone: {shown}"
        assert ping.returncode == 0, ping.stderr
    else:
        assert not alive and ping.returncode != 0, (shown, alive)
    return shown


def test_two_joiners_with_one_certificate_leave_status_true(instance, tmp_path) -> None:
    """Both reserve rank 3 (one key, one reservation) while its parent is vacant, both wait,
    then the parent joins. At most one may be online, and status and ping must say which: never
    a rank shown online whose broker has gone (both used to say hello, and rank 0 showed the
    first online after both were refused)."""
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=60s")
    cert = tmp_path / "twin.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    twins = [join_logged(inst, log, "broker.rank=3", f"broker.cert={cert}") for log in logs]
    wait_for(
        lambda: all("waiting for parent rank 1" in log.read_text() for log in logs),
        "both twins to hold the reservation and wait for rank 1",
    )
    assert [t.poll() for t in twins] == [None, None]
    inst.join("broker.rank=1")
    shown = settle_twins(inst, twins)
    # each twin may use the reservation (the one it was granted to, the other by proving that
    # it holds the key, which moves it): one is refused as a second holder, by rank 0 or at the
    # parent's hello
    [winner] = [twin for twin in twins if twin.poll() is None]
    [loser] = [twin for twin in twins if twin is not winner]
    said = logs[twins.index(loser)].read_text()
    assert loser.returncode == 77, said
    reasons = ("was not reserved by this connection", "is held by another broker")
    assert any(f"rank 3 incarnation 1 {why}" in said for why in reasons), said
    assert shown["pid"] == winner.pid and shown["incarnation"] == 1


def test_two_joiners_with_one_certificate_under_an_online_parent(instance, tmp_path) -> None:
    """Both may get the parent's card with their grant and say hello: the parent keeps the
    first and refuses the other broker (77). Or the first comes online while rank 0 orders the
    parent for the second, whose grant has then lapsed (77), or before the second asks, which is
    told the key holds the rank (69). Whichever, status tells the truth."""
    inst = instance(1, "size=4", "tbon.fanout=2", "broker.join-timeout=60s")
    inst.join("broker.rank=1")
    inst.wait_status(online(1), "rank 1 online")
    cert = tmp_path / "twin.cert"
    assert tbon("keygen", str(cert)).returncode == 0
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    twins = [join_logged(inst, log, "broker.rank=3", f"broker.cert={cert}") for log in logs]
    shown = settle_twins(inst, twins)
    assert shown["state"] == "online" and shown["incarnation"] == 1
    [loser] = [twin for twin in twins if twin.returncode is not None]
    said = logs[twins.index(loser)].read_text()
    reasons = {77: ("is held by another broker", "lapsed"), 69: ("this key already holds rank 3",)}
    assert any(why in said for why in reasons.get(loser.returncode, ())), said
