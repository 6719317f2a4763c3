"""What moves a rank in the rank table, and what the table answers.

Events are small frozen records of something a broker saw or asked for (dask's stimuli). Each
names its rank (Reserve: the one it asks for, or None) and, but for Reserve and Reboot, the
incarnation it speaks of. ranktable.py holds the rules that decide them, and re-exports every
name here. A broker that holds no table (all but the root and its standbys) imports them from
here, so that it never loads the table's rules (tests/test_broker_imports.py).
"""

from __future__ import annotations

from tbon.record import Record


class Online(Record):
    """A parent welcomed this rank's broker (its hello was accepted). `parent` is the broker that
    welcomed it, which its link goes to from now on: its topology parent, or a foster parent
    (None: its topology parent). `key` is the broker's public key (Z85), which a foster parent
    is told to admit should its parent go; "" for the instance's shared key (config bootstrap)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "host", "pid", "parent", "key")

    def __init__(
        self,
        rank: int,
        incarnation: int,
        host: str,
        pid: int,
        parent: int | None = None,
        key: str = "",
    ) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.host = host
        self.pid = pid
        self.parent = parent
        self.key = key


class Lost(Record):
    """A parent saw this rank's broker go: its connection dropped or it fell silent. Rank 0
    decides it itself of a broker that lost its parent and did not reattach in time."""

    __slots__ = __match_args__ = ("rank", "incarnation", "reason", "parent")

    def __init__(self, rank: int, incarnation: int, reason: str, parent: int | None = None) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.reason = reason
        self.parent = parent  # the broker that saw it go (None: rank 0 decided it)


class Departed(Record):
    """This rank's broker said goodbye: a clean exit."""

    __slots__ = __match_args__ = ("rank", "incarnation", "parent")

    def __init__(self, rank: int, incarnation: int, parent: int | None = None) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.parent = parent  # the broker it said goodbye to


class Torpid(Record):
    """This rank's broker is connected but has been silent past tbon.torpid (or spoke again)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "torpid", "parent")

    def __init__(
        self, rank: int, incarnation: int, torpid: bool, parent: int | None = None
    ) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.torpid = torpid
        self.parent = parent  # the broker that judged it


class Moved(Record):
    """This rank's broker left the link to `parent` for the one to `to` (it went home, or two
    ancestors welcomed it while it sought one and it kept the other). Its new parent reports an
    Online of its own; this says the old link is over, in whatever order the two arrive."""

    __slots__ = __match_args__ = ("rank", "incarnation", "parent", "to")

    def __init__(self, rank: int, incarnation: int, parent: int | None, to: int) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.parent = parent
        self.to = to


class Dropped(Record):
    """This rank's broker saw its connection to `gone`, the parent it was attached by, drop, and
    was welcomed by another ancestor since: it says so through its new parent, once there. The
    rank's own word on its own link (`parent` is the rank itself, the broker that saw it); rank
    0 believes it about `gone` only while no broker holds a link to `gone` (ranktable.py)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "gone", "reason", "parent")

    def __init__(self, rank: int, incarnation: int, gone: int, reason: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.gone = gone
        self.reason = reason
        self.parent = rank  # the broker that saw it: this rank's own


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


UNKNOWN_HOST = "unknown"
"""The host of a launched rank whose broker has not come online yet, until bootstrap says (Located):
rank 0 learns each host from the rank's Online, not by asking PMI for them all at the start."""


class Located(Record):
    """Bootstrap says where a launched rank's broker was started: rank 0 asks PMI only for the
    ranks whose broker never came online (an Online brings its own host)."""

    __slots__ = __match_args__ = ("rank", "incarnation", "host")

    def __init__(self, rank: int, incarnation: int, host: str) -> None:
        self.rank = rank
        self.incarnation = incarnation
        self.host = host


Event = (
    Online
    | Lost
    | Departed
    | Torpid
    | Moved
    | Dropped
    | Expire
    | Release
    | Retire
    | Reboot
    | Void
    | Located
)
"""What brokers report about a rank (they travel up the tree to rank 0), and what rank 0 decides
itself (Expire, Release, Retire, Reboot, Void, Located)."""


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


class Outcome(Record):
    """What an event did: `changed` lists every rank whose entry changed (empty if refused).
    For Reserve, `reservation` is the answer to give the joiner; None for other events. A record,
    not a frozen dataclass: one is made for every event rank 0 decides, and a frozen dataclass
    costs microseconds to make (each field set through object.__setattr__)."""

    __slots__ = __match_args__ = ("applied", "changed", "reason", "reservation")

    def __init__(
        self,
        applied: bool,
        changed: tuple[int, ...] = (),
        reason: str = "",
        reservation: Reservation | None = None,
    ) -> None:
        self.applied = applied
        self.changed = changed
        self.reason = reason
        self.reservation = reservation
