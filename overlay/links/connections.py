"""Which peer is on which connection: socket-monitor events matched to the messages read.

A ROUTER names its peers by routing id, but the socket monitor names connections by file
descriptor, and descriptors are reused: a client that closes and another that connects may get
the same number. Each accept starts a new generation of its descriptor, and a peer is tied to
the generation current when its first message is read. That is the right one, because libzmq
reports a connection's accept before any of its messages can be read, and reports the old
connection's close before the descriptor can be accepted again, so long as the monitor is
drained before each read.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

Peer = TypeVar("Peer", bound=Hashable)


class ConnectionLedger(Generic[Peer]):
    """A pure record of connections (by descriptor and generation) and the peers on them."""

    def __init__(self) -> None:
        self._generation: dict[int, int] = {}
        self._open: dict[int, bool] = {}
        self._peers: dict[tuple[int, int], list[Peer]] = {}
        self._where: dict[Peer, tuple[int, int]] = {}

    def accepted(self, fd: int) -> None:
        self._generation[fd] = self._generation.get(fd, 0) + 1
        self._open[fd] = True

    def closed(self, fd: int) -> list[Peer]:
        """The connection on `fd` closed: the peers that were on it are gone."""
        self._open[fd] = False
        connection = (fd, self._generation.get(fd, 0))
        gone = self._peers.pop(connection, [])
        for peer in gone:
            self._where.pop(peer, None)
        return gone

    def heard(self, peer: Peer, fd: int) -> bool:
        """A message from `peer` came in on `fd`. False if its connection is already closed
        (it spoke and hung up before the message was read): the peer is gone already."""
        if peer in self._where:
            return True
        if not self._open.get(fd, True):
            return False
        connection = (fd, self._generation.get(fd, 0))
        self._where[peer] = connection
        self._peers.setdefault(connection, []).append(peer)
        return True
