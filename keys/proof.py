"""Proof of possession: a joiner shows rank 0 that it holds the secret key of the public key a
reservation was made for (docs/flub.md §5, "A restarted joiner").

Rank 0 makes a fresh key pair for each challenge and sends its public half with 16 random bytes.
The joiner answers with a NaCl box (Curve25519, XSalsa20-Poly1305) of a statement naming the
reservation, made from its own secret key and the challenge's public key under the nonce
`NONCE_PREFIX` + those bytes. Opening that box needs the shared key of the two pairs, which only
the joiner's secret key or the challenge's can give: rank 0 holds the second, and forgets it once
the challenge is answered or expired, so a box is checked once and never again.

The prefix keeps these boxes apart from every box ZeroMQ's CURVE handshake makes with the same
long-term key (its nonces begin "CurveZMQ", "VOUCH---", "WELCOME-", "COOKIE--"); the statement
names the rank, the incarnation and the key, so a proof for one reservation says nothing of
another. Pure functions, but `new_challenge`, which draws randomness.
"""

from __future__ import annotations

import base64
import binascii
import os

import nacl.exceptions
import nacl.public

from tbon.keys.cert import decode_key, encode_key
from tbon.record import Record

NONCE_PREFIX = b"tbonPoP1"
"""The first 8 of a proof's 24 nonce bytes; the challenge gives the other 16."""
CHALLENGE_BYTES = 16


class Challenge(Record):
    """One challenge: its random bytes, and the key pair made for it alone. The secret half
    never leaves rank 0, and is left out of the repr and str."""

    __slots__ = __match_args__ = ("nonce", "public", "secret")

    def __init__(self, nonce: bytes, public: str, secret: bytes) -> None:
        self.nonce, self.public, self.secret = nonce, public, secret  # public: Z85, to the joiner

    def __repr__(self) -> str:
        return f"Challenge(nonce={self.nonce!r}, public={self.public!r})"

    __str__ = __repr__


def new_challenge() -> Challenge:
    """A fresh challenge: 16 random bytes and a key pair used for nothing else."""
    pair = nacl.public.PrivateKey.generate()
    return Challenge(os.urandom(CHALLENGE_BYTES), encode_key(bytes(pair.public_key)), bytes(pair))


def statement(rank: int, incarnation: int, public_key: str) -> bytes:
    """What a proof says: this key's holder claims this reservation."""
    return (
        f"tbon flub: the holder of {public_key} claims rank {rank} incarnation {incarnation}"
    ).encode()


def encode_nonce(nonce: bytes) -> str:
    return base64.b64encode(nonce).decode("ascii")


def decode_nonce(text: object) -> bytes | None:
    """A challenge's bytes as sent (base64), or None if they are not exactly 16 bytes."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    return raw if len(raw) == CHALLENGE_BYTES else None


def prove(secret_key: str, challenge_key: str, nonce: bytes, said: bytes) -> str:
    """The joiner's answer: the box of `said` from its secret key (Z85) to the challenge's
    public key (Z85), base64. ValueError if a key or the nonce is malformed."""
    if len(nonce) != CHALLENGE_BYTES:
        raise ValueError("a challenge is 16 bytes")
    box = nacl.public.Box(
        nacl.public.PrivateKey(decode_key(secret_key)),
        nacl.public.PublicKey(decode_key(challenge_key)),
    )
    sealed = box.encrypt(said, NONCE_PREFIX + nonce).ciphertext
    return base64.b64encode(sealed).decode("ascii")


def check(challenge: Challenge, public_key: str, said: bytes, proof: object) -> bool:
    """Whether `proof` is the box of `said` that only the secret key of `public_key` (Z85)
    could have made for `challenge`."""
    if not isinstance(proof, str):
        return False
    try:
        sealed = base64.b64decode(proof.encode("ascii"), validate=True)
        box = nacl.public.Box(
            nacl.public.PrivateKey(challenge.secret),
            nacl.public.PublicKey(decode_key(public_key)),
        )
        opened = box.decrypt(sealed, NONCE_PREFIX + challenge.nonce)
    except (binascii.Error, UnicodeEncodeError, ValueError, nacl.exceptions.CryptoError):
        return False
    import hmac  # here, not at the top: only rank 0 checks, and hmac loads OpenSSL (~3 ms)

    return hmac.compare_digest(opened, said)
