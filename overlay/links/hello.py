"""The hello judge: whether a child's hello is welcomed, refused, or needs rank 0 to rejoin it.

A parent hears hellos from holders of two kinds of key:

* a key bound to one (rank, incarnation) (PMI bootstrap, FLUB): the hello must claim exactly that
  identity, and it must still be the rank's current incarnation here;
* the instance's shared key (config-file bootstrap): every rank holds it, so the hello's claim is
  all there is. Its broker cannot know its incarnation: rank 0 says it (a rejoin), the current one
  on first boot, a new one for a broker restarted on its host, or refuses (a retired rank, say).

The checks, in order; the first that fails gives the refusal:

1. (bound key) the incarnation has not ended: a retired one exits 0, one departed or revoked gets
   the exit code it ended with. One that was lost may return, as the same broker (host and pid)
   only: a healed partition (rank 0 then decides whether its incarnation is still current);
2. the protocol version is this broker's;
3. (bound key) the hello claims the key's identity;
4. the rank claimed is a child of this parent, or a foster child rank 0 told it to expect;
5. (bound key) the rank has a current incarnation here, and it is the key's (else superseded);
6. (bound key) no other broker was welcomed as that incarnation: two processes may hold one key
   (`broker.cert`), and the first to say hello keeps the rank while the second is refused;
   the same broker saying hello again (on a new connection) is welcomed again;
7. the instance is not shutting down (exit 0);
8. (shared key) the rank is not held by a broker that joined by FLUB.

Then a bound key is welcomed. A shared key that claims the incarnation rank 0 told this parent
to expect (a foster child, or a child coming home) is welcomed too; any other shared key goes to
rank 0; if the rank's broker is connected, it is the old broker of that host, and the new one
replaces it.

A message other than hello from a peer with no live session is judged here too (`judge_stale`),
by the same rules for an ended or superseded incarnation.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from tbon import exitcodes
from tbon.overlay.links.keyring import Identity
from tbon.overlay.parse.numbers import is_int
from tbon.overlay.state.topology import Topology
from tbon.overlay.wire.message import PROTOCOL_VERSION
from tbon.record import Record


class Refusal(Record):
    __slots__ = __match_args__ = ("reason", "exit_code")

    def __init__(self, reason: str, exit_code: int) -> None:
        self.reason = reason
        self.exit_code = exit_code


class Welcome(Record):
    __slots__ = __match_args__ = ("identity",)

    def __init__(self, identity: Identity) -> None:
        self.identity = identity


class AskRankZero(Record):
    """A shared-key hello that passed: rank 0 must name the incarnation it joins as."""

    __slots__ = __match_args__ = ("rank", "ended", "replaces")

    def __init__(self, rank: int, ended: int, replaces: bool) -> None:
        self.rank = rank
        self.ended = ended  # the rank's incarnation here (0 if none): the one a rejoin ends
        self.replaces = replaces  # that incarnation's broker is connected: the new one replaces it


Judgement = Welcome | Refusal | AskRankZero

Broker = tuple[str, int]
"""Who said a hello: its hostname and process id."""


def hello_broker(hello: dict[str, Any]) -> Broker:
    """The broker a hello comes from, as its parent reports it online."""
    pid = hello.get("pid")
    return str(hello.get("hostname", "")), pid if is_int(pid) else 0


@dataclass(frozen=True, slots=True)
class Standing:
    """A child rank's session, as far as the judge needs it."""

    incarnation: int
    ended: str = ""  # why it ended ("was lost: WHY", "has departed"); empty while current
    end_code: int = exitcodes.LOST  # the exit code its broker is told, should it speak again
    connected: bool = False
    shared: bool = False  # its broker holds the instance's shared key (config bootstrap)
    broker: Broker | None = None  # the broker welcomed as this incarnation, while connected
    foster: bool = False  # not a child in the topology: rank 0 told this parent to foster it
    expected: bool = False  # rank 0 told this parent to expect it (fostered, or coming home)
    returnable: bool = False  # it was lost, and its own broker may say hello again
    last_broker: Broker | None = None  # the broker last welcomed as this incarnation


@dataclass(frozen=True, slots=True)
class Parent:
    """The parent hearing the hello, as far as the judge needs it."""

    rank: int
    topology: Topology
    children: Mapping[int, Standing] = field(default_factory=dict)
    retired: Set[Identity] = frozenset()  # told "retired" even once the rank is refilled
    shutting_down: bool = False

    def is_parent_of(self, rank: int) -> bool:
        if rank < self.topology.size and self.topology.parent(rank) == self.rank:
            return True
        standing = self.children.get(rank)
        return standing is not None and standing.foster


def judge_hello(hello: dict[str, Any], key: Identity | None, parent: Parent) -> Judgement:
    """Judge `hello`, whose sender's key is bound to `key` (None: the instance's shared key)."""
    if (
        key is not None
        and not _returns(key, hello, parent)
        and (ended := _ended(key, parent)) is not None
    ):
        return ended
    version = hello.get("version")
    if version != PROTOCOL_VERSION:
        # a shared-key broker has always been told without the parent's own version
        speaks = "" if key is None else f" (rank {parent.rank} speaks {PROTOCOL_VERSION})"
        return Refusal(f"incompatible protocol version {version!r}{speaks}", exitcodes.REFUSED)
    claimed = hello.get("rank"), hello.get("incarnation")
    if key is not None and claimed != (key.rank, key.incarnation):
        return Refusal(
            f"key is authorized for rank {key.rank} incarnation {key.incarnation}, "
            f"not for rank {claimed[0]} incarnation {claimed[1]}",
            exitcodes.REFUSED,
        )
    rank = key.rank if key is not None else _claimed_rank(hello)
    if rank is None or not parent.is_parent_of(rank):
        shown = rank if rank is not None else claimed[0]
        return Refusal(f"rank {shown} is not a child of rank {parent.rank}", exitcodes.REFUSED)
    standing = parent.children.get(rank)
    if key is not None:
        if standing is None or (standing.ended and not _returns(key, hello, parent)):
            return Refusal(f"rank {rank} has no incarnation expecting a broker", exitcodes.REFUSED)
        if standing.incarnation != key.incarnation:
            return _superseded(rank, standing.incarnation)
        if standing.broker is not None and standing.broker != hello_broker(hello):
            host, pid = standing.broker
            return Refusal(
                f"rank {rank} incarnation {key.incarnation} is held by another broker "
                f"(pid {pid} on {host})",
                exitcodes.REFUSED,
            )
    if parent.shutting_down:
        return Refusal("the instance is shutting down", exitcodes.SHUTDOWN)
    if key is not None:
        return Welcome(key)
    if (
        standing is not None
        and standing.expected
        and standing.shared
        and not standing.ended
        and claimed[1] == standing.incarnation
    ):
        return Welcome(Identity(rank, standing.incarnation))  # fostered, or home, as rank 0 said
    if standing is not None and standing.foster:
        return Refusal(
            f"rank {rank} is fostered here as incarnation {standing.incarnation}, not {claimed[1]}",
            exitcodes.REFUSED,
        )
    if standing is not None and standing.connected and not standing.shared:
        return Refusal(f"rank {rank} is held by a broker that joined by FLUB", exitcodes.REFUSED)
    here = standing.incarnation if standing is not None else 0
    return AskRankZero(rank, here, replaces=standing is not None and standing.connected)


def judge_stale(sender: Identity, parent: Parent) -> Refusal | None:
    """The answer to a message from `sender` on a connection with no live session: a refusal
    that makes an ended or superseded broker exit instead of lingering, or None to drop it."""
    if (ended := _ended(sender, parent)) is not None:
        return ended
    standing = parent.children.get(sender.rank)
    if standing is not None and standing.incarnation > sender.incarnation:
        return _superseded(sender.rank, standing.incarnation)
    return None


def retired_reason(identity: Identity) -> str:
    return f"retired: rank {identity.rank} incarnation {identity.incarnation} has retired"


def _ended(identity: Identity, parent: Parent) -> Refusal | None:
    """Why an incarnation that has ended may not speak again, if it has. A lost one is told
    "lost", not "refused": a new broker may take the rank by FLUB."""
    if identity in parent.retired:
        return Refusal(retired_reason(identity), exitcodes.SHUTDOWN)
    standing = parent.children.get(identity.rank)
    if standing is not None and standing.incarnation == identity.incarnation and standing.ended:
        reason = f"rank {identity.rank} incarnation {identity.incarnation} {standing.ended}"
        return Refusal(reason, standing.end_code)
    return None


def _returns(key: Identity, hello: dict[str, Any], parent: Parent) -> bool:
    """Whether this hello is a lost incarnation's own broker coming back (a healed partition)."""
    standing = parent.children.get(key.rank)
    return (
        standing is not None
        and standing.returnable
        and standing.incarnation == key.incarnation
        and standing.last_broker == hello_broker(hello)
    )


def _superseded(rank: int, current: int) -> Refusal:
    return Refusal(f"superseded: rank {rank} is now incarnation {current}", exitcodes.REFUSED)


def _claimed_rank(hello: dict[str, Any]) -> int | None:
    """The rank a shared-key hello claims, if it is a rank at all."""
    rank = hello.get("rank")
    return rank if is_int(rank) and rank >= 0 else None
