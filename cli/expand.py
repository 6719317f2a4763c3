"""`tbon expand`: start brokers on this host that join a running instance by FLUB.

Each new broker asks rank 0 for a rank itself; rank 0's table decides atomically, so running
expand twice at once, or on a stale view, can never hand a rank out twice: the surplus brokers
are told there is no rank (exit 69) and nothing that was online is touched.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tbon import exitcodes
from tbon.cli.common import URI_HELP, duration, interactive, print_json, python_module
from tbon.cli.retire import ask_again
from tbon.errors import RankError, TbonError, UsageError
from tbon.limits import MAX_SIZE, check_size
from tbon.overlay.parse.idset import format_idset, parse_idset
from tbon.overlay.parse.numbers import is_int

if TYPE_CHECKING:
    from tbon.overlay.launch.forker import Forked, Forker
    from tbon.overlay.launch.pace import Pace
    from tbon.overlay.state.onlineview import Online

BOOT_SERVERS = 4
"""How many of the instance's URIs a new broker is given as broker.boot-server, tried in order
(boot/flub.py): a stand-in or three for a boot server that goes away during the join, while a
silent one costs the joiner at most a broker.join-timeout each."""

BOOT_INFO_TIMEOUT = 2.0
"""How long expand waits for a broker to say where its socket is (seconds): a broker too busy to
say is skipped, it would make a poor boot server anyway."""


@dataclass
class Joiner:
    """One broker this command starts, and what became of it."""

    command: list[str]  # the process that is this broker
    argv: list[str]  # for the forker: what follows `tbon broker` (none: started over ssh)
    log: Path
    wanted: int | None  # the rank it asked for, if any
    host: str = ""  # the host it runs on, through ssh; "" for this one
    after: int = 0  # a remote joiner is known by its rank coming online past this incarnation
    process: subprocess.Popen[bytes] | Forked | None = None  # None: not started (yet)
    rank: int | None = None
    exit_code: int | None = None
    reason: str = ""

    @property
    def pending(self) -> bool:
        return self.rank is None and self.exit_code is None

    @property
    def joined(self) -> bool:
        """Online, and not ended since (one that ended during the follow failed: _reap_ended)."""
        return self.rank is not None and self.exit_code is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


def register(app: typer.Typer) -> None:
    @app.command("expand")
    def expand(
        uri: str = typer.Argument(None, metavar="[URI]", help=URI_HELP),
        count: int = typer.Option(
            None,
            "--count",
            "-n",
            min=1,
            help=f"Start COUNT brokers (at most {MAX_SIZE}), each taking any available rank.",
        ),
        fill: bool = typer.Option(
            False, "--fill", help="Start one broker per available (vacant or lost) rank."
        ),
        ranks: str = typer.Option(
            None,
            "--ranks",
            "-r",
            metavar="IDSET",
            help="Start one broker for each of these ranks (e.g. 4,6-9).",
        ),
        timeout: str = typer.Option(
            "60s",
            "--timeout",
            "-t",
            metavar="DURATION",
            help="Give up on brokers not online after DURATION; 0: no limit.",
        ),
        setattr_: list[str] = typer.Option(
            [],
            "--setattr",
            "-S",
            metavar="NAME=VALUE",
            help="Extra attribute for the new brokers (e.g. log-stderr-level=info).",
        ),
        hosts: str = typer.Option(
            None,
            "--hosts",
            metavar="HOSTLIST",
            help="Start the brokers on these hosts over ssh (round robin), e.g. node[5-8].",
        ),
        launcher: str = typer.Option(
            None, "--launcher", metavar="ssh", help="How to reach --hosts: ssh (the default)."
        ),
        window: int = typer.Option(
            None,
            "--window",
            min=0,
            metavar="N",
            help="Keep at most N brokers booting at once (default: 128 per CPU); 0: all at once.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Report as JSON."),
    ) -> None:
        """Grow an instance: start brokers here that join it into vacant or lost ranks.

        Exit status: 0 if every broker joined, 69 if some found no rank (the instance was
        full), 1 if any failed otherwise.
        """
        if sum((count is not None, fill, ranks is not None)) != 1:
            raise UsageError("give exactly one of -n COUNT, --fill or --ranks IDSET")
        if count is not None:
            check_size(count, "-n")
        _check_attributes(setattr_)
        if launcher not in (None, "ssh"):
            raise UsageError(f"--launcher {launcher!r}: expand reaches other hosts with ssh")
        if launcher is not None and hosts is None:
            raise UsageError("--launcher ssh needs --hosts HOSTLIST")
        remote_hosts = _remote_hosts(hosts)
        given = duration(timeout, "--timeout")
        limit = None if given == 0 else 60.0 if given is None else given  # 0: no limit
        from tbon.overlay.launch.forker import take_forker
        from tbon.overlay.launch.pace import default_window

        booting = default_window() if window is None else window

        # Started first (by cli/main.py), so that it imports the broker while we ask the
        # instance what to start; through ssh, not wanted.
        forker = take_forker()
        if forker is not None and remote_hosts:
            forker.cancel()
            forker = None
        try:
            joiners = _expand(
                uri, count, fill, ranks, setattr_, remote_hosts, limit, forker, booting
            )
        finally:
            if forker is not None:
                forker.cancel()
        if not joiners:
            _report([], as_json, "no available ranks: nothing to fill")
            return
        raise typer.Exit(_report(joiners, as_json))


def _expand(
    uri: str | None,
    count: int | None,
    fill: bool,
    ranks: str | None,
    setattr_: list[str],
    remote_hosts: list[str],
    limit: float | None,
    forker: Forker | None,
    window: int,
) -> list[Joiner]:
    """Ask the instance what to start, start it (through `forker`, if any, here) at most
    `window` booting at once (0: all at once), and follow the brokers until each is online or
    gone."""
    from tbon.cli.common import fetch_status, open_client

    def plan(client: Any) -> tuple[dict[str, Any], dict[str, Any], list[int | None], list[str]]:
        status = fetch_status(client)
        # the root's broker, a boot server: rank 0's, or the member's that took over (§13.4)
        root = status.get("root")
        info = client.rpc("broker.info", nodeid=root if is_int(root) else 0)
        wanted = _wanted(status, count, fill, ranks)
        boot = _boot_servers(client, status, info, remote=bool(remote_hosts)) if wanted else []
        return status, info, wanted, boot

    with _Planned(open_client(uri), uri, limit) as planned:
        status, info, wanted, boot = planned.ask(plan)
        client = planned.client
        above = vacant_ancestors(status, [r for r in wanted if r is not None])
        if above:
            print(
                f"tbon expand: also starting brokers for rank{'s' * (len(above) > 1)} "
                f"{format_idset(above)} above the ranks asked for: no broker holds "
                f"{'them' if len(above) > 1 else 'it'}, and a broker comes online only "
                "below a parent that is online",
                file=sys.stderr,
            )
            wanted = [*above, *wanted]  # the highest first: they start first
        if not wanted:
            return []
        if remote_hosts:
            joiners = _remote(boot, status, wanted, remote_hosts, setattr_)
        else:
            joiners = _local(boot, info, wanted, setattr_)
        from tbon.overlay.launch.pace import Pace

        try:
            _follow(client, joiners, limit, uri, Pace(len(joiners), window), forker)
        finally:
            for joiner in joiners:
                if not joiner.pending:
                    continue
                if joiner.process is None:
                    why = "ended" if limit is None else f"within {limit:g}s"
                    joiner.exit_code, joiner.reason = -1, f"not started: {why}"
                elif joiner.process.poll() is None:
                    joiner.process.kill()  # ours, by PID: never leave a half-joined broker
                    joiner.process.wait()
                    why = "ended" if limit is None else f"not online within {limit:g}s"
                    joiner.exit_code, joiner.reason = -1, why
    return joiners


def _check_attributes(extra: list[str]) -> None:
    """Refuse bad -S settings here, once, rather than in every broker started with them. The
    brokers get broker.boot-server from this command: a stand-in URI takes its place."""
    from tbon.overlay.config.attributes import broker_config, parse_assignments

    attributes = parse_assignments(extra)
    broker_config(
        {**attributes, "broker.boot-server": attributes.get("broker.boot-server", "local:///")}
    )


def _wanted(
    status: dict[str, Any], count: int | None, fill: bool, ranks: str | None
) -> list[int | None]:
    if ranks is not None:
        chosen = parse_idset(ranks)
        beyond = [r for r in chosen if r >= status["size"]]
        if beyond:
            raise RankError(
                f"--ranks {ranks}: no rank {beyond[0]} in this instance of size {status['size']}"
            )
        return list(chosen)
    if fill:
        return [None] * sum(r["state"] in ("vacant", "lost") for r in status["ranks"])
    assert count is not None
    return [None] * count


def vacant_ancestors(status: dict[str, Any], ranks: list[int]) -> list[int]:
    """The ranks above `ranks` that no broker holds and none is expected for (`vacant` or
    `lost`), and that are not asked for themselves, parents before children: a joiner comes
    online only below a parent that is online, so each of these needs a broker too, or the
    joiners below it wait out their lease for nothing (docs/flub.md §2, step 2)."""
    asked = set(ranks)
    found: set[int] = set()
    for rank in ranks:
        parent = status["ranks"][rank]["parent"]
        while parent is not None and parent not in found:
            entry = status["ranks"][parent]
            if entry["state"] in ("online", "retiring"):
                break  # connected: what is above it is its own broker's concern
            if entry["state"] in ("vacant", "lost") and parent not in asked:
                found.add(parent)
            parent = entry["parent"]
    levels = {rank: _depth(status, rank) for rank in found}
    return sorted(found, key=lambda rank: (levels[rank], rank))


def _depth(status: dict[str, Any], rank: int) -> int:
    depth = 0
    while (rank := status["ranks"][rank]["parent"]) is not None:
        depth += 1
    return depth


def _tbon_command() -> list[str]:
    """This tbon, to start brokers here with."""
    from tbon.overlay.connectors.ssh import tbon_script

    found = tbon_script() or shutil.which("tbon")
    return [found] if found else python_module("tbon.cli")


def _boot_servers(
    client: Any, status: dict[str, Any], info: dict[str, Any], remote: bool
) -> list[str]:
    """Every URI by which a new broker may reach the instance, best first: the one this command
    was given, the root's (rank 0's, or its successor's), then up to two other online brokers'
    (this host's first, lowest ranks first), BOOT_SERVERS in all. A broker on this host is
    named by its local:// URI, one on another by the ssh:// form; joiners on other hosts
    (`remote`) get ssh:// forms only."""
    from tbon.overlay.connectors.uri import reach, to_remote

    given = client.uri
    first = str(to_remote(given) if remote else given)
    if "," in first:
        raise UsageError(f"{first}: broker.boot-server cannot carry a URI with a comma in it")
    here = socket.gethostname()
    found = [first]

    def add(about: dict[str, Any]) -> None:
        uri = reach(about["uri"], about["hostname"], given, remote)
        if "," not in str(uri) and str(uri) not in found:
            found.append(str(uri))

    add(info)
    from tbon.overlay.state.heldtable import said

    others = sorted(
        (r for r in said(status) if r["rank"] and r["state"] == "online" and not r["torpid"]),
        key=lambda r: (r["host"] != here, r["rank"]),
    )
    for entry in others[:BOOT_SERVERS]:  # one of them may be the broker of `given`
        if len(found) >= BOOT_SERVERS:
            break
        try:
            add(client.rpc("broker.info", nodeid=entry["rank"], timeout=BOOT_INFO_TIMEOUT))
        except TbonError:
            continue  # gone or busy since the snapshot: one stand-in fewer
    return found


def _local(
    boot: list[str], info: dict[str, Any], wanted: list[int | None], extra: list[str]
) -> list[Joiner]:
    """The brokers for `wanted`, here, not started yet (`_start`)."""
    # Logs live in the boot broker's run directory (it is on this host), and go with it.
    given = boot[0]
    rundir = os.path.dirname(given[len("local://") :]) if given.startswith("local://") else None
    logs = Path(rundir or os.environ.get("TMPDIR", "/tmp")) / "expand"
    logs.mkdir(mode=0o700, exist_ok=True)
    attributes = [f"broker.boot-server={','.join(boot)}", *_log_level(extra), *extra]
    if info.get("endpoint", "").startswith("tcp://127.") and not any(
        a.startswith("tbon.endpoint=") for a in extra
    ):
        attributes.append("tbon.endpoint=tcp://127.0.0.1:*")  # the instance lives on loopback
    # Run directories inside rank 0's, so that none outlives the instance, even after kill -9
    # (overlay/launch/rundirs.py); those of brokers gone since the last expand are swept.
    from tbon.overlay.launch.rundirs import joiner_rundir, joiners_directory, sweep

    own_rundir = not any(a.startswith("broker.rundir=") for a in extra)
    under = joiners_directory(info.get("uri", "")) if own_rundir else None
    sweep(under)
    tbon = _tbon_command()
    joiners = []
    for index, rank in enumerate(wanted):
        argv: list[str] = []
        place = joiner_rundir(under, f"{os.getpid()}-{index}")
        for attribute in [
            *attributes,
            *([f"broker.rank={rank}"] if rank is not None else []),
            *([f"broker.rundir={place}"] if place is not None else []),
        ]:
            argv += ["-S", attribute]
        log = logs / f"broker-{os.getpid()}-{index}.log"
        joiners.append(Joiner([*tbon, "broker", *argv], argv, log, rank))
    return joiners


def _start(batch: list[Joiner], forker: Forker | None) -> None:
    """Start these joiners: forked by `forker` (launch/forker.py) if they are this host's and
    there is one, else each a process of its own (`tbon broker`, or ssh). TbonError if the
    forker failed: none of the batch is running then."""
    here = [j for j in batch if not j.host]
    if forker is not None and here:
        for joiner in here:
            open(joiner.log, "wb").close()  # a new log for each, as a process of its own gets
        forked = forker.fork([(j.argv, str(j.log)) for j in here])
        for joiner, process in zip(here, forked, strict=True):
            joiner.process = process
        batch = [j for j in batch if j.host]
    for joiner in batch:
        with open(joiner.log, "wb") as output:
            joiner.process = subprocess.Popen(
                joiner.command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )


def _remote_hosts(hosts: str | None) -> list[str]:
    if hosts is None:
        return []
    from tbon.overlay.parse.hostlist import expand_hostlist

    return expand_hostlist(hosts)


def _remote(
    boot: list[str],
    status: dict[str, Any],
    wanted: list[int | None],
    hosts: list[str],
    extra: list[str],
) -> list[Joiner]:
    """Joiners on other hosts, to start over ssh (`_start`), booting through ssh:// URIs. Each
    asks for a rank of its own (the lowest available first), so that it can be told apart
    once online; rank 0 still decides, and turns away any that lost a race (exit 69)."""

    from tbon.overlay.connectors.ssh import endpoint_on, remote_tbon, ssh_argv

    available = [
        e["rank"]
        for e in status["ranks"]
        if e["state"] in ("vacant", "lost") and e["rank"] not in wanted
    ]
    ranks = [
        rank if rank is not None else available.pop(0)
        for rank in wanted
        if available or rank is not None
    ]
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"tbon-expand-{os.getuid()}"
    logs.mkdir(mode=0o700, exist_ok=True)
    tbon = remote_tbon()
    joiners = []
    for index, rank in enumerate(ranks):
        host = hosts[index % len(hosts)]
        attributes = [f"broker.boot-server={','.join(boot)}", f"broker.rank={rank}"]
        attributes += _log_level(extra)
        attributes += extra
        attributes += endpoint_on(host, extra)
        remote = ["env", f"TBON_SSH={os.environ.get('TBON_SSH', 'ssh')}", tbon, "broker"]
        for attribute in attributes:
            remote += ["-S", attribute]
        log = logs / f"broker-{os.getpid()}-{index}.log"
        before = status["ranks"][rank]["incarnation"]
        command = ssh_argv(host, "", None, remote)
        joiners.append(Joiner(command, [], log, rank, host=host, after=before))
    return joiners


def _follow(
    client: Any,
    joiners: list[Joiner],
    limit: float | None,
    uri: str | None,
    pace: Pace,
    forker: Forker | None,
) -> None:
    """Start the joiners as `pace` says (in order, as those booting come online or end), and
    watch the root's pushed status and our processes until each joiner is online or gone.
    A batch that cannot be started fails the joiners not started yet, and those booting are
    still followed; if it was the first, nothing runs, and the error is the command's.
    Given a URI list (`uri`, or $TBON_URI), the watch outlives the broker it went through: a
    root that died and was taken over (docs/protocol.md §13.4) is watched again through the
    list's first entry that answers, and the joiners, which boot through the same brokers,
    are followed to their end rather than killed with the connection."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    deadline = math.inf if limit is None else time.monotonic() + limit
    by_pid: dict[int, Joiner] = {}
    by_rank: dict[int | None, Joiner] = {}
    unstarted = iter(joiners)
    settled = 0
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("joining"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress if interactive() else nullcontext():
        task = progress.add_task("join", total=len(joiners))
        watch = _Watch(client, uri)
        while any(j.pending for j in joiners) and time.monotonic() < deadline:
            if due := pace.due():
                batch = [next(unstarted) for _ in range(due)]
                try:
                    _start(batch, forker)
                except TbonError as error:
                    if batch[0] is joiners[0]:
                        raise  # nothing started: the command's error, as before the window
                    pace.abandon()
                    pace.settled(due)
                    for failed in [*batch, *unstarted]:
                        failed.exit_code, failed.reason = -1, f"not started: {error}"
                for started in batch:
                    if started.host:
                        by_rank[started.wanted] = started
                    elif started.pid is not None:
                        by_pid[started.pid] = started
            online = watch.receive(0.1, deadline)
            if online is not None:
                for rank, pid, incarnation in online:
                    seen = by_pid.get(pid) if pid is not None else None
                    seen = seen or by_rank.get(rank)
                    if seen is None or not seen.pending:
                        continue
                    if not seen.host or incarnation > seen.after:
                        seen.rank = rank
            for joiner in joiners:
                process = joiner.process
                if joiner.pending and process is not None and process.poll() is not None:
                    joiner.exit_code = process.returncode
                    joiner.reason = _last_line(joiner.log)
            _reap_ended(joiners, forker)
            settled_now = sum(not j.pending for j in joiners if j.process is not None)
            pace.settled(settled_now - settled)
            settled = settled_now
            progress.update(task, completed=sum(not j.pending for j in joiners))
        watch.close()


VIEW_PAUSE = 0.1
"""Seconds between two updates read from the root's watch (`_Watch.receive`), at most: after
one of PAUSE_FULL_AT online ranks or more; after a smaller one, that share of it."""
PAUSE_FULL_AT = 1024
"""Online ranks in an update for which the whole VIEW_PAUSE is taken. Rank 0's cost of an
update goes with its ranks (about 1 ms at 1024 for the `online` view, 45 ms for an older
broker's `held` view), so a pause in proportion keeps its share of rank 0 bounded, and an
expand into an instance of a few brokers (or a chain of three joiners into a vacant subtree)
sees each join within milliseconds, not a tenth of a second later."""


def _reap_ended(joiners: list[Joiner], forker: Forker | None) -> None:
    """Reap every child of this process that has ended, as it ends: expand is its joiners'
    parent or their child subreaper (launch/forker.py), and so it also adopts what they leave
    behind when they die (a job, the guard that kills it: overlay/broker/guard.py). One not
    waited for stays a zombie until expand exits, and keeps this check true at every turn.
    A joiner that ended after it came online is reported as a failure, as one that ended before
    it came online is (the turn's poll of the pending ones); the forker is reaped by its own
    Popen, which keeps its exit code; any other child is an orphan nobody else waits for.
    Looked for only once some child has ended (a waitid that reaps nothing), not at every turn
    for every joiner online."""
    by_pid = {j.process.pid: j for j in joiners if j.process is not None}
    while (pid := _ended_child()) is not None:
        joiner = by_pid.get(pid)
        process: Any = None if joiner is None else joiner.process
        if process is None and forker is not None and pid == forker.process.pid:
            process = forker.process
        if process is None or process.returncode is not None:  # (reaped: its PID is reused)
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            continue
        process.poll()
        if joiner is not None and joiner.rank is not None and joiner.exit_code is None:
            joiner.exit_code = process.returncode
            said = _last_line(joiner.log)
            joiner.reason = f"ended after it came online as rank {joiner.rank}: {said}"


def _ended_child() -> int | None:
    """The PID of a child of this process that has ended and is not reaped yet (it stays
    unreaped), or None."""
    try:
        found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # no child at all
        return None
    return None if found is None else found.si_pid


RECONNECT_PAUSE = 0.2
"""Seconds between attempts to watch again through a URI list, while no root answers yet."""


class _Planned:
    """The client through which expand plans (the root's status, its broker.info, the boot
    servers), asked again through a URI list when the broker asked dies or no root can answer
    yet (a takeover under way, docs/protocol.md §13.4): nothing is started before the plan, so
    asking again is harmless. Without a list, or past the limit, the error is the command's."""

    def __init__(self, client: Any, uri: str | None, limit: float | None) -> None:
        from tbon.overlay.connectors.client import given_list

        self.client = client
        self.listed = given_list(uri)
        self.deadline = math.inf if limit is None else time.monotonic() + limit
        self.said = False  # the first error asked again is told, once

    def ask(self, plan: Any) -> Any:
        from tbon.overlay.connectors.client import RequestError, connect

        while True:
            try:
                if self.client is None:
                    self.client = connect(self.listed)
                return plan(self.client)
            except TbonError as error:
                if isinstance(error, UsageError | RankError):
                    raise  # the command's own word: asked again, it would say the same
                passing = not isinstance(error, RequestError) or ask_again(error.errnum)
                if self.listed is None or not passing or time.monotonic() >= self.deadline:
                    raise
                if not self.said:
                    self.said = True
                    print(
                        f"tbon expand: {error}: asking again through the URI list", file=sys.stderr
                    )
            self.close()
            time.sleep(RECONNECT_PAUSE)  # a paced retry while the takeover runs, not a wait

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client = None

    def __enter__(self) -> _Planned:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Watch:
    """The root's pushed `online` view (each online rank's pid and incarnation), as one stream
    of updates: across a lost connection or an ended stream, started again through a URI list
    (none: the error is the command's). A broker of an older tbon refuses that view (EINVAL);
    its `held` view, the entries of every rank held, is read for the same instead."""

    def __init__(self, client: Any, uri: str | None) -> None:
        from tbon.overlay.connectors.client import given_list

        self.client, self.owned = client, False  # the first client is the caller's to close
        self.listed = given_list(uri)
        self.view = "online"  # "held" from an older broker
        self.pages: Any = None
        self.tag = self._send()
        self.read = -math.inf  # when the last update was read
        self.pause = 0.0  # before the next is read: VIEW_PAUSE's share for the last one's size

    def _send(self) -> int:
        from tbon.overlay.state.heldtable import HeldPages
        from tbon.overlay.state.onlineview import OnlinePages

        self.pages = OnlinePages() if self.view == "online" else HeldPages()
        return int(self.client.send("status.watch", {"view": self.view}, nodeid=0))

    def receive(self, timeout: float, deadline: float) -> Online | None:
        """The online ranks of the next whole update pushed, or None. At most one a VIEW_PAUSE
        (less after a small one: PAUSE_FULL_AT): rank 0 makes each update anew once this one is
        read, so reading as fast as it comes would keep rank 0 and this command busy, the more
        the more joined."""
        from tbon.overlay.state.onlineview import from_status

        pause = self.read + self.pause - time.monotonic()
        if pause > 0:
            time.sleep(min(pause, timeout))  # the loop's beat meanwhile: processes are polled
            return None
        if self.client is None:  # no URI of the list answered at the last attempt
            self._again(deadline)
            return None
        try:
            reply = self.client.receive(timeout)
            if reply is None or reply.tag != self.tag:
                return None
            if reply.errnum == errno.EINVAL and self.view == "online":
                self.view = "held"  # a broker from before the online view
                self.tag = self._send()
                return None
            if reply.errnum:
                raise TbonError(f"status stream ended: {reply.errstr}")
            taken = self.pages.take(reply.payload)
            if taken is None:
                return None
            online: Online = taken if self.view == "online" else from_status(taken)
            self.read = time.monotonic()
            self.pause = VIEW_PAUSE * min(1.0, len(online) / PAUSE_FULL_AT)
            return online
        except TbonError:
            if self.listed is None:
                raise
            self._again(deadline)
            return None

    def _again(self, deadline: float) -> None:
        from tbon.overlay.connectors.client import connect

        assert self.listed is not None
        self.close()
        time.sleep(RECONNECT_PAUSE)  # a paced retry while the takeover runs, not a wait
        try:
            self.client, self.owned = connect(self.listed), True
            self.tag = self._send()
        except TbonError:
            self.close()
            self.client = None
            if time.monotonic() >= deadline:
                raise

    def close(self) -> None:
        if self.owned and self.client is not None:
            self.client.close()
        self.owned = False


def _log_level(extra: list[str]) -> list[str]:
    """The brokers' logs go to files, not to a terminal: they keep what went right too (info),
    unless -S says otherwise."""
    if any(a.startswith("log-stderr-level=") for a in extra):
        return []
    return ["log-stderr-level=info"]


_LOG_LINE = re.compile(r"(?:\S+ )?tbon-broker(?:\[\d+\])?: (\w+): (.*)")
"""A broker's log line: `[TIME] tbon-broker[RANK]: LEVEL: MESSAGE`."""


def _last_line(log: Path) -> str:
    """Why a joiner failed: the last line of its log that is not news of progress (info), without
    its time and the broker's name. A line that is not the broker's (ssh's) counts as trouble."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    if not lines:
        return "exited without a word"
    for line in reversed(lines):
        said = _LOG_LINE.fullmatch(line)
        if said is None:
            return line
        if said[1] not in ("debug", "info"):
            return said[2]
    said = _LOG_LINE.fullmatch(lines[-1])
    return said[2] if said else lines[-1]


def _report(joiners: list[Joiner], as_json: bool, note: str = "") -> int:
    joined = sorted((j for j in joiners if j.joined), key=lambda j: j.rank or 0)
    failed = [j for j in joiners if not j.joined]
    if as_json:
        print_json(
            {
                "joined": [{"rank": j.rank, "pid": j.pid} for j in joined],
                "failed": [
                    {
                        "pid": j.pid,
                        "rank": j.wanted if j.rank is None else j.rank,
                        "exit_code": j.exit_code,
                        "reason": j.reason,
                        "log": str(j.log),
                    }
                    for j in failed
                ],
            }
        )
    else:
        if joined:
            ranks = format_idset([j.rank for j in joined if j.rank is not None])
            typer.echo(
                f"joined: {len(joined)} broker{'s' * (len(joined) != 1)}, "
                f"rank{'s' * (len(joined) != 1)} {ranks}"
            )
        if note:
            typer.echo(note)
        for joiner in failed:
            rank = joiner.wanted if joiner.rank is None else joiner.rank
            who = "a broker not started" if joiner.pid is None else f"broker pid {joiner.pid}"
            print(
                f"tbon expand: {who}"
                f"{f' (rank {rank})' if rank is not None else ''}: "
                f"{joiner.reason} (exit {joiner.exit_code}; log {joiner.log})",
                file=sys.stderr,
            )
    if not failed:
        return 0
    if all(j.exit_code == exitcodes.NO_RANK for j in failed):
        return exitcodes.NO_RANK
    return 1
