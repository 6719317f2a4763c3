"""`tbon exec`, the brokers' side: fan a request out to the targets below, act on it here, and
kill what a vanished client started.

One `exec.start` reaches every target: each broker acts on it if it is a target itself and
sends one copy to each child whose subtree holds targets. Answers travel back along the
request's route, so rank 0 never talks to more than its own children; the ranks' exits go up
merged, a subtree's in one answer (`gather`, state/exitmerge.py), so neither rank 0 nor the
client reads one message per rank at the end. The processes themselves
are started and watched by the broker's job runner (overlay/broker/jobs.py), once this service
has checked the request: a bad one is refused here, before anything is started.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable
from typing import Any

from tbon.errors import UsageError
from tbon.limits import ENV_LIMIT, environment_size
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.actions import (
    AbandonJob,
    Action,
    Forward,
    GrantCredit,
    KillJobsFrom,
    PassOn,
    Respond,
    Send,
    SignalJob,
    StartJob,
    Wake,
    WriteStdin,
)
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.trust import not_its_client, unless_broker_own, unless_job_client
from tbon.overlay.state.exitmerge import ExitMerge, Flush
from tbon.overlay.state.healing import is_below
from tbon.overlay.state.takenhold import TakenHold
from tbon.overlay.state.topology import Topology, grouped
from tbon.overlay.wire.exits import BadExits, decode, encode, exit_of
from tbon.overlay.wire.flow import (
    DEFAULT_WINDOW,
    MAX_WINDOW,
    MESSAGE_COST,
    MIN_WINDOW,
    output_window,
)
from tbon.overlay.wire.message import SEPARATORS, Kind, Message
from tbon.overlay.wire.resend import Handoff
from tbon.record import Record

EXEC_TOPICS = ("exec.start", "exec.stdin", "exec.signal", "exec.resend", "exec.taken")
"""Fanned out to a list of target ranks. exec.credit goes to one rank: its `nodeid`."""

ENDED_KEPT = 8
"""The ids of a local client's last jobs that its broker remembers once they are over
everywhere: a late exec.signal for one is no stranger's (ExecService.unless_own_job)."""

DUPLICATE = "exec.start: bad argv or a duplicate id"

ALL = 2**62
"""An acknowledgement of every answer a job sent (exec.taken: its last one was taken)."""


def os_text(value: object) -> bool:
    """A string the system takes as an argument, a path or a variable: no NUL byte, and nothing
    that has no bytes (surrogateescape's U+DC80-U+DCFF, standing for bytes that are not UTF-8,
    do)."""
    if not isinstance(value, str) or "\0" in value:
        return False
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def environment_problem(env: object) -> str | None:
    """Why an exec.start's `env` cannot be a job's environment, or None: null (the broker's own
    environment), or an object of names to values that execve(2) can take, within ENV_LIMIT."""
    if env is None:
        return None
    if not isinstance(env, dict):
        return "exec.start: env must be an object of names to values, or null"
    size = _fitting_size(env)
    if size is None:  # something is wrong: which variable, one by one
        for name, value in env.items():
            if not name or "=" in name or not os_text(name):
                return f"exec.start: env: {name[:64]!r} is not a variable name"
            if not os_text(value):
                return f"exec.start: env: the value of {name[:64]} must be a string without NUL"
        size = environment_size(env)
    if size > ENV_LIMIT:
        return f"exec.start: env takes {size} bytes, over the limit of {ENV_LIMIT} (1 MiB)"
    return None


def _fitting_size(env: dict[Any, Any]) -> int | None:
    """environment_size of an env whose names and values are all good, in one pass over all of
    them at once (every rank checks the client's whole environment: one encoding rather than
    one per name and value); None if any is not. Encoding with surrogateescape is done
    character by character, so the whole encodes, and to as many bytes, iff every part does.
    Every test is one call in C (a join refuses anything but strings), none a Python step per
    variable: each rank of `tbon exec -r all` checks dozens of them."""
    names = list(env)
    try:
        joined = "".join(names)
        text = joined + "".join(env.values())
    except TypeError:  # a name or a value that is not a string
        return None
    if not all(names) or "=" in joined or "\0" in text:
        return None
    try:
        return len(os.fsencode(text)) + 2 * len(names)
    except UnicodeEncodeError:
        return None


def target_ranks(payload: dict[str, Any]) -> list[int] | None:
    """The ranks an exec request names, or None if `targets` is not a list of integers."""
    targets = payload.get("targets")
    # one pass in C, not a call of is_int per rank (thousands a job at rank 0): `type(t) is
    # int` is is_int's test, since a bool's type is bool, not int
    if not isinstance(targets, list) or not set(map(type, targets)) <= _INT_ONLY:
        return None
    return targets


_INT_ONLY = {int}


def targets_problem(topic: str, targets: list[int] | None, size: int) -> str | None:
    """Why an exec request's `targets` name no ranks to act on, or None: each must be a rank of
    the instance, and an exec.start needs one at least (it is answered per target, so with none
    nothing would ever answer it)."""
    if targets is None:
        return f"{topic} needs a list of target ranks"
    outside = next((t for t in targets if not 0 <= t < size), None)
    if outside is not None:
        shown = str(outside) if abs(outside) < 10**12 else "out of range"
        return f"{topic}: no rank {shown} in this instance of size {size}"
    if not targets and topic == "exec.start":
        return "exec.start needs at least one target rank"
    return None


def start_problem(payload: dict[str, Any]) -> str | None:
    """Why an exec.start cannot start anything, whatever the rank, or None. (A duplicate id is
    the job runner's to see: only it knows what runs.)"""
    job_id, argv, cwd = payload.get("id"), payload.get("argv"), payload.get("cwd")
    if not isinstance(job_id, str) or not isinstance(argv, list) or not argv:
        return "exec.start needs id and argv"
    if not all(os_text(word) for word in argv):
        return DUPLICATE
    if cwd is not None and not os_text(cwd):
        return "exec.start: cwd must be a directory's path or null"
    if why := environment_problem(payload.get("env")):
        return why
    window = payload.get("window", DEFAULT_WINDOW)
    if not is_int(window) or not MIN_WINDOW <= window <= MAX_WINDOW:
        return f"exec.start: window must be a number of bytes from {MIN_WINDOW} to {MAX_WINDOW}"
    if not isinstance(payload.get("eof", False), bool):
        return "exec.start: eof must be true or false"
    if not isinstance(payload.get("acks", False), bool):
        return "exec.start: acks must be true or false"
    if not isinstance(payload.get("merge", False), bool):
        return "exec.start: merge must be true or false"
    return None


class ClientJob(Record):
    """A job a local client of this broker started: the ranks yet to end it (to kill, should
    the client vanish) and, for a client that acknowledges, what was handed to it from each.
    Not a dataclass, for start-up time (tbon/record.py); mutable, so not hashable."""

    __slots__ = __match_args__ = ("id", "running", "window", "acks", "handoffs", "named")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        id: Any,
        running: set[int],
        window: int,
        acks: bool,
        handoffs: dict[int, Handoff] | None = None,
        named: bool = False,
    ) -> None:
        self.id, self.running, self.window, self.acks = id, running, window, acks
        self.handoffs: dict[int, Handoff] = {} if handoffs is None else handoffs
        # its targets were named (`all`, an idset) and the root has not yet said which ranks
        # they are: until then, `running` is empty but the job is not over
        self.named = named


class ExecService:
    def __init__(self, rank: int, topology: Topology, lifecycle: Lifecycle) -> None:
        self.rank = rank
        self.topology = topology
        self.lifecycle = lifecycle
        # a local client's hop -> the tag of each exec.start it sent -> that job
        self._client_jobs: dict[str, dict[int, ClientJob]] = {}
        # a local client's hop -> the ids of its last jobs over everywhere (unless_own_job)
        self._ended: dict[str, list[Any]] = {}
        # the ranks whose last answer was handed to its client, until told (takenhold.py)
        self._taken = TakenHold()
        # the broker attached here that a target is reached through (the router's, once built)
        self.toward: Callable[[int], int] = lambda target: topology.next_hop(rank, target)
        # the same for many targets at once, grouped by that broker (the router's, once built)
        self.towards: Callable[[list[int]], dict[int, list[int]]] = lambda targets: grouped(
            targets, self.toward
        )
        # whether this broker is the root (the broker's term fence says; set by broker.py): a
        # root that took over (docs/protocol.md §13.4) serves ranks the topology puts in the
        # dead root's other subtrees, fostered here, or answers for them
        self.leads: Callable[[], bool] = lambda: rank == 0
        # the exits of the jobs fanned out from here, held to go up together (exitmerge.py)
        self.merge = ExitMerge()
        # the root's `states` view of its rank table (statusviews.states), by which it chooses
        # the targets an exec.start names (`all`, an idset); None where there is no table
        self.rank_states: Callable[[], dict[str, Any] | None] = lambda: None
        # the exec.start of a job here (running, or finished with answers kept), as it reached
        # this broker, by the job's id: whose job it is (the job runner's, once built)
        self.started: Callable[[str], Message | None] = lambda job_id: None

    def handle(self, request: Message, now: float) -> list[Action]:
        """exec.start, exec.stdin or exec.signal: one copy down each branch with targets, and
        the work itself here if this rank is one of them."""
        if request.topic == "exec.taken" and (ignored := unless_broker_own(request)) is not None:
            return ignored  # only the client's broker says what its client has taken
        if request.topic == "exec.start" and isinstance(request.payload.get("targets"), str):
            return self._choose(request, now)
        targets = target_ranks(request.payload)
        if why := targets_problem(request.topic, targets, self.topology.size):
            return [Respond(request.fail(errno.EINVAL, why))]
        assert targets is not None
        below: dict[int, list[int]] = {}
        astray: set[int] = set()  # ranks of the instance, but neither this one nor below it
        if self.leads():  # every target is its to reach: split in one pass (towards)
            below = self.towards([t for t in targets if t != self.rank])
        else:
            for target in targets:
                if target == self.rank:
                    continue
                if is_below(self.topology, target, self.rank):
                    below.setdefault(self.toward(target), []).append(target)
                else:
                    astray.add(target)
        # one encoding of what every copy shares (exec.start's: the client's environment)
        rest = _all_but_targets(request.payload) if len(below) > 1 else None
        actions: list[Action] = [
            self._copy_down(request, child, ranks, rest) for child, ranks in below.items()
        ]
        if self.rank in targets:
            actions += self._here(request)
        if request.topic == "exec.start":  # every target answers, if only to say it is missing
            # merged where it fans out: a broker with no branch to wait for (a leaf) sends its
            # own exit as it is, which the broker above merges as it would the merged one
            if below and request.payload.get("merge") is True:
                key = (request.tag, tuple(request.route))
                mine = [t for t in targets if t not in astray]
                job = str(request.payload.get("id"))
                self.merge.open(key, job, mine, request.nodeid, now)
            why = f"not below rank {self.rank}, which this request was sent to"
            actions += [
                _answer(request, {"rank": r, "error": f"rank {r} is {why}"}) for r in sorted(astray)
            ]
        elif request.topic == "exec.signal" and request.payload.get("gone") is True:
            self.merge.gone(str(request.payload.get("id")))
        return actions

    def _choose(self, request: Message, now: float) -> list[Action]:
        """An exec.start that names its targets (`all`, or an idset, but `exclude`): the root
        chooses them from its table (exectargets.py), answers first with the ranks chosen and
        the view it chose them by, then carries the request out as one that lists them. So the
        client need not wait for a view of its own before it starts (docs/protocol.md §7)."""
        # imported here: only a root chooses (a leaf's import is part of every start-up)
        from tbon.overlay.parse.idset import format_idset
        from tbon.overlay.state.exectargets import chosen_targets
        from tbon.overlay.state.statesview import RankStates

        payload = request.payload
        view = self.rank_states() if self.leads() else None
        if view is None:
            why = "exec.start: only the root chooses targets by name ('all', an idset)"
            return [Respond(request.fail(errno.EINVAL, why))]
        exclude = payload.get("exclude")
        if exclude is not None and not isinstance(exclude, str):
            return [Respond(request.fail(errno.EINVAL, "exec.start: exclude must be an idset"))]
        try:
            chosen = chosen_targets(RankStates(view), payload["targets"], exclude)
        except UsageError as error:
            return [Respond(request.fail(errno.EINVAL, f"exec.start: {error}"))]
        window = payload.get("window", output_window(len(chosen)))
        said = {
            "targets": format_idset(chosen),
            "window": window,
            "size": view["size"],
            "states": view["states"],
        }
        if not chosen:  # nothing to run: the answer is the last
            return [Respond(request.respond(said))]
        listed = {k: v for k, v in payload.items() if k != "exclude"}
        listed["targets"], listed["window"] = chosen, window
        resolved = Message(
            Kind.REQUEST,
            request.topic,
            listed,
            nodeid=request.nodeid,
            tag=request.tag,
            route=list(request.route),
            data=request.data,
        )
        return [_answer(request, said), *self.handle(resolved, now)]

    def _copy_down(
        self, request: Message, child: int, ranks: list[int], rest: bytes | None = None
    ) -> Forward:
        """The request for the branch of `child`, naming its `ranks`; `rest`: the payload but
        its targets, encoded once for every branch (_all_but_targets)."""
        copy = Message(
            Kind.REQUEST,
            request.topic,
            {**request.payload, "targets": ranks},
            nodeid=child,
            tag=request.tag,
            route=list(request.route),
            data=request.data,
            body=None if rest is None else _with_targets(rest, ranks),
        )
        if request.topic != "exec.start":
            return Forward(child, copy)

        def missing() -> list[Action]:  # every target answers, if only to say it is missing
            return [
                _answer(request, {"rank": rank, "error": unreachable(rank, child)})
                for rank in ranks
            ]

        return Forward(child, copy, missing)

    def _here(self, request: Message) -> list[Action]:
        payload = request.payload
        job_id = str(payload.get("id", ""))
        if (refused := unless_job_client(request, self.rank, self.started(job_id))) is not None:
            if request.topic == "exec.start":  # another client's job: it keeps its id and answers
                return [_answer(request, {"rank": self.rank, "error": DUPLICATE})]
            return refused  # only the job's own client (or its broker) acts on it
        if request.topic == "exec.stdin":
            return [WriteStdin(job_id, request.data, bool(payload.get("eof")))]
        if request.topic == "exec.resend":  # a heal is over: what the client has not taken
            return [GrantCredit(job_id, 0, 0, resend=True)]
        if request.topic == "exec.taken":  # its last answer reached the client: keep nothing
            return [GrantCredit(job_id, 0, ALL)]
        if request.topic == "exec.signal":
            signum = payload.get("signal")
            if payload.get("gone") is True:  # its client has gone (client_gone, below)
                return [AbandonJob(job_id)]
            if is_int(signum) and 0 < signum < signal.NSIG:
                return [SignalJob(job_id, signum)]
            return []
        if why := self.lifecycle.refusing_work(self.rank) or start_problem(payload):
            return [_answer(request, {"rank": self.rank, "error": why})]
        return [StartJob(self._job(request))]

    def _job(self, request: Message) -> Message:
        """The exec.start as the job runner takes it: checked, with its defaults, and with the
        instance's size (for TBON_SIZE), which the runner is not told otherwise."""
        payload = request.payload
        job = {
            "id": payload["id"],
            "argv": payload["argv"],
            "cwd": payload.get("cwd"),
            "env": payload.get("env"),
            "window": payload.get("window", DEFAULT_WINDOW),
            "eof": payload.get("eof", False),
            "acks": payload.get("acks", False),
            "size": self.topology.size,
        }
        return Message(
            Kind.REQUEST,
            request.topic,
            job,
            nodeid=request.nodeid,
            tag=request.tag,
            route=list(request.route),
        )

    def credit(self, request: Message, now: float) -> list[Action]:
        """exec.credit: the client wrote out what this rank sent; it may send that much more,
        and need not keep the answers numbered below `seq`; with `resend`, it wants them again
        from `seq` on. One-way, like exec.stdin: nothing is answered, a bad one is dropped."""
        payload = request.payload
        job_id, amount = payload.get("id"), payload.get("bytes", 0)
        seq, resend = payload.get("seq"), payload.get("resend", False)
        if not isinstance(job_id, str) or not is_int(amount) or amount < 0:
            return []
        if (seq is not None and not (is_int(seq) and seq >= 0)) or not isinstance(resend, bool):
            return []
        if amount == 0 and seq is None:
            return []
        if (refused := unless_job_client(request, self.rank, self.started(job_id))) is not None:
            return refused  # a stranger's seq would drop what the job keeps for its client
        return [GrantCredit(job_id, amount, seq, resend)]

    # --- clients that go away -------------------------------------------------------------

    def started_by(self, hop: str, request: Message) -> None:
        """A local client (route hop `hop`) asked for a job: remember it, to kill it should the
        client vanish, and to acknowledge for it what is handed to it."""
        payload = request.payload
        named = isinstance(payload.get("targets"), str)  # the root says which (_choose)
        targets = [] if named else target_ranks(payload)
        if targets is None:
            return  # refused at once (handle): nothing runs
        window = payload.get("window", DEFAULT_WINDOW)
        job = ClientJob(  # not its env: up to 1 MiB
            payload.get("id"),
            set(targets),
            window if is_int(window) else DEFAULT_WINDOW,
            payload.get("acks") is True,
            named=named,
        )
        self._client_jobs.setdefault(hop, {})[request.tag] = job

    def unless_own_job(self, hop: str, request: Message) -> list[Action] | None:
        """exec.stdin or exec.signal from local client `hop`, before it goes anywhere: None if
        that client started a job of that id which has not ended everywhere (to be sent on: its
        ranks judge it as they judge any, `unless_job_client`); else it is ignored here, said in
        the log as the job's ranks would say it. No other client's job can be the one it names:
        a job is its client's (docs/protocol.md §7), and this broker is where every job of its
        clients is known. So a stranger's request never travels the tree. One for a job its
        client's answers showed over everywhere would act on nothing: dropped without a word if
        it is among that client's last ENDED_KEPT (a Ctrl-C that crossed the job's last answers;
        the job's ranks would not have said anything either)."""
        job_id = request.payload.get("id")
        if any(job.id == job_id for job in self._client_jobs.get(hop, {}).values()):
            return None
        if job_id in self._ended.get(hop, ()):
            return []
        return [not_its_client(request, hop)]

    def answered(self, hop: str, reply: Message) -> list[Action]:
        """A response went to local client `hop`: a rank's last word on a job (its exit, or
        why it could not run) means nothing is left to kill there, and a job that every rank
        has ended is forgotten, so that a client that leaves after its jobs is no cause for an
        exec.signal to every rank. A numbered answer handed over is acknowledged for the client
        (resend.Handoff): its rank need not keep it for a heal any more. A merged answer
        (wire/exits.py) is each of the ranks' exits it stands for."""
        jobs = self._client_jobs.get(hop)
        if reply.topic != "exec.start" or jobs is None or reply.tag not in jobs:
            return []
        job = jobs[reply.tag]
        actions: list[Action] = []
        if reply.errnum or not reply.streaming:
            job.running.clear()  # the request itself failed (or the root chose no rank)
            job.named = False
        elif job.named:  # the root's first answer: the ranks it chose (_choose)
            _chosen(job, reply.payload)
        else:
            cost = len(reply.data) + MESSAGE_COST
            said = reply.payload
            if "exits" in said:  # many ranks' exits: read without a dict per rank
                actions += self._exits_handed(job, said["exits"], cost)
            else:
                rank, last = said.get("rank"), "exit" in said
                actions += self._acknowledge(job, said, cost, last)
                if (last or "error" in said) and is_int(rank):
                    job.running.discard(rank)
                    job.handoffs.pop(rank, None)
        if not job.running and not job.named:
            self._taken.over(str(job.id))  # its ranks are told together: flush
            del jobs[reply.tag]
            ended = self._ended.setdefault(hop, [])
            ended.append(job.id)
            del ended[:-ENDED_KEPT]
            if not jobs:
                del self._client_jobs[hop]
        return actions

    def _exits_handed(self, job: ClientJob, groups: object, cost: int) -> list[Action]:
        """A merged answer (wire/exits.py) handed to the client: each rank's exit as `answered`
        takes a rank's own, in one loop over the ranks (1024 of them at once for `tbon exec -r
        all true`). The ranks whose exit was their first answer are held to be told together
        (takenhold.py); any other is acknowledged as `_acknowledge` does."""
        try:
            exits = decode(groups, self.topology.size)
        except BadExits:
            return []  # dropped, as the client drops it
        running, handoffs, acks = job.running, job.handoffs, job.acks
        first_is_last: list[int] = []
        actions: list[Action] = []
        for one in exits:
            rank = one.rank
            if rank not in running:
                continue
            if acks:
                if one.seq == 0 and rank not in handoffs:
                    first_is_last.append(rank)
                else:
                    actions += self._acknowledge(job, one.payload(), cost, True)
            running.discard(rank)
            handoffs.pop(rank, None)
        if first_is_last:
            self._taken.taken_all(str(job.id), first_is_last)
        return actions

    def _acknowledge(
        self, job: ClientJob, said: dict[str, Any], cost: int, last: bool
    ) -> list[Action]:
        rank, seq = said.get("rank"), said.get("seq")
        if not job.acks or not is_int(rank) or rank not in job.running or not is_int(seq):
            return []
        handoff = job.handoffs.get(rank)
        if handoff is None:
            if last and seq == 0:  # its first answer and its last, in order: with the others'
                self._taken.taken(str(job.id), rank)
                return []
            handoff = job.handoffs[rank] = Handoff(job.window)
        upto = handoff.handed(seq, cost, last)
        if upto is None:
            return []
        if last and upto == seq + 1:  # its last word, in order: with the others' (flush)
            self._taken.taken(str(job.id), rank)
            return []
        ack = {"id": job.id, "bytes": 0, "seq": upto}
        return [Send(Message(Kind.REQUEST, "exec.credit", ack, nodeid=rank))]

    def flush(self, now: float) -> list[Action]:
        """Once per turn of the broker's loop: the exits held long enough go up (exitmerge.py),
        and the last answers handed over are acknowledged together once their job is over
        (takenhold.py): one exec.taken per job, fanned out like exec.start, rather than one
        exec.credit to each rank (1024 at once for `tbon exec -r all true`)."""
        if not self.merge.jobs and not self._taken:
            return []  # most turns of most brokers: nothing held
        actions: list[Action] = []
        deadline = self.merge.next_deadline()
        if deadline is not None and now >= deadline:
            actions += self._sent_on(self.merge.due(now))
        before = self._taken.next_deadline()
        actions += [
            Send(Message(Kind.REQUEST, "exec.taken", {"id": i, "targets": ranks}, nodeid=0))
            for i, ranks in self._taken.due(now)
        ]
        after = self._taken.next_deadline()
        if after is not None and (before is None or after < before):
            actions.append(Wake())  # a hold began: the loop's next deadline is sooner
        return actions

    def next_deadline(self) -> float | None:
        """When held exits are due to go up without the rest of their subtree's, or held
        acknowledgements to go down."""
        if not self.merge.jobs and not self._taken:
            return None
        merge, taken = self.merge.next_deadline(), self._taken.next_deadline()
        deadlines = [d for d in (merge, taken) if d is not None]
        return min(deadlines) if deadlines else None

    # --- exits merged on their way up -------------------------------------------------------

    def gather(self, reply: Message, now: float) -> list[Action] | None:
        """A streaming answer to exec.start on its way up from here (a child's, or this
        broker's own): what to do instead of sending it on, or None to send it on as it is. A
        rank's exit, or a merged answer, of a job that merges here is held (exitmerge.py); an
        error counts its rank as done; anything else goes on at once."""
        payload = reply.payload
        if "stream" in payload or not self.merge.jobs:
            return None
        key = (reply.tag, tuple(reply.route))
        if not self.merge.merges(key):
            return None
        if "exits" in payload:
            try:
                exits = decode(payload["exits"], self.topology.size)
            except BadExits:
                return None  # sent on: the client drops it as it drops any answer it cannot read
        elif (one := exit_of(payload)) is not None:
            exits = [one]
        else:
            rank = payload.get("rank")
            if "error" not in payload or not is_int(rank):
                return None
            flushes = self.merge.passed(key, rank, now)  # it goes on as it came, and first
            return [PassOn(reply), *self._sent_on(flushes)] if flushes else None
        before = self.merge.next_deadline()
        actions = self._sent_on(self.merge.take(key, exits, now) or [])
        after = self.merge.next_deadline()
        if after is not None and (before is None or after < before):
            actions.append(Wake())  # a hold began: the loop's next deadline is sooner
        return actions

    def _sent_on(self, flushes: list[Flush]) -> list[Action]:
        actions: list[Action] = []
        for flush in flushes:
            tag, route = flush.key
            for groups in encode(flush.exits):
                merged = Message(
                    Kind.RESPONSE,
                    "exec.start",
                    {"exits": groups},
                    nodeid=flush.origin,
                    tag=tag,
                    route=list(route),
                    streaming=True,
                )
                actions.append(PassOn(merged))
        return actions

    def client_gone(self, hop: str) -> list[Action]:
        """A client of this broker's socket closed its connection: kill the jobs it started,
        wherever they still run, and have them keep nothing for it (`gone`): so that a rank's
        last word that finds the client gone needs no client.disconnect (`last_word`)."""
        actions: list[Action] = []
        self._ended.pop(hop, None)
        for job in self._client_jobs.pop(hop, {}).values():
            if self._taken.over(str(job.id)):  # what was handed over before it left: told
                actions.append(Wake())  # at the next turn's flush, even if this one's is past
            # targets not yet said (`named`): any rank may have started it
            running = range(self.topology.size) if job.named else sorted(job.running)
            kill = {
                "id": job.id,
                "signal": int(signal.SIGKILL),
                "targets": list(running),
                "gone": True,
            }
            # its route names the client (wire/route.py `speaks_for`): a job of another client
            # whose id it reused is not killed for it
            killing = Message(Kind.REQUEST, "exec.signal", kill, nodeid=0, route=[hop])
            actions.append(Send(killing))
        return actions

    def disconnect(self, request: Message, now: float) -> list[Action]:
        """client.disconnect: the client whose answers travel along this route has gone. Its
        jobs here are killed."""
        return [KillJobsFrom(tuple(request.route))]


def _chosen(job: ClientJob, said: dict[str, Any]) -> None:
    """The root's first answer to a job whose targets were named: the ranks it runs on, and the
    window each has. An answer that is not one (a broker's that does not choose) leaves the job
    as one with no rank left to hear from."""
    from tbon.overlay.parse.idset import parse_idset

    job.named = False
    ranks, window = said.get("targets"), said.get("window")
    try:
        job.running = set(parse_idset(ranks)) if isinstance(ranks, str) and ranks else set()
    except UsageError:
        job.running = set()
    if is_int(window):
        job.window = window


def last_word(reply: Message) -> bool:
    """Whether `reply` is a rank's last answer to an exec.start (its exit, or why it could not
    run). One that finds its client gone needs no client.disconnect: that rank's stream is over,
    and the client's broker told the ranks it had not heard the end from to keep nothing (the
    `gone` of its exec.signal). So a duplicate resent after the client left (a heal, a prompt)
    is dropped where it meets the gone client, not answered with a request to its rank."""
    said = reply.payload
    return reply.topic == "exec.start" and ("exit" in said or "error" in said or "exits" in said)


def _all_but_targets(payload: dict[str, Any]) -> bytes:
    """A request's payload without its `targets`, as Message's encode() puts a payload."""
    rest = {k: v for k, v in payload.items() if k != "targets"}
    return json.dumps(rest, separators=SEPARATORS).encode()


def _with_targets(rest: bytes, targets: list[int]) -> bytes:
    """The encoded payload `rest` (_all_but_targets) with `targets` in it: what encode() would
    make of the whole, but for the order of its keys."""
    head = b'{"targets":' + json.dumps(targets, separators=SEPARATORS).encode()
    return head + b"}" if rest == b"{}" else head + b"," + rest[1:]


def unreachable(target: int, hop: int) -> str:
    if hop == target:
        return f"rank {target} is not connected"
    return f"rank {target} is unreachable: rank {hop} is not connected"


def _answer(request: Message, payload: dict[str, Any]) -> Respond:
    return Respond(request.respond(payload, streaming=True))
