"""FLUB, the joining side: ask a running instance for a rank, swap keys with the parent, go.

1. Ask rank 0 (through the boot server's local socket) for a rank: it reserves a vacant or lost
   one for this broker's public key, with a new incarnation and a lease (broker.join-timeout).
   If the rank's parent is online, rank 0 has it admit this key for (rank, incarnation) at once
   and the answer carries the parent's card (its endpoint and public key): the join is one
   round trip.
2. Otherwise wait for the parent rank to come online (ranks may join in any order), then ask
   rank 0 for the card (`flub.kex`): it has the parent admit the key the same way. A reservation
   rank 0 granted to another connection (this broker's previous process, or an earlier boot
   server) is used by proving that this broker holds its key's secret half: rank 0 sends a
   challenge (`flub.challenge`) and the request carries the answer (keys/proof.py).
3. Connect to the parent and say hello like any other broker.
A joiner that fails between its grant and step 3 gives the reservation back (`flub.release`),
so that the rank is free at once instead of when its lease runs out.

broker.boot-server may list several URIs. A boot server that cannot be reached, whose
connection ends, or that leaves a request unanswered for broker.join-timeout is left for the
next one, where the join starts again with the same key; a reservation already granted is named
again by rank 0 while its lease lasts, and used by the proof. When the list is used up, the
joiner exits 75, unless a boot server said it cannot reach the root for now (a takeover under
way, grants paused): then the list is tried again after a pause, within the joiner's own
broker.join-timeout (joinretry.py).
docs/flub.md has the whole protocol and its security argument.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from tbon import exitcodes
from tbon.errors import TbonError
from tbon.keys.proof import decode_nonce, prove, statement
from tbon.overlay.boot.joinretry import pause_before_round
from tbon.overlay.boot.wireup import BusinessCard, Wireup
from tbon.overlay.connectors.client import Client, RequestError
from tbon.overlay.connectors.uri import split_uris
from tbon.overlay.state.topology import Topology

log = logging.getLogger("tbon.flub")

RELEASE_TIMEOUT = 5.0
"""The longest a failed joiner waits for rank 0 to take its reservation back (seconds)."""

INSTANCE_ATTRIBUTES = ("tbon.heartbeat", "tbon.torpid", "tbon.timeout", "broker.join-timeout")
"""Attributes a joiner takes from the instance, so that both ends of a link agree."""


class BootServerLost(TbonError):
    """A boot server that cannot see the join through: unreachable, its connection ended, or
    silent for a whole request's timeout. The join moves on to the next URI of the list."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exitcodes.LOST)


class RootUnsettled(BootServerLost):
    """A boot server that answered, but cannot have the join granted now: its way to the root
    is being healed (a takeover under way), or the root's grants are paused. The next URI is
    tried, and the list again after a pause (joinretry.py)."""


def flub_wireup(
    boot_server: str,
    requested_rank: int | None,
    hostname: str,
    keys: tuple[str, str],
    timeout: float,
    bind: Callable[[Topology, int], str],
    warm: Callable[[], None] = lambda: None,
) -> tuple[Wireup, dict[str, Any]]:
    """Join through the boot servers of `boot_server` (comma-separated URIs), one after
    another until one sees the join through, with `keys` (public, secret; Z85); returns the
    wire-up and the instance's attributes. When every one has failed, exit 75 naming what
    was tried. `warm` readies what comes after the join; it is called before a wait for the
    parent, so that the wait covers it."""
    deadline = time.monotonic() + timeout
    join = _Join(requested_rank, hostname, keys, timeout, bind)
    join.warm = warm
    uris = split_uris(boot_server)
    if len(uris) > 1:
        log.info("FLUB: boot servers, in order: %s", " ".join(uris))
    rounds = 0
    while True:
        reasons: list[str] = []
        unsettled = False
        for place, uri in enumerate(uris):
            try:
                return join.through(uri)
            except BootServerLost as lost:
                reasons.append(str(lost))
                unsettled = unsettled or isinstance(lost, RootUnsettled)
                if place + 1 < len(uris):
                    log.warning("FLUB: %s%s; trying %s", lost, join.holding(), uris[place + 1])
        rounds += 1
        pause = pause_before_round(rounds, unsettled, deadline - time.monotonic())
        if pause is None:
            raise join.given_up(reasons)
        (log.warning if rounds == 1 else log.info)(
            "FLUB: %s%s; trying the boot servers again in %gs",
            reasons[-1],
            join.holding(),
            pause,
        )
        time.sleep(pause)


class _Join:
    """One join, carried from boot server to boot server: what the earlier ones left it.

    A reservation is used (`flub.kex`, `flub.release`) as it is only on the connection it was
    granted on (docs/flub.md §5). Through the next boot server, as after a restart, rank 0
    names the same reservation again while it lasts (or makes a new one if it lapsed) and says
    that this connection does not hold it (`held`): the joiner then proves that it holds the
    key (`_proof`) in the request that uses it."""

    def __init__(
        self,
        requested_rank: int | None,
        hostname: str,
        keys: tuple[str, str],
        timeout: float,
        bind: Callable[[Topology, int], str],
    ) -> None:
        self.requested_rank = requested_rank
        self.hostname = hostname
        self.public_key, self.secret_key = keys
        self.timeout = timeout
        self.bind = bind
        self.held: tuple[int, int] | None = None  # the (rank, incarnation) last granted
        self.bound: int | None = None  # the rank whose children's socket is bound
        self.warm: Callable[[], None] = lambda: None  # readies what follows, before a wait

    def through(self, uri: str) -> tuple[Wireup, dict[str, Any]]:
        """The whole join through one boot server. BootServerLost: try the next one."""
        try:
            client = Client(uri)
        except TbonError as error:
            if error.exit_code == exitcodes.USAGE:  # a URI we cannot use: never (exit 2)
                raise TbonError(f"FLUB: {error}", exitcodes.USAGE) from None
            raise BootServerLost(str(error)) from None  # unreachable: perhaps for now
        try:
            with client:
                return self._join(client)
        except BootServerLost:
            raise
        except RequestError as error:  # an answer we have no exit code for
            raise TbonError(_flub(str(error)), exitcodes.INTERNAL) from None
        except TbonError as error:
            if error.exit_code != exitcodes.INTERNAL:
                raise
            # Something we could not go on from (a socket to bind, a card without a key): a
            # supervisor may try again with a new process.
            raise TbonError(_flub(str(error)), exitcodes.LOST) from None

    def _join(self, client: Client) -> tuple[Wireup, dict[str, Any]]:
        grant = _allocate(client, self._ask(), self.hostname, self.public_key, self.timeout)
        rank, incarnation = grant["rank"], grant["incarnation"]
        self.held = (rank, incarnation)
        # None: this connection holds the reservation; else the keys that prove we do
        keys = None if grant.get("held") else (self.public_key, self.secret_key)
        if keys is None:
            log.info("FLUB: reserved rank %d incarnation %d", rank, incarnation)
        else:
            log.info(
                "FLUB: rank 0 holds rank %d incarnation %d for this key, reserved through "
                "another connection: it is used by proving that we hold the key",
                rank,
                incarnation,
            )
        try:
            topology = Topology(grant["topo"], grant["size"])
            if self.bound is not None and self.bound != rank:
                raise TbonError(f"FLUB: given rank {rank}, but set up for rank {self.bound}")
            if self.bound is None and topology.children(rank):
                self.bind(topology, rank)
                self.bound = rank
            parent = grant.get("parent", topology.parent(rank))  # rank 0's: the root's
            if not isinstance(parent, int) or not 0 <= parent < topology.size:
                raise TbonError(f"FLUB: rank {rank} was granted with no parent to join under")
            card = _card(grant.get("parent_card"))
            if card is None:
                card = self._parent_card(client, grant, parent, keys)
        except BootServerLost:
            raise  # nobody to give the reservation back to: rank 0 lets its lease lapse
        except BaseException:
            _release(client, rank, incarnation, self.public_key, self.timeout, keys)
            raise
        peer = parent if parent != topology.parent(rank) else None
        wireup = Wireup(
            rank, topology.size, 0, topology, parent=card, incarnation=incarnation, peer=peer
        )
        return wireup, grant["attributes"]

    def _parent_card(
        self,
        client: Client,
        grant: dict[str, Any],
        parent: int,
        keys: tuple[str, str] | None,
    ) -> BusinessCard:
        """The parent's card when the grant came without it: one `flub.kex` that rank 0 holds
        (`wait`) until the parent is online, at most the lease, and answers at once then, in
        the same turn of its loop that saw the parent come online. A rank 0 that holds no key
        exchange (older) answers EHOSTUNREACH at once: then the joiner watches the table for
        the parent, and asks again."""
        rank, incarnation, lease = grant["rank"], grant["incarnation"], grant["lease"]
        state = grant.get("parent_state")
        if state is not None and state != "online":
            log.warning(
                "rank %d: waiting for parent rank %d (%s) to come online", rank, parent, state
            )
            self.warm()  # while the parent is not online anyway
        try:
            return _key_exchange(
                client, rank, incarnation, parent, self.public_key, self.timeout, keys, lease
            )
        except _Unreachable:
            pass
        _wait_online(client, rank, parent, lease)
        return _key_exchange(client, rank, incarnation, parent, self.public_key, self.timeout, keys)

    def _ask(self) -> int | None:
        """The rank to ask for: the one asked for, or, once this broker has bound its
        children's socket for a rank, that rank (the socket serves no other)."""
        return self.bound if self.bound is not None else self.requested_rank

    def holding(self) -> str:
        """What a log line about a failover adds: the reservation held, if any."""
        if self.held is None:
            return ""
        return f"; still holding rank {self.held[0]} incarnation {self.held[1]}"

    def given_up(self, reasons: list[str]) -> TbonError:
        """Every boot server failed: one line naming each, and what becomes of the
        reservation (rank 0 lets it lapse with its lease)."""
        said = (
            reasons[0] if len(reasons) == 1 else "every boot server failed: " + "; ".join(reasons)
        )
        if self.held is not None:
            said += (
                f"; the reservation of rank {self.held[0]} incarnation {self.held[1]} lapses "
                "with its lease"
            )
        return TbonError(_flub(said), exitcodes.LOST)


def _flub(text: str) -> str:
    """A FLUB message, said to be one once."""
    return text if text.startswith("FLUB: ") else f"FLUB: {text}"


def _rpc(client: Client, topic: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A request to rank 0 through the boot server; a server that is gone or silent, rather
    than an answer, is BootServerLost."""
    try:
        return client.rpc(topic, payload, nodeid=0, timeout=timeout)
    except RequestError as error:
        if error.errnum == errno.EHOSTUNREACH and topic == "flub.allocate":
            # it cannot reach the root: perhaps healing, or the root group electing
            raise RootUnsettled(f"{client.uri}: {error}") from None
        raise
    except TbonError as error:
        raise BootServerLost(_naming(client, error)) from None


def _watch(client: Client, deadline: float) -> Iterator[dict[str, Any]]:
    """Rank 0's status tables until `deadline`, as Client.watch_status gives them; a stream
    cut by a boot server that is gone (or that cannot reach rank 0) is BootServerLost."""
    from tbon.overlay.state.heldtable import HeldPages

    pages = HeldPages()  # one page but for thousands of ranks held
    try:
        for page in client.watch_status(deadline, {"view": "held"}):
            if (status := pages.take(page)) is not None:
                yield status
    except RequestError as error:
        if error.errnum == errno.EHOSTUNREACH:
            raise BootServerLost(f"{client.uri}: {error}") from None
        raise
    except TbonError as error:
        raise BootServerLost(_naming(client, error)) from None


def _naming(client: Client, error: TbonError) -> str:
    """The error, with the boot server's URI in it."""
    return str(error) if str(client.uri) in str(error) else f"{client.uri}: {error}"


def _allocate(
    client: Client,
    rank: int | None,
    hostname: str,
    public_key: str,
    timeout: float,
    retry: bool = True,
) -> dict[str, Any]:
    request = {"public_key": public_key, "hostname": hostname, "rank": rank}
    try:
        return _rpc(client, "flub.allocate", request, timeout)
    except RequestError as error:
        if (
            retry
            and error.errnum == errno.EBUSY
            and rank is not None
            and _wait_release(client, rank, timeout)
        ):
            return _allocate(client, rank, hostname, public_key, timeout, retry=False)
        if error.errnum in (errno.ENOSPC, errno.EBUSY, errno.ENOENT, errno.EAGAIN):
            raise TbonError(f"FLUB: {error}", exitcodes.NO_RANK) from None
        if error.errnum == errno.ESHUTDOWN:
            raise TbonError(f"FLUB: {error}", exitcodes.SHUTDOWN) from None
        if error.errnum == errno.ETIMEDOUT:
            # grants paused (no majority of the root group answers), or the root superseded
            # while it held the request (docs/protocol.md §13.3, §13.5): a later try may succeed
            raise RootUnsettled(f"{client.uri}: {error}") from None
        if error.errnum == errno.ESTALE:
            # granted, but lapsed before rank 0 could answer: a new process may try again
            raise TbonError(f"FLUB: {error}", exitcodes.LOST) from None
        if error.errnum == errno.EPERM:
            raise TbonError(f"FLUB: {error}", exitcodes.REFUSED) from None
        raise


def _proof(
    client: Client, rank: int, incarnation: int, keys: tuple[str, str], timeout: float
) -> dict[str, str]:
    """What a request that uses a reservation this connection does not hold adds: the answer to
    a fresh challenge of rank 0, which only the secret key can give (keys/proof.py). Rank 0's
    refusal is a RequestError, as for the request it goes with."""
    public, secret = keys
    ask = {"rank": rank, "incarnation": incarnation, "public_key": public}
    challenge = _rpc(client, "flub.challenge", ask, timeout)
    nonce, key = decode_nonce(challenge.get("challenge")), challenge.get("key")
    if nonce is None or not isinstance(key, str):
        raise TbonError("FLUB: rank 0's challenge is malformed")
    try:
        return {"proof": prove(secret, key, nonce, statement(rank, incarnation, public))}
    except ValueError as error:
        raise TbonError(f"FLUB: rank 0's challenge is malformed: {error}") from None


def _release(
    client: Client,
    rank: int,
    incarnation: int,
    public_key: str,
    timeout: float,
    keys: tuple[str, str] | None,
) -> None:
    """Give the reservation back at once rather than hold the rank until the lease lapses,
    proving that we hold its key if this connection does not hold it (`keys`). Best effort:
    whatever happens here, the failure that got us here is what counts."""
    ask: dict[str, Any] = {"rank": rank, "incarnation": incarnation, "public_key": public_key}
    timeout = min(timeout, RELEASE_TIMEOUT)
    try:
        if keys is not None:
            ask |= _proof(client, rank, incarnation, keys, timeout)
        client.rpc("flub.release", ask, nodeid=0, timeout=timeout)
    except Exception as error:  # an unreachable, refusing or broken boot server alike
        log.warning("FLUB: could not release rank %d incarnation %d: %s", rank, incarnation, error)
    else:
        log.warning("FLUB: released rank %d incarnation %d", rank, incarnation)


def _wait_release(client: Client, rank: int, timeout: float) -> bool:
    """A replacement that arrives while the old broker is torpid (silent, not yet declared
    lost) waits, at most `timeout`, for the verdict instead of being turned away; the rank is
    never held by two. True if the rank became available."""
    told = False
    try:
        for status in _watch(client, time.monotonic() + timeout):
            if not 0 <= rank < len(status["ranks"]):
                return False
            entry = status["ranks"][rank]
            if entry["state"] in ("vacant", "lost"):
                return True
            if not entry["torpid"]:
                return False  # held by a live broker: no waiting for that
            if not told:
                log.warning(
                    "rank %d is held by a silent broker (pid %s): waiting for it to be declared "
                    "lost",
                    rank,
                    entry["pid"],
                )
                told = True
    except RequestError:
        return False
    return False


def _wait_online(client: Client, rank: int, parent: int, lease: float) -> None:
    """Wait for the parent rank to be online, at most as long as the reservation lasts."""
    told = False
    try:
        for status in _watch(client, time.monotonic() + lease):
            state = status["ranks"][parent]["state"]
            if state == "online":
                return
            if not told:
                log.warning(
                    "rank %d: waiting for parent rank %d (%s) to come online", rank, parent, state
                )
                told = True
    except RequestError as error:
        # ENODATA: the instance shut down while we waited
        code = exitcodes.SHUTDOWN if error.errnum == errno.ENODATA else exitcodes.LOST
        raise TbonError(f"FLUB: {error}", code) from None
    raise TbonError(
        f"FLUB: parent rank {parent} did not come online within {lease:g}s; the reservation of "
        f"rank {rank} lapses",
        exitcodes.LOST,
    )


class _Unreachable(Exception):
    """A key exchange held for the parent (`wait`) was answered EHOSTUNREACH: the parent or
    the way to it is not connected, and rank 0 did not hold the request."""


def _key_exchange(
    client: Client,
    rank: int,
    incarnation: int,
    parent: int,
    public_key: str,
    timeout: float,
    keys: tuple[str, str] | None,
    wait: float | None = None,
) -> BusinessCard:
    """The parent's card, from rank 0 (`flub.kex`), with the proof that we hold the key if
    this connection does not hold the reservation (`keys`). With `wait` (the lease left), rank
    0 holds the request until the parent is online; an EHOSTUNREACH then is _Unreachable.
    Only a refusal that no new process with this key could turn (a proof refused, a second
    holder, the parent's refusal) exits 77; a reservation that lapsed or was used meanwhile, or
    a challenge that expired, exits 75."""
    try:
        ask: dict[str, Any] = {"rank": rank, "incarnation": incarnation, "public_key": public_key}
        if keys is not None:
            ask |= _proof(client, rank, incarnation, keys, timeout)
        if wait is not None:
            ask["wait"] = True
        reply = _rpc(client, "flub.kex", ask, timeout + (wait or 0.0))
    except RequestError as error:
        if wait is not None and error.errnum == errno.EHOSTUNREACH:
            raise _Unreachable(str(error)) from None
        codes = {
            errno.EPERM: exitcodes.REFUSED,
            errno.ESTALE: exitcodes.LOST,
            errno.ESHUTDOWN: exitcodes.SHUTDOWN,
            errno.EHOSTUNREACH: exitcodes.LOST,
            errno.ETIMEDOUT: exitcodes.LOST,
        }
        if error.errnum in codes:
            raise TbonError(f"FLUB: rank {parent}: {error}", codes[error.errnum]) from None
        raise
    card = _card(reply)
    if card is None:
        raise TbonError(f"FLUB: rank {parent}: no endpoint and key in the answer")
    return card


def _card(payload: object) -> BusinessCard | None:
    """The parent's card in an answer of rank 0, if it carries one."""
    if not isinstance(payload, dict):
        return None
    endpoint, key = payload.get("endpoint"), payload.get("public_key")
    if not isinstance(endpoint, str) or not isinstance(key, str) or not endpoint:
        return None
    return BusinessCard(str(payload.get("hostname", "")), key, endpoint)
