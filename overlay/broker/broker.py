"""The broker: one rank of an instance, as an event loop around plain services.

Everything it decides is decided elsewhere: in the services (overlay/services/), which take a
request and the time and return actions; in the rank table, the liveness judges and the hello
judge. This module polls the links, feeds what arrives to the router, has the actions that come back
carried out (perform.py), keeps the clock (heartbeats, silences, leases, calls) and the signals,
and ends the broker with the exit code that tells a supervisor what to do. It is the one place
where every link's input meets the clock, which is why it runs a little over 400 lines: split
further, the order of reads, judgements and shutdown would have to be read across files.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from tbon import exitcodes
from tbon.errors import TbonError, UsageError
from tbon.overlay.broker.dispatch import ROOT_TOPICS, Services
from tbon.overlay.broker.jobs import JobRunner
from tbon.overlay.broker.logs import set_log_rank, setup_logging
from tbon.overlay.broker.perform import Performer
from tbon.overlay.broker.program import InitialProgram
from tbon.overlay.broker.router import Router
from tbon.overlay.broker.signals import SignalPipe
from tbon.overlay.broker.startup import Booted, Links, boot, open_links
from tbon.overlay.broker.wakeup import WakeUp
from tbon.overlay.config.attributes import BrokerConfig
from tbon.overlay.links.asker import Asker
from tbon.overlay.links.cards import encode_group
from tbon.overlay.links.descriptors import raise_limit
from tbon.overlay.links.zmqio import readable
from tbon.overlay.services.actions import Action, Apply, ApplyAll, Foster, Revoke
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.ping import Whoami
from tbon.overlay.services.retire import Draining
from tbon.overlay.state.healing import adrift
from tbon.overlay.state.rankevents import UNKNOWN_HOST, Event, Located, Lost, Online
from tbon.overlay.state.rankstates import CONNECTED
from tbon.overlay.state.reports import Batcher, encode_events
from tbon.overlay.state.terms import Ignored, News, Superseded, Terms
from tbon.overlay.wire.message import Kind, Message
from tbon.proctitle import name_broker

if TYPE_CHECKING:  # the links up: loaded by a broker that has a parent only, not at rank 0
    from tbon.overlay.boot.latehosts import LateHosts
    from tbon.overlay.links.parent import LinkEnded, ParentLink
    from tbon.overlay.links.uplink import Card, Uplink, UplinkNews
    from tbon.overlay.services.group import GroupService
    from tbon.overlay.services.rankpath import RankPath  # rank 0's only
    from tbon.overlay.state.ranktable import RankTable  # rank 0's, and a member's

log = logging.getLogger("tbon.broker")

BATCH = 256  # messages read from one socket before the others get a turn
QUIET = True  # a handler read only heartbeats: no turn's work, no asking every source (wakeup.py)
VERDICT_GRACE_MS = 100  # before judging a peer's silence, how long to look for its messages


class Broker:
    def __init__(
        self, booted: Booted, links: Links, command: list[str], signals: SignalPipe
    ) -> None:
        config = self.config = booted.config
        wireup = booted.wireup
        self.booted = booted
        self.rank, self.topology = wireup.rank, wireup.topology
        self.incarnation = wireup.incarnation
        self.public = booted.public
        self.links = links
        self.children, self.local = links.children, links.local
        self.signals = signals
        self.uri = self.local.uri
        self._poller = zmq.Poller()
        # what reads each socket; one returns QUIET when it read only heartbeats (wakeup.py)
        self._handlers: dict[Any, Callable[[float], bool | None]] = {}
        self._wakeup = WakeUp()  # when the loop next wakes (wakeup.py)
        self.reattach_timeout = config.reattach_timeout or config.timeout or 60.0
        # the term fence (docs/protocol.md §13.3), shared by the router and the links: rank 0
        # leads term 1 from the start; a takeover raises it (Terms.lead), and only there
        # the root from the start: rank 0 as bootstrap made it, not one refilled by FLUB after a
        # takeover (that one joins under the root as a member: docs/protocol.md §13.6)
        self.founding = self.rank == 0 and links.parent is None
        self.terms = Terms(self.rank, leading=self.founding)
        self.parent: Uplink | None = None
        if links.parent is not None:
            from tbon.overlay.links.parent import ParentLink
            from tbon.overlay.links.uplink import Uplink

            assert isinstance(links.parent, ParentLink)  # as bootstrap opened it, not yet wrapped
            self.parent = links.parent = Uplink(
                links.parent,
                self._open_link,
                self.reattach_timeout,
                self._watch_link,
                self._unwatch_link,
                self.terms,
            )
        now = time.monotonic()
        self.table: RankTable | None = None
        self.late_hosts: LateHosts | None = None  # rank 0: PMI open for hosts not yet known
        self.path: RankPath | None = None
        if self.founding:
            from tbon.overlay.services.rankpath import RankPath
            from tbon.overlay.state.ranktable import RankTable

            grace = (config.timeout or 60.0) + self.reattach_timeout
            self.table = RankTable(
                self.topology, wireup.hosts, now, fixed=booted.by_config, reattach_grace=grace
            )
            self.path = RankPath(self.table)
            origin = {"hosts": list(wireup.hosts), "fixed": booted.by_config, "grace": grace}
            self._origin: dict[str, Any] | None = {**origin, "now": now}
        else:
            self._origin = None
        self.group = self._root_group(now)
        self.group.card = self._own_card()
        self.group.on_cards = self._group_changed
        if self.table is not None:
            self.table.members = self.group.members
            if self.group.active:
                self.group.cards = {self.rank: self._own_card()}
        if self.children is not None:
            self.children.terms = self.terms
            self.children.lineage = [self._card()] if self.founding else []
            if self.parent is not None:  # a child welcomed while this broker seeks is told so
                self.children.seeking_for = self.parent.seeking_for
        self.exit_code: int | None = None
        self.final_code = 0  # the instance's exit status: its initial program's
        self.stop_deadline: float | None = None
        self._cut = False
        self._alone_since: float | None = None  # a root stepped down with nothing attached
        self.asker = Asker(  # such a root asks the members whether a later term exists
            self.rank,
            lambda card: self._open_link(card, self.incarnation),
            self._watch_asking,
            self._unwatch_link,
            self.terms,
            self._term_news,
        )
        self._drop_parent = False  # a standby that took over: its uplink closes after this turn
        self.reports = Batcher()  # what goes up to the parent, a report per short interval
        self.program = InitialProgram(command, self.uri, self.rank, self.topology.size)
        self.jobs = JobRunner(
            self.rank,
            self.uri,
            self._watch,
            self._unwatch,
            self._respond,
            self.local.reserve,
            signals.catch_children,
        )
        self.draining: Draining | None = None
        self.lifecycle = Lifecycle()
        self._build_services()
        self.group.on_root = self._take_over
        self.group.on_superseded = self._superseded
        if self.founding:
            self.perform([Apply(Online(0, 1, config.hostname, os.getpid()))])
            assert self.table is not None
            if self.booted.pmi is not None and not self.table.up():
                from tbon.overlay.boot.latehosts import LateHosts

                self.late_hosts = LateHosts(now)  # see _locate_late
            else:
                self._finalize_pmi()  # rank 0 is in the tree from the start
        log.info("rank %d of %d up at %s", self.rank, self.topology.size, self.uri)

    def _root_group(self, now: float) -> GroupService:
        """This broker's part in the root group (docs/protocol.md §13.2): at rank 0 with
        standbys, the root, whose table waits for the group; a standby learns it is one from
        the root's first append."""
        from tbon.overlay.services.group import GroupService, patience_for
        from tbon.overlay.state.standbys import kept_standbys

        members: tuple[int, ...] = ()
        if self.founding:
            launched = self.booted.wireup.launched
            standbys, fewer = kept_standbys(self.topology, self.config.standbys, launched)
            if fewer is not None:
                log.warning("%s", fewer)
            members = (0, *standbys) if standbys else ()
        wait = (self.config.join_timeout or 60.0) / 2  # a joiner hears why before it gives up
        return GroupService(
            self.rank,
            self.topology,
            members,
            lambda: self.incarnation,
            now,
            wait,
            path=self.path,
            origin=self._origin,
            patience=patience_for(self.config.timeout),
        )

    def _build_services(self) -> None:
        me = Whoami(
            self.rank,
            self.config.hostname,
            os.getpid(),
            self.uri,
            self.booted.endpoint,
            self.public,
            self.config.attributes,
        )
        self.services = Services.build(
            me, self.config, self.topology, self.table, self.lifecycle, self._whole, self.group
        )
        self.services.ping.adrift = self._adrift
        links = (self.parent, self.children, self.local)
        handlers = self.services.handlers()
        self.router = Router(
            self.rank,
            self.topology,
            self.table,
            links,
            handlers,
            ROOT_TOPICS,
            self.perform,
            self._local_request,
            call_timeout=self.config.join_timeout,
            terms=self.terms,
        )
        self.router.on_terms = self._term_news
        self.services.exec.toward = self.router.hop_down
        self.services.exec.towards = self.router.hops_down
        self.services.exec.leads = lambda: self.terms.root == self.rank  # rank 0, or a new root
        self.services.exec.started = self.jobs.started  # whose job it is
        self.services.exec.rank_states = self._rank_states
        self.router.gather = self.services.exec.gather
        self.router.on_local_response = lambda hop, reply: self.perform(
            self.services.exec.answered(hop, reply)
        )
        status = self.services.status
        self.performer = Performer(
            self.rank, self, self.router, self.children, self.jobs, status, self.path, self.group
        )

    def _card(self) -> list[Any]:
        """This broker as its children's lineage names it: rank, endpoint, public key."""
        return [self.rank, self.booted.endpoint, self.public]

    def _own_card(self) -> tuple[int, str, str]:
        """The same card, as the root group's cards hold it (docs/protocol.md §13.4)."""
        return (self.rank, self.booted.endpoint, self.public)

    def _group_changed(self) -> None:
        """The root learned a member's card: every child hears the group with the lineage."""
        if self.children is not None and self.group.leads:
            self.children.group = encode_group(self.group.group_cards())
            self.children.send_lineage()

    def _admit_members(self, now: float, every: bool = False) -> None:
        """A member whose parent is lost (the root died, perhaps) admits at once the members
        ranked above it, which may seek it (upward.group_seeks), so that the group can elect
        over its links: their keys from the cards the root sent, nothing else; their
        incarnations from its copy of the table (§13.4). As a foster parent admits, for the
        reattach grace. A member elected admits `every` other member: one ranked below it,
        whose child it was, seeks it once it hears of its term, and the new root's first
        commit needs that member's answer when the group is three (admitting a key is no
        transition of the table, so it waits for no commit)."""
        parent, path, group = self.parent, self.group.path, self.group
        if parent is None or path is None or group.member is None or self.children is None:
            return
        admitted = []
        for rank, _endpoint, key in parent.group:
            if rank == self.rank or (rank < self.rank and not every):
                continue
            if rank not in group.members:
                continue
            entry = path.table.entry(rank)
            # a config-booted member holds the instance's shared key, as this broker does, and
            # its entry no key of its own: admitted as such ("", that incarnation exactly)
            shared = self.booted.by_config and entry.key is None and key == self.public
            if (entry.key == key or shared) and entry.state in CONNECTED:
                admitted.append((rank, entry.incarnation, "" if shared else key))
        if admitted:
            log.info("admitting root group members %s", ",".join(str(r) for r, _, _ in admitted))
            self.perform([Foster(tuple(admitted), now + self.reattach_timeout)])

    def _known_root(self) -> int | None:
        """The root of the latest term this broker knows of, once past rank 0's: its term
        fence's, or the one its member machine follows."""
        member = self.group.member
        if member is not None and member.leader is not None and member.leader != 0:
            return member.leader
        return self.terms.root if self.terms.term > 1 else None

    def _rank_states(self) -> dict[str, Any] | None:
        """The `states` view of this broker's rank table (the root's, which chooses the targets
        an exec.start names), or None without one: its status service's, built once per
        generation of the table for both the exec's watch and its targets."""
        status = self.services.status
        return None if status is None else status.states()

    def _whole(self) -> bool:
        """What heal.wait waits for: rank 0, no rank adrift; any other, attached to a parent."""
        if self.table is not None:
            return not adrift(self.table)
        return self.parent is not None and self.parent.welcomed

    # --- the links up -----------------------------------------------------------------------

    def _open_link(self, card: Card, incarnation: int) -> ParentLink:
        """A link to an ancestor (seeking a parent, or going home), saying hello on it."""
        from tbon.overlay.links.parent import ParentLink

        rank, endpoint, key = card
        return ParentLink(
            self.links.context,
            self.rank,
            incarnation,
            self.config,
            (self.public, self.booted.secret),
            (endpoint, key),
            time.monotonic(),
            peer=rank,
            shared_key=self.booted.by_config,
        )

    def _watch_link(self, link: ParentLink) -> None:
        self._handlers[link.socket] = lambda now: self._read_parent(link, now)
        self._handlers[link.monitor] = lambda now: self._read_parent_monitor(link, now)
        self._poller.register(link.socket, zmq.POLLIN)
        self._poller.register(link.monitor, zmq.POLLIN)
        self.wake()

    def _watch_asking(self, link: ParentLink, on_ready: Callable[[float], None]) -> None:
        """A link of the asker's (links/asker.py): its socket and monitor, read by `on_ready`."""
        for sock in (link.socket, link.monitor):
            self._handlers[sock] = on_ready
            self._poller.register(sock, zmq.POLLIN)
        self.wake()

    def _unwatch_link(self, link: ParentLink) -> None:
        for sock in (link.socket, link.monitor):
            if self._handlers.pop(sock, None) is not None:
                self._poller.unregister(sock)
        self.wake()  # a retry of it may be due

    def go_home(self, card: tuple[int, str, str]) -> str:
        if self.parent is None:
            return "rank 0 has no parent"
        now, parent = time.monotonic(), self.parent
        news = parent.move_home(card, now)
        self._uplink_news(news, now)
        if not news.declined and parent.peer != card[0]:
            log.info("going home to rank %d", card[0])
        return news.declined

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until shut down or cut off, then close every link; returns the exit code."""
        try:
            self._loop()
        finally:
            self._close()
        assert self.exit_code is not None
        return self.exit_code

    def _watch(self, fd: int, writing: bool, on_ready: Callable[[], None]) -> None:
        """Have the loop call `on_ready` when `fd` (a pipe of an exec job) is ready."""
        self._handlers[fd] = lambda _now: on_ready()
        self._poller.register(fd, zmq.POLLOUT if writing else zmq.POLLIN)

    def _unwatch(self, fd: int) -> None:
        if self._handlers.pop(fd, None) is not None:
            self._poller.unregister(fd)

    def _loop(self) -> None:
        poller, handlers = self._poller, self._handlers
        handlers[self.signals.fileno()] = self._handle_signals
        handlers[self.local.fileno()] = lambda _now: self.local.accept()
        self.local.watch_with(self._watch_client)
        if self.children is not None:
            handlers[self.children.zap.socket] = self._read_zap
            handlers[self.children.monitor] = self._read_children
        for sock in handlers:
            poller.register(sock, zmq.POLLIN)
        if self.parent is None or self.parent.admits_children:
            self._admit_children()
        self._handle_signals(time.monotonic())
        wakeup, busy = self._wakeup, True
        while True:
            now = time.monotonic()
            if now >= wakeup.due:  # heartbeats, silence, leases: not on every message
                self._timers(now)
                busy = True
            if busy:  # a turn that did anything: every deadline it added is asked for here
                self._tick(now)
                if self.exit_code is not None:
                    return
                up = self.parent.next_deadline() if self.parent is not None else None
                wakeup.asked(now, self._deadlines(), up)
            ready = poller.poll(wakeup.timeout_ms(now))
            now = time.monotonic()
            busy = not ready or wakeup.stale
            for sock, _ in ready:
                handler = handlers.get(sock)  # exec jobs' pipes come and go
                if handler is not None and self.exit_code is None and handler(now) is not QUIET:
                    busy = True
            busy = busy or self.exit_code is not None or wakeup.stale

    def _admit_children(self) -> None:
        """Read the children's hellos from now on: a broker welcomes no child before it is
        itself welcomed (upward.py), so that each child's welcome carries a lineage."""
        children = self.children
        if children is None or children.socket in self._handlers:
            return
        self._handlers[children.socket] = self._read_children
        self._poller.register(children.socket, zmq.POLLIN)

    def _deadlines(self) -> tuple[float | None, ...]:
        """Every source's next deadline but the link up's (the loop asks that one apart, as
        a heartbeat moves it: wakeup.py). A new source of deadlines is one more line here."""
        return (
            self.children.next_deadline() if self.children else None,
            # while the root group has not committed what is asked, the table's own
            # deadlines wait for it (the commit wakes the loop): asked again, they would spin
            self.table.next_expiry() if self.table and not self.group.waiting else None,
            self.group.next_deadline(),
            self.asker.next_deadline(),
            self.late_hosts.next_deadline() if self.late_hosts else None,
            self.services.heal.next_deadline(),
            self.draining.next_deadline() if self.draining else None,
            self.reports.deadline(),
            self.router.next_deadline(),
            self.services.exec.next_deadline(),
            self.services.dmesg.next_deadline(),
            self.stop_deadline,
        )

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
            self.report(self.children.tick(now), now)
        parent = self.parent
        if parent is not None and parent.verdict_due(now):
            link = parent.link
            if link is not None and link.socket.poll(VERDICT_GRACE_MS):
                self._read_parent(link, now)
                if self.exit_code is not None:
                    return
        if parent is not None:
            self._uplink_news(parent.tick(now), now)
            if self.exit_code is not None:
                return
            if (root := self._known_root()) is not None and self.parent is not None:
                self._uplink_news(self.parent.learn_root(root, now), now)
        self.router.expire(now)
        self.perform(self.group.tick(now))
        alone = self._stepped_down_alone()
        self.asker.tick(alone, self.group.group_cards() if alone else (), now)
        if self.exit_code is not None:
            return
        self._leave_if_abandoned(alone, now)
        if self.table is not None:
            self.perform(self.services.flub.expire(now))
            self.report(self.table.adrift(now), now)

    def _stepped_down_alone(self) -> bool:
        """A root that stepped down (its lease lapsed: no majority answers it) with no parent
        and no broker attached: the members dropped their links to it when they elected another
        (a root stopped past tbon.timeout and woken, docs/protocol.md §13.5)."""
        group, children = self.group, self.children
        return (
            group.member is not None
            and group.leads  # it served the table ...
            and not group.member.is_root  # ... and its member leads no more
            and self.parent is None
            and not self.lifecycle.stopping
            and (children is None or not children.connected())
        )

    def _adrift(self, now: float) -> str | None:
        """Why a request for the table sent here now would not reach the current root's (None
        if it would): this broker has no parent and is not a root serving its table (a root
        stepped down, or woken with its lease over; a broker seeking an ancestor). A URI list
        passes over it (docs/protocol.md §13.4)."""
        if self.parent is not None:
            return None
        member = self.group.member
        if self.table is not None and (member is None or member.serves(now)):
            return None
        if self.table is not None:
            return "not the root now: no majority of the root group answers it"
        return "no parent now: seeking a live ancestor"

    def _leave_if_abandoned(self, alone: bool, now: float) -> None:
        """A root stepped down and alone asks the members whether a later term exists (the
        asker: a successor's refusal makes it leave with 77). If none answers so within
        broker.reattach-timeout (all dead, or none took over), it leaves with 75, as a broker
        no ancestor takes back, rather than answer status from a table that stopped when it
        did."""
        if not alone:
            self._alone_since = None
            return
        if self._alone_since is None:
            self._alone_since = now
            log.warning("stepped down as the root, and no broker is attached")
            return
        if now - self._alone_since < self.reattach_timeout:
            return
        log.error(
            "stepped down as the root, no member of the root group answers and no broker is "
            "attached: leaving (a later root may exist)"
        )
        self.program.terminate()
        self.exit_code = exitcodes.LOST
        self._cut = True

    def _tick(self, now: float) -> None:
        """After every batch of input: push status changes and log records, start the program,
        finish."""
        if self.exit_code is not None:
            return
        if flushed := self.services.exec.flush(now):  # exits held, last answers taken: together
            self.perform(flushed)
        if self._drop_parent:
            self._end_search()
        if self.parent is not None and self.parent.overflow is not None:
            self._uplink_news(self.parent.overflowed(now), now)
            if self.exit_code is not None:
                return
        self._send_reports(now)
        if self.services.heal.waiting:
            self.perform(self.services.heal.settle(now, self._whole()))
        status = self.services.status
        if self.table is not None and status is not None:
            self.perform(self.services.flub.unpark(now))  # key exchanges a parent waited for
            for watcher, update in status.pushes(now):
                if not self._respond(update):
                    status.forget_watcher(watcher)
            self.perform(self.services.retire.settle(now))
            if self.program.pending and not self.lifecycle.stopping and self.table.up():
                self._start_program(now)
            if self.late_hosts is not None:
                self._locate_late(now)
        if self.draining is not None and self.exit_code is None:
            self.perform(self.draining.step(now, len(self.jobs.jobs)))
        if self.exit_code is None and (pushes := self.services.dmesg.pushes(now)):
            self.perform(pushes)  # what was logged meanwhile, to its followers
        if dropped := self.local.dropped_since():  # dropped while being sent to
            self._clients_gone(dropped)
        self.local.release()  # what dropped and closed clients held, back to the system
        self._maybe_finish(now)

    def _start_program(self, now: float) -> None:
        if (failed := self.program.start()) is not None:
            self.final_code = failed  # 127 or 126, as a shell says
            self.begin_shutdown(now)

    # --- inputs -----------------------------------------------------------------------------

    def _handle_signals(self, now: float) -> None:
        for signum in self.signals.take():
            if signum == signal.SIGCHLD:
                self._reap_program()
                self.jobs.reap()
            elif signum == signal.SIGINT and self.signals.sigint_ignored:
                if not (self.table is not None and self.program.pending):
                    log.debug("ignored SIGINT")  # Ctrl-C is for the initial program
                    continue
                # Ctrl-C before the initial program started: it would never see it, so the
                # start-up is what is interrupted.
                log.info("SIGINT before the initial program started: shutting down")
                self.final_code = 128 + signal.SIGINT
                self.begin_shutdown(now)
            else:
                log.info("%s: shutting down", signal.Signals(signum).name)
                self.program.terminate()
                self.begin_shutdown(now)

    def _read_zap(self, now: float) -> None:
        assert self.children is not None
        while readable(self.children.zap.socket):
            self.children.zap.handle()

    def _read_children(self, now: float) -> bool | None:
        """Connection events and messages from children, in the order they happened; QUIET if
        that was only heartbeats from live sessions (they put off only their silences)."""
        children = self.children
        assert children is not None
        beats = not children.drain_monitor()
        if children.socket not in self._handlers:
            return None  # no hello is read before this broker's own welcome (_admit_children)
        for _ in range(BATCH):
            if not children.readable():
                settled = children.settle()
                beats = beats and not settled
                self.report(settled, now)
                break
            inbound = children.read(now)
            beats = beats and inbound.beat
            if inbound.sooner:
                self.wake()  # a child came, went or changed: its timers change too
            self.report(inbound.reports, now)  # rank 0: a deadline the table gave wakes it
            welcomed = self.parent is None or self.parent.welcomed
            for rejoin in inbound.rejoins:
                self.perform(self.services.flub.ask_rejoin(rejoin, welcomed))
            for child, message in inbound.messages:
                self.router.route(message, f"c{child}", now)
        else:
            beats = False  # more to read: the next turn's
        self._maybe_finish(now)
        return QUIET if beats and self.exit_code is None else None

    def _read_parent_monitor(self, link: ParentLink, now: float) -> None:
        assert self.parent is not None
        self._uplink_news(self.parent.monitor(link, now), now)

    def _read_parent(self, link: ParentLink, now: float) -> bool | None:
        """What the link up brought; QUIET if that was only heartbeats, answered by the link."""
        parent = self.parent
        assert parent is not None
        beats = True
        for _ in range(BATCH):  # called when the poller (or a poll) found the link readable
            if self.exit_code is not None or not parent.holds(link):
                break
            news = parent.read(link, now)
            if news is None:  # a heartbeat, answered (or nothing): what follows, if anything,
                break  # the next poll finds (it asks ZeroMQ first): no readable() asked here
            beats = False
            self._uplink_news(news, now)
            if self.exit_code is not None or not parent.holds(link) or not link.readable():
                break
        if not beats or self.exit_code is not None or not parent.holds(link) or link.overflow:
            return None  # an answer that found the link full: _tick ends the link
        # only heartbeats: the answers put this broker's own beat off, and nothing else
        # changed (idle is free: no turn's work, no asking every source; wakeup.py)
        self._wakeup.beat(now, parent.next_deadline())
        return QUIET

    def _uplink_news(self, news: UplinkNews, now: float) -> None:
        """Act on what the links up brought: a welcome, a loss, orders, messages."""
        parent = self.parent
        assert parent is not None
        if news.attached:
            self.incarnation = parent.incarnation
            if news.first:
                log.info("welcomed by the parent")
                self.perform(self.services.flub.welcomed())
                self._finalize_pmi()
                self._admit_children()
            elif self.children is not None:
                # up a new link: what the lost one carried may be lost with it (downward.py)
                self.report(self.children.census(), now)
            self.wake()  # heartbeats to the parent start now
        if news.lineage and self.children is not None:
            self.children.lineage = [*map(list, parent.lineage), self._card()]
            if not self.group.leads:  # the root's own group is what it learned itself
                self.children.group = encode_group(parent.group)
            self.children.send_lineage()
        if news.lineage and not news.first:
            # a way up that changed (this broker's, or an ancestor's: its lineage came down)
            # may have lost job output in flight: send again what no client acknowledged
            self.jobs.resend()
        if news.seeking_until is not None and self.children is not None:
            self._tell_children_seeking(news.seeking_until, now)
        if news.declined:
            log.warning("%s", news.declined)
        if news.detached:
            self._admit_members(now)
            self.perform(self.group.root_unreachable(now))
        if news.detached or news.declined:
            self.wake()
        if news.terms:
            self._term_news(news.terms)
        if news.ended is not None:
            self._cut_off(news.ended)
            return
        if news.shutdown:
            self.begin_shutdown(now)
        if news.retire is not None and self.draining is None:
            self.lifecycle.retiring = True
            self.draining = Draining(self.rank, self.incarnation, news.retire, now)
            self.perform(self.draining.begin(len(self.jobs.jobs)))
            self.wake()
        came_from = f"p{news.peer}"
        for message in news.messages:
            self.router.route(message, came_from, now)

    def _tell_children_seeking(self, until: float, now: float) -> None:
        """This broker (or its parent) seeks a parent until `until`: each child's own search,
        should this broker go, ends no later (docs/protocol.md §12.1)."""
        from tbon.overlay.links.uplink import seeking_seconds

        assert self.children is not None
        seeking = Message(Kind.CONTROL, "seeking", {"for": seeking_seconds(until, now)})
        for rank in self.children.connected():
            self.children.send(rank, seeking)

    def _watch_client(self, fd: int, writing: bool | None) -> None:
        """Poll a local client's connection for input, and for output while some waits for it
        (`writing`); None: it is closing."""
        if writing is None:
            self._unwatch(fd)
            return
        self._handlers[fd] = lambda now: self._read_local(fd, now)
        self._poller.register(fd, zmq.POLLIN | (zmq.POLLOUT if writing else 0))

    def _read_local(self, fd: int, now: float) -> None:
        """What waits for a local client, its requests, then the clients that went away (after
        what they sent, so that a client that asked for something and hung up at once is
        cleaned up after)."""
        for hop, message in self.local.read(fd):
            self.router.route(message, hop, now)
        self._clients_gone(self.local.gone())

    def _clients_gone(self, hops: list[str]) -> None:
        """Local clients that hung up or were dropped: their jobs and streams end."""
        for hop in hops:
            self.perform(self.services.exec.client_gone(hop))
            self.router.forget_client(hop)

    def _local_request(self, hop: str, message: Message) -> list[Action] | None:
        """A local client's request, before it goes on: an exec.start is remembered as its
        client's; another client's exec.signal or exec.stdin stops here (None: it goes on)."""
        if message.topic == "exec.start":
            self.services.exec.started_by(hop, message)
        elif message.topic in ("exec.stdin", "exec.signal"):
            return self.services.exec.unless_own_job(hop, message)
        return None

    def _locate_late(self, now: float) -> None:
        """Rank 0 keeps PMI open until every launched rank is online (then there is nothing to
        read), or until the wire-up goes quiet: then it reads where each broker still offline
        was started, for status to show, and finalizes (boot/latehosts.py)."""
        late, table = self.late_hosts, self.table
        assert late is not None and table is not None and self.booted.pmi is not None
        if not table.up():
            late.saw(table.generation, now)
            if not late.is_due(now):
                return
            from tbon.overlay.boot.pmi import started_on

            launched = self.booted.wireup.launched
            missing = [r for r in range(launched) if table.entry(r).host == UNKNOWN_HOST]
            try:
                found = started_on(self.booted.pmi, missing)
            except TbonError as error:
                log.warning("the hosts of ranks never online are unknown: %s", error)
                found = []
            events = [Located(r, table.entry(r).incarnation, host) for r, host in found]
            self.perform([ApplyAll(events)] if events else [])
        self.late_hosts = None
        self._finalize_pmi()

    def _finalize_pmi(self) -> None:
        if self.booted.pmi is not None:
            self.booted.pmi.finalize()
            self.booted.pmi = None

    # --- carrying out what the services ask -------------------------------------------------

    def perform(self, actions: list[Action]) -> None:
        self.performer.perform(actions)

    def shut_down(self, end_program: bool, now: float) -> None:
        if end_program:
            self.program.terminate()
        self.begin_shutdown(now)

    def leave(self, exit_code: int) -> None:
        """A retired broker: goodbye to the parent, and out."""
        assert self.parent is not None
        self._send_reports(time.monotonic(), force=True)  # what it saw goes before it
        self.parent.goodbye()
        self.exit_code = exit_code

    def wake(self) -> None:
        """Something changed what the timers wait for: recompute them on the next turn."""
        self._wakeup.recompute()

    def _respond(self, reply: Message) -> bool:
        return self.router.respond(reply)

    def report(self, events: Sequence[Event], now: float) -> None:
        """Rank-table events seen here: rank 0 applies them on its one path (rankpath.py) in one
        pass; any other broker holds them for its next report up (reports.py), which goes after
        this turn of the loop, or an interval after the last one (docs/protocol.md §5.4)."""
        if not events:
            return
        if self.path is not None:
            self.perform([ApplyAll(events)])
            return
        self.reports.add(events, now)
        # sent by this turn's _tick, or, held, at the deadline the loop then asks for

    def _send_reports(self, now: float, force: bool = False) -> None:
        """Send the reports due now (all that are held, if `force`: before a goodbye)."""
        if self.parent is None:
            return
        for batch in self.reports.take(now, force):
            self.parent.send(Message(Kind.CONTROL, "report", encode_events(batch)))

    # --- the end ----------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> None:
        """Shut this broker's subtree down, leaves first, then leave."""
        if self.lifecycle.stopping:
            return
        self.lifecycle.stopping = True
        if self.parent is not None:
            self.parent.stop(now)  # a parent lost now is not sought again
        self.stop_deadline = now + self.config.shutdown_timeout
        self.wake()
        self.jobs.kill_all(signal.SIGTERM)
        if self.children is not None:
            self.children.shutdown()
        self._maybe_finish(now)

    def _reap_program(self) -> None:
        status = self.program.exit_status()
        if status is None:
            return
        self.final_code = status
        if not self.lifecycle.stopping:
            log.info("initial program exited with status %d: shutting down", status)
            self.begin_shutdown(time.monotonic())

    def _maybe_finish(self, now: float) -> None:
        if not self.lifecycle.stopping or self.exit_code is not None:
            return
        waiting = self.children.awaited(now) if self.children is not None else []
        running = self.program.running() or self.jobs.busy()
        if (waiting or running) and self.stop_deadline is not None and now < self.stop_deadline:
            return  # children's goodbyes and the initial program's exit wake us up
        if waiting:
            log.warning("shutdown: gave up waiting for ranks %s", ",".join(map(str, waiting)))
        if self.jobs.busy():
            self.jobs.kill_all(signal.SIGKILL)
        self.program.kill()
        self._reap_program()  # its status is the instance's exit status
        if self.parent is not None:
            self._send_reports(now, force=True)  # its children's departures go before it
            self.parent.goodbye()
        if self.services.status is not None:
            self.perform(self.services.status.end())
            self.perform(self.services.retire.end())
        self.exit_code = self.final_code

    def _term_news(self, news: list[News]) -> None:
        """What the term fence learned. A later term, to a broker that led one: its member
        machine steps down (`Superseded.stale`), answering what waited for a commit; if that
        term's root is known, this broker is no root any more and exits 77 (§13.5), with a
        member or without one (K=0); with none known, it stays and follows."""
        for item in news:
            if isinstance(item, Ignored):
                log.warning("a term from the parent was ignored: %s", item.why)
                continue
            assert isinstance(item, Superseded)
            self.perform(self.group.stale(item.stale, item.root, time.monotonic()))
            if self.exit_code is not None:
                continue  # the member stepped down for its successor: _superseded
            if item.root is None or item.root == self.rank:
                log.warning("%s", item.reason)
                continue
            log.error("%s", item.reason)
            self.program.terminate()
            self.exit_code = exitcodes.REFUSED
            self._cut = True

    def _take_over(self, term: int, now: float) -> list[Action]:
        """This standby was elected root of `term` (docs/protocol.md §13.4): its replica of the
        table becomes the table, its status and table services answer from it, its term goes
        on every order, its search for the dead root ends, its children hear the new lineage,
        and the dead root's rank is marked lost through the log."""
        path = self.group.path
        assert path is not None  # a member elected holds the log, so a copy of the table
        self.terms.lead(term)
        self.table, self.path = path.table, path
        built = Services.build(
            self.services.ping.me,
            self.config,
            self.topology,
            self.table,
            self.lifecycle,
            self._whole,
            self.group,
        )
        status = built.status
        assert status is not None  # its roles: this broker the root, the others standing by
        self.services = self.services.replaced(status=status, flub=built.flub, retire=built.retire)
        self.router.handlers = self.services.handlers()
        self.router.table = self.table
        self.performer.status, self.performer.path = status, path
        self.services.heal.leads = True  # it fosters what the dead root held, siblings too
        self._drop_parent = True  # once this turn's messages are out (_tick)
        self.group.lead_with(self.parent.group if self.parent is not None else ())
        self._admit_members(now, every=True)  # while the parent link still names the cards
        if self.children is not None:
            self.children.lineage = [self._card()]
            self.children.group = encode_group(self.group.group_cards())
            self.children.seeking_for = lambda now: None
            self.children.send_lineage()
        # rank 0, or a root that took over before: the one this root's log names once applied
        # whole, entries of earlier terms not yet committed included (they are committed with
        # this term's first, before anything this root proposes; docs/protocol.md §13.4)
        from tbon.overlay.state.ranktable import root_once_applied

        dead = self.table.entry(root_once_applied(self.table, self.group.unapplied()))
        why = f"the root died; rank {self.rank} took over in term {term}"
        log.warning("%s", why)
        card = self.group.cards.get(dead.rank)  # a root's key is in its card, not the table
        if self.children is not None and card is not None:
            # the dead root may only have been stopped: woken, it asks the members whether a
            # later term exists (links/successor.py). Admitted and revoked at once, its key is
            # heard, and its hello refused 77 with this root's term (docs/protocol.md §13.5)
            until = now + self.reattach_timeout
            superseded = f"superseded: rank {self.rank} is the root in term {term}"
            self.perform(
                [
                    Foster(((dead.rank, dead.incarnation, card[2]),), until),
                    Revoke(dead.rank, dead.incarnation, superseded),
                ]
            )
        # what its children said while it had no parent goes to its table, after the dead
        # root's Lost (before it, a member fostered here would not be held by the root)
        held = [event for batch in self.reports.take(now, True) for event in batch]
        if self.parent is not None:
            held += self.parent.take_reports()
        if self.children is not None:
            held += self.children.census()
        lost = Apply(Lost(dead.rank, dead.incarnation, why, parent=self.rank))
        return [lost, ApplyAll(held)] if held else [lost]

    def _end_search(self) -> None:
        """The root that took over has no parent: its link to the dead root (still open, if
        that root was only stopped: the appends of the new term wait there for it, so that it
        learns of its successor when it wakes) is closed, its messages sent first."""
        self._drop_parent = False
        parent, self.parent = self.parent, None
        self.router.parent = None
        if parent is not None:
            parent.close(linger=True)
        self.jobs.resend()  # job output held for the dead root's link went with it

    def _superseded(self, root: int, term: int) -> None:
        """This root stepped down for another (§13.5): no root any more, it leaves with 77."""
        log.error("superseded: rank %d is the root in term %d", root, term)
        self.program.terminate()
        self.exit_code = exitcodes.REFUSED
        self._cut = True

    def _cut_off(self, ended: LinkEnded) -> None:
        """The parent link is over: leave at once, with the exit code that says why."""
        log.log(logging.INFO if ended.exit_code == 0 else logging.ERROR, "%s", ended.reason)
        self.program.terminate()
        self.exit_code = ended.exit_code
        self._cut = True

    def _close(self) -> None:
        if self.jobs.busy():
            # However this broker ends (cut off from its parent, say), its jobs end with it.
            self.jobs.kill_all(signal.SIGKILL)
            self.jobs.wait_all()
        self.jobs.close()
        self.program.wait(timeout=2)
        self.asker.close()
        self.links.close(linger=self.parent is not None and self.parent.welcomed and not self._cut)


def run_broker(config: BrokerConfig, command: list[str]) -> int:
    """Boot a broker and serve until it ends; its exit code tells a supervisor what to do."""
    setup_logging(config.log_level)
    raise_limit()  # before any socket: the caps and the reserve are reckoned from it
    context = zmq.Context()
    signals = SignalPipe(children=bool(command))  # jobs' ends come by pidfd (signals.py)
    try:
        booted = boot(config, context)
        set_log_rank(booted.wireup.rank)
        name_broker(booted.wireup.rank, booted.wireup.topology.size)  # what ps shows
        try:
            links = open_links(booted, context, time.monotonic())
        except BaseException:
            booted.close()
            raise
        try:
            broker = Broker(booted, links, command, signals)
        except BaseException:
            links.close(linger=False)
            raise
        return broker.run()
    except UsageError:
        raise  # found while booting: main() says it as any command says its usage
    except TbonError as error:
        log.error("%s", error)
        return error.exit_code
    finally:
        context.term()
        signals.close()
