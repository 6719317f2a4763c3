"""The state of a rank: the six that `tbon status` shows, the finer ones rank 0 keeps, the entry
that holds one rank's state, and the subtree roll-up.

The public states and subtree statuses are a contract (docs/design.md): scripts read them. The
rank table needs finer distinctions than those six, for instance whether an offline rank belongs
to its host in a config file or was launched by PMI, or whether a vacant rank was retired. Each of
those is a `Phase` of its own, and `PUBLIC` is the one mapping from a phase to what status shows.
ranktable.py says how a rank moves between phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from tbon.overlay.state.topology import Topology


class RankState(StrEnum):
    """What `tbon status` shows for a rank (docs/design.md): never rename or add one lightly."""

    ONLINE = "online"
    OFFLINE = "offline"
    RESERVED = "reserved"
    RETIRING = "retiring"
    LOST = "lost"
    VACANT = "vacant"


class SubtreeStatus(StrEnum):
    """A rank's subtree rolled up as Flux does: lost below beats short below."""

    FULL = "full"
    PARTIAL = "partial"
    DEGRADED = "degraded"
    LOST = "lost"
    OFFLINE = "offline"


CONNECTED = frozenset({RankState.ONLINE, RankState.RETIRING})
"""States whose broker holds a live connection to its parent."""

ALLOCATABLE = (RankState.VACANT, RankState.LOST)
"""States FLUB may hand to a joining broker (docs/design.md); the table's Reserve rows agree."""


class Phase(Enum):
    """The state rank 0 keeps for a rank: a public state, refined by who holds the rank.

    An *open* rank is filled by whichever broker bootstrap (PMI) or FLUB gives it to; a
    *config* rank belongs to its host in the config file, which alone may run its broker. The
    values are for logs and tests only; status shows `PUBLIC[phase]`.
    """

    LAUNCHED = "launched"  # open, offline: started by bootstrap, its hello is awaited
    RESERVED = "reserved"  # open: FLUB gave it to a joiner's key, until hello or lease end
    ONLINE = "online"  # open: its broker is connected
    RETIRING = "retiring"  # open: its broker is being drained by `tbon retire`
    LOST = "lost"  # open: its broker failed; FLUB may give the rank to another
    VACANT = "vacant"  # open: a spare, a clean goodbye, or a lapsed reservation
    RETIRED = "retired"  # vacant for good for its broker: the key that held it is barred
    CONFIG_BOOTING = "config-booting"  # config, offline: this incarnation not yet online
    CONFIG_DOWN = "config-down"  # config, offline: this incarnation was online, its broker went
    CONFIG_ONLINE = "config-online"  # config: its host's broker is connected
    CONFIG_RETIRING = "config-retiring"  # config: its host's broker is being drained
    CONFIG_LOST = "config-lost"  # config: its broker died while retiring; FLUB may refill it


PUBLIC: dict[Phase, RankState] = {
    Phase.LAUNCHED: RankState.OFFLINE,
    Phase.RESERVED: RankState.RESERVED,
    Phase.ONLINE: RankState.ONLINE,
    Phase.RETIRING: RankState.RETIRING,
    Phase.LOST: RankState.LOST,
    Phase.VACANT: RankState.VACANT,
    Phase.RETIRED: RankState.VACANT,
    Phase.CONFIG_BOOTING: RankState.OFFLINE,
    Phase.CONFIG_DOWN: RankState.OFFLINE,
    Phase.CONFIG_ONLINE: RankState.ONLINE,
    Phase.CONFIG_RETIRING: RankState.RETIRING,
    Phase.CONFIG_LOST: RankState.LOST,
}
"""The one mapping from what the table keeps to what status shows."""

CONFIG_PHASES = frozenset(
    {
        Phase.CONFIG_BOOTING,
        Phase.CONFIG_DOWN,
        Phase.CONFIG_ONLINE,
        Phase.CONFIG_RETIRING,
        Phase.CONFIG_LOST,
    }
)
"""The phases of a rank that belongs to its host in the config file."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A reservation's terms: when it lapses, and the host to show again if it does."""

    until: float
    host_before: str


@dataclass(slots=True)
class RankEntry:
    """One rank as rank 0 knows it. Its state is the phase; the fields are that phase's data,
    and the properties give callers the public view without exposing the phase."""

    rank: int
    phase: Phase
    incarnation: int
    host: str
    pid: int | None
    since: float  # when the rank entered its phase
    torpid: bool = False
    key: str | None = None  # the key FLUB last reserved the rank for: kept, to know who holds it
    lease: Lease | None = None  # while reserved, and only then

    @property
    def state(self) -> RankState:
        """The public state: what status shows and callers compare."""
        return PUBLIC[self.phase]

    @property
    def lease_until(self) -> float | None:
        return self.lease.until if self.lease is not None else None

    @property
    def joiner(self) -> str | None:
        """The key a reservation awaits, while the rank is reserved."""
        return self.key if self.phase is Phase.RESERVED else None

    @property
    def retired(self) -> bool:
        return self.phase is Phase.RETIRED


def roll_up(topology: Topology, states: list[RankState]) -> list[SubtreeStatus]:
    """Each rank's subtree status, rolled up from the leaves as Flux does: in the tree's
    post-order, since a config file's tree may number a parent after its child.

    Lost beats partial."""
    statuses: list[SubtreeStatus] = [SubtreeStatus.FULL] * topology.size
    below_lost = [False] * topology.size
    below_short = [False] * topology.size
    for rank in topology.postorder():
        state = states[rank]
        if state is RankState.LOST:
            statuses[rank] = SubtreeStatus.LOST
        elif state not in CONNECTED:
            statuses[rank] = SubtreeStatus.OFFLINE
        elif below_lost[rank]:
            statuses[rank] = SubtreeStatus.DEGRADED
        elif below_short[rank] or state is RankState.RETIRING:
            statuses[rank] = SubtreeStatus.PARTIAL
        parent = topology.parent(rank)
        if parent is not None:
            below_lost[parent] |= state is RankState.LOST or below_lost[rank]
            below_short[parent] |= state is not RankState.ONLINE or below_short[rank]
    return statuses
