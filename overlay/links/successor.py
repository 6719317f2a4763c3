"""Whether a root that stepped down has a successor: it asks the root group (docs/protocol.md
§13.5). Pure: the clock, and which links ended, in; links to open and close out.

Why. A root stopped past tbon.timeout among sibling standbys (`kary:N`) is woken with no link to
any member: each dropped its link when the root fell silent, and they elected another over links
of their own. Nothing dials a root, so it would never hear of the later term. Once it has stepped
down (its lease lapsed) with no parent and no broker attached (`alone`), it says hello to each
member whose card it holds, as a child would. A member that took over from it admitted its key
at the takeover and revoked it at once, so that this hello is heard and refused (77); every
refusal carries its sender's term and the root of that term (§5.1). What a refusal or a welcome
says of the term goes to the broker's term fence, which tells a broker that led a term of a later
one with a root: it leaves superseded (77), by the path every later term takes (§13.3). A member
that never admitted its key refuses it at the handshake, which says nothing: asked again later,
since the takeover may come after the wake.

Rules.
- Asking runs while the broker says it is `alone` (at each `tick`), never otherwise: a root that
  has a broker attached hears of a successor there. No longer alone, every link is closed.
- Each member but this broker is asked on one link at a time, in rank order; a link that ended
  (answered, refused, dropped, silent) is closed and its member asked again after RETRY_AFTER.
- Answers are judged by the term fence, not here (`learned` reads what one says).
"""

from __future__ import annotations

from tbon.overlay.links.cards import Card
from tbon.overlay.parse.numbers import is_int
from tbon.record import Record

RETRY_AFTER = 0.5
"""Seconds before a member whose link ended is asked again: a takeover may come after the wake,
and a key refused is no news; not faster, since each attempt is a CURVE handshake the member
logs as a refused key."""


class Ask(Record):
    """Open a link to the member of `card` and say hello on it."""

    __slots__ = __match_args__ = ("card",)

    def __init__(self, card: Card) -> None:
        self.card = card


class Hang(Record):
    """Close the link to member `rank`."""

    __slots__ = __match_args__ = ("rank",)

    def __init__(self, rank: int) -> None:
        self.rank = rank


Instruction = Ask | Hang


class Asking:
    """The links a stepped-down root holds to the members, and when each is asked again."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.asking: set[int] = set()  # members with a link open
        self.again: dict[int, float] = {}  # member -> asked again from then on

    def tick(self, alone: bool, cards: tuple[Card, ...], now: float) -> list[Instruction]:
        """The broker's state now: ask every member not being asked (or due again) if `alone`,
        else close every link."""
        if not alone:
            out: list[Instruction] = [Hang(rank) for rank in sorted(self.asking)]
            self.asking.clear()
            self.again.clear()
            return out
        asks: list[Instruction] = []
        for card in sorted(cards):
            rank = card[0]
            if rank == self.rank or rank in self.asking or self.again.get(rank, now) > now:
                continue
            self.asking.add(rank)
            self.again.pop(rank, None)
            asks.append(Ask(card))
        return asks

    def ended(self, rank: int, now: float) -> list[Instruction]:
        """The link to `rank` is over (an answer read, a refusal, a drop, silence)."""
        if rank not in self.asking:
            return []
        self.asking.discard(rank)
        self.again[rank] = now + RETRY_AFTER
        return [Hang(rank)]

    def next_deadline(self) -> float | None:
        return min(self.again.values(), default=None)


def named_root(value: object) -> int | None:
    """The root a refusal names (payload `root`), if it is a rank at all."""
    return value if is_int(value) and value >= 0 else None
