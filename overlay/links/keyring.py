"""Which CURVE public keys may connect to a parent's ROUTER, and as whom.

A key is bound to one (rank, incarnation). Revoking it when that incarnation ends means the old
broker can never authenticate again, whatever its supervisor does.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.utils import z85

from tbon.overlay.links.zmqio import receive_bytes, send_frames
from tbon.overlay.parse.numbers import is_decimal


@dataclass(frozen=True, slots=True)
class Identity:
    rank: int
    incarnation: int

    @property
    def user_id(self) -> str:
        return f"{self.rank}.{self.incarnation}"

    @staticmethod
    def parse(user_id: str) -> Identity | None:
        rank, dot, incarnation = user_id.partition(".")
        if not dot or not is_decimal(rank) or not is_decimal(incarnation):
            return None
        return Identity(int(rank), int(incarnation))


SHARED_USER_ID = "instance"
"""The User-Id of a peer holding the instance's shared key (config-file bootstrap): it may be
any rank of the instance, and says which in its hello."""


class KeyRing:
    def __init__(self) -> None:
        self._by_key: dict[bytes, Identity] = {}
        self._shared: bytes | None = None

    def share(self, public_z85: str) -> None:
        """Admit the instance's shared key (config bootstrap: every rank holds the same one)."""
        self._shared = z85.decode(public_z85)

    def shared(self, public_key: bytes) -> bool:
        return self._shared is not None and public_key == self._shared

    def authorize(self, public_z85: str, identity: Identity) -> None:
        """Let `public_z85` connect as `identity`; any older key of that rank is revoked."""
        self.revoke_rank(identity.rank)
        self._by_key[z85.decode(public_z85)] = identity

    def revoke(self, identity: Identity) -> None:
        for key, bound in list(self._by_key.items()):
            if bound == identity:
                del self._by_key[key]

    def revoke_rank(self, rank: int) -> None:
        for key, bound in list(self._by_key.items()):
            if bound.rank == rank:
                del self._by_key[key]

    def lookup(self, public_key: bytes) -> Identity | None:
        return self._by_key.get(public_key)


ZAP_ENDPOINT = "inproc://zeromq.zap.01"


class ZapHandler:
    """Answers libzmq's ZAP requests from the KeyRing, in the broker's own poll loop."""

    def __init__(self, context: zmq.Context, keyring: KeyRing) -> None:
        self.keyring = keyring
        self.socket = context.socket(zmq.REP)
        self.socket.linger = 0
        self.socket.bind(ZAP_ENDPOINT)
        self.refusals: list[tuple[str, str]] = []

    def handle(self) -> None:
        """Answer one pending request; a refused key is remembered as (address, key) for the log."""
        frames = receive_bytes(self.socket)
        if len(frames) < 6:
            send_frames(self.socket, [b"1.0", b"", b"400", b"malformed ZAP request", b"", b""])
            return
        version, request_id, _domain, address, _identity, mechanism = frames[:6]
        credentials = frames[6:]
        identity = None
        if mechanism == b"CURVE" and credentials and len(credentials[0]) == 32:
            if self.keyring.shared(credentials[0]):
                send_frames(
                    self.socket, [version, request_id, b"200", b"OK", SHARED_USER_ID.encode(), b""]
                )
                return
            identity = self.keyring.lookup(credentials[0])
        if identity is None:
            key = z85.encode(credentials[0]).decode() if credentials else "-"
            self.refusals.append((address.decode(errors="replace"), key))
            send_frames(self.socket, [version, request_id, b"400", b"key not authorized", b"", b""])
            return
        user_id = identity.user_id.encode()
        send_frames(self.socket, [version, request_id, b"200", b"OK", user_id, b""])

    def close(self) -> None:
        self.socket.close(linger=0)
