"""Flow control, end to end: a reader that stops stops the jobs, a job that does not read its
input stops the reading of it, and nothing in between buffers more than its window.

The jobs are dd, which moves data with read(2) and write(2), so that its /proc/PID/io counts
every byte it wrote, and whose blocked write shows in /proc/PID/wchan. Each wait is for a
positive condition with a deadline: "every job is blocked on its pipe", not "a while passed".
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import DEADLINE, TBON, child_env, process_gone, wait_for
from rawlocal import RawClient

from tbon.overlay.wire.flow import CHUNK, STDIN_WINDOW, output_window

MiB = 1024 * 1024


def processes_reading(path: Path) -> list[int]:
    """Pids of processes whose command line names `path` (ours: the jobs of this test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(path).encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def blocked_writing_a_pipe(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as wchan:
            return "pipe_write" in wchan.read()
    except OSError:
        return False


def bytes_written(pid: int) -> int:
    with open(f"/proc/{pid}/io") as io:
        return int(next(line for line in io if line.startswith("wchar:")).split()[1])


def file_offset(pid: int, fd: int) -> int:
    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
        return int(next(line for line in info if line.startswith("pos:")).split()[1])


def cksum(path: Path) -> bytes:
    with open(path, "rb") as stdin:
        return subprocess.run(["cksum"], stdin=stdin, capture_output=True, check=True).stdout


def test_a_reader_that_stops_blocks_the_jobs_then_gets_every_byte(instance, tmp_path) -> None:
    """Four ranks (three of them through the tree) each write 24 MiB into a `tbon exec` whose
    stdout nobody reads: each job blocks once its window is spent, instead of the brokers and
    the CLI taking it all in; then the reader reads, and every byte arrives."""
    inst = instance(4)
    zeros = tmp_path / "zeros"
    size = 24 * MiB
    with open(zeros, "wb") as f:
        f.truncate(size)
    cli = subprocess.Popen(
        [TBON, "exec", "-r", "all", "dd", f"if={zeros}", "bs=64k", "status=none"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(TBON_URI=inst.uri),
    )
    try:
        jobs: list[int] = []

        def every_job_blocked() -> bool:
            jobs[:] = [pid for pid in processes_reading(zeros) if pid != cli.pid]
            return len(jobs) == 4 and all(blocked_writing_a_pipe(pid) for pid in jobs)

        wait_for(every_job_blocked, "every job blocked on its output pipe", timeout=60)
        # What a job got out: its window, the pipe to its broker, and what the CLI holds or
        # has written to its own pipe; far from the 24 MiB it has to say.
        bound = output_window(4) + CHUNK + 2 * MiB
        assert all(bytes_written(pid) <= bound for pid in jobs), [
            bytes_written(pid) for pid in jobs
        ]
        assert cli.stdout is not None
        received = 0
        while chunk := cli.stdout.read1(MiB):
            received += len(chunk)
        assert cli.wait(timeout=DEADLINE) == 0
        assert received == 4 * size
    finally:
        if cli.poll() is None:
            cli.kill()
        cli.wait(timeout=DEADLINE)
        for stream in (cli.stdout, cli.stderr):
            assert stream is not None
            stream.close()


def test_stdin_reaches_every_rank_whole(instance, tmp_path) -> None:
    inst = instance(4)
    data = tmp_path / "input"
    data.write_bytes(os.urandom(MiB) * 6)
    with open(data, "rb") as stdin:
        done = subprocess.run(
            [TBON, "exec", "-r", "all", "-l", "sh", "-c", "cksum"],
            stdin=stdin,
            capture_output=True,
            timeout=120,
            env=child_env(TBON_URI=inst.uri),
        )
    expected = cksum(data).decode()
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.decode().splitlines()) == [
        f"{r}: {expected.strip()}" for r in range(4)
    ]


def test_a_job_that_does_not_read_its_input_stops_the_reading_of_it(instance, tmp_path) -> None:
    """The CLI reads its stdin only as far as every rank has room: a job that never reads makes
    it stop after one window (plus the job's pipe), not swallow the file into the brokers."""
    inst = instance(2)
    data = tmp_path / "input"
    with open(data, "wb") as f:
        f.truncate(64 * MiB)
    ready = tmp_path / "ready"
    with open(data, "rb") as stdin:
        cli = subprocess.Popen(
            [TBON, "exec", "-r", "1", "sh", "-c", f"touch {ready}; exec sleep 600"],
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=child_env(TBON_URI=inst.uri),
        )
        try:
            wait_for(ready.exists, "the job started")
            wait_for(
                lambda: file_offset(cli.pid, 0) >= STDIN_WINDOW,
                "the CLI sent the job one window of input",
            )
            # A round trip through the same brokers, to give a CLI that did not stop time to
            # show it: reading on would take it past the bound within this.
            assert (
                subprocess.run(
                    [TBON, "exec", "-r", "1", "true"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=DEADLINE,
                    env=child_env(TBON_URI=inst.uri),
                ).returncode
                == 0
            )
            read = file_offset(cli.pid, 0)
            assert read <= STDIN_WINDOW + CHUNK + MiB, read
        finally:
            cli.terminate()  # passed on to the job as SIGTERM: it ends, and so does the CLI
            code = cli.wait(timeout=DEADLINE)
            assert cli.stderr is not None
            cli.stderr.close()
    assert code == 128 + 15


def test_stdin_is_credited_back_as_the_job_reads(instance, tmp_path) -> None:
    """A job that reads slowly, a megabyte at a time, still gets every byte: the window keeps
    moving as it reads."""
    inst = instance(2)
    data = tmp_path / "input"
    data.write_bytes(os.urandom(5 * MiB))
    started = time.monotonic()
    with open(data, "rb") as stdin:
        done = subprocess.run(
            [TBON, "exec", "-r", "1", "sh", "-c", "dd bs=1M iflag=fullblock status=none | cksum"],
            stdin=stdin,
            capture_output=True,
            timeout=120,
            env=child_env(TBON_URI=inst.uri),
        )
    assert done.returncode == 0, (done.stderr, time.monotonic() - started)
    assert done.stdout == cksum(data)


# --- every other stream and socket: bounded too ---------------------------------------------------


@contextlib.contextmanager
def raw_client(inst) -> Iterator[RawClient]:
    """A client of the instance's local socket that does only what the test tells it: it reads
    nothing and acknowledges nothing unless asked."""
    with RawClient(inst.uri) as client:
        yield client


def send(dealer: RawClient, topic: str, tag: int, payload: dict[str, Any] | None = None) -> None:
    header = {"v": 1, "k": "request", "t": topic, "n": 0, "g": tag}
    dealer.send_multipart([json.dumps(header).encode(), json.dumps(payload or {}).encode()])


def read(dealer: RawClient) -> tuple[dict[str, Any], dict[str, Any]]:
    assert dealer.poll(int(DEADLINE * 1000)), "no answer in time"
    frames = dealer.recv_multipart()
    return json.loads(frames[0]), json.loads(frames[1]) if frames[1] else {}


def read_until(dealer: RawClient, tag: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Everything that arrives before the answer tagged `tag`: a barrier, since one connection
    delivers in order."""
    before = []
    while True:
        header, payload = read(dealer)
        if header.get("g") == tag:
            return before
        before.append((header, payload))


def test_a_status_watcher_that_does_not_read_gets_the_latest_table_when_it_does(instance) -> None:
    inst = instance(4)
    with raw_client(inst) as watcher:
        send(watcher, "status.watch", 5)
        retired = subprocess.run(
            [TBON, "retire", inst.uri, "2-3"],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
        assert retired.returncode == 0, retired.stderr
        # Retiring two ranks changed the table several times; the watcher, which has read
        # nothing, was sent only the first table.
        send(watcher, "status.get", 6)
        [(header, first)] = read_until(watcher, 6)
        assert header["g"] == 5 and [r["state"] for r in first["ranks"]] == ["online"] * 4
        # It reads it and says so: it gets the newest table at once, and only that one.
        send(watcher, "status.ack", 7, {"watch": 5})
        header, latest = read(watcher)
        assert header["g"] == 5
        assert [r["state"] for r in latest["ranks"]] == ["online", "online", "vacant", "vacant"]
        send(watcher, "status.get", 8)
        assert read_until(watcher, 8) == []


def test_a_client_that_stops_reading_is_dropped_and_no_other_is_delayed(instance, tmp_path) -> None:
    """A client that asks and asks without reading passes its backlog (32 MiB here: echoes of
    1 MiB pings): the broker drops it, kills its job, and keeps serving everyone else."""
    inst = instance(2, "broker.client-backlog=32M")
    pidfile = tmp_path / "pid"
    with raw_client(inst) as greedy:
        start = {
            "id": "greedy",
            "argv": [
                "sh",
                "-c",
                f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 600",
            ],
            "cwd": None,
            "targets": [1],
        }
        send(greedy, "exec.start", 1, start)
        wait_for(pidfile.exists, "the greedy client's job started")
        job = int(pidfile.read_text())
        big = {"pad": "x" * MiB}
        for tag in range(100, 140):
            send(greedy, "broker.ping", tag, big)
        wait_for(lambda: "dropped local client" in inst.stderr(), "the broker dropped the client")
        wait_for(lambda: process_gone(job), "its job killed")
        # Everyone else is served as before.
        other = subprocess.run(
            [TBON, "exec", inst.uri, "-r", "all", "echo", "ok"],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            stdin=subprocess.DEVNULL,
            env=child_env(),
        )
        assert other.returncode == 0 and other.stdout == "ok\nok\n", other.stderr
        # What the greedy client finds when it reads at last: what was sent before the bound,
        # then one line saying why it was dropped.
        while True:
            header, _ = read(greedy)
            if header["t"] == "client.dropped":
                break
        assert header["e"] == errno.ENOBUFS and "went unread" in header["es"]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def test_greedy_clients_together_never_take_rank_0_past_the_total_bound(instance) -> None:
    """Eight clients each start a job flooding stdout on both ranks, grant themselves credit
    every 50 ms and never read. Each may leave 32 MiB unread, all of them 40 MiB: rank 0 grows
    by about the total, not eight times one client's bound (256 MiB, as before issue 24); each
    is dropped and told why, the greediest first; and once they have gone, rank 0 gives the
    memory back."""
    inst = instance(2, "broker.client-backlog=32M")
    rank0 = inst.pid(0)
    done = subprocess.run(
        [TBON, "exec", inst.uri, "-r", "all", "true"], capture_output=True, env=child_env()
    )
    assert done.returncode == 0, done.stderr
    idle = rss_bytes(rank0)
    window = 4 * MiB
    cap = str(48 * 1000 * 1000)  # each job's output, so that nothing runs away
    greedy = [RawClient(inst.uri) for _ in range(8)]
    try:
        for number, client in enumerate(greedy):
            start = {"id": f"g{number}", "argv": ["head", "-c", cap, "/dev/zero"], "cwd": None}
            send(
                client, "exec.start", 1, {**start, "targets": [0, 1], "eof": True, "window": window}
            )
        peak = idle

        def all_dropped() -> bool:
            nonlocal peak
            for number, client in enumerate(greedy):
                for rank in (0, 1):
                    header = {"v": 1, "k": "request", "t": "exec.credit", "n": rank, "g": 0}
                    credit = {"id": f"g{number}", "bytes": window}
                    with contextlib.suppress(OSError):
                        client.send_multipart(
                            [json.dumps(header).encode(), json.dumps(credit).encode()]
                        )
            peak = max(peak, rss_bytes(rank0))
            time.sleep(0.05)  # the clients' own pace: a grant every 50 ms
            return inst.stderr().count("dropped local client") >= 8

        wait_for(all_dropped, "all eight greedy clients dropped", timeout=120)
        assert peak - idle < 40 * MiB + 32 * MiB, (idle, peak)
        reasons = []
        for client in greedy:  # each reads at last: what it was sent, then why it was dropped
            while True:
                header, _ = read(client)
                if header["t"] == "client.dropped":
                    break
            assert header["e"] == errno.ENOBUFS and "went unread" in header["es"]
            reasons.append(header["es"])
        assert any("broker.client-backlog-total, 40 MiB" in why for why in reasons), reasons
    finally:
        for client in greedy:
            client.close()
    wait_for(lambda: rss_bytes(rank0) < idle + 24 * MiB, "rank 0 to give the memory back")
    status = subprocess.run([TBON, "status", inst.uri], capture_output=True, env=child_env())
    assert status.returncode == 0 and status.stdout.count(b": full") == 2


# --- the window arithmetic, without sockets ------------------------------------------------------


def test_a_window_stops_when_spent_and_a_replayed_grant_cannot_widen_it() -> None:
    from tbon.overlay.wire.flow import MESSAGE_COST, Window

    window = Window.full(8192)
    window.spend(8000)
    window.spend(MESSAGE_COST)
    assert not window.open and window.credit == 8192 - 8000 - MESSAGE_COST
    assert window.grant(4096)  # reopened: the sender reads again
    assert not window.grant(4096)  # already open: nothing to wake
    for _ in range(3):  # the same grant, replayed
        window.grant(8000 + MESSAGE_COST)
    assert window.credit == 8192


def test_credit_goes_back_a_quarter_window_at_a_time() -> None:
    from tbon.overlay.wire.flow import Returns

    returns = Returns(4000)
    assert [returns.consumed(600) for _ in range(4)] == [0, 1200, 0, 1200]  # all that is owed
    assert returns.consumed(999) == 0


def test_input_goes_no_faster_than_the_fullest_rank_and_ended_ranks_do_not_hold_it() -> None:
    from tbon.overlay.wire.flow import STDIN_WINDOW, StdinRoom

    room = StdinRoom.for_ranks([1, 2, 3])
    room.sent(STDIN_WINDOW)
    assert room.available() == 0
    room.read(1, 1000)
    room.read(2, 5000)
    assert room.available() == 0  # rank 3 has read nothing yet
    room.done(3)  # its job exited: it no longer counts
    assert room.available() == 1000 and room.ranks == [1, 2]
    room.read(1, 10 * STDIN_WINDOW)
    assert room.room[1] == STDIN_WINDOW  # never above the window


def test_windows_shrink_with_the_number_of_ranks_within_bounds() -> None:
    from tbon.overlay.wire.flow import MAX_WINDOW, MIN_WINDOW, OUTPUT_BUDGET

    assert output_window(1) == MAX_WINDOW
    assert output_window(16) == OUTPUT_BUDGET // 16
    assert output_window(8192) == MIN_WINDOW
    assert all(
        output_window(n) * n <= max(OUTPUT_BUDGET, n * MIN_WINDOW) for n in range(1, 9000, 37)
    )
