"""The broker's services without sockets or processes: a request and a time go in, the actions
come out (overlay/services/). Each test builds a service with a rank table, a topology and a
lifecycle, as the broker does, and reads the list it returns."""

from __future__ import annotations

import errno
import json
import signal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rank0 import AtRank0
from tables import bring_up, started

from tbon import exitcodes
from tbon.keys.cert import generate_keypair
from tbon.overlay.services import exec as exec_service
from tbon.overlay.services.actions import (
    AbandonJob,
    Action,
    Authorize,
    Call,
    ForgetWatches,
    Forward,
    GrantCredit,
    KillAllJobs,
    KillJobsFrom,
    Leave,
    Log,
    Readmit,
    Respond,
    RetireChild,
    Revoke,
    Send,
    ShutDown,
    SignalJob,
    StartJob,
    WriteStdin,
    warning,
)
from tbon.overlay.services.exec import ExecService
from tbon.overlay.services.flub import RESERVATIONS_PER_CONNECTION, FlubService, flub_attributes
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.ping import PingService, Whoami
from tbon.overlay.services.retire import Draining, RetireService
from tbon.overlay.services.status import StatusService
from tbon.overlay.services.trust import from_parent_of
from tbon.overlay.state.ranktable import Departed, Lost, Online, RankState, RankTable
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message, decode, encode
from tbon.overlay.wire.route import (
    client_notice,
    connection_of,
    from_rank0,
    origin,
    same_client,
    speaks_for,
)

NOW = 200.0
CARD = {"endpoint": "tcp://10.0.0.1:5000", "public_key": "P" * 40, "hostname": "parent"}
ATTRIBUTES = flub_attributes(2.0, 10.0, 60.0, 30.0)


def request(
    topic: str,
    payload: dict[str, Any] | None = None,
    route: list[str] | None = None,
    nodeid: int = 0,
) -> Message:
    return Message(
        Kind.REQUEST,
        topic,
        payload or {},
        nodeid=nodeid,
        tag=7,
        route=route if route is not None else ["l01"],
    )


def responses(actions: list[Action]) -> list[Message]:
    return [a.message for a in actions if isinstance(a, Respond)]


def only_response(actions: list[Action]) -> Message:
    found = responses(actions)
    assert len(found) == 1, actions
    return found[0]


def of_type(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def reply_to(
    call: Call, payload: dict[str, Any] | None = None, errnum: int = 0, errstr: str = ""
) -> Message:
    reply = call.request.respond(payload or {})
    reply.errnum, reply.errstr = errnum, errstr
    return reply


# --- trust ----------------------------------------------------------------------------------


def test_only_rank0s_own_requests_pass_as_from_rank0() -> None:
    assert from_rank0(request("x", route=["s", "p0", "p1"]))
    assert from_rank0(request("x", route=["s", "p0"]))  # a fostered broker: fewer hops
    assert not from_rank0(request("x", route=["l00", "c2", "s", "p0", "p1"]))
    assert not from_rank0(request("x", route=["l00", "p0", "p1"]))
    assert not from_rank0(request("x", route=["s", "p1"]))  # rank 1's own request
    assert not from_rank0(request("x", route=["s", "c2", "p0"]))  # rank 2's, through rank 0
    assert not from_rank0(request("x", route=["s", "p0", "l3"]))
    assert from_rank0(request("x", route=["s"]))
    assert not from_rank0(request("x", route=["l00"]))


def test_only_the_parent_itself_passes_as_the_parent_of_a_rank() -> None:
    topology = Topology("kary:2", 7)
    assert from_parent_of(request("x", route=["s", "c1"]), topology, 3)
    assert not from_parent_of(request("x", route=["l00", "c1"]), topology, 3)
    assert not from_parent_of(request("x", route=["s", "c3", "c1"]), topology, 3)
    assert from_parent_of(request("x", route=["s"]), topology, 1)
    # a client of rank 1 itself, padding its route to look like rank 1's own request
    assert not from_parent_of(request("x", route=["s", "l05", "c1"]), topology, 3)


def test_a_request_names_the_connection_it_came_by_whatever_its_sender_wrote() -> None:
    """The hops before the first broker's own are the sender's, and name nothing."""
    cases = [
        (["l01"], ("l01",)),
        (["l0a", "c1"], ("l0a", "c1")),
        (["c7", "l0a", "c1"], ("l0a", "c1")),  # padded: still that client of rank 1
        (["l0b", "p0", "l0a", "c1"], ("l0a", "c1")),
        (["s", "c3", "c1"], ("s", "c3", "c1")),  # rank 3's own request
        (["l0a", "c1", "p0"], ("l0a", "c1", "p0")),  # a notice on its way down to a stream
        ([], ()),
    ]
    for route, connection in cases:
        assert connection_of(request("x", route=route)) == connection, route
    assert client_notice(request("client.disconnect", route=["l0a", "c1"]))
    assert client_notice(request("client.disconnect", route=["l0a"]))
    for forged in (["x", "l0a", "c1"], ["l0b", "l0a"], ["s", "c1"], ["c1"], []):
        assert not client_notice(request("client.disconnect", route=forged)), forged


# --- ping -----------------------------------------------------------------------------------


def ping_service() -> PingService:
    me = Whoami(1, "node1", 4242, "local:///run/local", "tcp://h:1", "K" * 40, {"size": "4"})
    return PingService(me, Topology("kary:2", 4))


def test_ping_echoes_its_payload_with_who_answered_and_the_hops() -> None:
    reply = only_response(
        ping_service().ping(request("broker.ping", {"seq": 3}, route=["l0a", "p0"]), NOW)
    )
    assert reply.payload == {"seq": 3, "rank": 1, "hostname": "node1", "pid": 4242, "hops": 1}
    assert reply.route == ["l0a", "p0"]


def test_ping_says_why_a_broker_is_adrift_so_a_uri_list_passes_over_it() -> None:
    service = ping_service()
    service.adrift = lambda now: "no parent now: seeking a live ancestor" if now > NOW else None
    calm = only_response(service.ping(request("broker.ping"), NOW))
    assert "adrift" not in calm.payload
    lost = only_response(service.ping(request("broker.ping"), NOW + 1))
    assert lost.payload["adrift"] == "no parent now: seeking a live ancestor"


def test_info_says_where_the_broker_sits() -> None:
    reply = only_response(ping_service().info(request("broker.info"), NOW))
    assert reply.payload["parent"] == 0 and reply.payload["children"] == [3]
    assert reply.payload["size"] == 4 and reply.payload["topo"] == "kary:2"
    assert reply.payload["endpoint"] == "tcp://h:1"


def test_shutdown_answers_first_then_shuts_down() -> None:
    actions = ping_service().shutdown(request("instance.shutdown"), NOW)
    assert isinstance(actions[0], Respond) and actions[1] == ShutDown(end_program=True)


# --- status ---------------------------------------------------------------------------------


def test_a_watcher_gets_the_table_then_one_push_per_change() -> None:
    table = started("kary:2", 3)
    lifecycle = Lifecycle()
    status = StatusService(table, lifecycle)
    watch = request("status.watch")
    first = only_response(status.watch(watch, NOW))
    assert first.streaming and first.payload["ranks"][1]["state"] == "offline"
    assert status.pushes(NOW) == []  # nothing changed since
    assert status.ack(request("status.ack", {"watch": watch.tag}), NOW) == []
    bring_up(table, [1, 2])
    pushed = status.pushes(NOW)
    assert len(pushed) == 1 and pushed[0][1].payload["ranks"][2]["state"] == "online"
    assert status.pushes(NOW) == []


def test_a_watcher_is_pushed_a_standbys_acknowledgement_that_changes_no_entry() -> None:
    """status.watch pushes when only the root group's view changed (a standby's `acked`, its
    `voter`, grants paused): the table's generation alone would not say so."""
    table = started("kary:2", 3)
    bring_up(table, [1, 2])
    status = StatusService(table, Lifecycle())
    group = {"term": 1, "index": 5, "commit": 5, "paused": False, "standbys": []}
    standbys = [{"rank": 1, "acked": 4, "lag": 1, "voter": True}]
    status.group = lambda now: {**group, "standbys": [dict(s) for s in standbys]}
    watch = request("status.watch")
    ack = request("status.ack", {"watch": watch.tag})
    first = only_response(status.watch(watch, NOW))
    assert first.payload["group"]["standbys"][0]["acked"] == 4
    assert status.ack(ack, NOW) == [] and status.pushes(NOW) == []  # nothing new
    generation = table.generation
    standbys[0].update(acked=5, lag=0)
    pushed = status.pushes(NOW)
    assert table.generation == generation  # no entry changed
    assert len(pushed) == 1 and pushed[0][1].payload["group"]["standbys"][0]["acked"] == 5
    assert status.pushes(NOW) == []  # once
    standbys[0]["voter"] = False  # unread meanwhile: given on the acknowledgement
    assert status.pushes(NOW) == []
    latest = only_response(status.ack(ack, NOW))
    assert latest.payload["group"]["standbys"][0]["voter"] is False
    assert status.ack(ack, NOW) == []
    group["paused"] = True
    assert status.pushes(NOW)[0][1].payload["group"]["paused"] is True


def test_a_watcher_that_has_not_read_gets_only_the_latest_table_when_it_does() -> None:
    table = started("kary:2", 7)
    status = StatusService(table, Lifecycle())
    watch = request("status.watch", route=["l0a", "c1"])
    status.watch(watch, NOW)
    for rank in range(1, 7):  # six changes, one table in flight: nothing more is sent
        bring_up(table, [rank])
        assert status.pushes(NOW) == []
    elsewhere = request("status.ack", {"watch": watch.tag}, route=["l0b"])
    assert status.ack(elsewhere, NOW) == []  # another client's ack: not this watcher's
    latest = only_response(
        status.ack(request("status.ack", {"watch": watch.tag}, route=["l0a", "c1"]), NOW)
    )
    assert latest.route == ["l0a", "c1"] and latest.streaming
    assert [r["state"] for r in latest.payload["ranks"]] == ["online"] * 7
    assert status.ack(request("status.ack", {"watch": watch.tag}, route=["l0a", "c1"]), NOW) == []


def test_a_held_watcher_of_thousands_of_held_ranks_reads_its_table_in_pages() -> None:
    """Past what one message holds, each update of the held view goes as pages, the next
    once the one before is acknowledged; a change meanwhile goes as a new update after them."""
    from tbon.overlay.state.heldtable import HeldPages

    table = started("kary:32", 20_000)  # 20,000 ranks launched: every one held
    status = StatusService(table, Lifecycle())
    watch = request("status.watch", {"view": "held"})
    ack = request("status.ack", {"watch": watch.tag})
    pages = HeldPages()
    reply = only_response(status.watch(watch, NOW))
    count = 1
    while (view := pages.take(reply.payload)) is None:
        assert status.pushes(NOW) == []  # a page in flight: nothing else goes
        reply = only_response(status.ack(ack, NOW))
        assert reply.streaming and reply.payload["start"] > 0
        count += 1
    assert count > 2 and view["ranks"][19_999]["state"] == "offline"
    assert status.ack(ack, NOW) == []  # the whole view read, and nothing changed
    bring_up(table, [1])
    (pushed,) = status.pushes(NOW)
    assert pushed[1].payload["start"] == 0 and pushed[1].payload["next"] is not None
    bring_up(table, [2])  # while the pages of the update go
    reply = pushed[1]
    while (view := pages.take(reply.payload)) is None:
        reply = only_response(status.ack(ack, NOW))
    assert view["ranks"][1]["state"] == "online"
    again = only_response(status.ack(ack, NOW))  # then the newer table, from its first page
    assert again.payload["start"] == 0


def test_a_states_watcher_is_sent_each_ranks_state_as_idsets_in_one_message() -> None:
    """What tbon exec follows: every rank in one idset per state (spares vacant), a few bytes
    at 262,144 ranks, and the next view once a rank's state changed and the last was read."""
    table = started("kary:32", 262_144, launched=1024)
    bring_up(table, list(range(1, 1024)))
    status = StatusService(table, Lifecycle())
    watch = request("status.watch", {"view": "states"})
    first = only_response(status.watch(watch, NOW)).payload
    assert first["states"] == {"online": "0-1023", "vacant": "1024-262143"}
    assert first["reattaching"] == "" and first["root"] == 0 and len(json.dumps(first)) < 200
    status.ack(request("status.ack", {"watch": watch.tag}), NOW)
    assert table.apply(Lost(1000, 1, "test", 31), NOW).applied
    ((_, pushed),) = status.pushes(NOW)
    assert pushed.payload["states"]["lost"] == "1000"
    assert pushed.payload["states"]["online"] == "0-999,1001-1023"


def test_the_states_view_is_built_once_a_generation_and_anew_after_any_change() -> None:
    """exec's watch and its exec.start's targets read one build of `states` while nothing
    changed, and never an old one after a change: a rank lost is lost in the next."""
    table = started("kary:32", 2048, launched=1024)
    bring_up(table, list(range(1, 1024)))
    status = StatusService(table, Lifecycle())
    watch = request("status.watch", {"view": "states"})
    first = only_response(status.watch(watch, NOW)).payload
    built = status.states()
    assert built is status.states() and built["states"] == first["states"]
    assert table.apply(Lost(1000, 1, "test", 31), NOW).applied
    after = status.states()
    assert after is not built and after["states"]["lost"] == "1000"
    assert built["states"] == {"online": "0-1023", "vacant": "1024-2047"}  # never changed


def test_an_online_watcher_is_sent_the_online_ranks_pids_in_pages() -> None:
    """What tbon expand follows: each online rank's pid and incarnation, in pages past what one
    holds (each the next once the one before is acknowledged), and a rank lost meanwhile is
    gone from the next update: no view shows a rank online that is not."""
    from tbon.overlay.state.onlineview import OnlinePages

    table = started("kary:32", 30_000)
    bring_up(table, list(range(1, 30_000)))
    status = StatusService(table, Lifecycle())
    watch = request("status.watch", {"view": "online"})
    ack = request("status.ack", {"watch": watch.tag})
    pages = OnlinePages()
    reply = only_response(status.watch(watch, NOW))
    count = 1
    while (online := pages.take(reply.payload)) is None:
        assert len(json.dumps(reply.payload["online"])) < 2 * (1 << 20)  # PAGE_BYTES, and some
        reply = only_response(status.ack(ack, NOW))
        assert reply.streaming and reply.payload["start"] > 0
        count += 1
    assert count > 1 and [r for r, _, _ in online] == list(range(30_000))
    assert online[5] == (5, table.entries.peek(5).pid, 1)
    assert status.ack(ack, NOW) == []  # all read, nothing changed
    assert table.apply(Lost(29_999, 1, "test", 937), NOW).applied  # its parent says
    ((_, reply),) = status.pushes(NOW)
    while (online := pages.take(reply.payload)) is None:
        reply = only_response(status.ack(ack, NOW))
    assert [r for r, _, _ in online] == list(range(29_999))


def test_the_held_view_is_asked_for_a_page_at_a_time() -> None:
    table = started("kary:32", 20_000)
    status = StatusService(table, Lifecycle())
    first = only_response(status.get(request("status.get", {"view": "held"}), NOW)).payload
    later = status.get(request("status.get", {"view": "held", "start": first["next"]}), NOW)
    assert only_response(later).payload["ranks"][0]["rank"] == first["next"]
    bad = status.get(request("status.get", {"view": "held", "start": 20_000}), NOW)
    assert only_response(bad).errnum == errno.EINVAL


def test_watches_end_with_their_client_and_at_shutdown() -> None:
    table = started("kary:2", 3)
    status = StatusService(table, Lifecycle())
    status.watch(request("status.watch", route=["l01"]), NOW)
    status.watch(request("status.watch", route=["l02"]), NOW)
    status.forget(("l01",))
    assert [w.route for w in status.watchers] == [["l02"]]
    ended = only_response(status.end())
    assert ended.errnum == errno.ENODATA and status.watchers == []


def test_no_new_watch_while_the_instance_stops() -> None:
    lifecycle = Lifecycle(stopping=True)
    status = StatusService(started("kary:2", 3), lifecycle)
    assert only_response(status.watch(request("status.watch"), NOW)).errnum == errno.ENODATA
    assert status.watchers == []


# --- FLUB: rank 0 ---------------------------------------------------------------------------


def flub_at_rank0(table: RankTable, lifecycle: Lifecycle | None = None) -> Any:
    """FLUB at rank 0, its Apply actions carried out on the one path (tests/rank0.py)."""
    flub = FlubService(0, table.topology, table, lifecycle or Lifecycle(), CARD, ATTRIBUTES)
    return AtRank0.of(lambda _: flub, table)


def retire_at_rank0(table: RankTable) -> Any:
    return AtRank0.of(lambda _: RetireService(0, table.topology, table), table)


def allocate(key: str, rank: int | None = None) -> Message:
    return request("flub.allocate", {"public_key": key, "hostname": "joiner", "rank": rank})


def test_allocation_under_an_online_parent_orders_it_to_admit_the_key_and_passes_its_card() -> None:
    table = started("kary:2", 4, launched=2)
    bring_up(table, [1])
    flub = flub_at_rank0(table)
    key = generate_keypair()[0]
    actions = flub.allocate(allocate(key), NOW)
    assert responses(actions) == []  # the answer waits for the parent
    [call] = of_type(actions, Call)
    assert call.request.topic == "flub.authorize" and call.request.nodeid == 0  # 2's parent is 0
    assert call.request.payload == {"rank": 2, "incarnation": 1, "public_key": key}
    assert table.entry(2).state is RankState.RESERVED
    answer = only_response(call.then(reply_to(call, CARD), NOW + 1))
    assert answer.payload["rank"] == 2 and answer.payload["incarnation"] == 1
    assert answer.payload["parent_card"] == CARD
    assert answer.payload["lease"] == pytest.approx(29.0)
    assert answer.payload["attributes"] == ATTRIBUTES


def test_an_allocation_that_lapsed_while_the_parent_answered_is_refused() -> None:
    table = started("kary:2", 4, launched=2)
    bring_up(table, [1])
    flub = flub_at_rank0(table)
    [call] = of_type(flub.allocate(allocate(generate_keypair()[0], rank=2), NOW), Call)
    flub.expire(NOW + 31)
    flub.allocate(allocate(generate_keypair()[0], rank=2), NOW + 31)  # another key has it now
    late = only_response(call.then(reply_to(call, CARD), NOW + 32))
    assert late.errnum == errno.ESTALE and "lapsed" in late.errstr  # the joiner exits 75


def test_allocation_answers_without_a_card_when_the_parent_is_not_online_or_refuses() -> None:
    table = started("kary:2", 4, launched=2)  # rank 1 is offline: rank 3's parent
    flub = flub_at_rank0(table)
    answer = only_response(flub.allocate(allocate(generate_keypair()[0], rank=3), NOW))
    assert answer.payload["rank"] == 3 and "parent_card" not in answer.payload
    assert of_type(flub.allocate(allocate(generate_keypair()[0], rank=3), NOW), Call) == []
    [call] = of_type(flub.allocate(allocate(generate_keypair()[0], rank=2), NOW), Call)
    refused = call.then(reply_to(call, errnum=errno.ESHUTDOWN, errstr="shutting down"), NOW)
    assert "parent_card" not in only_response(refused).payload


@pytest.mark.parametrize(
    ("payload", "errnum"),
    [
        ({"public_key": "nope", "hostname": "h"}, errno.EINVAL),
        ({"public_key": None, "hostname": "h"}, errno.EINVAL),
        ({"hostname": 5}, errno.EINVAL),
        ({"rank": True}, errno.EINVAL),
        ({"rank": 9}, errno.ENOENT),
        ({"rank": 1}, errno.EBUSY),
    ],
)
def test_allocation_refusals_carry_the_errno_the_joiner_maps_to_an_exit_code(
    payload: dict[str, Any], errnum: int
) -> None:
    table = started("kary:2", 4, launched=2)
    bring_up(table, [1])
    body = {"public_key": generate_keypair()[0], "hostname": "joiner", "rank": None, **payload}
    answer = only_response(flub_at_rank0(table).allocate(request("flub.allocate", body), NOW))
    assert answer.errnum == errnum, answer.errstr


def test_no_allocation_while_stopping_and_none_when_full() -> None:
    table = started("kary:2", 2)
    stopping = only_response(
        flub_at_rank0(table, Lifecycle(stopping=True)).allocate(
            allocate(generate_keypair()[0]), NOW
        )
    )
    assert stopping.errnum == errno.ESHUTDOWN
    full = only_response(flub_at_rank0(table).allocate(allocate(generate_keypair()[0]), NOW))
    assert full.errnum == errno.ENOSPC and "no available ranks" in full.errstr


def test_kex_checks_the_reservation_then_orders_the_parent_and_passes_its_answer_on() -> None:
    table = started("kary:2", 4, launched=2)
    bring_up(table, [1])
    flub = flub_at_rank0(table)
    key, other = generate_keypair()[0], generate_keypair()[0]
    flub.allocate(allocate(key, rank=3), NOW)
    kex = {"rank": 3, "incarnation": 1, "public_key": other}
    refused = only_response(flub.kex(request("flub.kex", kex), NOW))
    assert refused.errnum == errno.ESTALE and "reserved for another key" in refused.errstr
    stale = only_response(
        flub.kex(request("flub.kex", {**kex, "public_key": key, "incarnation": 2}), NOW)
    )
    assert stale.errnum == errno.ESTALE and "is not reserved" in stale.errstr
    [call] = flub.kex(request("flub.kex", {**kex, "public_key": key}), NOW)
    assert isinstance(call, Call) and call.request.nodeid == 1
    assert call.request.topic == "flub.authorize"
    assert only_response(call.then(reply_to(call, CARD), NOW)).payload == CARD
    lost = call.then(reply_to(call, errnum=errno.EHOSTUNREACH, errstr="gone"), NOW)
    assert only_response(lost).errnum == errno.EHOSTUNREACH
    broken = call.then(reply_to(call, errnum=errno.EPROTO, errstr="internal error"), NOW)
    assert only_response(broken).errnum == errno.EPROTO  # the joiner exits 1, not 77


def test_kex_for_a_rank_whose_parent_is_not_connected_is_unreachable() -> None:
    table = started("kary:2", 4, launched=2)  # rank 1 offline
    flub = flub_at_rank0(table)
    key = generate_keypair()[0]
    flub.allocate(allocate(key, rank=3), NOW)
    answer = only_response(
        flub.kex(request("flub.kex", {"rank": 3, "incarnation": 1, "public_key": key}), NOW)
    )
    assert answer.errnum == errno.EHOSTUNREACH and answer.errstr == "rank 1 is offline"


def test_a_kex_that_waits_is_held_until_its_parent_is_online_then_orders_the_parent() -> None:
    table = started("kary:2", 8, launched=1)  # rank 1 vacant: a joiner of rank 3 waits for it
    flub = flub_at_rank0(table)
    key = generate_keypair()[0]
    grant = only_response(flub.allocate(allocate(key, rank=3), NOW))
    assert "parent_card" not in grant.payload and grant.payload["parent_state"] == "vacant"
    kex = {"rank": 3, "incarnation": 1, "public_key": key, "wait": True}
    assert flub.kex(request("flub.kex", kex), NOW) == []  # held, not EHOSTUNREACH
    assert flub.unpark(NOW) == []  # nothing changed for it yet
    parents = generate_keypair()[0]
    flub.allocate(allocate(parents, rank=1), NOW)  # the table changes, rank 1 is not up yet
    assert flub.unpark(NOW) == []
    assert table.apply(Online(1, 1, "node1", 1001, 0, parents), NOW).applied
    [call] = flub.unpark(NOW + 1)
    assert isinstance(call, Call) and call.request.topic == "flub.authorize"
    assert call.request.nodeid == 1 and call.request.payload["rank"] == 3
    answer = only_response(call.then(reply_to(call, CARD), NOW + 1))
    assert answer.payload == CARD and answer.tag == 7  # the joiner's own request, answered
    assert flub.unpark(NOW + 2) == [] and flub.parked == {}


def test_a_held_kex_is_answered_when_its_lease_ends_and_dropped_with_its_client() -> None:
    table = started("kary:2", 8, launched=1)
    lifecycle = Lifecycle()
    flub = flub_at_rank0(table, lifecycle)
    keys = [generate_keypair()[0] for _ in range(3)]
    for rank, key, route in zip((3, 4, 5), keys, (["l0a"], ["l0b"], ["l0c"]), strict=True):
        flub.allocate(request("flub.allocate", {**_ask(key), "rank": rank}, route=route), NOW)
        kex = {"rank": rank, "incarnation": 1, "public_key": key, "wait": True}
        assert flub.kex(request("flub.kex", kex, route=route), NOW) == []
    assert flub.disconnect(request("client.disconnect", route=["l0b"]), NOW) == []
    lapsed = responses(flub.expire(NOW + 31))  # rank 3's and rank 5's leases: rank 4's client left
    assert sorted(r.route[-1] for r in lapsed if r.topic == "flub.kex") == ["l0a", "l0c"]
    assert all(r.errnum == errno.ESTALE for r in lapsed if r.topic == "flub.kex")
    assert flub.parked == {}
    key = generate_keypair()[0]
    flub.allocate(request("flub.allocate", {**_ask(key), "rank": 6}), NOW + 40)
    assert flub.kex(request("flub.kex", {**_triple(6, key), "wait": True}), NOW + 40) == []
    lifecycle.stopping = True
    stopped = only_response(flub.unpark(NOW + 41))
    assert stopped.errnum == errno.ESHUTDOWN and flub.parked == {}


def _triple(rank: int, key: str) -> dict[str, Any]:
    return {"rank": rank, "incarnation": 1, "public_key": key}


def test_an_expired_lease_is_voided_at_the_parent_once() -> None:
    table = started("kary:2", 4, launched=2)
    flub = flub_at_rank0(table)
    flub.allocate(allocate(generate_keypair()[0], rank=3), NOW)
    assert flub.expire(NOW + 29) == []
    actions = flub.expire(NOW + 31)
    [send] = of_type(actions, Send)
    assert send.message.topic == "flub.revoke" and send.message.nodeid == 1
    assert send.message.payload == {
        "rank": 3,
        "incarnation": 1,
        "reason": "the reservation expired",
    }
    assert table.entry(3).state is RankState.VACANT and flub.expire(NOW + 32) == []


def release(rank: int, incarnation: int, key: str, route: list[str] | None = None) -> Message:
    body = {"rank": rank, "incarnation": incarnation, "public_key": key}
    return request("flub.release", body, route=route)


def test_a_joiner_releases_its_own_reservation_and_the_parent_drops_its_key() -> None:
    table = started("kary:2", 4, launched=2)
    flub = flub_at_rank0(table)
    key, other = generate_keypair()[0], generate_keypair()[0]
    flub.allocate(allocate(key, rank=3), NOW)
    refusals = [
        (release(3, 1, other), "reserved for another key"),
        (release(3, 2, key), "is not reserved"),
        (release(1, 1, key), "is not reserved"),
        (release(9, 1, key), "no rank 9"),
    ]
    for asked, why in refusals:
        refused = only_response(flub.release(asked, NOW))
        assert refused.errnum == errno.ESTALE and why in refused.errstr, refused.errstr
        assert of_type(flub.release(asked, NOW), Send) == []
    assert table.entry(3).state is RankState.RESERVED
    bad = only_response(flub.release(request("flub.release", {"rank": 3}), NOW))
    assert bad.errnum == errno.EINVAL
    actions = flub.release(release(3, 1, key), NOW + 1)
    assert only_response(actions).errnum == 0 and only_response(actions).payload == {}
    [send] = of_type(actions, Send)
    assert send.message.topic == "flub.revoke" and send.message.nodeid == 1
    assert send.message.payload == {
        "rank": 3,
        "incarnation": 1,
        "reason": "the joiner released its reservation",
    }
    entry = table.entry(3)
    assert entry.state is RankState.VACANT and entry.host == "extra1"  # its placeholder again
    assert entry.incarnation == 1 and entry.lease is None and flub.expire(NOW + 31) == []
    again = only_response(flub.release(release(3, 1, key), NOW + 2))  # once only
    assert again.errnum == errno.ESTALE and "is not reserved" in again.errstr
    assert (
        only_response(flub.allocate(allocate(other, rank=3), NOW + 2)).payload["incarnation"] == 2
    )


def test_a_release_after_the_joiner_came_online_changes_nothing() -> None:
    """Whoever asks with that key now is a second broker with it (77), or someone who knows
    the public key."""
    table = started("kary:2", 3, launched=1)
    flub = flub_at_rank0(table)
    key = generate_keypair()[0]
    flub.allocate(allocate(key, rank=1), NOW)
    table.apply(Online(1, 1, "h1", 4242), NOW)
    refused = only_response(flub.release(release(1, 1, key), NOW))
    assert refused.errnum == errno.EPERM
    assert refused.errstr == "rank 1 incarnation 1 is held by another broker (pid 4242 on h1)"
    assert table.entry(1).state is RankState.ONLINE


def test_one_connection_holds_a_bounded_number_of_reservations() -> None:
    table = started("kary:2", 12, launched=1)
    flub = flub_at_rank0(table)
    cap = RESERVATIONS_PER_CONNECTION
    hostile = ["l0a", "c1"]  # a client of rank 1's socket
    keys = [generate_keypair()[0] for _ in range(cap + 1)]
    granted = [
        flub.allocate(request("flub.allocate", _ask(k), route=hostile), NOW) for k in keys[:cap]
    ]
    assert all(_granted(actions) for actions in granted)
    refused = only_response(
        flub.allocate(request("flub.allocate", _ask(keys[cap]), route=hostile), NOW)
    )
    assert refused.errnum == errno.EAGAIN
    assert f"this connection already holds {cap} reservations" in refused.errstr
    assert table.entry(cap + 1).state is RankState.VACANT  # nothing was reserved for it
    # the same key asking again is a repeat, not a new reservation
    repeat = flub.allocate(request("flub.allocate", _ask(keys[0]), route=hostile), NOW)
    assert _granted(repeat)
    # another connection (same hop id, at another broker) is counted apart
    elsewhere = flub.allocate(request("flub.allocate", _ask(keys[cap]), route=["l0a", "c2"]), NOW)
    assert _granted(elsewhere)
    # a slot frees when a reservation ends: online, released, expired
    bring_up(table, [1])
    fifth = generate_keypair()[0]
    assert _granted(flub.allocate(request("flub.allocate", _ask(fifth), route=hostile), NOW))
    flub.release(release(2, 1, keys[1], route=hostile), NOW)
    sixth = generate_keypair()[0]
    assert _granted(flub.allocate(request("flub.allocate", _ask(sixth), route=hostile), NOW))
    full = only_response(
        flub.allocate(request("flub.allocate", _ask(generate_keypair()[0]), route=hostile), NOW)
    )
    assert full.errnum == errno.EAGAIN
    flub.expire(NOW + 31)
    later = request("flub.allocate", _ask(generate_keypair()[0]), route=hostile)
    assert _granted(flub.allocate(later, NOW + 31))
    assert flub.held == {tuple(hostile): {(2, 3)}}  # the ended ones are forgotten


def test_a_connection_that_goes_frees_its_slots_but_not_its_reservations() -> None:
    table = started("kary:2", 12, launched=1)
    flub = flub_at_rank0(table)
    hostile = ["l0a", "c1"]
    for _ in range(RESERVATIONS_PER_CONNECTION):
        flub.allocate(request("flub.allocate", _ask(generate_keypair()[0]), route=hostile), NOW)
    asked = request("flub.allocate", _ask(generate_keypair()[0]), route=hostile)
    assert only_response(flub.allocate(asked, NOW)).errnum == errno.EAGAIN
    assert flub.disconnect(request("client.disconnect", route=["l0b", "c1"]), NOW) == []
    assert only_response(flub.allocate(asked, NOW)).errnum == errno.EAGAIN  # another client
    assert flub.disconnect(request("client.disconnect", route=hostile), NOW) == []
    assert _granted(flub.allocate(asked, NOW))
    reserved = [e.rank for e in table.entries if e.state is RankState.RESERVED]
    assert len(reserved) == RESERVATIONS_PER_CONNECTION + 1  # a joiner closes its client early


def test_only_the_connection_granted_a_reservation_may_exchange_keys_or_release_it() -> None:
    """The key is public (a certificate's, a fingerprint away from status); the connection the
    grant went to is not. Another connection naming (rank, incarnation, key) exactly is refused."""
    table = started("kary:2", 4, launched=2)
    bring_up(table, [1])
    flub = flub_at_rank0(table)
    key, joiner, other = generate_keypair()[0], ["l0a", "c1"], ["l0b", "c1"]
    flub.allocate(request("flub.allocate", {**_ask(key), "rank": 3}, route=joiner), NOW)
    triple = {"rank": 3, "incarnation": 1, "public_key": key}
    for asked in (
        request("flub.kex", triple, route=other),
        request("flub.release", triple, route=other),
        request("flub.kex", triple, route=["l0a", "c2"]),  # the same hop id at another broker
    ):
        actions = (flub.kex if asked.topic == "flub.kex" else flub.release)(asked, NOW)
        refused = only_response(actions)
        assert refused.errnum == errno.EPERM
        assert refused.errstr == "rank 3 incarnation 1 was not reserved by this connection"
        assert of_type(actions, Call) == of_type(actions, Send) == []
    assert table.entry(3).state is RankState.RESERVED
    # the joiner itself may, however it pads its route
    [call] = flub.kex(request("flub.kex", triple, route=["junk", *joiner]), NOW)
    assert isinstance(call, Call) and call.request.topic == "flub.authorize"
    assert only_response(flub.release(release(3, 1, key, route=joiner), NOW)).payload == {}
    assert table.entry(3).state is RankState.VACANT


def test_asking_again_on_another_connection_gives_no_right_to_the_reservation() -> None:
    """Two brokers started with one certificate, or anyone who read the public key: the second
    connection is told the reservation (one key, one reservation), and may not use it."""
    table = started("kary:2", 4, launched=2)  # rank 3's parent, rank 1, is not yet online
    flub = flub_at_rank0(table)
    key, first, second = generate_keypair()[0], ["l0a"], ["l0b"]
    asked = {**_ask(key), "rank": 3}
    grants = [
        only_response(flub.allocate(request("flub.allocate", asked, route=r), NOW))
        for r in (first, second)
    ]
    assert [(g.payload["rank"], g.payload["incarnation"]) for g in grants] == [(3, 1), (3, 1)]
    assert flub.held == {("l0a",): {(3, 1)}}
    bring_up(table, [1])
    triple = {"rank": 3, "incarnation": 1, "public_key": key}
    for topic, serve in (("flub.kex", flub.kex), ("flub.release", flub.release)):
        refused = only_response(serve(request(topic, triple, route=second), NOW))
        assert refused.errnum == errno.EPERM and "not reserved by this connection" in refused.errstr
    assert of_type(flub.kex(request("flub.kex", triple, route=first), NOW), Call)
    # once the holder's connection has gone, nobody holds it: it ends by hello or lease
    assert flub.disconnect(request("client.disconnect", route=first), NOW) == []
    again = flub.allocate(request("flub.allocate", asked, route=second), NOW)
    assert of_type(again, Call)  # told again, with the parent's card now that it is online
    refused = only_response(flub.kex(request("flub.kex", triple, route=second), NOW))
    assert refused.errnum == errno.EPERM and flub.held == {}


def test_padding_a_route_gets_no_more_reservations() -> None:
    table = started("kary:2", 12, launched=1)
    flub = flub_at_rank0(table)
    hostile = ["l0a", "c1"]
    for pad in range(RESERVATIONS_PER_CONNECTION):
        asked = request("flub.allocate", _ask(generate_keypair()[0]), route=[f"x{pad}", *hostile])
        assert _granted(flub.allocate(asked, NOW))
    padded = request("flub.allocate", _ask(generate_keypair()[0]), route=["c9", "l0f", *hostile])
    assert only_response(flub.allocate(padded, NOW)).errnum == errno.EAGAIN
    assert list(flub.held) == [tuple(hostile)]


def _granted(actions: list[Action]) -> bool:
    """A reservation was made: rank 0 ordered the parent, or answered with a grant."""
    return bool(of_type(actions, Call)) or "rank" in only_response(actions).payload


def _ask(key: str) -> dict[str, Any]:
    return {"public_key": key, "hostname": "joiner", "rank": None}


def test_config_rejoin_is_answered_only_to_the_ranks_parent() -> None:
    table = RankTable(Topology("kary:2", 4), ["h0", "h1", "h2", "h3"], NOW, fixed=True)
    table.apply(Online(0, 1, "h0", 1), NOW)
    bring_up(table, [1, 3])
    table.apply(Lost(3, 1, "connection lost"), NOW)
    flub = flub_at_rank0(table)
    forged = only_response(
        flub.rejoin(
            request("config.rejoin", {"rank": 3, "incarnation": 1}, route=["l00", "c1"]), NOW
        )
    )
    assert forged.errnum == errno.EPERM
    asked = request("config.rejoin", {"rank": 3, "incarnation": 1}, route=["s", "c1"])
    assert only_response(flub.rejoin(asked, NOW)).payload == {"incarnation": 2}


# --- FLUB: a parent -------------------------------------------------------------------------


def flub_at(rank: int, lifecycle: Lifecycle | None = None) -> FlubService:
    return FlubService(
        rank, Topology("kary:2", 7), None, lifecycle or Lifecycle(), CARD, ATTRIBUTES
    )


def test_a_parent_admits_a_key_on_rank0s_order_and_answers_its_card() -> None:
    key = generate_keypair()[0]
    order = request(
        "flub.authorize",
        {"rank": 3, "incarnation": 2, "public_key": key},
        route=["s", "p0"],
        nodeid=1,
    )
    actions = flub_at(1).authorize(order, NOW)
    assert actions[0] == Authorize(3, 2, key)
    assert only_response(actions).payload == CARD


def test_a_parent_obeys_the_order_of_a_root_that_is_not_rank0() -> None:
    """After a takeover (protocol §13.4) the root is another rank: its own order, sent down,
    passes the service; which broker is the root of the order's term, the router's fence says."""
    key = generate_keypair()[0]
    payload = {"rank": 3, "incarnation": 2, "public_key": key}
    order = request("flub.authorize", payload, route=["s"], nodeid=1)  # rank 1's own: the root
    assert flub_at(1).authorize(order, NOW)[0] == Authorize(3, 2, key)


@pytest.mark.parametrize(
    ("rank", "route", "why"),
    [
        (3, ["l05", "p0"], "comes from the root only"),
        (3, ["s", "l05", "p0"], "comes from the root only"),
        (3, ["s", "c2", "p0"], "comes from the root only"),
        (5, ["s", "p0"], "rank 5 is not a child of rank 1"),
        (0, ["s", "p0"], "rank 0 is not a child of rank 1"),
    ],
)
def test_a_parent_refuses_forged_and_misdirected_orders(
    rank: int, route: list[str], why: str
) -> None:
    key = generate_keypair()[0]
    order = request(
        "flub.authorize", {"rank": rank, "incarnation": 2, "public_key": key}, route=route, nodeid=1
    )
    actions = flub_at(1).authorize(order, NOW)
    assert of_type(actions, Authorize) == []
    answer = only_response(actions)
    assert answer.errnum == errno.EPERM and why in answer.errstr


def test_a_stopping_parent_admits_no_one() -> None:
    order = request(
        "flub.authorize",
        {"rank": 3, "incarnation": 2, "public_key": generate_keypair()[0]},
        route=["s", "p0"],
    )
    answer = only_response(flub_at(1, Lifecycle(stopping=True)).authorize(order, NOW))
    assert answer.errnum == errno.ESHUTDOWN


def test_revoke_is_obeyed_from_rank0_only_and_answers_nothing() -> None:
    notice = {"rank": 3, "incarnation": 2, "reason": "the reservation expired"}
    obeyed = flub_at(1).revoke(request("flub.revoke", notice, route=["s", "p0"]), NOW)
    assert obeyed == [Revoke(3, 2, "the reservation expired")]
    forged = flub_at(1).revoke(request("flub.revoke", notice, route=["l00", "p0"]), NOW)
    assert of_type(forged, Revoke) == [] and only_response(forged).errnum == errno.EPERM
    assert flub_at(1).revoke(request("flub.revoke", {"rank": "x"}, route=["s", "p0"]), NOW) == []


def test_a_config_child_at_the_door_waits_until_its_parent_is_welcomed() -> None:
    from tbon.overlay.links.children import Rejoin

    flub = flub_at(1)
    rejoin = Rejoin(3, 1, b"id", 9, request("hello"))
    assert flub.ask_rejoin(rejoin, welcomed=False) == []
    [call] = flub.welcomed()
    assert isinstance(call, Call) and call.request.topic == "config.rejoin"
    assert call.request.payload == {"rank": 3, "incarnation": 1} and flub.welcomed() == []
    readmitted = call.then(reply_to(call, {"incarnation": 2}), NOW)
    assert Readmit(rejoin, 2, "") in readmitted
    refused = call.then(reply_to(call, errnum=errno.EPERM, errstr="was retired"), NOW)
    assert refused == [Readmit(rejoin, None, "was retired")]


# --- retire ---------------------------------------------------------------------------------


def retire_body(rank: int, **more: Any) -> dict[str, Any]:
    return {"rank": rank, "force": False, "timeout": None, **more}


def test_retire_records_first_then_orders_the_parent_then_answers_when_gone() -> None:
    table = started("kary:2", 4)
    bring_up(table, [1, 2, 3])
    service = retire_at_rank0(table)
    actions = service.retire_rank(request("retire.rank", retire_body(3)), NOW)
    assert table.entry(3).state is RankState.RETIRING  # recorded before anyone is told
    news = only_response(actions)
    assert news.streaming and news.payload["event"] == "retiring"
    [call] = of_type(actions, Call)
    assert call.request.topic == "retire.order" and call.request.nodeid == 1
    assert call.request.payload == {"rank": 3, "incarnation": 1, "force": False, "timeout": None}
    assert service.settle(NOW) == []
    progress = service.progress(
        request(
            "retire.progress", {"rank": 3, "incarnation": 1, "event": "draining", "running": 2}
        ),
        NOW,
    )
    assert only_response(progress).payload == {"rank": 3, "event": "draining", "running": 2}
    table.apply(Departed(3, 1), NOW + 1)
    done = only_response(service.settle(NOW + 1))
    assert done.payload["event"] == "retired" and not done.streaming
    assert done.payload["seconds"] == pytest.approx(1.0)
    assert service.waiters == []


def test_retire_refusals_are_the_tables_and_a_lost_order_is_news() -> None:
    table = started("kary:2", 4)
    bring_up(table, [1, 3])
    service = retire_at_rank0(table)
    busy = only_response(service.retire_rank(request("retire.rank", retire_body(1)), NOW))
    assert busy.errnum == errno.EPERM and "children" in busy.errstr
    missing = only_response(service.retire_rank(request("retire.rank", retire_body(9)), NOW))
    assert missing.errnum == errno.ENOENT
    bad = only_response(service.retire_rank(request("retire.rank", {"rank": 3}), NOW))
    assert bad.errnum == errno.EINVAL
    [call] = of_type(service.retire_rank(request("retire.rank", retire_body(3)), NOW), Call)
    unreachable = call.then(reply_to(call, errnum=errno.EHOSTUNREACH, errstr="gone"), NOW)
    assert only_response(unreachable).payload["event"] == "unreachable"
    assert of_type(unreachable, Log)


def test_waiting_retirements_fail_when_the_instance_ends() -> None:
    table = started("kary:2", 4)
    bring_up(table, [1, 3])
    service = retire_at_rank0(table)
    service.retire_rank(request("retire.rank", retire_body(3)), NOW)
    assert only_response(service.end()).errnum == errno.ESHUTDOWN


def test_a_parent_passes_rank0s_retire_order_to_its_links_and_refuses_forgeries() -> None:
    service = RetireService(1, Topology("kary:2", 7), None)
    order = request(
        "retire.order",
        {"rank": 3, "incarnation": 1, "force": True, "timeout": 5},
        route=["s", "p0"],
    )
    [action] = service.order(order, NOW)
    assert action == RetireChild(order, 3, 1, {"force": True, "timeout": 5})
    forged = request("retire.order", {"rank": 3, "incarnation": 1}, route=["l01", "p0"])
    assert only_response(service.order(forged, NOW)).errnum == errno.EPERM


def test_a_draining_broker_waits_kills_at_its_deadline_and_leaves() -> None:
    draining = Draining(3, 1, {"force": False, "timeout": 10}, NOW)
    begun = draining.begin(running=2)
    [told] = of_type(begun, Send)
    assert told.message.topic == "retire.progress" and told.message.nodeid == 0
    assert draining.step(NOW + 5, running=2) == []
    killed = draining.step(NOW + 10, running=2)
    assert of_type(killed, KillAllJobs)[0].signum == signal.SIGKILL
    assert of_type(killed, Send)[0].message.payload["event"] == "killed"
    assert draining.step(NOW + 11, running=0)[-1] == Leave(exitcodes.SHUTDOWN)


def test_an_idle_broker_leaves_at_once_when_told_to_retire() -> None:
    draining = Draining(3, 1, {"force": False, "timeout": None}, NOW)
    assert of_type(draining.begin(running=0), Send) == []
    assert draining.next_deadline() is None
    assert draining.step(NOW, running=0)[-1] == Leave(exitcodes.SHUTDOWN)


# --- exec -----------------------------------------------------------------------------------


def exec_at(rank: int, lifecycle: Lifecycle | None = None) -> ExecService:
    return ExecService(rank, Topology("kary:2", 7), lifecycle or Lifecycle())


def start_request(targets: list[int]) -> Message:
    return request("exec.start", {"id": "j1", "argv": ["true"], "targets": targets})


def test_exec_sends_one_copy_down_each_branch_and_starts_here_if_targeted() -> None:
    actions = exec_at(0).handle(start_request([0, 3, 4, 5]), NOW)
    forwards = of_type(actions, Forward)
    assert {(f.child, tuple(f.message.payload["targets"])) for f in forwards} == {
        (1, (3, 4)),
        (2, (5,)),
    }
    assert of_type(actions, StartJob)
    down = forwards[0]
    assert down.message.route == ["l01"] and down.message.tag == 7
    assert callable(down.otherwise)  # made only if the child is not connected
    missing = of_type(down.otherwise(), Respond)
    assert [r.message.payload["rank"] for r in missing] == list(down.message.payload["targets"])
    assert all(r.message.payload["error"].endswith("is not connected") for r in missing)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(), JSON_VALUES, max_size=5))
def test_exec_copies_down_encode_as_their_payloads_say(extra: dict[str, Any]) -> None:
    """The copies of a request sent down several branches share one encoding of all but their
    targets (Message.body): each decodes to the payload it carries, the targets its own."""
    payload = {**extra, "id": "j1", "argv": ["true"], "targets": [0, 3, 4, 5]}
    forwards = of_type(exec_at(0).handle(request("exec.start", payload), NOW), Forward)
    assert len(forwards) == 2 and all(f.message.body is not None for f in forwards)
    for forward in forwards:
        copy = forward.message
        assert copy.payload == {**payload, "targets": copy.payload["targets"]}
        assert decode(encode(copy)).payload == copy.payload
    alone = exec_service._with_targets(exec_service._all_but_targets({"targets": [1]}), [2, 3])
    assert json.loads(alone) == {"targets": [2, 3]}  # nothing else to share


def test_exec_answers_targets_outside_its_subtree_and_refuses_bad_ones() -> None:
    """Every exec.start is answered: a target that is not below the rank it was sent to gets an
    `error` of its own, and targets that name no rank of the instance (or none at all) refuse
    the request; one-way exec.stdin and exec.signal to such ranks do nothing."""
    astray = exec_at(1).handle(start_request([2, 5, 2]), NOW)
    assert [(r.message.payload["rank"], r.message.streaming) for r in of_type(astray, Respond)] == [
        (2, True),
        (5, True),
    ]
    assert "not below rank 1" in of_type(astray, Respond)[0].message.payload["error"]
    for targets in ("all", [99], [-5], [10**30], [], [0, 7]):
        bad = only_response(exec_at(0).handle(start_request(targets), NOW))  # type: ignore[arg-type]
        assert bad.errnum == errno.EINVAL and not bad.streaming, targets
    assert (
        "no rank out of range"
        in only_response(exec_at(0).handle(start_request([10**30]), NOW)).errstr
    )
    quiet = request("exec.signal", {"id": "j1", "signal": 9, "targets": [2, 5]})
    assert exec_at(1).handle(quiet, NOW) == []


def test_exec_at_a_root_that_took_over_sends_every_other_target_toward_its_broker() -> None:
    """Rank 1 took over from rank 0 (kary:2): rank 2's subtree hangs below the dead root in the
    topology; each target goes toward the broker attached here on its way (rank 2 fostered
    here), and the dead root's own rank toward itself, where it is answered as not connected."""
    service = exec_at(1)
    service.leads = lambda: True
    service.toward = lambda target: {0: 0, 2: 2, 5: 2, 6: 2}.get(target, 1 if target > 6 else 3)
    actions = service.handle(start_request([0, 1, 3, 5, 6]), NOW)
    forwards = of_type(actions, Forward)
    assert {(f.child, tuple(f.message.payload["targets"])) for f in forwards} == {
        (0, (0,)),
        (3, (3,)),
        (2, (5, 6)),
    }
    assert of_type(actions, StartJob) and of_type(actions, Respond) == []
    [dead] = [f for f in forwards if f.child == 0]
    assert callable(dead.otherwise)
    [said] = of_type(dead.otherwise(), Respond)
    assert said.message.payload == {"rank": 0, "error": "rank 0 is not connected"}


def test_stdin_and_signals_reach_the_job_and_odd_signals_do_not() -> None:
    stdin = request("exec.stdin", {"id": "j1", "eof": True, "targets": [0, 3]})
    stdin.data = b"x\n\xff"
    actions = exec_at(0).handle(stdin, NOW)
    assert WriteStdin("j1", b"x\n\xff", True) in actions
    [down] = of_type(actions, Forward)  # the bytes go down the tree with the request
    assert down.message.data == b"x\n\xff" and down.message.payload["targets"] == [3]
    kill = request("exec.signal", {"id": "j1", "signal": 9, "targets": [0]})
    assert exec_at(0).handle(kill, NOW) == [SignalJob("j1", 9)]
    odd = request("exec.signal", {"id": "j1", "signal": 999, "targets": [0]})
    assert exec_at(0).handle(odd, NOW) == []


def test_credit_goes_to_the_job_and_a_bad_grant_is_dropped() -> None:
    grant = request("exec.credit", {"id": "j1", "bytes": 4096})
    assert exec_at(0).credit(grant, NOW) == [GrantCredit("j1", 4096)]
    for payload in (
        {"id": "j1", "bytes": 0},
        {"id": "j1", "bytes": -5},
        {"id": 3, "bytes": 9},
        {"id": "j1", "bytes": True},
        {"id": "j1", "bytes": 1.5},
        {},
    ):
        assert exec_at(0).credit(request("exec.credit", payload), NOW) == []


def test_a_retiring_or_stopping_broker_takes_no_new_work() -> None:
    for lifecycle, why in (
        (Lifecycle(retiring=True), "retiring"),
        (Lifecycle(stopping=True), "shutting down"),
    ):
        answer = only_response(exec_at(0, lifecycle).handle(start_request([0]), NOW))
        assert why in answer.payload["error"] and answer.streaming


def test_a_vanished_clients_jobs_are_killed_everywhere() -> None:
    service = exec_at(0)
    service.started_by("l0a", start_request([0, 3]))
    [send] = service.client_gone("l0a")
    assert send.message.topic == "exec.signal"
    kill = {"id": "j1", "signal": int(signal.SIGKILL), "targets": [0, 3], "gone": True}
    assert send.message.payload == kill
    assert service.client_gone("l0a") == []
    gone = service.disconnect(request("client.disconnect", route=["l0a", "c1"]), NOW)
    assert gone == [KillJobsFrom(("l0a", "c1"))]
    # at each target: killed, and nothing kept for the client (no acknowledgement will come)
    assert AbandonJob("j1") in service.handle(request("exec.signal", kill), NOW)


def test_only_a_rank_s_last_word_to_a_gone_client_needs_no_disconnect() -> None:
    """The last word ends that rank's stream, and the client's broker told the ranks still
    running to keep nothing (`gone`): a duplicate exit resent after the client left is dropped
    where it meets the gone client. Anything else still asks its rank to stop."""
    start = start_request([0, 3])
    assert exec_service.last_word(last_word(start, 3))
    assert exec_service.last_word(last_word(start, 3, error="rank 3 is not connected"))
    output = start.respond({"rank": 3, "stream": "stdout"}, streaming=True)
    assert not exec_service.last_word(output)
    watch = request("dmesg.follow", {}).respond({"rank": 3, "records": []}, streaming=True)
    assert not exec_service.last_word(watch)


def last_word(start: Message, rank: int, **said: Any) -> Message:
    """A rank's exit (or error) for `start`, as it reaches the client's broker."""
    return start.respond({"rank": rank, **(said or {"exit": 0})}, streaming=True)


def test_a_client_that_leaves_after_its_jobs_ended_kills_nothing() -> None:
    """Every rank's last word went to the client: nothing runs, so no exec.signal fans out."""
    service, start = exec_at(0), start_request([0, 3])
    service.started_by("l0a", start)
    service.answered("l0a", start.respond({"rank": 3, "stream": "stdout"}, streaming=True))
    service.answered("l0a", last_word(start, 3))
    service.answered("l0a", last_word(start, 0, error="rank 0 is retiring"))
    assert service.client_gone("l0a") == []


def test_a_client_that_leaves_early_kills_only_the_ranks_still_running() -> None:
    service, start = exec_at(0), start_request([0, 3, 4])
    service.started_by("l0a", start)
    service.answered("l0a", last_word(start, 3))
    service.answered("l0b", last_word(start, 0))  # another client's: not this job's
    [send] = service.client_gone("l0a")
    assert send.message.payload["targets"] == [0, 4]


def test_last_words_handed_to_the_client_are_acknowledged_together_once_the_job_is_over() -> None:
    """The client's broker acknowledges each rank's last word for its client: not with one
    exec.credit to each rank, but with one exec.taken per job once every target's last word
    was handed over (takenhold.py), fanned out to those ranks, each of which then keeps nothing
    of that job. Other answers still go one by one."""
    service = exec_at(0)
    start = request(
        "exec.start",
        {"id": "j1", "argv": ["true"], "targets": [0, 3, 4], "acks": True, "window": 4096},
    )
    service.started_by("l0a", start)
    numbered = start.respond({"rank": 4, "stream": "stdout", "seq": 0}, streaming=True)
    numbered.data = b"x" * 9000  # a quarter of the window and more: acknowledged at once
    [credit] = of_type(service.answered("l0a", numbered), Send)
    assert credit.message.topic == "exec.credit" and credit.message.payload["seq"] == 1
    for rank, seq in ((3, 0), (0, 0), (4, 1)):
        assert of_type(service.flush(0.0), Send) == []  # the job is not over: held
        said = {"rank": rank, "exit": 0, "seq": seq}
        assert service.answered("l0a", start.respond(said, streaming=True)) == []
    [taken] = of_type(service.flush(0.0), Send)
    assert taken.message.topic == "exec.taken" and taken.message.nodeid == 0
    assert taken.message.payload == {"id": "j1", "targets": [3, 0, 4]}
    assert service.flush(0.0) == []
    actions = service.handle(request("exec.taken", taken.message.payload, route=["s"]), NOW)
    assert GrantCredit("j1", 0, exec_service.ALL) in actions  # rank 0's own: keep nothing
    assert [f.child for f in of_type(actions, Forward)] == [1]  # ranks 3 and 4 are below 1


def test_an_exec_taken_a_client_wrote_is_ignored_wherever_it_comes() -> None:
    """Only the client's broker says that its client took a job's last answers: a client that
    wrote one could make the ranks of another client's job forget what they keep for a heal."""
    payload = {"id": "j1", "targets": [0, 3]}
    for route in (["l01"], ["s", "l01"], ["s", "c3", "l01", "c1"], ["l0a", "c1"]):
        actions = exec_at(0).handle(request("exec.taken", payload, route=route), NOW)
        [logged] = actions
        assert isinstance(logged, Log) and "written by a client" in logged.text, route
    for route in (["s"], ["s", "c3", "c1"], ["s", "c1", "p0", "p1"]):
        actions = exec_at(0).handle(request("exec.taken", payload, route=route), NOW)
        assert GrantCredit("j1", 0, exec_service.ALL) in actions, route


def test_a_request_s_origin_is_its_first_broker_and_that_broker_s_hop() -> None:
    """Who started a request is read the same at every rank and along every way: the client's
    broker (named by the next broker's link hop, up or down) and its hop there."""
    cases = {
        ("l0a",): (3, "l0a"),  # the client's broker is the rank reading it
        ("l0a", "c3", "c1", "p0", "p2"): (3, "l0a"),  # up to rank 0, then down
        ("l0a", "c3", "p0", "p2"): (3, "l0a"),  # the same client after rank 1 died
        ("l0a", "p1"): (1, "l0a"),  # straight down from the client's broker
        ("x", "p5", "l0a", "c3", "p0"): (3, "l0a"),  # what the client wrote is passed over
        ("s", "c4", "c1"): (4, "s"),  # a broker's own
        ("c4", "c1"): None,  # no broker started it
        (): None,
    }
    for route, expected in cases.items():
        assert origin(request("x", route=list(route)), 3) == expected, route


@given(
    padding=st.lists(st.sampled_from(["s", "l0", "c1", "p2", "x"]), max_size=4),
    hop=st.sampled_from(["l0a", "l1", "s"]),
    broker=st.integers(0, 50),
    up=st.booleans(),
    way=st.lists(st.builds(lambda k, r: f"{k}{r}", st.sampled_from("cp"), st.integers(0, 50))),
)
def test_no_route_a_client_writes_or_a_heal_changes_moves_a_request_s_origin(
    padding: list[str], hop: str, broker: int, up: bool, way: list[str]
) -> None:
    route = [*padding, hop, f"{'c' if up else 'p'}{broker}", *way]
    assert origin(request("x", route=route), 99) == (broker, hop)


def test_only_a_job_s_client_and_its_broker_act_on_it() -> None:
    start = request("exec.start", {"id": "j1"}, route=["l0a", "c3", "c1", "p0"])
    assert same_client(request("exec.credit", route=["l0a", "c3", "p0"]), start, 2)  # healed
    assert same_client(request("exec.signal", route=["s", "c3", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["l0b", "c3", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["l0a", "c4", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["s", "c4", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["l0a", "c3", "l0b"]), start, 2)
    # the broker's kill for a client that left names it before its "s": only that client's job
    assert same_client(request("exec.signal", route=["l0a", "s", "c3", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["l0b", "s", "c3", "c1", "p0"]), start, 2)
    assert not same_client(request("exec.signal", route=["l0b", "s"]), start, 3)
    # a client's "s" before its broker's hop names nobody: its broker's hop is the sender
    assert not same_client(request("exec.signal", route=["l0a", "s", "l0b", "c3"]), start, 1)


def test_a_broker_s_request_names_the_client_it_speaks_for_and_no_client_can() -> None:
    assert speaks_for(request("exec.signal", route=["l9f", "s", "c3", "p0"])) == "l9f"
    assert speaks_for(request("exec.signal", route=["s", "c3", "p0"])) is None
    assert speaks_for(request("exec.signal", route=["x", "l9f", "s", "c3"])) == "l9f"
    assert speaks_for(request("exec.signal", route=["l9f", "s", "l0b", "c3"])) is None
    assert speaks_for(request("exec.signal", route=["l9f"])) is None


def test_exec_requests_from_a_client_that_did_not_start_the_job_are_ignored() -> None:
    """exec.stdin, exec.signal, exec.credit, exec.resend and exec.taken naming a job at this
    rank act on it only from its own client or that client's broker; the rest are said in the
    log, and an exec.start reusing the id is refused as a duplicate."""
    service = exec_at(0)
    owner, stranger, broker = ["l0a", "c3", "c1"], ["l0b", "c3", "c1"], ["s", "c3", "c1"]
    service.started = lambda job_id: request("exec.start", route=owner) if job_id == "j1" else None
    targets = {"id": "j1", "targets": [0]}
    signal_job = request("exec.signal", {**targets, "signal": 15}, route=stranger)
    stdin = request("exec.stdin", targets, route=stranger)
    resend = request("exec.resend", targets, route=stranger)
    taken = request("exec.taken", targets, route=["s", "c4", "c1"])  # another broker
    for refused in (signal_job, stdin, resend, taken):
        [logged] = service.handle(refused, NOW)
        assert isinstance(logged, Log) and "ignored" in logged.text, refused.topic
    credit = {"id": "j1", "bytes": 0, "seq": 5}
    [logged] = service.credit(request("exec.credit", credit, route=stranger, nodeid=0), NOW)
    assert isinstance(logged, Log) and "for job j1 from l0b/c3/c1: not its client" in logged.text
    assert service.credit(request("exec.credit", credit, route=owner), NOW) == [
        GrantCredit("j1", 0, 5)
    ]
    assert service.credit(request("exec.credit", credit, route=broker), NOW) == [
        GrantCredit("j1", 0, 5)
    ]
    assert service.handle(request("exec.signal", {**targets, "signal": 15}, route=owner), NOW) == [
        SignalJob("j1", 15)
    ]
    gone = request("exec.signal", {**targets, "signal": 9, "gone": True}, route=broker)
    assert service.handle(gone, NOW) == [AbandonJob("j1")]
    another = {"id": "j1", "argv": ["true"], "targets": [0]}
    [answer] = service.handle(request("exec.start", another, route=stranger), NOW)
    assert isinstance(answer, Respond) and "duplicate id" in answer.message.payload["error"]
    assert of_type(service.handle(request("exec.start", another, route=owner), NOW), StartJob)
    # a job not here (never started, or forgotten): nothing to guard
    assert service.handle(
        request("exec.signal", {**targets, "id": "j2", "signal": 15}, route=stranger), NOW
    ) == [SignalJob("j2", 15)]


def test_a_refused_exec_start_leaves_nothing_to_kill() -> None:
    service, start = exec_at(0), start_request([0, 3])
    service.started_by("l0a", start)
    service.answered("l0a", start.fail(errno.EHOSTUNREACH, "rank 0 is reattaching"))
    assert service.client_gone("l0a") == []
    service.started_by("l0a", request("exec.start", {"id": "j2", "targets": [True]}))
    assert service.client_gone("l0a") == []  # refused at once (EINVAL): nothing ran


def test_exec_start_s_eof_is_passed_to_the_job_and_checked() -> None:
    start = request("exec.start", {"id": "j1", "argv": ["cat"], "targets": [0], "eof": True})
    [job] = of_type(exec_at(0).handle(start, NOW), StartJob)
    assert job.request.payload["eof"] is True
    [job] = of_type(exec_at(0).handle(start_request([0]), NOW), StartJob)
    assert job.request.payload["eof"] is False
    start.payload["eof"] = 1
    answer = only_response(exec_at(0).handle(start, NOW))
    assert answer.payload["error"] == "exec.start: eof must be true or false"


def test_a_vanished_client_loses_its_jobs_everywhere_and_its_status_streams_at_rank0() -> None:
    from tbon.overlay.broker.dispatch import Services
    from tbon.overlay.config.attributes import broker_config

    table = started("kary:2", 4)
    me = Whoami(0, "node0", 1, "local:///x", "tcp://h:1", "K" * 40)
    root = Services.build(me, broker_config({}), table.topology, table, Lifecycle())
    leaf = Services.build(me, broker_config({}), table.topology, None, Lifecycle())
    gone = request("client.disconnect", route=["l0a", "c1"])
    assert root.handlers()["client.disconnect"](gone, NOW) == [
        KillJobsFrom(("l0a", "c1")),
        ForgetWatches(("l0a", "c1")),
    ]
    assert leaf.handlers()["client.disconnect"](gone, NOW) == [KillJobsFrom(("l0a", "c1"))]
    # a client may write a client.disconnect of its own: with a route before its hop, it is
    # not a broker's notice, and nothing ends
    forged = request("client.disconnect", route=["l0a", "l0b", "c1"])
    [said] = root.handlers()["client.disconnect"](forged, NOW)
    assert isinstance(said, Log) and "written by a client (l0b/c1)" in said.text


def test_a_clients_broker_passes_on_only_its_clients_own_signal_and_input() -> None:
    """exec.signal and exec.stdin stop at the client's broker unless that client started a job
    of that id (its ranks then judge it): a stranger's is said in the log there. One for the
    client's own job that its answers showed over everywhere (a Ctrl-C that crossed the last
    exit) is dropped without a word, as its ranks would have."""
    service, start = exec_at(0), start_request([0, 3])
    service.started_by("l0a", start)
    kill = {"id": "j1", "signal": 2, "targets": [0, 3]}
    for topic in ("exec.signal", "exec.stdin"):
        assert service.unless_own_job("l0a", request(topic, kill)) is None
        [said] = service.unless_own_job("l0b", request(topic, kill)) or []
        assert said == warning(f"ignored {topic} for job j1 from l0b: not its client")
    other = request("exec.signal", {**kill, "id": "j2"})
    assert service.unless_own_job("l0a", other) == [
        warning("ignored exec.signal for job j2 from l0a: not its client")
    ]
    service.answered("l0a", last_word(start, 3))
    assert service.unless_own_job("l0a", request("exec.signal", kill)) is None  # rank 0 runs
    service.answered("l0a", last_word(start, 0))
    assert service.unless_own_job("l0a", request("exec.signal", kill)) == []
    assert service.unless_own_job("l0b", request("exec.signal", kill)) != []
    service.client_gone("l0a")
    assert service.unless_own_job("l0a", request("exec.signal", kill)) != []
