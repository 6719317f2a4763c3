"""What moves a rank in the rank table, and what the table answers.

Events are small frozen records of something a broker saw or asked for (dask's stimuli). Each
names its rank (Reserve: the one it asks for, or None) and, but for Reserve and Reboot, the
incarnation it speaks of. ranktable.py holds the rules that decide them, and re-exports every
name here: callers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Online:
    """A parent welcomed this rank's broker (its hello was accepted)."""

    rank: int
    incarnation: int
    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class Lost:
    """A parent saw this rank's broker go: its connection dropped or it fell silent."""

    rank: int
    incarnation: int
    reason: str


@dataclass(frozen=True, slots=True)
class Departed:
    """This rank's broker said goodbye: a clean exit."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Torpid:
    """This rank's broker is connected but has been silent past tbon.torpid (or spoke again)."""

    rank: int
    incarnation: int
    torpid: bool


@dataclass(frozen=True, slots=True)
class Retire:
    """`tbon retire` begins for this incarnation: it is drained, then leaves (as Departed)."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Expire:
    """A reservation's lease (broker.join-timeout) ran out before its joiner said hello."""

    rank: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Reboot:
    """A config-booted rank's broker was restarted on its host: the rank takes a new
    incarnation (the ended one is `incarnation`) and stays offline until it is welcomed."""

    rank: int
    incarnation: int


Event = Online | Lost | Departed | Torpid | Expire | Retire | Reboot
"""What brokers report about a rank (they travel up the tree to rank 0)."""


@dataclass(frozen=True, slots=True)
class Reserve:
    """A joining broker asks for a rank (FLUB): a specific one, or None for any available."""

    public_key: str
    host: str
    rank: int | None
    lease: float


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer to Reserve: a rank and its new incarnation, or why there is none."""

    granted: bool
    rank: int = -1
    incarnation: int = 0
    reason: str = ""
    repeated: bool = False  # the same key asked before and gets the same reservation
    never: bool = False  # this key may never have a rank: its broker was retired


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an event did: `changed` lists every rank whose entry changed (empty if refused).
    For Reserve, `reservation` is the answer to give the joiner; None for other events."""

    applied: bool
    changed: tuple[int, ...] = ()
    reason: str = ""
    reservation: Reservation | None = None
