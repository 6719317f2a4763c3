"""The broker: one rank of an instance, and the event loop that joins its links together.

Everything it decides is decided elsewhere, in plain objects (rank table, liveness, hello judge);
this module only moves messages between the parent link, the children's ROUTER, the local socket
and those objects, and keeps the clock.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from tbon import exitcodes
from tbon.errors import TbonError
from tbon.keys.cert import generate_keypair, load_certificate
from tbon.overlay.boot.config_file import load_bootconfig
from tbon.overlay.boot.flub import flub_wireup
from tbon.overlay.boot.pmi_client import PmiClient
from tbon.overlay.boot.wireup import Wireup, config_wireup, pmi_wireup, singleton_wireup
from tbon.overlay.broker.attributes import BrokerConfig, host_address
from tbon.overlay.links.children import Children, Rejoin
from tbon.overlay.links.local import LocalServer
from tbon.overlay.links.parent import LinkEnded, ParentLink
from tbon.overlay.parse.numbers import is_decimal, is_int
from tbon.overlay.services.exec import ExecServices
from tbon.overlay.services.flub import FlubServices
from tbon.overlay.services.jobs import ExecService
from tbon.overlay.services.retire import RetireServices, RetireWaiter
from tbon.overlay.state.instance import Instance
from tbon.overlay.state.ranktable import CONNECTED, Event, Online, RankTable
from tbon.overlay.state.reports import encode_event
from tbon.overlay.state.retirement import Retirement
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import ANY_RANK, Kind, Message

log = logging.getLogger("tbon.broker")

ROOT_TOPICS = frozenset({"status.get", "status.watch", "instance.shutdown"})
BATCH = 256  # messages read from one socket before the others get a turn
VERDICT_GRACE_MS = 100  # before judging a peer's silence, how long to look for its messages


class Broker(FlubServices, ExecServices, RetireServices):
    def __init__(self, config: BrokerConfig, command: list[str]) -> None:
        self.config = config
        self.command = command
        self.rank = 0
        self.exit_code: int | None = None
        self.stopping = False
        self.stop_deadline: float | None = None
        self.final_code = exitcodes.SHUTDOWN
        self.children: Children | None = None
        self.parent: ParentLink | None = None
        self.instance: Instance | None = None
        self.program: subprocess.Popen[bytes] | None = None
        self.pmi: PmiClient | None = None
        self._created_rundir: str | None = None
        self._signals: list[int] = []
        self._cut = False
        self._due = 0.0  # when the next timer falls due; 0 makes the loop recompute it
        self._poller = zmq.Poller()
        self._handlers: dict[Any, Callable[[float], None]] = {}
        self._gone: set[tuple[str, int]] = set()  # (client hop, rank) told the client left
        self._client_jobs: dict[str, list[dict[str, Any]]] = {}  # exec jobs by local client
        self.endpoint = ""
        self.incarnation = 1
        self._pending: dict[int, Callable[[Message], None]] = {}
        self._tags = itertools.count(1)
        self.retirement: Retirement | None = None  # set when told to retire
        self._retire_waiters: list[RetireWaiter] = []  # rank 0: `tbon retire` requests
        self._retire_generation = -1
        self._waiting_admission: list[Rejoin] = []  # config children, until we are welcomed

    # --- start-up ---------------------------------------------------------------------------

    def run(self) -> int:
        """Bootstrap, serve until shut down or cut off, clean up; returns the exit code."""
        self.context = zmq.Context()
        try:
            self._start()
            self._loop()
        finally:
            self._close()
        assert self.exit_code is not None
        return self.exit_code

    def _start(self) -> None:
        config = self.config
        self._wakeup = self._install_signals()
        boot = load_bootconfig(config.config_file) if config.config_file is not None else None
        self.public, secret = self._keypair(boot.curve_cert if boot else config.cert)
        self._secret = secret
        self.pmi = PmiClient.from_environment() if boot is None else None
        if boot is not None:
            wireup = config_wireup(
                boot,
                config.topo,
                config.size,
                config.hostname,
                self.public,
                self._bind,
                self._share_key,
            )
            if self.children is not None:  # what its children dial, as the file says
                self.endpoint = boot.hosts[wireup.rank].connect
        elif config.boot_server is not None:
            wireup, attributes = flub_wireup(
                config.boot_server,
                config.requested_rank,
                config.hostname,
                self.public,
                config.join_timeout,
                self._bind,
            )
            self._adopt(attributes)
        elif self.pmi is not None:
            wireup = pmi_wireup(
                self.pmi,
                config.topo,
                config.size,
                config.hostname,
                self.public,
                self._bind,
                self._authorize,
            )
        else:
            wireup = singleton_wireup(config.topo, config.size, config.hostname, self._bind)
        self.wireup: Wireup = wireup
        self.rank, self.topology = wireup.rank, wireup.topology
        self.incarnation = wireup.incarnation
        set_log_rank(self.rank)
        self.rundir = self._make_rundir()  # once the rank is known: %r in broker.rundir
        self.local = LocalServer(self.context, self.rundir)
        self.uri = self.local.uri
        self.execd = ExecService(self.rank, self.uri, self._watch, self._unwatch, self._respond)
        now = time.monotonic()
        if self.rank == 0:
            table = RankTable(self.topology, wireup.hosts, now, fixed=boot is not None)
            self.instance = Instance(table)
            self.instance.apply(Online(0, 1, config.hostname, os.getpid()), now)
            self._finalize_pmi()
        else:
            assert wireup.parent is not None
            self.parent = ParentLink(
                self.context, self.rank, self.incarnation, self.config, (self.public, secret)
            )
            self.parent.connect(wireup.parent.endpoint, wireup.parent.public_key, now)
        log.info("rank %d of %d up at %s", self.rank, self.topology.size, self.uri)

    def _keypair(self, path: str | None) -> tuple[str, str]:
        """A fresh key pair, or the one in a certificate: broker.cert, or the instance's shared
        one (config bootstrap). A broker that keeps its key keeps its identity, so that once
        retired it is recognised and refused should it come back."""
        if path is None:
            return generate_keypair()
        what = "curve_cert" if self.config.config_file else "broker.cert"
        try:
            cert = load_certificate(path)
        except TbonError as error:
            raise TbonError(f"{what}: {error}", exitcodes.USAGE) from None
        if cert.secret is None:
            raise TbonError(
                f"{what}: {path} has no secret key (make one with tbon keygen)", exitcodes.USAGE
            )
        return cert.public, cert.secret

    def _bind(self, topology: Topology, rank: int, template: str | None = None) -> str:
        """Make this broker a parent: bind its ROUTER to tbon.endpoint, or to the config file's
        bind URI, and return the address bound."""
        self.children = Children(self.context, rank, topology, self.config, self._secret)
        address = host_address(self.config.hostname)
        where = (template or self.config.endpoint).replace("%h", address)
        self.endpoint = self.children.bind(where)
        return self.endpoint

    def _share_key(self) -> None:
        """Config bootstrap: admit the instance's key, for children that say which they are."""
        assert self.children is not None
        self.children.keyring.share(self.public)

    def _authorize(self, rank: int, incarnation: int, public_key: str) -> None:
        assert self.children is not None
        self.children.authorize(rank, incarnation, public_key)

    def _make_rundir(self) -> str:
        wanted = self.config.rundir
        if wanted is not None:
            wanted = wanted.replace("%r", str(self.rank))  # one launch line, a dir per rank
        if wanted is None:
            self._created_rundir = tempfile.mkdtemp(prefix="tbon-")
            return self._created_rundir
        if not os.path.isdir(wanted):
            os.makedirs(wanted, mode=0o700)
            self._created_rundir = wanted
        os.chmod(wanted, 0o700)
        return wanted

    def _install_signals(self) -> socket.socket:
        """Signals become bytes on a socket the poll loop watches, handled between messages."""
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._signal_writer = writer
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        handled = [signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP]
        # Under a launcher that ignores SIGINT (Ctrl-C meant for the initial program), keep
        # ignoring it, but through a handler: unlike SIG_IGN, a handler is not inherited by the
        # programs this broker starts.
        sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        for signum in [*handled, signal.SIGINT]:
            signal.signal(signum, self._on_signal)
        self._sigint_ignored = sigint_ignored
        return reader

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals.append(signum)

    def _finalize_pmi(self) -> None:
        if self.pmi is not None:
            self.pmi.finalize()
            self.pmi = None

    # --- the loop ---------------------------------------------------------------------------

    def _watch(self, fd: int, writing: bool, on_ready: Callable[[], None]) -> None:
        """Have the loop call `on_ready` when `fd` (a pipe of an exec job) is ready."""
        self._handlers[fd] = lambda _now: on_ready()
        self._poller.register(fd, zmq.POLLOUT if writing else zmq.POLLIN)

    def _unwatch(self, fd: int) -> None:
        if self._handlers.pop(fd, None) is not None:
            self._poller.unregister(fd)

    def _loop(self) -> None:
        poller = self._poller
        handlers = self._handlers
        # A plain socket comes back from zmq.Poller as its file descriptor.
        handlers[self._wakeup.fileno()] = self._handle_signals
        handlers[self.local.socket] = self._read_local
        handlers[self.local.monitor] = self._read_local
        if self.children is not None:
            handlers[self.children.zap.socket] = self._read_zap
            handlers[self.children.monitor] = self._read_children
            handlers[self.children.socket] = self._read_children
        if self.parent is not None:
            handlers[self.parent.monitor] = self._read_parent_monitor
            handlers[self.parent.socket] = self._read_parent
        for sock in handlers:
            poller.register(sock, zmq.POLLIN)
        self._handle_signals(time.monotonic())
        while True:
            now = time.monotonic()
            if now >= self._due:  # heartbeats, silence, leases: not on every message
                self._timers(now)
            self._tick(now)
            if self.exit_code is not None:
                return
            if now >= self._due:
                timeout = self._next_deadline(now)
                self._due = float("inf") if timeout is None else now + timeout
            left = self._due - now
            ready = dict(
                poller.poll(None if left == float("inf") else max(0, int(left * 1000) + 1))
            )
            now = time.monotonic()
            for sock in ready:
                handler = handlers.get(sock)  # exec jobs' pipes come and go
                if handler is not None and self.exit_code is None:
                    handler(now)

    def _next_deadline(self, now: float) -> float | None:
        deadlines = [
            d
            for d in (
                self.children.next_deadline() if self.children else None,
                self.parent.next_deadline() if self.parent else None,
                self.instance.table.next_expiry() if self.instance else None,
                self.retirement.next_deadline() if self.retirement else None,
                self.stop_deadline,
            )
            if d is not None
        ]
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _timers(self, now: float) -> None:
        """Heartbeats, judgements of silence and lease expiry: run when one falls due."""
        if self.exit_code is not None:
            return
        # Judge a peer's silence only on an empty queue: if this broker was the one stopped
        # (SIGSTOP, a stalled node), what its peers sent meanwhile is waiting to be read.
        # The grace lets ZeroMQ's I/O thread, woken with us, move what arrived into the queue.
        if self.children is not None:
            if self.children.verdict_due(now) and (
                self.children.socket.poll(VERDICT_GRACE_MS) or self.children.monitor.poll(0)
            ):
                self._read_children(now)
            self._report(self.children.tick(now), now)
        if (
            self.parent is not None
            and self.parent.verdict_due(now)
            and self.parent.socket.poll(VERDICT_GRACE_MS)
        ):
            self._read_parent(now)
            if self.exit_code is not None:
                return
        if self.parent is not None and (ended := self.parent.tick(now)) is not None:
            self._cut_off(ended)
            return
        if self.instance is not None:
            self._expire_leases(now)

    def _tick(self, now: float) -> None:
        """After every batch of input: push status changes, start the program, finish."""
        if self.exit_code is not None:
            return
        if self.instance is not None:
            self._push_status(now)
            self._settle_retirements(now)
            waiting_to_start = self.command and self.program is None and not self.stopping
            if waiting_to_start and self.instance.table.up():
                self._start_program()
        self._drain(now)
        self._maybe_finish(now)

    # --- inputs -----------------------------------------------------------------------------

    def _handle_signals(self, now: float) -> None:
        try:
            while self._wakeup.recv(512):
                pass
        except BlockingIOError:
            pass
        signals, self._signals = self._signals, []
        for signum in signals:
            if signum == signal.SIGCHLD:
                self._reap_program()
                self.execd.reap()
            elif signum == signal.SIGINT and self._sigint_ignored and not self._starting():
                log.debug("ignored SIGINT")  # Ctrl-C is for the initial program, which has it
            elif signum == signal.SIGINT and self._sigint_ignored:
                # Ctrl-C before the initial program started: it would never see it, so the
                # start-up is what is interrupted.
                log.info("SIGINT before the initial program started: shutting down")
                self.final_code = 128 + signal.SIGINT
                self.begin_shutdown(now)
            else:
                log.info("%s: shutting down", signal.Signals(signum).name)
                self._terminate_program()
                self.begin_shutdown(now)

    def _starting(self) -> bool:
        """Rank 0 with an initial program it has not started yet."""
        return self.instance is not None and bool(self.command) and self.program is None

    def _read_zap(self, now: float) -> None:
        assert self.children is not None
        while self.children.zap.socket.poll(0):
            self.children.zap.handle()

    def _read_children(self, now: float) -> None:
        """Connection events and messages from children, in the order they happened."""
        children = self.children
        assert children is not None
        children.drain_monitor()
        for _ in range(BATCH):
            if not children.socket.poll(0):
                self._report(children.settle(), now)
                break
            inbound = children.read(now)
            if inbound.reports:
                self._due = 0.0  # a child came, went or changed: its timers change too
            self._report(inbound.reports, now)
            for rejoin in inbound.rejoins:
                self._ask_rejoin(rejoin)
            for child, message in inbound.messages:
                self._route(message, f"c{child}", now)
        self._maybe_finish(now)

    def _read_parent_monitor(self, now: float) -> None:
        assert self.parent is not None
        if (ended := self.parent.drain_monitor()) is not None:
            self._cut_off(ended)

    def _read_parent(self, now: float) -> None:
        parent = self.parent
        assert parent is not None
        for _ in range(BATCH):
            if not parent.socket.poll(0) or self.exit_code is not None:
                break
            inbound = parent.read(now)
            if inbound.welcomed:
                log.info("welcomed by the parent")
                self.incarnation = parent.incarnation
                self._admit_waiting()
                self._finalize_pmi()
                self._due = 0.0  # heartbeats to the parent start now
            if inbound.ended is not None:
                self._cut_off(inbound.ended)
                return
            if inbound.shutdown:
                self.begin_shutdown(now)
            if inbound.retire is not None:
                self._begin_retirement(inbound.retire, now)
            for message in inbound.messages:
                self._route(message, "p", now)

    def _read_local(self, now: float) -> None:
        """Requests from local clients, then the clients that went away (after what they sent,
        so that a client that asked for something and hung up at once is cleaned up after)."""
        for _ in range(BATCH):
            if not self.local.socket.poll(0):
                break
            received = self.local.read()
            if received is not None:
                hop, message = received
                self._route(message, hop, now)
        for hop in self.local.gone():
            self._local_client_gone(hop)

    # --- routing ----------------------------------------------------------------------------

    def _route(self, message: Message, came_from: str, now: float) -> None:
        if message.kind is Kind.REQUEST:
            if came_from.startswith("l") and message.topic == "exec.start":
                self._client_jobs.setdefault(came_from, []).append(dict(message.payload))
            message.route.append(came_from)
            self._request(message, now)
        elif message.kind is Kind.RESPONSE:
            self._respond(message)
        else:
            log.warning("dropped a %s message %r from %s", message.kind, message.topic, came_from)

    def _request(self, message: Message, now: float) -> None:
        if message.topic in ROOT_TOPICS and message.nodeid == ANY_RANK:
            message.nodeid = 0
        target = message.nodeid
        if target in (ANY_RANK, self.rank):
            try:
                reply = self._serve(message, now)
            except Exception as error:  # a request we could not serve never stops a broker
                log.error("request %r failed: %r", message.topic, error)
                reply = message.fail(errno.EPROTO, f"{message.topic}: internal error")
            if reply is not None:
                self._respond(reply)
            return
        if not 0 <= target < self.topology.size:
            self._respond(
                message.fail(
                    errno.ENOENT, f"no rank {target} in this instance of size {self.topology.size}"
                )
            )
            return
        if self.instance is not None:
            state = self.instance.table.entry(target).state
            if state not in CONNECTED:
                self._respond(message.fail(errno.EHOSTUNREACH, f"rank {target} is {state}"))
                return
        hop = self.topology.next_hop(self.rank, target)
        if hop == self.topology.parent(self.rank):
            assert self.parent is not None
            self.parent.send(message)
        elif self.children is None or not self.children.send(hop, message):
            self._respond(message.fail(errno.EHOSTUNREACH, self._unreachable(target, hop)))

    def _unreachable(self, target: int, hop: int) -> str:
        if hop == target:
            return f"rank {target} is not connected"
        return f"rank {target} is unreachable: rank {hop} is not connected"

    def _call(self, request: Message, on_reply: Callable[[Message], None]) -> None:
        """Send a request of this broker's own; `on_reply` gets the response."""
        request.tag = next(self._tags)
        self._pending[request.tag] = on_reply
        self._route(request, "s", time.monotonic())

    def _respond(self, reply: Message) -> bool:
        if not reply.route:
            return False
        hop = reply.route.pop()
        if hop == "s":
            on_reply = self._pending.pop(reply.tag, None)
            if on_reply is not None:
                on_reply(reply)
            return on_reply is not None
        if hop == "p" and self.parent is not None:
            self.parent.send(reply)
            return True
        if hop.startswith("c") and is_decimal(hop[1:]) and self.children is not None:
            return self.children.send(int(hop[1:]), reply)
        if hop.startswith("l"):
            if self.local.send(hop, reply):
                return True
            if reply.streaming:
                self._client_gone(hop, reply.nodeid)
        return False

    def _client_gone(self, hop: str, origin: int) -> None:
        """Tell the rank serving a stream that its client went away, along the stream's route."""
        if (hop, origin) in self._gone:
            return
        self._gone.add((hop, origin))
        notice = Message(Kind.REQUEST, "client.disconnect", nodeid=origin, route=[hop])
        self._request(notice, time.monotonic())

    # --- services ---------------------------------------------------------------------------

    def _serve(self, request: Message, now: float) -> Message | None:
        topic = request.topic
        if topic == "broker.ping":
            return request.respond(
                {**request.payload, **self._identity(), "hops": len(request.route) - 1}
            )
        if topic == "broker.info":
            return request.respond(
                {
                    **self._identity(),
                    "size": self.topology.size,
                    "topo": self.topology.spec,
                    "uri": self.uri,
                    "endpoint": self.endpoint,
                    "public_key": self.public,
                    "parent": self.topology.parent(self.rank),
                    "children": list(self.topology.children(self.rank)),
                    "attributes": self.config.attributes,
                }
            )
        if topic == "client.disconnect":
            if self.instance is not None:
                self.instance.forget(request.route)
            for job in list(self.execd.jobs.values()):
                if job.request.route == request.route:
                    log.info("exec %s: its client went away, killing it", job.id)
                    self.execd.send_signal(job.id, signal.SIGKILL)
            return None
        if topic in ("exec.start", "exec.stdin", "exec.signal"):
            return self._fan_out(request)
        if topic == "flub.kex":
            return self._kex(request)
        if topic == "flub.revoke":
            return self._revoke(request)
        if topic == "retire.order":
            return self._retire_order(request)
        if self.instance is None:
            return request.fail(errno.ENOSYS, f"unknown request {topic!r}")
        if topic == "status.get":
            return request.respond(self.instance.status(now))
        if topic == "status.watch":
            if self.stopping:
                return request.fail(errno.ENODATA, "the instance is shutting down")
            return self.instance.watch(request, now)
        if topic == "flub.allocate":
            return self._allocate(request, now)
        if topic == "config.rejoin":
            return self._rejoin(request, now)
        if topic == "retire.rank":
            return self._retire_rank(request, now)
        if topic == "retire.progress":
            self._retire_progress(request)
            return None
        if topic == "flub.verify":
            rank, incarnation, key = (
                request.payload.get(name) for name in ("rank", "incarnation", "public_key")
            )
            if not (is_int(rank) and is_int(incarnation) and isinstance(key, str)):
                return request.fail(errno.EINVAL, "flub.verify needs rank, incarnation, key")
            assert isinstance(rank, int) and isinstance(incarnation, int)
            why = self.instance.table.verify(rank, incarnation, key)
            return request.fail(errno.EPERM, why) if why else request.respond({})
        if topic == "instance.shutdown":
            self._respond(request.respond({"rank": self.rank}))
            self._terminate_program()
            self.begin_shutdown(now)
            return None
        return request.fail(errno.ENOSYS, f"unknown request {topic!r}")

    def _identity(self) -> dict[str, Any]:
        return {"rank": self.rank, "hostname": self.config.hostname, "pid": os.getpid()}

    def _push_status(self, now: float) -> None:
        assert self.instance is not None
        for watcher, update in self.instance.pushes(now):
            if not self._respond(update):
                self.instance.forget_watcher(watcher)

    # --- reports ----------------------------------------------------------------------------

    def _report(self, events: list[Event], now: float) -> None:
        for event in events:
            if self.instance is not None:
                outcome = self.instance.apply(event, now)
                if isinstance(event, Online) and not outcome.applied:
                    self._void(event.rank, event.incarnation, outcome.reason)
            elif self.parent is not None:
                self.parent.send(Message(Kind.CONTROL, "report", encode_event(event)))

    # --- the initial program (rank 0) -------------------------------------------------------

    def _start_program(self) -> None:
        env = {**os.environ, "TBON_URI": self.uri, "TBON_RANK": str(self.rank)}
        for name in ("PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID"):
            env.pop(name, None)
        log.info("instance up: running %s", self.command)
        try:
            self.program = subprocess.Popen(self.command, env=env)
        except OSError as error:
            log.error("cannot run %s: %s", self.command[0], error.strerror)
            self.final_code = 127 if isinstance(error, FileNotFoundError) else 126
            self.begin_shutdown(time.monotonic())

    def _reap_program(self) -> None:
        if self.program is None or self.program.poll() is None:
            return
        code = self.program.returncode
        self.final_code = 128 - code if code < 0 else code
        if not self.stopping:
            log.info("initial program exited with status %d: shutting down", self.final_code)
            self.begin_shutdown(time.monotonic())

    def _terminate_program(self) -> None:
        if self.program is not None and self.program.poll() is None:
            self.program.terminate()

    # --- shutdown ---------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> None:
        """Shut this broker's subtree down, leaves first, then leave."""
        if self.stopping:
            return
        self.stopping = True
        self.stop_deadline = now + self.config.shutdown_timeout
        self._due = 0.0
        self.execd.kill_all(signal.SIGTERM)
        if self.children is not None:
            self.children.shutdown()
        self._maybe_finish(now)

    def _maybe_finish(self, now: float) -> None:
        if not self.stopping or self.exit_code is not None:
            return
        waiting = self.children.connected() if self.children is not None else []
        running = self.program is not None and self.program.poll() is None
        running = running or self.execd.busy()
        if (waiting or running) and self.stop_deadline is not None and now < self.stop_deadline:
            return  # children's goodbyes and the initial program's exit wake us up
        if waiting:
            log.warning("shutdown: gave up waiting for ranks %s", ",".join(map(str, waiting)))
        if self.execd.busy():
            self.execd.kill_all(signal.SIGKILL)
        if running and self.program is not None and self.program.poll() is None:
            log.warning("shutdown: killing the initial program (pid %d)", self.program.pid)
            self.program.kill()
            self.program.wait()
        self._reap_program()  # its status is the instance's exit status
        if self.parent is not None:
            self.parent.goodbye()
        if self.instance is not None:
            for _watcher, ended in self.instance.end_watches():
                self._respond(ended)
            self._end_retirements()
        self.exit_code = self.final_code

    def _cut_off(self, ended: LinkEnded) -> None:
        """The parent link is over: leave at once, with the exit code that says why."""
        log.log(logging.INFO if ended.exit_code == 0 else logging.ERROR, "%s", ended.reason)
        self._terminate_program()
        self.exit_code = ended.exit_code
        self._cut = True

    def _close(self) -> None:
        if hasattr(self, "execd") and self.execd.busy():
            # However this broker ends (cut off from its parent, say), its jobs end with it.
            self.execd.kill_all(signal.SIGKILL)
            self.execd.wait_all()
        if self.program is not None and self.program.poll() is None:
            try:
                self.program.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.program.kill()
                self.program.wait()
        if self.parent is not None:
            self.parent.close(linger=self.parent.welcomed and not self._cut)
        if self.children is not None:
            self.children.close()
        if hasattr(self, "local"):
            self.local.close()
        self.context.term()
        signal.set_wakeup_fd(-1)
        if self._created_rundir is not None:
            shutil.rmtree(self._created_rundir, ignore_errors=True)


class _RankFormatter(logging.Formatter):
    rank: int | None = None

    def format(self, record: logging.LogRecord) -> str:
        where = "tbon-broker" if self.rank is None else f"tbon-broker[{self.rank}]"
        return f"{where}: {record.levelname.lower()}: {record.getMessage()}"


_formatter = _RankFormatter()


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_formatter)
    root = logging.getLogger("tbon")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def set_log_rank(rank: int) -> None:
    _formatter.rank = rank


def run_broker(config: BrokerConfig, command: list[str]) -> int:
    setup_logging(config.log_level)
    try:
        return Broker(config, command).run()
    except TbonError as error:
        log.error("%s", error)
        return error.exit_code
