"""FLUB, the joining side: ask a running instance for a rank, swap keys with the parent, go.

1. Ask rank 0 (through the boot server's local socket) for a rank: it reserves a vacant or lost
   one for this broker's public key, with a new incarnation and a lease (broker.join-timeout).
   If the rank's parent is online, rank 0 has it admit this key for (rank, incarnation) at once
   and the answer carries the parent's card (its endpoint and public key): the join is one
   round trip.
2. Otherwise wait for the parent rank to come online (ranks may join in any order), then ask
   rank 0 for the card (`flub.kex`): it has the parent admit the key the same way.
3. Connect to the parent and say hello like any other broker.
A joiner that fails between its grant and step 3 gives the reservation back (`flub.release`),
so that the rank is free at once instead of when its lease runs out.
docs/flub.md has the whole protocol and its security argument.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import Any

from tbon import exitcodes
from tbon.errors import TbonError
from tbon.overlay.boot.wireup import BusinessCard, Wireup
from tbon.overlay.connectors.client import Client, RequestError
from tbon.overlay.state.topology import Topology

log = logging.getLogger("tbon.flub")

RELEASE_TIMEOUT = 5.0
"""The longest a failed joiner waits for rank 0 to take its reservation back (seconds)."""

INSTANCE_ATTRIBUTES = ("tbon.heartbeat", "tbon.torpid", "tbon.timeout", "broker.join-timeout")
"""Attributes a joiner takes from the instance, so that both ends of a link agree."""


def flub_wireup(
    boot_server: str,
    requested_rank: int | None,
    hostname: str,
    public_key: str,
    timeout: float,
    bind: Callable[[Topology, int], str],
) -> tuple[Wireup, dict[str, Any]]:
    """Join through `boot_server`; returns the wire-up and the instance's attributes."""
    try:
        client = Client(boot_server)
    except TbonError as error:
        # Unreachable: perhaps for now (exit 75: retry); a URI we cannot use: never (exit 2).
        code = exitcodes.USAGE if error.exit_code == exitcodes.USAGE else exitcodes.LOST
        raise TbonError(f"FLUB: {error}", code) from None
    try:
        with client:
            grant = _allocate(client, requested_rank, hostname, public_key, timeout)
            rank, incarnation = grant["rank"], grant["incarnation"]
            log.info("FLUB: reserved rank %d incarnation %d", rank, incarnation)
            try:
                topology = Topology(grant["topo"], grant["size"])
                if topology.children(rank):
                    bind(topology, rank)
                parent = topology.parent(rank)
                assert parent is not None  # rank 0 is never allocatable
                card = _card(grant.get("parent_card"))
                if card is None:
                    _wait_online(client, rank, parent, grant["lease"])
                    card = _key_exchange(client, rank, incarnation, parent, public_key, timeout)
            except BaseException:
                _release(client, rank, incarnation, public_key, timeout)
                raise
    except RequestError as error:
        raise TbonError(f"FLUB: {error}", exitcodes.INTERNAL) from None
    except TbonError as error:
        if error.exit_code != exitcodes.INTERNAL:
            raise
        # The boot server could not be reached (an ssh:// one, say): perhaps for now.
        raise TbonError(f"FLUB: {error}", exitcodes.LOST) from None
    wireup = Wireup(rank, topology.size, 0, topology, parent=card, incarnation=incarnation)
    return wireup, grant["attributes"]


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
        return client.rpc("flub.allocate", request, nodeid=0, timeout=timeout)
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
        if error.errnum == errno.EPERM:
            raise TbonError(f"FLUB: {error}", exitcodes.REFUSED) from None
        raise


def _release(client: Client, rank: int, incarnation: int, public_key: str, timeout: float) -> None:
    """Give the reservation back at once rather than hold the rank until the lease lapses.
    Best effort: whatever happens here, the failure that got us here is what counts."""
    ask = {"rank": rank, "incarnation": incarnation, "public_key": public_key}
    try:
        client.rpc("flub.release", ask, nodeid=0, timeout=min(timeout, RELEASE_TIMEOUT))
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
        for status in client.watch_status(time.monotonic() + timeout):
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
        for status in client.watch_status(time.monotonic() + lease):
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


def _key_exchange(
    client: Client, rank: int, incarnation: int, parent: int, public_key: str, timeout: float
) -> BusinessCard:
    try:
        reply = client.rpc(
            "flub.kex",
            {"rank": rank, "incarnation": incarnation, "public_key": public_key},
            nodeid=0,
            timeout=timeout,
        )
    except RequestError as error:
        codes = {
            errno.EPERM: exitcodes.REFUSED,
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
