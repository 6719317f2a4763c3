"""`tbon dmesg` and the brokers' logs: the ring each broker keeps and its service without sockets,
then what a user sees through real instances (the lines, -r, --level, --json, -f, exit 68), the
time on broker log lines, and the logs that `tbon expand` keeps."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import DEADLINE, TBON, child_env, process_gone, tbon, wait_for
from test_exec import Pipe

from tbon.overlay.broker import logs
from tbon.overlay.services.actions import Respond
from tbon.overlay.services.dmesg import (
    MESSAGE_CHARS,
    PROBE,
    RING_CHARS,
    RING_RECORDS,
    DmesgService,
    LogRing,
)
from tbon.overlay.wire.message import MAX_MESSAGE_BYTES, Kind, Message, encode
from tbon.record import Record

NOW = 100.0
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"
LOST_LEAF = "rank 3 lost: "  # what rank 1's warning starts with when its leaf 3 is killed


# --- the ring ---------------------------------------------------------------------------------


def filled(count: int, levelno: int = logging.INFO, text: str = "record {}") -> LogRing:
    ring = LogRing()
    for n in range(count):
        ring.append(1000.0 + n, levelno, text.format(n))
    return ring


def test_the_ring_keeps_the_last_records_only() -> None:
    ring = filled(RING_RECORDS + 500)
    assert len(ring) == RING_RECORDS
    kept = ring.since(0, logging.DEBUG)
    assert [e.seq for e in kept] == list(range(500, RING_RECORDS + 500))
    assert kept[-1].message == f"record {RING_RECORDS + 499}"
    assert ring.kept(logging.INFO) == RING_RECORDS + 500  # counted, kept or dropped since


def test_long_messages_are_cut_and_the_ring_is_bounded_in_characters_too() -> None:
    ring = filled(RING_RECORDS, text="x" * (MESSAGE_CHARS * 3) + "{}")
    kept = ring.since(0, logging.DEBUG)
    assert all(len(e.message) == MESSAGE_CHARS and e.message.endswith("\u2026") for e in kept)
    assert sum(len(e.message) for e in kept) <= RING_CHARS
    assert len(kept) == RING_CHARS // MESSAGE_CHARS


def test_a_full_ring_fits_in_one_message_even_when_every_character_is_escaped() -> None:
    ring = filled(RING_RECORDS * 2, levelno=logging.CRITICAL, text="\U0001f600" * MESSAGE_CHARS)
    service = DmesgService(8191, ring)
    [answer] = service.get(request("dmesg.get"), NOW)
    assert isinstance(answer, Respond)
    size = sum(len(frame) for frame in encode(answer.message))
    assert size < MAX_MESSAGE_BYTES, size


def test_levels_filter_at_or_above() -> None:
    ring = LogRing()
    for levelno in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, 50):
        ring.append(NOW, levelno, logging.getLevelName(levelno))
    assert [e.message for e in ring.since(0, logging.WARNING)] == ["WARNING", "ERROR", "CRITICAL"]
    [answer] = DmesgService(2, ring).get(request("dmesg.get", {"level": "error"}), NOW)
    assert isinstance(answer, Respond)
    assert [r["level"] for r in answer.message.payload["records"]] == ["error", "critical"]
    assert answer.message.payload["rank"] == 2


def test_the_handler_keeps_info_while_stderr_shows_warnings(monkeypatch) -> None:
    root = logging.getLogger("tbon")
    saved = (root.handlers[:], root.level, root.propagate, logs._formatter.rank)
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    try:
        logs.setup_logging("warning")
        logs.set_log_rank(5)
        logging.getLogger("tbon.broker").info("welcomed by the parent")
        logging.getLogger("tbon.broker").warning("lost the connection to the parent")
        logging.getLogger("tbon.broker").debug("not kept")
    finally:
        root.handlers[:], root.level, root.propagate, logs._formatter.rank = saved
    line = stderr.getvalue()
    assert re.fullmatch(
        rf"{STAMP} tbon-broker\[5\]: warning: lost the connection to the parent\n", line
    ), line
    kept = [(e.levelno, e.message) for e in logs.recent().since(0, logging.DEBUG)]
    assert kept == [
        (logging.INFO, "welcomed by the parent"),
        (logging.WARNING, "lost the connection to the parent"),
    ]


def test_records_read_as_words_in_a_log() -> None:
    from tbon.overlay.state.ranktable import Lost, Reboot

    assert (
        str(Lost(3, 1, "connection lost"))
        == "lost (rank 3, incarnation 1, reason: connection lost)"
    )
    assert str(Reboot(3, 2)) == "reboot (rank 3, incarnation 2)"
    assert isinstance(Lost(3, 1, ""), Record) and repr(Lost(3, 1, "x")).startswith("Lost(rank=3")


# --- the service, without sockets -------------------------------------------------------------


def request(topic: str, payload: dict[str, Any] | None = None, route: list[str] | None = None):
    return Message(
        Kind.REQUEST, topic, payload or {}, nodeid=3, tag=9, route=route or ["l0a", "p0"]
    )


def sent(actions: list[Any]) -> list[Message]:
    assert all(isinstance(a, Respond) for a in actions), actions
    return [a.message for a in actions]


def messages(reply: Message) -> list[str]:
    return [r["message"] for r in reply.payload["records"]]


def ack(reply: Message, route: list[str] | None = None) -> Message:
    return request("dmesg.ack", {"follow": 9, "next": reply.payload["next"]}, route)


def test_a_follower_gets_the_backlog_then_one_batch_at_a_time() -> None:
    ring = filled(3)
    service = DmesgService(3, ring)
    [first] = sent(service.follow(request("dmesg.follow"), NOW))
    assert first.streaming and messages(first) == ["record 0", "record 1", "record 2"]
    ring.append(NOW, logging.WARNING, "new one")
    assert service.pushes(NOW) == []  # the first batch is unread
    [second] = sent(service.ack(ack(first), NOW))  # read: what came meanwhile goes at once
    assert messages(second) == ["new one"] and "lost" not in second.payload
    assert service.pushes(NOW) == []
    assert sent(service.ack(ack(second), NOW)) == []  # nothing new
    ring.append(NOW, logging.ERROR, "and another")
    [third] = sent(service.pushes(NOW))  # nothing in flight: it goes with the next turn
    assert messages(third) == ["and another"] and third.route == ["l0a", "p0"]


def test_a_follower_that_does_not_read_is_told_how_many_records_it_lost() -> None:
    ring = LogRing(records=10)
    service = DmesgService(3, ring)
    [first] = sent(service.follow(request("dmesg.follow", {"level": "warning"}), NOW))
    assert messages(first) == []
    for n in range(25):
        ring.append(NOW, logging.WARNING if n % 2 else logging.INFO, f"r{n}")
    assert service.pushes(NOW) == []  # unread: nothing piles up, the ring is the only buffer
    [batch] = sent(service.ack(ack(first), NOW))
    assert messages(batch) == ["r15", "r17", "r19", "r21", "r23"]
    assert batch.payload["lost"] == 7  # warnings r1..r13, dropped by the ring; not the infos


def test_an_old_or_foreign_ack_releases_nothing() -> None:
    ring = filled(1)
    service = DmesgService(3, ring)
    [first] = sent(service.follow(request("dmesg.follow"), NOW))
    ring.append(NOW, logging.INFO, "second")
    stale = request("dmesg.ack", {"follow": 9, "next": first.payload["next"] - 1})
    assert service.ack(stale, NOW) == []
    assert service.ack(ack(first, route=["l0b", "p0"]), NOW) == []  # another client's
    assert service.ack(request("dmesg.ack", {"follow": 9, "next": "x"}), NOW) == []
    assert messages(sent(service.ack(ack(first), NOW))[0]) == ["second"]


def test_a_silent_followers_client_is_probed_then_forgotten_when_gone() -> None:
    ring = LogRing()
    service = DmesgService(3, ring)
    [first] = sent(service.follow(request("dmesg.follow"), NOW))
    assert service.pushes(NOW + PROBE * 2) == []  # nothing waiting: nothing to probe for
    ring.append(NOW, logging.INFO, "waiting")
    assert service.pushes(NOW + PROBE / 2) == []
    [probe] = sent(service.pushes(NOW + PROBE * 2))
    assert (
        probe.streaming and messages(probe) == [] and probe.payload["next"] == first.payload["next"]
    )
    assert service.pushes(NOW + PROBE * 2.5) == []  # one probe per PROBE seconds
    assert service.ack(ack(probe), NOW) != []  # a probe's answer releases the batch
    gone = request("client.disconnect", route=["l0a", "p0"])
    assert service.disconnect(gone, NOW) == [] and service.followers == []


def test_a_probe_is_a_deadline_of_the_loop_so_an_idle_broker_sends_it_on_time() -> None:
    """The probe is due PROBE seconds after the unread batch, whatever else wakes the broker
    (overlay/broker/wakeup.py asks every source; heartbeats alone do no turn's work)."""
    ring = LogRing()
    service = DmesgService(3, ring)
    assert service.next_deadline() is None  # no follower
    sent(service.follow(request("dmesg.follow"), NOW))
    assert service.next_deadline() is None  # its batch unread, but nothing waiting
    ring.append(NOW, logging.INFO, "waiting")
    assert service.next_deadline() == NOW + PROBE
    [probe] = sent(service.pushes(NOW + PROBE))
    assert service.next_deadline() == NOW + 2 * PROBE  # the next probe, while it stays unread
    sent(service.ack(ack(probe), NOW + PROBE))
    assert service.next_deadline() is None  # read, and its records sent: none unread waiting


def test_bad_requests_are_refused() -> None:
    service = DmesgService(3, LogRing())
    for bad in (
        request("dmesg.get", {"level": "loud"}),
        request("dmesg.follow", {"level": 3}),
        request("dmesg.follow", {"backlog": "yes"}),
    ):
        [reply] = sent(
            service.get(bad, NOW) if bad.topic == "dmesg.get" else service.follow(bad, NOW)
        )
        assert reply.errnum == 22 and "level must be one of" in reply.errstr
    assert service.followers == []


def test_clear_empties_the_ring_and_read_clear_reads_it_first() -> None:
    ring = filled(4)
    service = DmesgService(3, ring)
    [read] = sent(service.get(request("dmesg.get", {"level": "info", "clear": True}), NOW))
    assert messages(read) == [f"record {n}" for n in range(4)] and read.payload["cleared"] == 4
    assert len(ring) == 0 and messages(sent(service.get(request("dmesg.get"), NOW))[0]) == []
    ring.append(NOW, logging.WARNING, "after")
    [cleared] = sent(service.clear(request("dmesg.clear"), NOW))
    assert cleared.payload == {"rank": 3, "cleared": 1} and len(ring) == 0
    ring.append(NOW, logging.WARNING, "later")
    [kept] = sent(service.get(request("dmesg.get"), NOW))
    assert messages(kept) == ["later"] and kept.payload["records"][0]["seq"] == 5  # seq goes on
    [bad] = sent(service.get(request("dmesg.get", {"clear": "yes"}), NOW))
    assert bad.errnum == 22 and "clear true or false" in bad.errstr and len(ring) == 1


def test_a_follower_is_not_sent_cleared_records_nor_told_they_were_lost() -> None:
    ring = filled(2)
    service = DmesgService(3, ring)
    [first] = sent(service.follow(request("dmesg.follow"), NOW))
    ring.append(NOW, logging.INFO, "cleared before it was read")
    sent(service.clear(request("dmesg.clear"), NOW))
    ring.append(NOW, logging.INFO, "after the clear")
    [batch] = sent(service.ack(ack(first), NOW))
    assert messages(batch) == ["after the clear"] and "lost" not in batch.payload


def test_human_times_give_the_minute_then_the_seconds_between_lines() -> None:
    import time

    from tbon.cli.dmesg import HumanClock

    clock = HumanClock()
    base = time.mktime((2026, 3, 21, 10, 33, 5, 0, 0, -1))
    stamps = [clock.stamp(t) for t in (base, base + 0.25, base + 1.5, base + 60, base + 59)]
    assert stamps == [
        "[Mar 21 10:33]",
        "[      +0.250]",
        "[      +1.250]",
        "[Mar 21 10:34]",  # a new minute
        "[Mar 21 10:34]",  # time ran back (another rank's batch): the minute again
    ]
    assert len({len(s) for s in stamps}) == 1  # the messages line up


def test_no_backlog_follows_from_now() -> None:
    service = DmesgService(3, filled(5))
    [first] = sent(service.follow(request("dmesg.follow", {"backlog": False}), NOW))
    assert messages(first) == [] and "lost" not in first.payload


def test_the_command_shows_lost_records_where_they_were() -> None:
    from tbon.cli.dmesg import Reading, _as_json, _line

    reading = Reading(None, "debug", True, False, {})
    reading.following[9] = 3
    batch = {"rank": 3, "records": [{"seq": 7, "time": 5.0, "level": "info", "message": "m"}]}
    reply = Message(Kind.RESPONSE, "dmesg.follow", {**batch, "next": 8, "lost": 4}, tag=9)
    reply.streaming = True
    marker, record = sorted(reading._take(reply), key=lambda r: r.get("seq", -1))
    assert re.fullmatch(rf"{STAMP} rank 3: 4 records lost \(not read in time\)", _line(marker))
    assert re.fullmatch(rf"{STAMP} rank 3 info: m", _line(record))
    assert _as_json(marker)["lost"] == 4 and reading.acks == {9: 8}


def test_the_ranks_read_and_those_lost_meanwhile_come_from_the_states_view_or_held() -> None:
    """dmesg reads rank 0's `states` view (each rank's state, a few bytes at any size): which
    ranks to read, and which were lost while they were read; from a broker older than that
    view, its `held` view, read the same (cli/common.py's held_reader)."""
    from tbon.cli.common import held_reader
    from tbon.cli.dmesg import Reading, _targets
    from tbon.overlay.state import statusviews
    from tbon.overlay.state.rankevents import Lost, Online
    from tbon.overlay.state.ranktable import RankTable
    from tbon.overlay.state.statesview import RankStates
    from tbon.overlay.state.topology import Topology

    table = RankTable(Topology("kary:2", 10), [f"node{r}" for r in range(8)], 10.0)
    for rank in range(8):
        assert table.apply(Online(rank, 1, f"node{rank}", 100 + rank), 11.0).applied
    with contextlib.redirect_stderr(io.StringIO()) as said:
        states = RankStates(statusviews.states(table))
        assert _targets(states, "all") == (list(range(8)), {})
        assert _targets(states, "3,9") == ([3], {9: "rank 9 is vacant"})
    assert said.getvalue() == "tbon dmesg: rank 9 is vacant\n"
    assert table.apply(Lost(3, 1, "connection dropped", 1), 12.0).applied
    for read, view in (
        (RankStates, statusviews.states(table)),
        (held_reader(), statusviews.held(table, 13.0)),  # an older broker's
    ):
        reading = Reading(None, "debug", False, False, {})
        reading.watch, reading.read, reading.waiting = 5, read, [3, 2]
        update = Message(Kind.RESPONSE, "status.watch", view, tag=5)
        update.streaming = True
        with contextlib.redirect_stderr(io.StringIO()):
            assert reading._take(update) == []
        assert reading.waiting == [2] and reading.trouble == {3: "rank 3 is lost"}


# --- through real instances -------------------------------------------------------------------


def dmesg(inst, *args: str) -> subprocess.CompletedProcess[str]:
    return tbon("dmesg", inst.uri, *args)


def lines(text: str) -> list[tuple[int, str, str]]:
    """(rank, level, message) of each line; every line must have the documented form."""
    found = []
    for line in text.splitlines():
        match = re.fullmatch(rf"{STAMP} rank (\d+) (\w+): (.*)", line)
        assert match, f"not a dmesg line: {line!r}"
        found.append((int(match[1]), match[2], match[3]))
    return found


def kill_leaf(inst) -> None:
    """Kill rank 3's broker (ours, by PID) and wait until rank 0 has it lost: rank 1 logs it."""
    os.kill(inst.pid(3), signal.SIGKILL)
    inst.wait_status(lambda s: s["ranks"][3]["state"] == "lost", "rank 3 lost")


def test_a_brokers_warning_shows_up_with_its_rank_and_time(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    kill_leaf(inst)
    result = dmesg(inst)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "tbon dmesg: skipping lost rank 3\n"
    shown = lines(result.stdout)
    assert any(r[:2] == (1, "warning") and r[2].startswith(LOST_LEAF) for r in shown)
    assert {rank for rank, _, _ in shown} == {0, 1, 2}  # info records too: rank 3 is gone
    assert (2, "info", "welcomed by the parent") in shown
    stamps = [line.split(" ", 1)[0] for line in result.stdout.splitlines()]
    assert stamps == sorted(stamps)
    # the same warning on the broker's stderr, with a time, and the program in words
    inst.stop()
    said = inst.stderr()
    assert re.search(rf"^{STAMP} tbon-broker\[1\]: warning: {LOST_LEAF}", said, re.M), said


def test_ranks_and_levels_select_records(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    kill_leaf(inst)
    only_2 = dmesg(inst, "-r", "2")
    assert only_2.returncode == 0 and only_2.stderr == ""
    assert {rank for rank, _, _ in lines(only_2.stdout)} == {2}
    [(rank, level, text)] = lines(dmesg(inst, "--level", "warning").stdout)
    assert (rank, level) == (1, "warning") and text.startswith(LOST_LEAF)
    infos = lines(dmesg(inst, "-r", "0-2", "--level", "info").stdout)
    assert {level for _, level, _ in infos} == {"info", "warning"}
    bad = dmesg(inst, "--level", "loud")
    assert bad.returncode == 2 and bad.stderr.startswith("tbon dmesg: invalid --level 'loud'")


def test_clear_and_read_clear_empty_the_rings_named(instance) -> None:
    inst = instance(3)
    assert {rank for rank, _, _ in lines(dmesg(inst).stdout)} == {0, 1, 2}
    cleared = dmesg(inst, "-C", "-r", "[1]")
    assert (cleared.returncode, cleared.stdout, cleared.stderr) == (0, "", "")
    assert {rank for rank, _, _ in lines(dmesg(inst).stdout)} == {0, 2}
    read = dmesg(inst, "--read-clear", "-r", "0,2")
    assert read.returncode == 0, read.stderr
    assert {rank for rank, _, _ in lines(read.stdout)} == {0, 2}  # read once...
    assert dmesg(inst, "-r", "[0-2]").stdout == ""  # ...then gone, from every rank
    missing = dmesg(inst, "-C", "-r", "1,7")
    assert missing.returncode == 68
    assert missing.stderr == "tbon dmesg: rank 7: no such rank in this instance of size 3\n"


def test_human_times_on_a_real_instance(instance) -> None:
    inst = instance(2)
    shown = dmesg(inst, "-H")
    assert shown.returncode == 0, shown.stderr
    stamps = [re.match(r"\[([^]]*)\] rank [01] \w+: ", line) for line in shown.stdout.splitlines()]
    assert stamps and all(stamps), shown.stdout
    assert re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d", stamps[0][1]), shown.stdout
    assert all(re.fullmatch(r"[A-Z][a-z]{2} \d\d \d\d:\d\d| +\+\d+\.\d{3}", s[1]) for s in stamps)


def test_clear_and_human_refuse_what_does_not_go_with_them(instance) -> None:
    inst = instance(2)
    for args, words in (
        (["-C", "-f"], "--clear and --follow do not go together"),
        (["-c", "-C"], "--clear and --read-clear do not go together"),
        (["-c", "-f"], "--read-clear and --follow do not go together"),
        (["-H", "--json"], "--human and --json do not go together"),
        (["-C", "-r", "[1"], "invalid rank set '[1': ']' after '['"),
    ):
        result = dmesg(inst, *args)
        assert result.returncode == 2 and result.stdout == "", (args, result.stderr)
        assert result.stderr.startswith(f"tbon dmesg: {words}"), (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)
    assert {rank for rank, _, _ in lines(dmesg(inst).stdout)} == {0, 1}  # nothing was cleared


def test_json_is_an_array_of_records(instance) -> None:
    inst = instance(2)
    result = dmesg(inst, "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert isinstance(records, list) and records
    assert {tuple(sorted(r)) for r in records} == {
        ("level", "message", "rank", "seq", "time", "timestamp")
    }
    assert {r["rank"] for r in records} == {0, 1}
    assert [r["timestamp"] for r in records] == sorted(r["timestamp"] for r in records)
    assert all(re.fullmatch(rf"{STAMP}[+-]\d\d:\d\d", r["time"]) for r in records)
    assert json.loads(dmesg(inst, "--json", "--level", "error").stdout) == []


def test_unreachable_ranks_give_one_line_each_and_68(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    kill_leaf(inst)
    result = dmesg(inst, "-r", "2-3,9")
    assert result.returncode == 68
    assert result.stderr.splitlines() == [
        "tbon dmesg: rank 3 is lost",
        "tbon dmesg: rank 9: no such rank in this instance of size 4",
    ]
    assert {rank for rank, _, _ in lines(result.stdout)} == {2}


@contextlib.contextmanager
def following(inst: Any, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Pipe, Pipe]]:
    """`tbon dmesg URI -f ARGS...` in the background with its two pipes read as they fill;
    killed (if need be) and reaped on the way out, pass or fail."""
    follower = subprocess.Popen(
        [TBON, "dmesg", inst.uri, "-f", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    try:
        yield follower, Pipe(follower.stdout), Pipe(follower.stderr)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        follower.stdout.close()
        follower.stderr.close()


def test_follow_shows_what_is_logged_after_it_started_and_ends_on_sigint(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    with following(inst, "-r", "1") as (follower, out, err):
        # its backlog is written once rank 1 follows: from then on, what rank 1 logs is new
        out.wait(lambda got: any("welcomed by the parent" in line for line in got), "backlog")
        assert not any(LOST_LEAF in line for line in out.lines)
        kill_leaf(inst)
        out.wait(lambda got: any(LOST_LEAF in line for line in got), "the new warning")
        rank, level, text = lines("\n".join(out.lines))[-1]
        assert (rank, level) == (1, "warning") and text.startswith(LOST_LEAF)
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=DEADLINE) == 0
        assert err.rest() == []


def test_follow_as_json_lines_and_a_lost_rank_gives_68(instance) -> None:
    inst = instance(4, "tbon.fanout=2", "tbon.timeout=0")
    with following(inst, "--json") as (follower, out, err):
        out.wait(lambda got: any('"rank":3' in line for line in got), "rank 3's backlog")
        kill_leaf(inst)
        out.wait(lambda got: any(LOST_LEAF in line for line in got), "the warning")
        err.wait(lambda got: "tbon dmesg: rank 3 is lost" in got, "rank 3 noted lost")
        record = json.loads(next(line for line in out.lines if LOST_LEAF in line))
        assert (record["rank"], record["level"]) == (1, "warning")
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=DEADLINE) == 68


def test_expand_keeps_its_brokers_logs_at_info(instance) -> None:
    inst = instance(1, "size=2")
    result = tbon("expand", inst.uri, "-n", "1", "--json")
    assert result.returncode == 0, result.stderr
    [joined] = json.loads(result.stdout)["joined"]
    try:
        rundir = Path(inst.uri.removeprefix("local://")).parent
        [log] = (rundir / "expand").glob("broker-*-0.log")
        welcomed = re.compile(rf"^{STAMP} tbon-broker\[1\]: info: welcomed by the parent$", re.M)
        wait_for(lambda: welcomed.search(log.read_text()) is not None, "its welcome in its log")
        assert result.stderr == ""  # the terminal stays quiet
        shown = lines(dmesg(inst, "-r", "1").stdout)
        assert (1, "info", "welcomed by the parent") in shown
    finally:
        inst.stop()
        try:
            wait_for(lambda: process_gone(joined["pid"]), "the joined broker to leave")
        except AssertionError:
            os.kill(joined["pid"], signal.SIGKILL)
            raise


def test_the_initial_program_is_logged_in_words() -> None:
    result = tbon("start", "--test-size=1", "-S", "log-stderr-level=info", "sh", "-c", "true")
    assert result.returncode == 0, result.stderr
    assert re.search(
        rf"^{STAMP} tbon-broker\[0\]: info: instance up: running sh -c true$", result.stderr, re.M
    ), result.stderr
