"""One child incarnation as its parent knows it: its phase (expected, connected, ended) and what
rank 0 said of it. Plain data: downward.py decides every change of phase.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tbon import exitcodes
from tbon.overlay.links.hello import Broker, Standing
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.liveness import Liveness
from tbon.overlay.state.rankevents import Departed, Lost


@dataclass(frozen=True, slots=True)
class Expected:
    """Admitted; its broker has not been welcomed (yet)."""

    until: float | None = None  # a foster admission's grace: forgotten if it has not come by then


@dataclass(slots=True)
class Connected:
    """Welcomed on the connection the ledger ties it to; `routing_id` reaches it."""

    routing_id: bytes
    liveness: Liveness
    last_sent: float = float("-inf")  # when this parent last sent it anything (a heartbeat's due)


@dataclass(frozen=True, slots=True)
class Ended:
    """This incarnation is over here. `why` completes "rank R incarnation I ..."."""

    why: str  # "was lost: WHY", "has departed", "has retired", "was revoked: WHY", ...
    code: int = exitcodes.LOST  # the exit code its broker is told, should it speak again
    returnable: bool = False  # lost, and its own broker may say hello again (its key is kept)
    told: Lost | Departed | None = None  # the end this parent reported (said again in a census)


Phase = Expected | Connected | Ended


@dataclass(slots=True, eq=False)
class ChildSession:
    """Compared and hashed by identity of the object: the connection ledger holds sessions, and
    one that a newer incarnation displaced is still the one its connection's close ends."""

    identity: Identity
    phase: Phase = field(default_factory=Expected)
    key: str = ""  # its public key (Z85) as authorized here; "" for the instance's shared key
    shared: bool = False  # a config-booted rank, whose broker holds the instance's shared key
    foster: bool = False  # not a child in the topology: fostered at rank 0's word
    expected: bool = False  # rank 0 said to expect it (fostered, or a shared key coming home)
    retiring: bool = False  # told to retire: however it ends, it is retired (exit 0)
    broker: Broker | None = None  # the broker last welcomed as this incarnation (host, pid)
    parent: int | None = None  # this parent's rank, named in every event it reports

    @property
    def connected(self) -> bool:
        return isinstance(self.phase, Connected)

    @property
    def routing_id(self) -> bytes | None:
        return self.phase.routing_id if isinstance(self.phase, Connected) else None

    @property
    def ended(self) -> str:
        """Why this incarnation ended; empty while it may still connect."""
        return self.phase.why if isinstance(self.phase, Ended) else ""

    @property
    def end_code(self) -> int:
        return self.phase.code if isinstance(self.phase, Ended) else exitcodes.LOST

    @property
    def returnable(self) -> bool:
        return isinstance(self.phase, Ended) and self.phase.returnable

    @property
    def awaited_until(self) -> float | None:
        """A foster admission's grace, while its broker has not come."""
        return self.phase.until if isinstance(self.phase, Expected) and self.foster else None

    def standing(self) -> Standing:
        """What the hello judge needs of this session."""
        connected = self.connected
        return Standing(
            self.identity.incarnation,
            self.ended,
            self.end_code,
            connected,
            self.shared,
            self.broker if connected else None,
            foster=self.foster,
            expected=self.expected,
            returnable=self.returnable,
            last_broker=self.broker,
        )

    def deadline(self) -> float | None:
        """When its silence is next judged, if it is connected."""
        phase = self.phase
        return phase.liveness.deadline() if isinstance(phase, Connected) else None


class Standings(Mapping[int, Standing]):
    """The sessions' standings as the hello judge reads them, each built the first time it is
    asked for: a hello is judged on its own rank's session, so the judge's view of a parent
    costs the same with 1 child as with 1024. A view of one moment: built per judgement."""

    __slots__ = ("_built", "_sessions")

    def __init__(self, sessions: Mapping[int, ChildSession]) -> None:
        self._sessions = sessions
        self._built: dict[int, Standing] = {}

    def __getitem__(self, rank: int) -> Standing:
        standing = self._built.get(rank)
        if standing is None:
            standing = self._built[rank] = self._sessions[rank].standing()
        return standing

    def __contains__(self, rank: object) -> bool:
        return rank in self._sessions

    def __iter__(self) -> Iterator[int]:
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)


class Sessions(dict[int, ChildSession]):
    """A parent's sessions by rank, with the ranks of its foster children (`fosters`) kept as
    sessions come and go, not found by a walk: the router asks whether any child here is a
    foster child for every rank it sends to (exec's fan-out at rank 0: once per target).

    Never stale, because a session comes only by `sessions[rank] = session` and goes only by
    `del` or `pop`, each of which keeps `fosters` with it, and the dict's other ways to change
    (update, setdefault, popitem, clear, |=) are refused; a session's `foster` is set when it is
    made (downward.admit: the rank's topology parent is another broker) and never changed."""

    __slots__ = ("fosters",)

    def __init__(self) -> None:
        super().__init__()
        self.fosters: set[int] = set()

    def __setitem__(self, rank: int, session: ChildSession) -> None:
        super().__setitem__(rank, session)
        if session.foster:
            self.fosters.add(rank)
        else:
            self.fosters.discard(rank)

    def __delitem__(self, rank: int) -> None:
        super().__delitem__(rank)
        self.fosters.discard(rank)

    def pop(self, rank: int, *default: Any) -> Any:
        self.fosters.discard(rank)
        return super().pop(rank, *default)

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Sessions change only by [rank] = session, del and pop")

    update = setdefault = popitem = clear = __ior__ = _refused
