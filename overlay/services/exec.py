"""The broker's side of `tbon exec`: fan a request out to the targets below, act on it here,
and kill what a vanished client started. A mixin of Broker, in a module of its own."""

from __future__ import annotations

import errno
import logging
import signal
import time
from collections.abc import Callable

from tbon.overlay.links.children import Children
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.services.jobs import ExecService
from tbon.overlay.state.retirement import Retirement
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Kind, Message

log = logging.getLogger("tbon.broker")


class ExecServices:
    """exec.start, exec.stdin and exec.signal (the attributes are Broker's)."""

    rank: int
    topology: Topology
    children: Children | None
    execd: ExecService
    stopping: bool
    retirement: Retirement | None
    _client_jobs: dict[str, list[dict[str, object]]]
    _gone: set[tuple[str, int]]
    _respond: Callable[[Message], bool]
    _route: Callable[[Message, str, float], None]
    _unreachable: Callable[[int, int], str]
    _client_gone: Callable[[str, int], None]

    def _fan_out(self, request: Message) -> Message | None:
        """exec.*: act here if this rank is a target, and send one copy to each child whose
        subtree holds targets. Answers travel back along the request's route, so one request
        reaches every target and rank 0 never talks to more than its own children."""
        targets = request.payload.get("targets")
        if not isinstance(targets, list) or not all(is_int(t) for t in targets):
            return request.fail(errno.EINVAL, f"{request.topic} needs a list of target ranks")
        below: dict[int, list[int]] = {}
        for target in targets:
            if 0 <= target < self.topology.size and self.topology.is_ancestor(self.rank, target):
                below.setdefault(self.topology.next_hop(self.rank, target), []).append(target)
        for child, ranks in below.items():
            copy = Message(
                Kind.REQUEST,
                request.topic,
                {**request.payload, "targets": ranks},
                nodeid=child,
                tag=request.tag,
                route=list(request.route),
            )
            sent = self.children is not None and self.children.send(child, copy)
            if not sent and request.topic == "exec.start":
                for rank in ranks:
                    self._respond(
                        request.respond(
                            {"rank": rank, "error": self._unreachable(rank, child)}, streaming=True
                        )
                    )
        if self.rank in targets:
            self._exec_here(request)
        return None

    def _exec_here(self, request: Message) -> None:
        payload = request.payload
        job_id = str(payload.get("id", ""))
        if request.topic == "exec.stdin":
            data, eof = payload.get("data", ""), bool(payload.get("eof"))
            self.execd.write_stdin(job_id, data if isinstance(data, str) else "", eof)
        elif request.topic == "exec.signal":
            signum = payload.get("signal")
            if is_int(signum) and 0 < signum < signal.NSIG:
                self.execd.send_signal(job_id, signum)
        elif self.stopping or self.retirement is not None:
            why = "is shutting down" if self.stopping else "is retiring: it takes no new work"
            self._respond(
                request.respond(
                    {"rank": self.rank, "error": f"rank {self.rank} {why}"}, streaming=True
                )
            )
        elif (refused := self.execd.start(request)) is not None:
            self._respond(
                request.respond({"rank": self.rank, "error": refused.errstr}, streaming=True)
            )

    def _local_client_gone(self, hop: str) -> None:
        """A client of this broker's socket closed its connection: kill the jobs it started
        wherever they run, and end its status streams at rank 0."""
        for job in self._client_jobs.pop(hop, []):
            kill = {
                "id": job.get("id"),
                "signal": int(signal.SIGKILL),
                "targets": job.get("targets", []),
            }
            self._route(Message(Kind.REQUEST, "exec.signal", kill, nodeid=0), "s", time.monotonic())
        self._client_gone(hop, 0)
        self._gone = {(h, r) for h, r in self._gone if h != hop}  # ids are never reused soon
