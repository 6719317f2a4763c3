"""What a broker's local clients leave unread: one bound for each client, and one for them all.

Whatever a broker sends a client waits in memory until the client reads it, so what clients
leave unread is what they make the broker hold. Each client is held to `broker.client-backlog`;
without more, N clients that never read could make the broker hold N times that (256 clients,
16 GiB). So the clients together are held to `broker.client-backlog-total` as well.

The ledger keeps each client's unread bytes (what its connection reports, the larger of its
count and its queue) and their sum. Before a message of `size` bytes goes to a client, `admit`
says what happens, without doing it:

* the client would pass its own bound: it is dropped, and the message is not sent;
* the clients together would pass theirs: the greediest client (the most unread; on a tie, the
  one being sent to, then the one named first) is dropped, and again, until the rest fit; if the
  client being sent to is among them, its message is not sent.

Dropping the greediest, rather than the client whose message happens to tip the sum over, is
what keeps well-behaved clients served: flow control (wire/flow.py) holds each of them to a
window of a few MiB, while a client that asks and never reads grows until it is the greediest.
A dropped client's queue is given up at once but for the message being written (its end cannot
be cut off without garbling the stream) and a last notice; it stays in the ledger with what it
still holds, and if it is ever the greediest again its connection is closed outright.
"""

from __future__ import annotations

from tbon.record import Record


class Drop(Record):
    """Drop this client: `total` says whether for the bound of all clients (else its own)."""

    __slots__ = __match_args__ = ("hop", "total")

    def __init__(self, hop: str, total: bool) -> None:
        self.hop, self.total = hop, total


class Admission(Record):
    """What to do before a message goes to a client: drop these first, then send it or not."""

    __slots__ = __match_args__ = ("drops", "send")

    def __init__(self, drops: tuple[Drop, ...], send: bool) -> None:
        self.drops, self.send = drops, send


SEND = Admission((), send=True)


class Ledger:
    """Unread bytes by client (hop), and their sum, against a bound for each and for all."""

    def __init__(self, each: int, total: int) -> None:
        self.each = each
        self.total_bound = total
        self.unread: dict[str, int] = {}
        self.total = 0

    def set(self, hop: str, unread: int) -> None:
        """The client's unread bytes are now `unread`."""
        self.total += unread - self.unread.get(hop, 0)
        self.unread[hop] = unread

    def forget(self, hop: str) -> None:
        """The client is gone: it holds nothing any more."""
        self.total -= self.unread.pop(hop, 0)

    def admit(self, hop: str, after: int) -> Admission:
        """Whether a message may go to `hop`, which would then leave `after` bytes unread, and
        who is dropped first. Changes nothing: the caller drops, sends and `set`s."""
        if after > self.each:
            return Admission((Drop(hop, total=False),), send=False)
        excess = self.total - self.unread.get(hop, 0) + after - self.total_bound
        if excess <= 0:
            return SEND  # the common case: no copy, no search
        held = dict(self.unread)
        held[hop] = after
        drops: list[Drop] = []
        order = {name: place for place, name in enumerate(held)}
        while excess > 0:
            greediest = max(held, key=lambda name: (held[name], name == hop, -order[name]))
            drops.append(Drop(greediest, total=True))
            excess -= held.pop(greediest)
            if greediest == hop:
                break  # its message is not sent: what it held goes, and nothing more comes
        send = all(drop.hop != hop for drop in drops)
        return Admission(tuple(drops), send)
