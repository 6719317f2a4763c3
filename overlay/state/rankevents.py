"""What moves a rank in the rank table, and what the table answers.

Events are small frozen records of something a broker saw or asked for (dask's stimuli). Each
names its rank (Reserve: the one it asks for, or None) and, but for Reserve and Reboot, the
incarnation it speaks of. ranktable.py holds the rules that decide them, and re-exports every
name here: callers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass

from tbon.record import Record


class Online(Record):
    """A parent welcomed this rank's broker (its hello was accepted)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "host", "pid")

    def __init__(self, rank: int, incarnation: int, host: str, pid: int) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.host = host
        self.pid = pid


class Lost(Record):
    """A parent saw this rank's broker go: its connection dropped or it fell silent."""

    __slots__ = __match_args__ = ("rank", "incarnation", "reason")

    def __init__(self, rank: int, incarnation: int, reason: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.reason = reason


class Departed(Record):
    """This rank's broker said goodbye: a clean exit."""

    __slots__ = __match_args__ = ("rank", "incarnation")

    def __init__(self, rank: int, incarnation: int) -> None:
        self.rank = rank
        self.incarnation = incarnation


class Torpid(Record):
    """This rank's broker is connected but has been silent past tbon.torpid (or spoke again)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "torpid")

    def __init__(self, rank: int, incarnation: int, torpid: bool) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.torpid = torpid


class Retire(Record):
    """`tbon retire` begins for this incarnation: it is drained, then leaves (as Departed)."""

    __slots__ = __match_args__ = ("rank", "incarnation")

    def __init__(self, rank: int, incarnation: int) -> None:
        self.rank = rank
        self.incarnation = incarnation


class Expire(Record):
    """A reservation's lease (broker.join-timeout) ran out before its joiner said hello."""

    __slots__ = __match_args__ = ("rank", "incarnation")

    def __init__(self, rank: int, incarnation: int) -> None:
        self.rank = rank
        self.incarnation = incarnation


class Release(Record):
    """A joiner that failed before its hello gives its reservation back, for `public_key`."""

    __slots__ = __match_args__ = ("rank", "incarnation", "public_key")

    def __init__(self, rank: int, incarnation: int, public_key: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.public_key = public_key


class Void(Record):
    """Rank 0 has the parent cut this incarnation off (`flub.revoke`), which the parent does not
    report: if the table still shows it connected, it ends here."""

    __slots__ = __match_args__ = ("rank", "incarnation", "reason")

    def __init__(self, rank: int, incarnation: int, reason: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.reason = reason


class Reboot(Record):
    """A config-booted rank's broker was restarted on its host: the rank takes a new
    incarnation (the ended one is `incarnation`) and stays offline until it is welcomed."""

    __slots__ = __match_args__ = ("rank", "incarnation")

    def __init__(self, rank: int, incarnation: int) -> None:
        self.rank = rank
        self.incarnation = incarnation


Event = Online | Lost | Departed | Torpid | Expire | Release | Retire | Reboot | Void
"""What brokers report about a rank (they travel up the tree to rank 0), and what rank 0 decides
itself (Expire, Release, Retire, Reboot, Void)."""


class Reserve(Record):
    """A joining broker asks for a rank (FLUB): a specific one, or None for any available."""

    __slots__ = __match_args__ = ("public_key", "host", "rank", "lease")

    def __init__(self, public_key: str, host: str, rank: int | None, lease: float) -> None:
        self.public_key = public_key
        self.host = host
        self.rank = rank
        self.lease = lease


class Reservation(Record):
    """The answer to Reserve: a rank and its new incarnation, or why there is none."""

    __slots__ = __match_args__ = ("granted", "rank", "incarnation", "reason", "repeated", "never")

    def __init__(
        self,
        granted: bool,
        rank: int = -1,
        incarnation: int = 0,
        reason: str = "",
        repeated: bool = False,
        never: bool = False,
    ) -> None:
        self.granted = granted
        self.rank = rank
        self.incarnation = incarnation
        self.reason = reason
        self.repeated = repeated  # the same key asked before and gets the same reservation
        self.never = never  # this key may never have a rank: its broker was retired


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an event did: `changed` lists every rank whose entry changed (empty if refused).
    For Reserve, `reservation` is the answer to give the joiner; None for other events."""

    applied: bool
    changed: tuple[int, ...] = ()
    reason: str = ""
    reservation: Reservation | None = None
