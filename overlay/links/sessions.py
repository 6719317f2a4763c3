"""One child incarnation as its parent knows it: where to reach it, how alive it is, how it ended.

Pure: the parent's socket layer (children.py) owns the ROUTER, the keys and the connections, and
asks the session what a goodbye, a drop or a silence makes of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tbon import exitcodes
from tbon.overlay.links.hello import Broker, Standing
from tbon.overlay.links.keyring import Identity
from tbon.overlay.links.liveness import Liveness, Verdict
from tbon.overlay.state.ranktable import Departed, Event, Lost, Torpid

log = logging.getLogger("tbon.children")


@dataclass(slots=True, eq=False)
class ChildSession:
    """Compared and hashed by identity of the object: the connection ledger holds sessions, and
    one that a newer incarnation displaced is still the one its connection's close ends."""

    identity: Identity
    routing_id: bytes | None = None
    liveness: Liveness | None = None
    ended: str = ""  # why this incarnation ended; empty while it may still connect
    end_code: int = exitcodes.LOST  # the exit code its broker is told, should it speak again
    retiring: bool = False  # told to retire: however it ends, it is retired (exit 0)
    shared: bool = False  # a config-booted rank, whose broker holds the instance's shared key
    broker: Broker | None = None  # the broker last welcomed as this incarnation (host, pid)
    parent: int | None = None  # this parent's rank, named in every event it reports
    key: str = ""  # its public key (Z85) as authorized here; "" for the instance's shared key
    foster: bool = False  # not a child in the topology: fostered at rank 0's word
    expected: bool = False  # rank 0 said to expect it (fostered, or coming home)
    expected_until: float | None = None  # a foster child that has not come by then is forgotten
    returnable: bool = False  # lost, and its own broker may say hello again (its key is kept)

    @property
    def connected(self) -> bool:
        return self.routing_id is not None and not self.ended

    def standing(self) -> Standing:
        """What the hello judge needs of this session."""
        incarnation, connected = self.identity.incarnation, self.connected
        broker = self.broker if connected else None
        return Standing(
            incarnation,
            self.ended,
            self.end_code,
            connected,
            self.shared,
            broker,
            foster=self.foster,
            expected=self.expected,
            returnable=self.returnable,
            last_broker=self.broker,
        )

    def end(self, how: str, why: str) -> Event:
        """End this incarnation ("lost" or "departed") and say so. One that was retiring is
        retired whichever way it went: should it speak again, it is told so and exits 0."""
        identity = self.identity
        self.ended = f"was {how}: {why}" if how == "lost" else f"has {how}"
        self.returnable = how == "lost" and not self.retiring and not self.shared
        if self.retiring:
            self.ended, self.end_code = "has retired", exitcodes.SHUTDOWN
        if how == "lost":
            log.warning("rank %d lost: %s", identity.rank, why)
            return Lost(identity.rank, identity.incarnation, why, self.parent)
        log.info("rank %d %s", identity.rank, "retired" if self.retiring else "departed")
        return Departed(identity.rank, identity.incarnation, self.parent)

    def judge_silence(self, now: float) -> Event | None:
        """What its silence at `now` makes it: torpid, lost (and so ended), or nothing new."""
        if not self.connected or self.liveness is None:
            return None
        verdict = self.liveness.check(now)
        if verdict is Verdict.TORPID:
            log.warning("rank %d is torpid", self.identity.rank)
            return Torpid(self.identity.rank, self.identity.incarnation, True, self.parent)
        if verdict is Verdict.LOST:
            return self.end("lost", f"silent for {now - self.liveness.last_heard:.1f}s")
        return None

    def deadline(self) -> float | None:
        """When its silence is next judged, if it is connected."""
        if not self.connected or self.liveness is None:
            return None
        return self.liveness.deadline()
