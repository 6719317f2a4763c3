"""`tbon expand` forks its brokers from one process that imported the broker once
(overlay/launch/forker.py): what a user sees of them must be what a broker started on its own
shows, its whole title (which names its run directory and boot servers) and its log."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys

from brokers import title
from conftest import DEADLINE, TBON, child_env, process_gone, tbon, wait_for

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor movement


def test_a_forked_joiner_shows_its_whole_title_and_logs_to_its_file(instance) -> None:
    inst = instance(2, "size=3")
    rank0_dir = os.path.dirname(inst.uri[len("local://") :])
    joined = tbon("expand", inst.uri, "-n", "1", "--json")
    assert joined.returncode == 0, joined.stderr
    [broker] = json.loads(joined.stdout)["joined"]
    try:
        shown = title(broker["pid"])
        assert shown.startswith("tbon broker rank 2/3 -S broker.boot-server=local://"), shown
        assert f"-S broker.rundir={rank0_dir}{os.sep}" in shown, shown  # not cut short
        [log] = (os.path.join(rank0_dir, "expand", name) for name in _logs(rank0_dir))
        with open(log) as text:
            assert "FLUB: reserved rank 2" in text.read()
    finally:
        inst.stop()
        wait_for(lambda: process_gone(broker["pid"]), "the joined broker to leave")


def _logs(rundir: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(rundir, "expand")) if n.endswith(".log")]


# Run in a process of its own: it makes itself a child subreaper, which pytest's process must not
# become (every orphan of every later test would be adopted, and left a zombie, by it).
HALF_WAY = """
import sys
from tbon.errors import TbonError
from tbon.overlay.launch.forker import Forker, _children

forker = Forker.start()
assert forker is not None, "no subreaper here"
before = _children() - {forker.process.pid}
try:
    forker.fork([(["-S", "size=1"], sys.argv[1]), (["-S", "size=1"], sys.argv[2])])
except TbonError as error:
    print("refused:", error)
print("left:", sorted(_children() - before))
"""


def test_a_forker_that_fails_half_way_leaves_no_broker_running(tmp_path) -> None:
    """The forker started the first broker, then could not open the second's log and exited:
    expand, the subreaper that adopted the first, kills and reaps it rather than leave a broker
    that nobody follows."""
    missing = tmp_path / "no-such-directory" / "broker.log"
    ran = _script(HALF_WAY, str(tmp_path / "first.log"), str(missing))
    assert "refused: cannot start brokers: the forker exited 1" in ran.stdout, ran.stdout
    assert "left: []" in ran.stdout, ran.stdout


def test_expand_without_descriptors_for_its_forker_says_what_fails_in_one_line() -> None:
    """The forker starts before expand reads its command line (cli/main.py) and needs eight
    descriptors for its pipes: with six in all (three left after stdin, stdout and stderr) it
    cannot start, and expand goes on without it, as it did before there was one: its help, or
    its one-line error, never a traceback."""
    limit = ["prlimit", "--nofile=6:6", "--"]
    helped = subprocess.run(
        [*limit, TBON, "expand", "--help"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Usage: tbon expand"), helped.stdout
    nowhere = subprocess.run(
        [*limit, TBON, "expand", "local:///nowhere", "-n", "1"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert nowhere.returncode == 1, nowhere.stderr
    assert nowhere.stderr == (
        "tbon expand: cannot connect to local:///nowhere: no such socket (is the instance "
        "running?)\n"
    ), nowhere.stderr


STOPPED = """
import os, signal, sys
from tbon.errors import TbonError
from tbon.overlay.launch import forker as forking

forking.FORK_DEADLINE_S = 1.0
forker = forking.Forker.start()
assert forker is not None, "no subreaper here"
before = forking._children() - {forker.process.pid}
os.kill(forker.process.pid, signal.SIGSTOP)  # ours, by PID
try:
    forker.fork([(["-S", "size=1"], sys.argv[1])])
except TbonError as error:
    print("refused:", error)
print("left:", sorted(forking._children() - before))
"""


def test_a_forker_that_does_not_answer_is_given_up_within_its_deadline(tmp_path) -> None:
    """A forker stopped (or stuck importing) does not hang expand: past its deadline it is
    killed, and expand says why in one line."""
    ran = _script(STOPPED, str(tmp_path / "broker.log"))
    assert "refused: cannot start brokers: the forker did not answer within 1s" in ran.stdout
    assert "left: []" in ran.stdout, ran.stdout


def test_a_joiner_that_ends_while_expand_still_follows_is_reaped_and_reported(instance) -> None:
    """Expand follows its joiners until each is online or gone. One that came online and ends
    while another is still pending is reaped as it ends (expand, its child subreaper, would
    otherwise keep its zombie until it exits) and reported as failed, with the rank it held.
    The pending one asks for rank 3, whose parent, rank 1, is stopped: it cannot come online
    until rank 1 runs again. Expand's stderr is a terminal, so that its progress bar says when
    it has seen the first one online (1/2): only then is that one killed."""
    inst = instance(1, "size=4", "tbon.fanout=2")
    inst.join("broker.rank=1")
    parent = inst.wait_status(lambda s: s["ranks"][1]["state"] == "online", "rank 1 online")
    stopped = parent["ranks"][1]["pid"]
    os.kill(stopped, signal.SIGSTOP)  # ours, by PID
    terminal, slave = pty.openpty()
    expand = subprocess.Popen(
        [TBON, "expand", inst.uri, "-r2-3", "-t2m", "-S", "broker.join-timeout=2m"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        env=child_env(),
    )
    os.close(slave)
    shown = ""
    try:
        while "1/2" not in ANSI.sub("", shown):
            shown += _read(terminal, "expand's progress at 1/2", shown)
        ended = inst.status()["ranks"][2]["pid"]
        os.kill(ended, signal.SIGKILL)  # a joiner of our expand, by PID
        wait_for(lambda: not os.path.exists(f"/proc/{ended}"), "the ended joiner reaped")
        assert expand.poll() is None, "expand stopped following before rank 3 was online"
    finally:
        os.kill(stopped, signal.SIGCONT)
        with contextlib.suppress(AssertionError):  # expand closed the terminal: it has ended
            while True:
                shown += _read(terminal, "expand to end", shown)
        try:
            out, _ = expand.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            expand.kill()  # ours, by PID
            out, _ = expand.communicate()
        os.close(terminal)
    assert expand.returncode == 1, shown
    assert out == "joined: 1 broker, rank 3\n", (out, shown)
    said = f"broker pid {ended} (rank 2): ended after it came online as rank 2: "
    assert said in shown and f"(exit {-signal.SIGKILL}; log " in shown, shown


def _read(terminal: int, what: str, shown: str) -> str:
    """What the terminal shows next, within the deadline; AssertionError once it is closed."""
    ready, _, _ = select.select([terminal], [], [], DEADLINE)
    assert ready, f"timed out waiting for {what}; the terminal shows:\n{shown}"
    try:
        data = os.read(terminal, 4096)
    except OSError:  # EIO: every writer has gone
        data = b""
    assert data, f"the terminal closed while waiting for {what}:\n{shown}"
    return data.decode(errors="replace")


BATCHES = """
import os, signal, sys
from tbon.errors import TbonError
from tbon.overlay.launch.forker import Forker, _children

forker = Forker.start()
assert forker is not None, "no subreaper here"
before = _children() - {forker.process.pid}
brokers = []
try:
    for log in sys.argv[1:3]:  # one batch each, from the same forker
        brokers += forker.fork([(["-S", "size=1"], log)])
    pids = sorted(b.pid for b in brokers)
    print("ours:", sorted(_children() - before - {forker.process.pid}) == pids)
    sessions = {os.getsid(b.pid) for b in brokers}
    print("one session:", len(sessions) == 1 and os.getsid(0) not in sessions)
    os.kill(forker.process.pid, signal.SIGKILL)  # ours, by PID
    try:
        forker.fork([(["-S", "size=1"], sys.argv[3])])
    except TbonError as error:
        print("refused:", error)
    print("left:", sorted(_children() - before) == pids)
finally:
    for broker in brokers:
        broker.kill()
        broker.wait()
"""


def test_one_forker_forks_batch_after_batch_and_a_dead_one_starts_no_more(tmp_path) -> None:
    """Expand's window sends the forker a batch whenever it has room: each batch's brokers are
    expand's children (it reaps them), the brokers of one expand share one session, not
    expand's, and a forker gone between batches fails the next in one line, leaving the
    brokers already started alone and starting none."""
    logs = [str(tmp_path / f"broker-{n}.log") for n in range(3)]
    ran = _script(BATCHES, *logs)
    assert "ours: True" in ran.stdout, ran.stdout
    assert "one session: True" in ran.stdout, ran.stdout
    assert "refused: cannot start brokers: the forker exited -9" in ran.stdout, ran.stdout
    assert "left: True" in ran.stdout, ran.stdout


def _script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS...` in a user's environment, within a minute; it must exit 0 (what
    it saw is on its stdout)."""
    ran = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return ran
