"""Which peer is on which connection: socket-monitor events matched to the messages read.

A ROUTER names its peers by routing id, but the socket monitor names connections by file
descriptor, and descriptors are reused: a client that closes and another that connects may get
the same number. Each accept starts a new generation of its descriptor, so a connection is a
(descriptor, generation). Naming the connection a message came on is right so long as the monitor
is drained before each read: libzmq reports a connection's accept before any of its messages can
be read, and the old connection's close before the descriptor can be accepted again.

A peer is on the connection it was last heard on, and on no other. A local client's name is its
connection, so for it the first and the last are the same. A child's session outlives connections:
a broker whose TCP connection went half-dead may connect again and say hello on the new one. Its
session moves there. The old connection's close, which may come much later when TCP gives up, is
stale and ends nothing; the new connection's close ends the session. Tying a peer to its first
connection would miss that close (only silence would end the session), and tying it to both would
let the stale close end a live session.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

Peer = TypeVar("Peer", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Connection:
    fd: int
    generation: int  # 0 for a descriptor whose accept was never seen


class ConnectionLedger(Generic[Peer]):
    """A pure record of connections (by descriptor and generation) and the peers on them."""

    def __init__(self) -> None:
        self._generation: dict[int, int] = {}
        self._open: dict[int, bool] = {}
        self._peers: dict[Connection, list[Peer]] = {}
        self._where: dict[Peer, Connection] = {}

    def accepted(self, fd: int) -> None:
        self._generation[fd] = self._generation.get(fd, 0) + 1
        self._open[fd] = True

    def closed(self, fd: int) -> list[Peer]:
        """The connection on `fd` closed: the peers that were on it are gone."""
        self._open[fd] = False
        gone = self._peers.pop(self.connection(fd), [])
        for peer in gone:
            del self._where[peer]
        return gone

    def connection(self, fd: int) -> Connection:
        """The connection on `fd` now: to name the one a message came on, for a tie made later."""
        return Connection(fd, self._generation.get(fd, 0))

    def is_open(self, connection: Connection) -> bool:
        current = self._generation.get(connection.fd, 0) == connection.generation
        return current and self._open.get(connection.fd, True)

    def heard(self, peer: Peer, fd: int) -> bool:
        """A message from `peer` came in on `fd`: see `tie`."""
        return self.tie(peer, self.connection(fd))

    def tie(self, peer: Peer, connection: Connection) -> bool:
        """`peer` is on `connection` now, and no longer on any other. False if that connection
        has closed already (the peer spoke and hung up before it was read): the peer is gone,
        and tied to nothing."""
        if self._where.get(peer) == connection:
            return True
        self.forget(peer)
        if not self.is_open(connection):
            return False
        self._where[peer] = connection
        self._peers.setdefault(connection, []).append(peer)
        return True

    def tied(self, peer: Peer) -> bool:
        """Whether `peer` is on an open connection."""
        return peer in self._where

    def forget(self, peer: Peer) -> None:
        """`peer` has ended otherwise (it said goodbye, say): its connection's close is not news."""
        connection = self._where.pop(peer, None)
        if connection is not None:
            peers = self._peers[connection]
            peers.remove(peer)
            if not peers:
                del self._peers[connection]
