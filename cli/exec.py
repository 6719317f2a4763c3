"""`tbon exec`: run a command on many ranks at once, fanned out through the tree.

One request goes to rank 0; each broker starts the command if it is a target and passes the
request to the children whose subtrees hold targets. Output comes back up the same way, in whole
lines, as it is produced. The cost grows with the tree's depth, not with the number of ranks.

As with `flux exec`, jobs run in the caller's directory and with the caller's environment, which
--env rules trim (job_environment); each broker then sets its own TBON_* variables over them.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import time
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from string import Template
from typing import TYPE_CHECKING, Any

from tbon.cli.common import StatesReader, end_by_signal, open_client, print_json, watch_states
from tbon.cli.execargs import ExecArgs
from tbon.cli.failures import failure, failure_lines, name_ranks
from tbon.cli.interrupts import Interrupts
from tbon.errors import RANK_TROUBLE, Signalled, TbonError, UsageError
from tbon.overlay.parse.idset import format_idset, parse_idset

if TYPE_CHECKING:  # imported when used: the CLI's start-up pays only for what a command runs
    import typer

    from tbon.overlay.state.exectargets import Picked
    from tbon.overlay.state.statesview import RankStates
    from tbon.overlay.wire.flow import Returns, StdinRoom
    from tbon.overlay.wire.resend import Inbox

SIGNAL_GRACE = 0.5
"""Seconds an exec signalled by SIGTERM or SIGHUP still reads its jobs' last output and exits
after passing the signal on, before it ends with 128+N. A job a stopped broker holds is killed
when that broker wakes: it gets the signal, and sees the client gone. (SIGINT, Ctrl-C, is a
ladder instead: cli/interrupts.py.)"""
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Outcome:
    """What became of the command on each target rank."""

    pending: set[int]
    status: dict[int, int] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)  # why a command that ended, failed
    signals: dict[int, int] = field(default_factory=dict)  # the signal that ended a command
    output: dict[int, dict[str, list[bytes]]] = field(default_factory=dict)
    passed: set[int] = field(default_factory=set)  # signals passed on to the commands

    def exit_status(self) -> int:
        worst = max(self.status.values(), default=0)
        return max(worst, RANK_TROUBLE) if self.errors else worst


def register(app: typer.Typer) -> None:
    """The command as Typer builds it: its options and help (a command line it would take the
    same way is run before Typer is imported: cli/execargs.py)."""
    import typer

    @app.command("exec", context_settings={"allow_interspersed_args": False})
    def exec_(
        words: list[str] = typer.Argument(
            ...,
            metavar="[URI] COMMAND [ARGS]...",
            help="The command to run (after an optional URI).",
        ),
        uri_option: str = typer.Option(None, "--uri", hidden=True),
        ranks: str = typer.Option(
            "all",
            "--rank",
            "-r",
            metavar="RANKS",
            help="Target ranks: an idset like 0,3-7 or [0,3-7], or all (online).",
        ),
        exclude: str = typer.Option(
            None, "--exclude", "-x", metavar="RANKS", help="Ranks to leave out."
        ),
        label: bool = typer.Option(
            False,
            "--label",
            "--label-io",
            "-l",
            help="Prefix each output line with 'RANK: ' (--label-io as in flux exec).",
        ),
        directory: str = typer.Option(
            None,
            "--dir",
            "-d",
            metavar="DIR",
            help="Run in DIR (default: the current directory; a relative DIR is from there).",
        ),
        env_rules: list[str] = typer.Option(
            [],
            "--env",
            metavar="RULE",
            help="Change the environment passed (repeatable, applied in order): -PATTERN removes "
            "the variables whose names match a glob (-* removes all), NAME=VALUE sets one, NAME "
            "(or a glob) passes the caller's.",
        ),
        noinput: bool = typer.Option(
            False, "--noinput", "-n", help="Do not read stdin: the commands' input ends at once."
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON object: each rank's status and output."
        ),
        quiet: bool = typer.Option(
            False, "--quiet", "-q", help="Do not name the ranks whose command failed."
        ),
    ) -> None:
        """Run COMMAND on a set of ranks, like pdsh or flux exec, through the tree.

        Each command runs in the current directory (or DIR) with this environment (as changed
        by --env), plus TBON_RANK, TBON_SIZE and TBON_URI, which name its own broker. stdout and
        stderr are streamed in whole lines; stdin is sent to every process (unless -n). At the
        end, each way the commands failed is said on stderr with its ranks (`ranks 1-3: exit
        1`), unless -q. SIGTERM and SIGHUP are passed on to every process, and tbon exec then
        ends within half a second with 128+N. Ctrl-C sends SIGINT; a second within a second
        SIGTERM; a third SIGKILL, naming the ranks still running, and tbon exec ends (130).

        -r all runs on every online rank, and says on stderr which ranks it skips (lost,
        offline, retiring). Exit status: the largest of the commands' (128+N for signal N; 127
        for a command not found, 126 for one that cannot run), or 68 if a rank named with -r
        does not exist or is not online, or a rank was lost while running.
        """
        asked = ExecArgs(
            words, uri_option, ranks, exclude, label, directory, env_rules, noinput, as_json, quiet
        )
        raise typer.Exit(run_exec(asked))


def run_exec(asked: ExecArgs) -> int:
    """`tbon exec` as asked; its exit status."""
    directory, as_json = asked.directory, asked.as_json
    uri, command = _split(asked.words)
    uri = uri or asked.uri
    cwd = _directory(directory)
    env = job_environment(os.environ, asked.env_rules)
    if directory is not None and "PWD" in env:
        env["PWD"] = cwd  # what a shell's cd would leave, not the caller's directory
    _check_size(env)
    job = Job(command, cwd, env, asked.noinput or _empty_stdin())
    with open_client(uri) as client:
        started = _start(client, job, asked.ranks, asked.exclude)
        targets, problems, skipped = started.picked
        for line in _skipped_lines(skipped):
            print(f"tbon exec: {line}", file=sys.stderr)
        outcome = Outcome(set(targets))
        for rank, why in problems.items():
            outcome.errors[rank] = why
            if not as_json:
                print(f"tbon exec: rank {rank}: {why}", file=sys.stderr)
        if targets and _run(client, started, job, asked.label, as_json, outcome):
            return 128 + signal.SIGPIPE  # as a shell's pipeline: the jobs die
    if not as_json and not asked.quiet:
        for line in failure_lines(outcome.status, outcome.signals, outcome.notes, outcome.passed):
            print(f"tbon exec: {line}", file=sys.stderr)
    if as_json:
        print_json(
            {
                "status": outcome.exit_status(),
                "ranks": [
                    {
                        "rank": rank,
                        "status": outcome.status.get(rank),
                        "signal": _signal_name(outcome.signals.get(rank)),
                        "failure": _failure(outcome, rank),
                        "error": outcome.errors.get(rank, outcome.notes.get(rank)),
                        "stdout": _text(outcome.output.get(rank, {}).get("stdout", [])),
                        "stderr": _text(outcome.output.get(rank, {}).get("stderr", [])),
                    }
                    for rank in sorted(set(outcome.status) | set(outcome.errors))
                ],
            }
        )
    return outcome.exit_status()


def _signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _failure(outcome: Outcome, rank: int) -> str | None:
    """--json's `failure`: the words stderr would have named the rank with (or why it did
    not run), null for a command that succeeded."""
    if rank in outcome.errors:
        return outcome.errors[rank]
    status = outcome.status.get(rank)
    if status is None:
        return None
    return failure(status, outcome.signals.get(rank), outcome.notes.get(rank))


@dataclass
class Started:
    """An exec.start sent (or none: no rank to run on) and what the client follows it by."""

    watch: int  # the tag of the status stream that tells of ranks lost while the jobs run
    read: StatesReader  # how to read its updates
    picked: Picked  # the ranks to run on, why others asked for cannot be, the ranks skipped
    tag: int | None = None  # the exec.start's, if one was sent
    job_id: str = ""
    window: int = 0  # each rank's output credit


def _start(client: Any, job: Job, ranks: str, exclude: str | None) -> Started:
    """Follow the ranks' states at rank 0 and start the job at once, its targets named as asked
    (`all` or an idset, but `exclude`): rank 0 chooses them from its table and answers first
    with the ranks chosen and the states it chose them by (docs/protocol.md §7), so no round
    trip comes before the start. A broker of an older tbon refuses named targets (EINVAL): the
    client then chooses them from the stream's first view and sends them listed."""
    from tbon.overlay.connectors.client import RequestError
    from tbon.overlay.state.exectargets import pick_targets
    from tbon.overlay.state.statesview import RankStates
    from tbon.overlay.wire.flow import output_window

    named = "all" if ranks == "all" else format_idset(parse_idset(ranks))  # a bad one: here
    left_out = format_idset(parse_idset(exclude)) if exclude else None
    watch = client.send("status.watch", {"view": "states"}, nodeid=0)
    job_id = os.urandom(16).hex()  # as uuid4().hex, without loading uuid (and platform)
    start = _start_payload(job_id, job, named)
    if left_out:
        start["exclude"] = left_out
    _start_message(start)
    tag = client.send("exec.start", start, nodeid=0)
    reply, early = _first_reply(client, tag, watch)
    if reply.errnum == errno.EINVAL:  # an older broker: it takes listed targets only
        watch, read, states = watch_states(client, watch, early)
        picked = pick_targets(states, ranks, exclude)
        targets = sorted(picked[0])
        window = output_window(len(targets))
        if not targets:
            return Started(watch, read, picked)
        start = _start_payload(job_id, job, targets, window)
        _start_message(start)
        tag = client.send("exec.start", start, nodeid=0)
        return Started(watch, read, picked, tag, job_id, window)
    if reply.errnum:
        raise RequestError(reply.errnum, reply.errstr or os.strerror(reply.errnum))
    said = reply.payload
    states = RankStates({"size": said["size"], "states": said["states"]})
    _, problems, skipped = pick_targets(states, ranks, exclude)  # said as the client says them
    chosen = parse_idset(said["targets"]) if said["targets"] else []
    picked = (chosen, problems, skipped)
    return Started(watch, RankStates, picked, tag if chosen else None, job_id, said["window"])


def _first_reply(client: Any, tag: int, watch: int) -> tuple[Any, list[Any]]:
    """The first answer to request `tag`, and the status stream's updates that came before it
    (kept for the way of an older broker: watch_states reads them first)."""
    from tbon.overlay.connectors.client import DEFAULT_TIMEOUT, NoAnswer

    early: list[Any] = []
    deadline = time.monotonic() + DEFAULT_TIMEOUT
    while (reply := client.receive(max(0.0, deadline - time.monotonic()))) is not None:
        if reply.tag == tag:
            return reply, early
        if reply.tag == watch:
            early.append(reply)
    raise NoAnswer(
        f"no answer from rank 0 within {DEFAULT_TIMEOUT:g}s (is it stopped or overloaded?)"
    )


def _empty_stdin() -> bool:
    """Whether stdin is /dev/null (or closed): input that is over before it starts, which the
    jobs can be told with the command (exec.start's `eof`), sparing a message to every rank."""
    fd = _stdin_fd()
    if fd is None:
        return True
    try:
        given, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(given.st_mode) and given.st_rdev == null.st_rdev


def _text(chunks: list[bytes]) -> str:
    """Output as JSON text: bytes that are not UTF-8 as U+DC80-U+DCFF (surrogateescape)."""
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _split(words: list[str]) -> tuple[str | None, list[str]]:
    from tbon.overlay.connectors.uri import looks_like_uri

    if words and looks_like_uri(words[0]):
        uri, command = words[0], words[1:]
    else:
        uri, command = None, words
    if not command:
        raise UsageError("no COMMAND given")
    return uri, command


def job_environment(caller: Mapping[str, str], rules: Sequence[str]) -> dict[str, str]:
    """The environment to pass: the caller's, changed by --env rules in order, as by flux run's
    --env. `-PATTERN` removes the variables whose names match the glob (`-*`: all of them);
    `NAME=VALUE` sets one, `$NAME` or `${NAME}` in VALUE being taken from what is built so far,
    else from the caller (`$$` is a dollar sign); `NAME` alone, or a glob, brings back the
    caller's variables of that name that are not set already."""
    env = dict(caller)
    for rule in rules:
        if rule.startswith("-"):
            env = {name: value for name, value in env.items() if not fnmatchcase(name, rule[1:])}
        elif "=" in rule:
            name, value = rule.split("=", 1)
            if not name:
                raise UsageError(f"--env={rule}: no variable name before '='")
            lookup: ChainMap[str, str] = ChainMap(env, dict(caller))
            try:
                env[name] = Template(value).substitute(lookup)
            except KeyError as missing:
                raise UsageError(f"--env={rule}: ${missing.args[0]} is not set") from None
            except ValueError:
                raise UsageError(f"--env={rule}: write $$ for a '$' of its own") from None
        elif rule:
            env |= {n: v for n, v in caller.items() if fnmatchcase(n, rule) and n not in env}
        else:
            raise UsageError("--env needs a RULE: -PATTERN, NAME=VALUE or NAME")
    return env


def _directory(option: str | None) -> str:
    """Where the jobs run: DIR, from the current directory if relative, or that directory."""
    if option is not None and os.path.isabs(option):
        return option
    try:
        here = os.getcwd()
    except OSError as error:
        raise TbonError(
            f"cannot tell the current directory ({error.strerror}): use -d DIR"
        ) from None
    return os.path.join(here, option) if option is not None else here


def _check_size(env: dict[str, str]) -> None:
    """Refuse, before anything starts, an environment that no broker would take."""
    from tbon.limits import ENV_LIMIT, environment_size

    if (size := environment_size(env)) > ENV_LIMIT:
        raise UsageError(
            f"the environment takes {size} bytes, over the limit of {ENV_LIMIT} (1 MiB): leave "
            "variables out with --env=-PATTERN"
        )


def _skipped_lines(skipped: dict[str, list[int]]) -> list[str]:
    """What `-r all` says about the ranks it leaves out: one line for those whose broker is
    down, one for those retiring."""
    from tbon.overlay.state.exectargets import SKIPPED_STATES

    lines = []
    down = [
        f"{state} ranks {format_idset(skipped[state])}"
        for state in SKIPPED_STATES
        if state in skipped
    ]
    if down:
        lines.append(f"skipping {' and '.join(down)}")
    if "retiring" in skipped:
        lines.append(f"skipping retiring ranks {format_idset(skipped['retiring'])}")
    return lines


@dataclass
class Job:
    """What to run, where and how: the same on every rank."""

    command: list[str]
    cwd: str
    env: dict[str, str]
    noinput: bool


def _start_message(start: dict[str, Any]) -> None:
    """Refuse an exec.start too large to be a message (a long argv, an environment of many
    non-ASCII characters, which JSON escapes): the first broker would drop it unanswered."""
    from tbon.overlay.wire.message import MAX_MESSAGE_BYTES, Kind, Message, encode

    size = sum(len(frame) for frame in encode(Message(Kind.REQUEST, "exec.start", start)))
    if size > MAX_MESSAGE_BYTES - ROUTE_ROOM:
        raise UsageError(
            f"the command and its environment take {size} bytes as a message, over the limit "
            f"of {MAX_MESSAGE_BYTES - ROUTE_ROOM}: pass fewer arguments or variables"
        )


ROUTE_ROOM = 64 * 1024
"""Room left in a message for what the tree adds to an exec.start on its way down (its route)."""


def _start_payload(
    job_id: str, job: Job, targets: list[int] | str, window: int | None = None
) -> dict[str, Any]:
    """The exec.start of `job` on `targets` (listed, or named for rank 0 to choose: `all`, an
    idset); without `window`, rank 0 gives each rank its share for the ranks it chooses."""
    start: dict[str, Any] = {
        "id": job_id,
        "argv": job.command,
        "cwd": job.cwd,
        "env": job.env,
        "targets": targets,
        "acks": True,  # each rank keeps what this client has not acknowledged (resend.py)
        "merge": True,  # exits may come many ranks to a message (wire/exits.py)
    }
    if window is not None:
        start["window"] = window
    if job.noinput:
        start["eof"] = True
    return start


def _run(
    client: Any, started: Started, job: Job, label: bool, as_json: bool, outcome: Outcome
) -> bool:
    """Pass output, input, signals and credit of the job `started` until every rank is done;
    its status stream tells of ranks lost meanwhile. True if the output's reader went away (a
    broken pipe).

    Output is written as it comes and credited back once written (flow.py), so a reader that
    stops stops the jobs, as with ssh. Input is read only while every rank taking it has room.
    Input that is over before it starts (-n, /dev/null) goes with the command: `eof`."""
    from tbon.overlay.wire.exits import answers_of
    from tbon.overlay.wire.flow import StdinRoom

    targets, job_id, window, tag = started.picked[0], started.job_id, started.window, started.tag
    room = StdinRoom.for_ranks(targets)
    streams = Streams(client, job_id, window, label, as_json, outcome, room, eof_sent=job.noinput)

    from tbon.overlay.wire.resend import Prompts

    signals = Signals()
    prompts = Prompts(time.monotonic())  # ranks silent too long are asked to send again
    watcher = Watcher(client, targets) if client.progress is not None else None
    stdin = None if job.noinput else _stdin_fd()
    if stdin is None and not streams.eof_sent:
        streams.send_eof()  # at once: no job waits on input that will never come
    shutdown_said = False
    adrift = False  # some rank was reattaching, in rank 0's last table
    watch, read = started.watch, started.read
    try:
        while outcome.pending:
            now = time.monotonic()
            for signum in signals.taken():  # passed on at once
                outcome.passed.add(signum)
                client.send("exec.signal", {"id": job_id, "signal": signum, "targets": targets}, 0)
                if signum == signal.SIGKILL:  # the third Ctrl-C
                    signals.last_press()
                    still = name_ranks(sorted(outcome.pending))
                    print(f"tbon exec: {still}: still running, killed", file=sys.stderr)
                    raise Signalled(signal.SIGINT)
            if (ending := signals.ending(now)) is not None:
                raise Signalled(ending)
            wanted = [stdin] if stdin is not None and streams.stdin.available() > 0 else []
            watched = watcher.wait(now) if watcher is not None else None
            wakes = [w for w in (signals.wait(now), watched, prompts.wait(now)) if w is not None]
            _, readable = client.wait([*wanted, signals.fd], min(wakes, default=None))
            if stdin is not None and stdin in readable:
                stdin = streams.pass_stdin(stdin)
            while outcome.pending and (reply := client.receive(0)) is not None:
                if reply.tag == tag:
                    heard = time.monotonic()
                    for one in answers_of(reply.payload):  # a merged answer: each rank's
                        if watcher is not None:
                            watcher.heard(one.get("rank"))
                        if isinstance(rank := one.get("rank"), int):
                            prompts.heard(rank, heard)
                        streams.answer(one, reply.data)
                elif reply.tag == watch and not reply.errnum:
                    if (states := read(reply.payload)) is None:
                        continue
                    _note_lost(states, outcome, as_json)
                    prompts.soon(time.monotonic())
                    adrift, healed = heal_over(adrift, states)
                    if healed and outcome.pending:
                        resend = {"id": job_id, "targets": sorted(outcome.pending)}
                        client.send("exec.resend", resend, nodeid=0)
                elif reply.tag == watch and not shutdown_said:
                    shutdown_said = True  # the jobs are being stopped; their exits still come
                    print(f"tbon exec: {reply.errstr}", file=sys.stderr)
                elif watcher is not None:
                    watcher.answered(reply.tag)
            if watcher is not None:
                watcher.tick(outcome.pending)
            if quiet := prompts.ask(outcome.pending, time.monotonic()):
                client.send("exec.resend", {"id": job_id, "targets": quiet}, nodeid=0)
            if stdin is None and streams.stdin.ranks and not streams.eof_sent:
                streams.send_eof()
    except BrokenPipeError:
        return True
    finally:
        signals.close()
        if watcher is not None:
            watcher.close()
    return False


STUCK = 4
"""Ctrl-C presses that pile up unread (the loop stuck) before tbon exec ends at once; its
brokers then kill its jobs, as for any client that goes away."""


class Signals:
    """SIGINT, SIGTERM and SIGHUP while the jobs run: each is taken to be passed on to them.
    SIGTERM and SIGHUP end this exec SIGNAL_GRACE seconds after the first of them (a second
    one at once); each Ctrl-C sends a harder signal (Interrupts), the third SIGKILL.

    Signals are counted from the wake-up pipe, where Python's C-level handler writes one byte
    per delivery: the Python-level handler runs once for deliveries that come close together,
    and a quick second Ctrl-C must not be lost. The handler only ends this exec at once when
    the loop has not come to take the signals (a second SIGTERM or SIGHUP, or STUCK presses)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.fd = self._read
        self._untaken = 0
        self._first: tuple[int, float] | None = None
        self._interrupts = Interrupts()
        self._previous = {s: signal.signal(s, self._note) for s in PASSED_ON}
        self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def _note(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGINT and self._first is not None and self._untaken == 0:
            end_by_signal(self._first[0])  # a second SIGTERM or SIGHUP: no more grace
        self._untaken += 1
        if self._untaken >= STUCK:
            end_by_signal(signum)

    def taken(self) -> list[int]:
        """The signals to pass on for those that came since last asked: SIGTERM and SIGHUP as
        they are, each Ctrl-C as its rung of the ladder."""
        came = b""
        try:
            while chunk := os.read(self._read, 512):
                came += chunk
        except BlockingIOError:
            pass
        self._untaken = 0
        now = time.monotonic()
        passed = []
        for signum in came:
            if signum == signal.SIGINT:
                passed.append(int(self._interrupts.press(now)))
            elif signum in PASSED_ON:
                if self._first is None:
                    self._first = (signum, now)
                passed.append(signum)
        return passed

    def last_press(self) -> None:
        """The third Ctrl-C ends this exec: one more, while it closes, is nothing to it."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._previous[signal.SIGINT] = signal.SIG_IGN

    def ending(self, now: float) -> int | None:
        """The signal that ends this exec now that its grace is over, if one does."""
        if self._first is not None and now >= self._first[1] + SIGNAL_GRACE:
            return self._first[0]
        return None

    def wait(self, now: float) -> float | None:
        return None if self._first is None else max(0.0, self._first[1] + SIGNAL_GRACE - now)

    def close(self) -> None:
        signal.set_wakeup_fd(self._wakeup)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._read)
        os.close(self._write)


class Watcher:
    """At a terminal: pings the targets that have said nothing for a while, and shows on one
    line those whose broker does not answer either (patience.Silence decides)."""

    def __init__(self, client: Any, targets: list[int]) -> None:
        from tbon.overlay.connectors.patience import Silence

        self.client = client
        self.silence = Silence.of(targets, time.monotonic())
        self.pings: dict[int, int] = {}  # tag -> rank

    def heard(self, rank: object) -> None:
        if isinstance(rank, int):
            self.client.progress("")  # the line goes before any output
            self.silence.hear(rank, time.monotonic())

    def answered(self, tag: int) -> None:
        if (rank := self.pings.pop(tag, None)) is not None:
            self.silence.hear(rank, time.monotonic())

    def wait(self, now: float) -> float | None:
        return self.silence.wait(now)

    def tick(self, pending: set[int]) -> None:
        now = time.monotonic()
        for rank in [r for r in self.silence.heard if r not in pending]:
            self.silence.done(rank)
        for rank in self.silence.probes(now):
            self.pings[self.client.send("broker.ping", {}, nodeid=rank)] = rank
        if (line := self.silence.line(now)) is not None:
            self.client.progress(line)

    def close(self) -> None:
        self.client.progress("")


@dataclass
class Streams:
    """One exec's streams on the client's side: output written and credited back, input sent
    within the room the ranks have."""

    client: Any
    job: str
    window: int
    label: bool
    as_json: bool
    outcome: Outcome
    stdin: StdinRoom
    returns: dict[int, Returns] = field(default_factory=dict)  # each rank's credit owed back
    inboxes: dict[int, Inbox] = field(default_factory=dict)  # each rank's numbered answers
    eof_sent: bool = False

    def answer(self, payload: dict[str, Any], data: bytes | memoryview) -> None:
        """One rank's answer (a merged answer is split before: wire/exits.py)."""
        rank = payload.get("rank")
        if not isinstance(rank, int) or rank not in self.outcome.pending:
            return
        seq = payload.get("seq")
        inbox = None
        last = not ("stream" in payload or "stdin" in payload or "stdin_closed" in payload)
        if seq == 0 and last and rank not in self.inboxes:
            pass  # its first answer and its last (`tbon exec -r all true`): in order, and alone
        elif isinstance(seq, int) and not isinstance(seq, bool):
            inbox = self._inbox(rank)
            if not self._in_order(rank, inbox, seq):
                return
        if "stream" in payload:
            self._write(rank, str(payload["stream"]), data)
        elif "stdin" in payload:
            amount = payload["stdin"]
            if isinstance(amount, int):
                self.stdin.read(rank, amount)
        elif "stdin_closed" in payload:
            self.stdin.done(rank)
        else:
            self.stdin.done(rank)
            _answer(payload, self.outcome, self.as_json)
            if inbox is not None:
                # Its last word, which this client's broker acknowledged for it as it handed it
                # over ("acks": resend.Handoff): a second acknowledgement would only cross the
                # tree again, one message per rank (issue 26: exec -r all at 1024 ranks).
                return
        if inbox is not None and "stream" not in payload and inbox.took_free():
            self._credit(rank, 0, inbox)

    def _inbox(self, rank: int) -> Inbox:
        from tbon.overlay.wire.resend import Inbox

        inbox = self.inboxes.get(rank)
        if inbox is None:
            inbox = self.inboxes[rank] = Inbox()
        return inbox

    def _in_order(self, rank: int, inbox: Inbox, seq: int) -> bool:
        """Whether `seq` is the rank's next answer: one taken before is dropped (a resend after
        a heal), and so is one after a hole, which its rank is asked to fill (resend.py)."""
        from tbon.overlay.wire.resend import Verdict

        verdict = inbox.take(seq)
        if verdict is Verdict.AHEAD and inbox.ask_resend(time.monotonic()):
            ask = {"id": self.job, "bytes": 0, "seq": inbox.expected, "resend": True}
            self.client.send("exec.credit", ask, nodeid=rank)
        return verdict is Verdict.TAKE

    def _credit(self, rank: int, amount: int, inbox: Inbox | None) -> None:
        """Credit back to `rank`, with the acknowledgement of what it sent, if it numbers it."""
        credit: dict[str, Any] = {"id": self.job, "bytes": amount}
        if inbox is not None:
            credit["seq"] = inbox.acked()
        self.client.send("exec.credit", credit, nodeid=rank)

    def _write(self, rank: int, stream: str, data: bytes | memoryview) -> None:
        from tbon.overlay.wire.flow import MESSAGE_COST, Returns

        size = len(data)
        if self.as_json:
            self.outcome.output.setdefault(rank, {}).setdefault(stream, []).append(bytes(data))
        else:
            if self.label:
                lines = bytes(data).split(b"\n")  # newlines only: \r and friends stay inside a line
                ends = [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
                prefix = f"{rank}: ".encode()
                data = b"".join(prefix + line for line in ends)
            out = sys.stderr if stream == "stderr" else sys.stdout
            out.buffer.write(data)
            out.flush()
        returns = self.returns.get(rank)
        if returns is None:
            returns = self.returns[rank] = Returns(self.window)
        if owed := returns.consumed(size + MESSAGE_COST):
            self._credit(rank, owed, self.inboxes.get(rank))

    def pass_stdin(self, fd: int) -> int | None:
        """Send what stdin has, as much as every rank has room for; at EOF, None."""
        from tbon.overlay.wire.flow import CHUNK

        data = os.read(fd, min(CHUNK, self.stdin.available()))
        if not data:
            return None
        self.stdin.sent(len(data))
        payload = {"id": self.job, "targets": self.stdin.ranks}
        self.client.send("exec.stdin", payload, nodeid=0, data=data)
        return fd

    def send_eof(self) -> None:
        self.eof_sent = True
        payload = {"id": self.job, "targets": self.stdin.ranks, "eof": True}
        self.client.send("exec.stdin", payload, nodeid=0)


def heal_over(adrift: bool, states: RankStates) -> tuple[bool, bool]:
    """Whether some rank is reattaching in this view, and whether a heal has just ended (none
    is, and one was). Then what crossed a link that died may be lost, whichever way it went: the
    way back down to this client too, which no target can see. So every rank still running is
    asked to send again what this client has not acknowledged (exec.resend)."""
    now = states.reattaching
    return now, adrift and not now


def _note_lost(states: RankStates, outcome: Outcome, as_json: bool) -> None:
    for rank in sorted(outcome.pending):
        # A retiring broker still runs what it started: its jobs finish first.
        if (state := states.state(rank)) not in ("online", "retiring"):
            outcome.pending.discard(rank)
            outcome.errors[rank] = f"output may be incomplete: its broker was {state}"
            if not as_json:
                print(f"tbon exec: rank {rank}: {outcome.errors[rank]}", file=sys.stderr)


def _stdin_fd() -> int | None:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd


def _answer(payload: dict[str, Any], outcome: Outcome, as_json: bool) -> None:
    """A rank's last word: its exit status, or why it could not run."""
    rank = payload.get("rank")
    if not isinstance(rank, int) or rank not in outcome.pending:
        return
    if "exit" in payload:
        outcome.status[rank] = int(payload["exit"])
        outcome.pending.discard(rank)
        if "note" in payload:  # said, with its ranks, at the end (failure_lines)
            outcome.notes[rank] = str(payload["note"])
        if isinstance(signum := payload.get("signal"), int):
            outcome.signals[rank] = signum
    elif "error" in payload:
        outcome.errors[rank] = str(payload["error"])
        outcome.pending.discard(rank)
        if not as_json:
            print(f"tbon exec: rank {rank}: {payload['error']}", file=sys.stderr)
