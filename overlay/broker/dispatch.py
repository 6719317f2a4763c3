"""The broker's services, and the one table that says which of them serves each topic.

To find what a broker does with a request, find its topic here. Topics in the second half need
the rank table and are served by rank 0 alone; any other rank answers them ENOSYS, as it does an
unknown topic, and never loads the module that serves them (services/status.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tbon.overlay.broker.logs import recent
from tbon.overlay.broker.router import Handler
from tbon.overlay.config.attributes import BrokerConfig
from tbon.overlay.services.actions import Action, ForgetWatches, warning
from tbon.overlay.services.attr import AttrService, describe
from tbon.overlay.services.dmesg import DmesgService
from tbon.overlay.services.exec import EXEC_TOPICS, ExecService
from tbon.overlay.services.flub import FlubService, flub_attributes
from tbon.overlay.services.group import GroupService
from tbon.overlay.services.heal import HealService
from tbon.overlay.services.lifecycle import Lifecycle
from tbon.overlay.services.ping import PingService, Whoami
from tbon.overlay.services.retire import RetireService
from tbon.overlay.state.grouptopics import TOPICS as GROUP_TOPICS
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import Message
from tbon.overlay.wire.route import client_notice, connection_of

if TYPE_CHECKING:
    from tbon.overlay.services.status import StatusService
    from tbon.overlay.state.ranktable import RankTable  # rank 0's, and a member's

ROOT_TOPICS = frozenset(
    {
        "status.get",
        "status.watch",
        "status.ack",
        "status.summary",
        "status.errors",
        "status.tree",
        "instance.shutdown",
        "flub.kex",
    }
)
"""Topics that a request without a rank sends to rank 0."""

ONE_WAY_TOPICS = frozenset(
    {
        "client.disconnect",
        "exec.stdin",
        "exec.signal",
        "exec.resend",
        "exec.taken",
        "exec.credit",
        "status.ack",
        "dmesg.ack",
        "retire.progress",
        *GROUP_TOPICS,
    }
)
"""Topics that are never answered (docs/protocol.md §7 says "none"): notices and credit that
flow beside a stream, where an answer to each would double the traffic. Every other request is
answered, a response or an error, whatever its payload (tests/test_answers.py walks them all)."""


class Services:
    """This broker's services, each built with what it needs; the topic table is `handlers`.
    A plain class, not a dataclass, for start-up time (tbon/record.py)."""

    __slots__ = (
        "attr",
        "dmesg",
        "exec",
        "flub",
        "group",
        "heal",
        "ping",
        "retire",
        "status",
        "whole",
    )

    def __init__(
        self,
        *,
        ping: PingService,
        exec: ExecService,
        flub: FlubService,
        retire: RetireService,
        dmesg: DmesgService,
        heal: HealService,
        attr: AttrService,
        status: StatusService | None,
        whole: Callable[[], bool] = lambda: True,
        group: GroupService | None = None,
    ) -> None:
        self.ping, self.exec, self.flub, self.retire = ping, exec, flub, retire
        self.dmesg, self.heal, self.attr = dmesg, heal, attr
        self.status = status  # rank 0 only
        self.whole = whole  # what heal.wait waits for (the broker knows)
        self.group = group  # the root group's member here (services/group.py)

    def replaced(self, **changes: Any) -> Services:
        """These services with some changed (at a takeover, the root's own), as
        dataclasses.replace made them."""
        return Services(**{**{name: getattr(self, name) for name in self.__slots__}, **changes})

    @staticmethod
    def build(
        me: Whoami,
        config: BrokerConfig,
        topology: Topology,
        table: RankTable | None,
        lifecycle: Lifecycle,
        whole: Callable[[], bool] = lambda: True,
        group: GroupService | None = None,
    ) -> Services:
        """Each service gets what it needs and no more: `table` is rank 0's (None elsewhere);
        `whole` says whether the tree is whole, as heal.wait sees it from this broker."""
        rank = me.rank
        card = {"endpoint": me.endpoint, "public_key": me.public_key, "hostname": me.hostname}
        attributes = flub_attributes(
            config.heartbeat, config.torpid, config.timeout, config.join_timeout, config.standbys
        )
        heal = HealService(rank, topology, card)
        status = None
        if table is not None:  # rank 0
            from tbon.overlay.services.status import StatusService
            from tbon.overlay.state.standbys import Roles

            # the broker that holds the table is the root: the rest of its group stands by
            others = () if group is None else tuple(m for m in group.members if m != rank)
            status = StatusService(table, lifecycle, Roles(rank, others))
            if group is not None:
                status.group = group.view
        return Services(
            ping=PingService(me, topology),
            exec=ExecService(rank, topology, lifecycle),
            flub=FlubService(rank, topology, table, lifecycle, card, attributes),
            retire=RetireService(rank, topology, table),
            dmesg=DmesgService(rank, recent()),
            heal=heal,
            attr=AttrService(rank, describe(me, config, topology)),
            whole=whole,
            status=status,
            group=group or GroupService(rank, topology, (), lambda: 1, 0.0, config.join_timeout),
        )

    def disconnect(self, request: Message, now: float) -> list[Action]:
        """client.disconnect: the client's jobs, log follows and status streams end, and at
        rank 0 its reservations no longer count against it. Only a notice shaped as a broker
        makes one is obeyed (client_notice, wire/route.py): a client could send one, but only about
        itself."""
        if not client_notice(request):
            sender = "/".join(connection_of(request))
            return [warning(f"ignored a client.disconnect written by a client ({sender})")]
        actions = self.exec.disconnect(request, now) + self.dmesg.disconnect(request, now)
        if self.status is not None:  # rank 0
            actions.append(ForgetWatches(tuple(request.route)))
            actions += self.flub.disconnect(request, now)
        return actions

    def handlers(self) -> dict[str, Handler]:
        """Topic -> handler, for the router."""
        table: dict[str, Handler] = {
            "broker.ping": self.ping.ping,
            "broker.info": self.ping.info,
            "client.disconnect": self.disconnect,
            **{topic: self.exec.handle for topic in EXEC_TOPICS},
            "exec.credit": self.exec.credit,
            "flub.authorize": self.flub.authorize,
            "flub.revoke": self.flub.revoke,
            "retire.order": self.retire.order,
            "dmesg.get": self.dmesg.get,
            "dmesg.follow": self.dmesg.follow,
            "dmesg.ack": self.dmesg.ack,
            "dmesg.clear": self.dmesg.clear,
            "attr.get": self.attr.get,
            "attr.list": self.attr.list,
            "heal.foster": self.heal.foster,
            "heal.adopt": self.heal.adopt,
            "heal.withdraw": self.heal.withdraw,
            "heal.home": self.heal.home,
            "heal.wait": lambda request, now: self.heal.wait(request, now, self.whole()),
        }
        if self.group is not None:
            table |= {topic: self.group.receive for topic in GROUP_TOPICS}
            table["group.state"] = self.group.state
        if self.status is not None:  # rank 0: these need the rank table
            table |= {
                "status.get": self.status.get,
                "status.watch": self.status.watch,
                "status.ack": self.status.ack,
                "status.summary": self.status.summary,
                "status.errors": self.status.errors,
                "status.tree": self.status.tree,
                "instance.shutdown": self.ping.shutdown,
                "flub.allocate": self.flub.allocate,
                "flub.challenge": self.flub.challenge,
                "flub.kex": self.flub.kex,
                "flub.release": self.flub.release,
                "config.rejoin": self.flub.rejoin,
                "retire.rank": self.retire.retire_rank,
                "retire.progress": self.retire.progress,
            }
        return table
