"""Rank 0's open challenges: who may use a reservation from a connection it was not granted on
(docs/flub.md §5, "A restarted joiner").

A public key is no secret, so a reservation is used (`flub.kex`, `flub.release`) by the client
connection it was granted on, or by one that proves it holds the key's secret half: it asks for a
challenge (`flub.challenge`) and answers it in its request (keys/proof.py). The rules:

- A challenge is issued to one connection for one reservation (rank, incarnation, key), and
  lives CHALLENGE_LIFE seconds. A connection has at most one open per rank (a new one replaces
  it) and at most PER_CONNECTION in all (the oldest goes), so what a client can make rank 0 keep
  is bounded; a closed connection's challenges go with it.
- An answer is taken once: the challenge it answers is gone afterwards, whether it held or not,
  so a proof cannot be replayed, nor the same challenge guessed at twice.
- It holds only on the connection the challenge was issued to, for the very reservation the
  challenge named, before the challenge expires, and if its box opens to the statement with the
  key the reservation names.

A plain object: the time comes in, the randomness comes from `fresh` (a test passes its own).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from tbon.keys.cert import fingerprint
from tbon.keys.proof import Challenge, check, new_challenge, statement
from tbon.record import Record

CHALLENGE_LIFE = 10.0
"""Seconds a challenge may be answered in. A joiner answers at once, from its own memory: the
life covers two trips through a loaded boot server."""
PER_CONNECTION = 4
"""Open challenges one connection may have (a joiner needs one)."""

Connection = Hashable


class Issued(Record):
    """A challenge rank 0 keeps: to whom, for which reservation, until when."""

    __slots__ = __match_args__ = ("connection", "rank", "incarnation", "key", "until", "challenge")

    def __init__(
        self,
        connection: Connection,
        rank: int,
        incarnation: int,
        key: str,
        until: float,
        challenge: Challenge,
    ) -> None:
        self.connection, self.rank, self.incarnation = connection, rank, incarnation
        self.key, self.until, self.challenge = key, until, challenge


class Refused(Record):
    """Why an answer does not let its connection use the reservation. `expired`: a fresh
    challenge answered at once would do (a supervisor may try again); otherwise the answer
    was not made with the key's secret half, or not for this reservation."""

    __slots__ = __match_args__ = ("why", "expired")

    def __init__(self, why: str, expired: bool = False) -> None:
        self.why, self.expired = why, expired


class Challenges:
    """The open challenges, by connection and rank."""

    def __init__(self, fresh: Callable[[], Challenge] = new_challenge) -> None:
        self.fresh = fresh
        self.open: dict[tuple[Connection, int], Issued] = {}

    def issue(
        self, connection: Connection, rank: int, incarnation: int, key: str, now: float
    ) -> Issued:
        """A new challenge for `connection` to prove it holds the secret half of `key`, whose
        reservation (rank, incarnation) the caller has just checked is current."""
        self.open.pop((connection, rank), None)
        mine = [k for k in self.open if k[0] == connection]
        for stale in mine[: max(0, len(mine) - PER_CONNECTION + 1)]:  # oldest first
            del self.open[stale]
        issued = Issued(connection, rank, incarnation, key, now + CHALLENGE_LIFE, self.fresh())
        self.open[(connection, rank)] = issued
        return issued

    def redeem(
        self,
        connection: Connection,
        rank: int,
        incarnation: int,
        key: str,
        proof: object,
        now: float,
    ) -> Refused | None:
        """Take `proof` as the answer of `connection` to its challenge for `rank`: None if it
        proves that the connection holds the secret half of `key` for (rank, incarnation). The
        challenge is spent either way."""
        issued = self.open.pop((connection, rank), None)
        if issued is None:
            return Refused(
                f"no challenge is open for rank {rank} on this connection (ask flub.challenge)"
            )
        if (issued.incarnation, issued.key) != (incarnation, key):
            return Refused(f"the challenge was for another reservation of rank {rank}")
        if now >= issued.until:
            return Refused(f"the challenge for rank {rank} expired", expired=True)
        if not check(issued.challenge, key, statement(rank, incarnation, key), proof):
            return Refused(
                f"the answer to the challenge for rank {rank} was not made with the secret key "
                f"of {fingerprint(key)}"
            )
        return None

    def forget(self, connection: Connection) -> None:
        """A closed connection's challenges can no longer be answered."""
        for gone in [k for k in self.open if k[0] == connection]:
            del self.open[gone]
