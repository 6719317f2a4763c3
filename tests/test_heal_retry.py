"""The one retry of `tbon status` and `tbon ping` after the tree heals (issue 12).

A request that a broker could not route (EHOSTUNREACH: one on its way was just lost) is sent
again once, after `heal.wait` at the broker the command talks to and then at rank 0. Only the
RPC layer is scripted here (`Scripted`, in place of `connect`): the commands and the retry run
as they do for a user, in this process. The brokers' side of `heal.wait` is tested with them.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import tbon

from tbon.cli.app import run
from tbon.cli.common import HEAL_WAIT, once_healed, wait_healed
from tbon.errors import TbonError
from tbon.overlay.connectors.client import RequestError
from tbon.overlay.wire.message import ANY_RANK

UNREACHABLE = (errno.EHOSTUNREACH, "rank 1 is lost")
Answer = dict[str, Any] | tuple[int, str]


class Scripted:
    """A client whose answers are given in advance, per topic and in order: a dict answers,
    an (errnum, words) pair fails as the instance would. Every request is recorded."""

    uri = "local:///scripted"

    def __init__(self, answers: dict[str, list[Answer]]) -> None:
        self.answers = {topic: list(queue) for topic, queue in answers.items()}
        self.asked: list[tuple[str, int, dict[str, Any]]] = []

    def _next(self, topic: str, payload: dict[str, Any] | None, nodeid: int) -> dict[str, Any]:
        self.asked.append((topic, nodeid, payload or {}))
        answer = self.answers[topic].pop(0)
        if isinstance(answer, tuple):
            raise RequestError(*answer)
        return answer

    def rpc(
        self,
        topic: str,
        payload: dict[str, Any] | None = None,
        nodeid: int = ANY_RANK,
        timeout: float | None = 30.0,
        quiet: bool = False,
    ) -> dict[str, Any]:
        return self._next(topic, payload, nodeid)

    def watch_status(
        self, deadline: float | None = None, view: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        yield self._next("status.watch", view, 0)

    def table_pages(self, timeout: float | None = 30.0) -> Iterator[tuple[dict[str, Any], bytes]]:
        """A whole table scripted as `status.get` answers it, given as one page."""
        whole = self._next("status.get", {"start": 0}, 0)
        header = {"size": whole["size"], "topo": whole["topo"], "start": 0, "next": None}
        yield (
            header,
            ",".join(json.dumps(e, separators=(",", ":")) for e in whole["ranks"]).encode(),
        )

    def topics(self) -> list[tuple[str, int]]:
        return [(topic, nodeid) for topic, nodeid, _ in self.asked]

    def close(self) -> None:
        pass

    def __enter__(self) -> Scripted:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


def table() -> dict[str, Any]:
    """A status object of two ranks, both online."""
    ranks = [
        {
            "rank": rank,
            "state": "online",
            "host": f"n{rank}",
            "pid": 100 + rank,
            "incarnation": 1,
            "parent": None if rank == 0 else 0,
            "children": [1] if rank == 0 else [],
            "subtree": "full",
            "torpid": False,
            "since": 1.0,
            "attached_to": None if rank == 0 else 0,
        }
        for rank in (0, 1)
    ]
    return {"size": 2, "topo": "kary:32", "ranks": ranks}


def tree() -> dict[str, Any]:
    """status.tree's answer for table(): rank 0, and rank 1 below it."""
    entries = table()["ranks"]
    items = [
        {"depth": 0, "last": True, "entry": entries[0]},
        {"depth": 1, "last": True, "entry": entries[1]},
    ]
    return {"size": 2, "topo": "kary:32", "rank": 0, "items": items}


def summary() -> dict[str, Any]:
    """status.summary's answer for table()."""
    entry = table()["ranks"][0]
    counts = {"online": 2}
    return {"size": 2, "rank": 0, "entry": entry, "ranks": 2, "counts": counts, "missing": 0}


def scripted(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[Answer]]) -> Scripted:
    """The client every command of this test connects to."""
    client = Scripted(answers)
    monkeypatch.setattr("tbon.overlay.connectors.client.connect", lambda uri, progress=None: client)
    return client


HEALED: list[Answer] = [{}, {}]  # heal.wait: attached here, and nothing reattaching at rank 0


# --- once_healed ---------------------------------------------------------------------------------


def test_unreachable_waits_here_then_at_rank_0_and_asks_once_more() -> None:
    client = Scripted({"status.get": [UNREACHABLE, table()], "heal.wait": HEALED})
    answer = once_healed(client, lambda: client.rpc("status.get", nodeid=0), 3.0)
    assert answer == table()
    assert client.topics() == [
        ("status.get", 0),
        ("heal.wait", ANY_RANK),  # the broker this client is connected to
        ("heal.wait", 0),
        ("status.get", 0),
    ]
    waits = [payload["timeout"] for topic, _, payload in client.asked if topic == "heal.wait"]
    assert all(0 < seconds <= 3.0 for seconds in waits), waits


def test_without_a_limit_the_wait_is_bounded_by_the_default() -> None:
    client = Scripted({"status.get": [UNREACHABLE, table()], "heal.wait": HEALED})
    once_healed(client, lambda: client.rpc("status.get", nodeid=0), None)
    assert HEAL_WAIT - 1 < client.asked[1][2]["timeout"] <= HEAL_WAIT


@pytest.mark.parametrize(
    "local",
    [(errno.ENOSYS, "unknown request 'heal.wait'"), (errno.ETIMEDOUT, "heal.wait: timed out")],
    ids=["older-broker", "timed-out"],
)
def test_a_failed_wait_ends_the_wait_and_the_request_is_sent_again(local: Answer) -> None:
    client = Scripted({"status.get": [UNREACHABLE, table()], "heal.wait": [local]})
    assert once_healed(client, lambda: client.rpc("status.get", nodeid=0), 3.0) == table()
    assert client.topics() == [("status.get", 0), ("heal.wait", ANY_RANK), ("status.get", 0)]


def test_a_second_failure_is_the_error() -> None:
    again = (errno.EHOSTUNREACH, "rank 1 is still lost")
    client = Scripted({"status.get": [UNREACHABLE, again, table()], "heal.wait": HEALED})
    with pytest.raises(RequestError, match="rank 1 is still lost") as raised:
        once_healed(client, lambda: client.rpc("status.get", nodeid=0), 3.0)
    assert raised.value.errnum == errno.EHOSTUNREACH
    assert [t for t, _ in client.topics()].count("status.get") == 2


def test_no_other_error_is_retried() -> None:
    client = Scripted({"broker.ping": [(errno.ENOENT, "no rank 9"), (errno.EPROTO, "broken")]})
    for words in ("no rank 9", "broken"):
        with pytest.raises(RequestError, match=words):
            once_healed(client, lambda: client.rpc("broker.ping", nodeid=9), 3.0)

    def silent() -> dict[str, Any]:
        raise TbonError("no answer from rank 9 within 3s")

    with pytest.raises(TbonError, match="no answer"):
        once_healed(client, silent, 3.0)
    assert "heal.wait" not in [t for t, _ in client.topics()]


def test_no_time_left_means_no_wait() -> None:
    client = Scripted({"heal.wait": HEALED})
    started = time.monotonic()
    wait_healed(client, 0.0)
    assert client.asked == [] and time.monotonic() - started < 1.0


def test_a_command_spinner_says_why_it_pauses_and_then_what_it_said() -> None:
    class Spinner:
        def __init__(self) -> None:
            self.status, self.shown = "waiting for rank 0 to be full", []

        def update(self, status: str) -> None:
            self.status = status
            self.shown.append(status)

    spinner = Spinner()
    wait_healed(Scripted({"heal.wait": HEALED}), 3.0, spinner)  # type: ignore[arg-type]
    assert spinner.shown == ["waiting for the tree to heal", "waiting for rank 0 to be full"]


# --- the commands --------------------------------------------------------------------------------


def test_status_shows_the_table_it_got_on_the_second_try(monkeypatch, capsys) -> None:
    client = scripted(monkeypatch, {"status.tree": [UNREACHABLE, tree()], "heal.wait": HEALED})
    assert run(["status", "local:///scripted", "--no-pretty"]) == 0
    out, err = capsys.readouterr()
    assert out == "0 n0: full\n  1 n1: full\n" and err == ""  # piped: no note
    assert [t for t, _ in client.topics()] == [
        "status.tree",
        "heal.wait",
        "heal.wait",
        "status.tree",
    ]


def test_status_reports_a_second_failure_as_it_always_did(monkeypatch, capsys) -> None:
    scripted(monkeypatch, {"status.get": [UNREACHABLE, UNREACHABLE], "heal.wait": HEALED})
    assert run(["status", "local:///scripted", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "tbon status: rank 1 is lost\n"


def test_status_wait_retries_its_first_request_only(monkeypatch, capsys) -> None:
    client = scripted(
        monkeypatch,
        {"status.watch": [UNREACHABLE, summary()], "heal.wait": HEALED, "status.get": [table()]},
    )
    assert run(["status", "local:///scripted", "--wait", "full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == table()
    assert [t for t, _ in client.topics()] == [
        "status.watch",
        "heal.wait",
        "heal.wait",
        "status.watch",
        "status.get",  # the table, in pages, once the wait is over
    ]
    scripted(monkeypatch, {"status.watch": [UNREACHABLE, UNREACHABLE], "heal.wait": HEALED})
    assert run(["status", "local:///scripted", "--wait", "full"]) == 1
    assert capsys.readouterr().err == "tbon status: status stream ended: rank 1 is lost\n"


def test_ping_retries_once_per_command(monkeypatch, capsys) -> None:
    pong = {"hostname": "n1", "hops": 1}
    client = scripted(
        monkeypatch,
        {"broker.ping": [UNREACHABLE, pong, pong, UNREACHABLE, pong], "heal.wait": HEALED},
    )
    # the third ping: rank 1 not reachable, the retry spent: 68, as for any rank not online
    assert run(["ping", "local:///scripted", "1", "--count", "3"]) == 68
    out, err = capsys.readouterr()
    assert [line.split(" time=")[0] for line in out.splitlines()] == [
        "rank 1 (n1): seq=0",  # answered on the second try
        "rank 1 (n1): seq=1",
    ]
    assert err == "tbon ping: rank 1 is lost\n"  # the third ping's: the retry was spent
    assert [t for t, _ in client.topics()].count("heal.wait") == 2
    assert [payload["seq"] for t, _, payload in client.asked if t == "broker.ping"] == [0, 0, 1, 2]


def test_ping_waits_at_most_its_timeout(monkeypatch, capsys) -> None:
    pong = {"hostname": "n1", "hops": 1}
    client = scripted(monkeypatch, {"broker.ping": [UNREACHABLE, pong], "heal.wait": HEALED})
    assert run(["ping", "local:///scripted", "1", "--timeout", "2s", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hops"] == 1
    waits = [payload["timeout"] for topic, _, payload in client.asked if topic == "heal.wait"]
    assert len(waits) == 2 and all(0 < seconds <= 2.0 for seconds in waits)


# --- a real instance -----------------------------------------------------------------------------


def test_a_lost_rank_is_pinged_twice_and_reported_once(instance) -> None:
    """A lost target is unreachable too: the wait is short (nothing is healing), and the error
    is today's, with the exit status of a rank not online (68, as for every command). A broker
    without `heal.wait` answers ENOSYS, and the ping is sent again."""
    inst = instance(3)
    os.kill(inst.pid(2), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][2]["state"] == "lost", "rank 2 lost")
    ping = tbon("ping", inst.uri, "2")
    assert ping.returncode == 68 and ping.stderr == "tbon ping: rank 2 is lost\n"


def test_status_through_a_fostered_rank_waits_for_the_tree_and_shows_it(instance) -> None:
    """Ask rank 3 for the table right after its parent died: the request to rank 0 finds no
    route while rank 3 reattaches, the command waits for the tree to heal, asks again, and
    draws rank 3 under its foster parent."""
    inst = instance(7, "tbon.fanout=2")  # 0 - {1 - {3, 4}, 2 - {5, 6}}
    three = inst.uri.replace("/0/local", "/3/local")
    os.kill(inst.pid(1), signal.SIGKILL)
    shown = tbon("status", three, "--no-pretty", "--timeout", "10s")
    assert shown.returncode == 0, shown.stderr
    assert "  3 " in shown.stdout and "(fostered, home is rank 1)" in shown.stdout
    assert tbon("ping", three, "0").returncode == 0
