"""The term fence of one broker (docs/protocol.md §13.3): which orders of the root it obeys, and
what it tells its broker when it learns that a later root exists. Plain state, no I/O: a term in,
a verdict or news out. The adapters are the router (requests), the uplink (a parent's controls)
and the children's side (what this broker stamps on its own welcomes and orders).

Rules.
- Every broker keeps the highest term it has seen (`TermFence`) and the root of that term
  where it knows it. Orders, welcomes and lineages raise it; nothing lowers it.
- An order (a request from the root, or a parent's `retire` or `shutdown`) of a term below the
  fence is refused, ESTALE: `stale term T: rank R is the root in term T'` (`term T' is under way`
  when the root of T' is not known here). Of the fence's term or a later one it is obeyed, and a
  later one raises the fence.
- A request order names the broker that sent it (its route: services/trust.py). It is obeyed only
  from the root of its term: rank 0 for the first term, the fence's root for the fence's term
  (learned from a welcome, a lineage or that term's first order); from any other broker it is
  refused, EPERM: `not from the root: rank R is the root in term T`. The first order of a later
  term than the fence names that term's root (a new root's order may come before its lineage).
- A message without a term is of term 1: every broker before the term was added to the protocol
  runs in an instance whose root never changes, and that root leads term 1 (§9).
- A term is an integer from 1 to MAX_TERM. Anything else in the header (negative, 0, huge, a
  string, a float, a boolean) is not a term: an order carrying it is refused (EINVAL) and never
  obeyed; a welcome or lineage carrying it is taken without it (the fence is not moved).
- A broker that leads a term (the root: rank 0 leads term 1 at the instance's start) and hears of
  a later one (a raised fence, or an ESTALE answer to one of its orders that names one) is told
  `Superseded`, once per news: a `StaleTerm` (the stimulus of leadership.py's member machine)
  and the root of that term if known. The broker with no member machine leaves (77) when the root
  is known (§13.5).
"""

from __future__ import annotations

import errno

from tbon.overlay.parse.numbers import is_int
from tbon.record import Record

MAX_TERM = 2**63 - 1
"""The highest term a broker accepts: a leadership a second, for longer than the age of the
universe, stays far below it, and a larger number is a bug or an attack, not a term."""

TERMED_CONTROLS = frozenset({"welcome", "lineage", "retire", "shutdown", "refuse"})
"""The control messages a parent stamps with its term: `retire` and `shutdown` are orders (the
root's, passed down), fenced by the child; a welcome and a lineage only raise its fence; a
`refuse` tells a former root that asks the root group whether a later term exists (§13.5)."""

UNTERMED = 1
"""The term of a message without one (an older broker's): its instance has only the first."""


class TermFence:
    """The highest term this broker has seen: an order of a lower term is refused."""

    def __init__(self) -> None:
        self.term = 0

    def admit(self, term: int) -> bool:
        if term < self.term:
            return False
        self.term = term
        return True


class StaleTerm(Record):
    """What the fence tells a member machine that leads a term (leadership.py's stimulus): a
    broker knows `term`, a later one (it refused an order of this member's, or the fence rose)."""

    __slots__ = __match_args__ = ("term",)

    def __init__(self, term: int) -> None:
        self.term = term


class BadTerm(ValueError):
    """A header `term` that is not an integer from 1 to MAX_TERM."""


def read_term(raw: object) -> int:
    """The term a header carried (`None`: absent, so term 1), or BadTerm saying why not."""
    if raw is None:
        return UNTERMED
    if not is_int(raw) or not 1 <= raw <= MAX_TERM:
        shown = repr(raw) if len(repr(raw)) <= 24 else repr(raw)[:21] + "..."
        raise BadTerm(f"bad term {shown}: a term is an integer from 1 to {MAX_TERM}")
    return raw


class Obey(Record):
    """The order is of the fence's term or a later one: carry it out."""

    __slots__ = ()


class Refuse(Record):
    """The order is not obeyed: answer (where the order can be answered) `errnum`, `errstr`.
    `term` and `root`: what this broker knows (on ESTALE), for its sender to learn from."""

    __slots__ = __match_args__ = ("errnum", "errstr", "term", "root")

    def __init__(
        self, errnum: int, errstr: str, term: int | None = None, root: int | None = None
    ) -> None:
        self.errnum, self.errstr, self.term, self.root = errnum, errstr, term, root


class Ignored(Record):
    """A welcome's or lineage's term that is not a term: said in the log, the fence unmoved."""

    __slots__ = __match_args__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class Superseded(Record):
    """This broker led a term and a later one exists: `stale` for its member machine, `root` the
    later term's root if known (then it is no root any more: §13.5)."""

    __slots__ = __match_args__ = ("stale", "root")

    def __init__(self, stale: StaleTerm, root: int | None) -> None:
        self.stale, self.root = stale, root

    @property
    def reason(self) -> str:
        if self.root is None:
            return f"term {self.stale.term} is under way: this broker no longer leads"
        return f"superseded: rank {self.root} is the root in term {self.stale.term}"


Verdict = Obey | Refuse
News = Superseded | Ignored


class Terms:
    """One broker's fence, shared by its router and links; `term` is what it stamps on its own
    orders, welcomes and lineages (the takeover raises it with `lead`)."""

    def __init__(self, rank: int, leading: bool) -> None:
        """`leading`: this broker is the root of term 1 (rank 0 at the instance's start)."""
        self.rank = rank
        self.fence = TermFence()
        self.root: int | None = None  # the root of `fence.term`, where known
        self.led: int | None = None  # the term this broker leads (or led), if any
        self._told: tuple[int, int | None] | None = None  # the last Superseded given
        if leading:
            self.lead(UNTERMED)

    @property
    def term(self) -> int:
        """The term this broker stamps: its fence's (a broker not yet welcomed: the first)."""
        return max(self.fence.term, UNTERMED)

    def lead(self, term: int) -> None:
        """This broker is the root of `term` (at start, or once elected)."""
        self.fence.admit(term)
        self.root, self.led, self._told = self.rank, term, None

    def order(self, raw: object, sender: int | None) -> tuple[Verdict, list[News]]:
        """An order carrying header term `raw`, from the root `sender` (None: a parent's control,
        whose root is not named)."""
        try:
            term = read_term(raw)
        except BadTerm as error:
            return Refuse(errno.EINVAL, str(error)), []
        if term < self.fence.term:
            known = self.fence.term
            who = (
                f"term {known} is under way"
                if self.root is None
                else f"rank {self.root} is the root in term {known}"
            )
            return Refuse(errno.ESTALE, f"stale term {term}: {who}", known, self.root), []
        root = self.root_of(term)
        if sender is not None and root is not None and sender != root:
            why = f"not from the root: rank {root} is the root in term {term}"
            return Refuse(errno.EPERM, why), []
        return Obey(), self._raise(term, sender)

    def root_of(self, term: int) -> int | None:
        """The root of `term` (not below the fence) as this broker knows it: the fence's root
        for the fence's term, rank 0 for the first term (it leads it from the start), else None:
        a later term not heard of yet, whose first order names its root."""
        if term == self.fence.term and self.root is not None:
            return self.root
        return 0 if term == UNTERMED else None

    def heard(self, raw: object, root: int | None) -> list[News]:
        """A welcome, a lineage or an ESTALE answer carrying term `raw`, whose root is `root`
        where the message names it."""
        try:
            term = read_term(raw)
        except BadTerm as error:
            return [Ignored(str(error))]
        return self._raise(term, root)

    def _raise(self, term: int, root: int | None) -> list[News]:
        if term > self.fence.term or (term == self.fence.term and self.root is None):
            self.root = root  # the root of a later term, or of this one first named
        self.fence.admit(max(term, self.fence.term))
        return self._superseded()

    def _superseded(self) -> list[News]:
        """News for a broker that led a term, once per (later term, root) it learns."""
        if self.led is None or self.fence.term <= self.led:
            return []
        news = (self.fence.term, self.root)
        if news == self._told:
            return []
        self._told = news
        return [Superseded(StaleTerm(self.fence.term), self.root)]
