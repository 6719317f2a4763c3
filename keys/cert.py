"""CURVE key pairs and the certificate files that hold them.

A certificate is a small TOML file::

    [metadata]
    name = "node17"
    hostname = "node17.cluster"
    time = "2025-01-31T12:00:00Z"
    tbon-version = "0.1.0"

    [curve]
    public-key = "<40 Z85 characters>"
    secret-key = "<40 Z85 characters>"   # absent in a public-only certificate

Keys are Curve25519 keys made with PyNaCl and Z85-encoded, the form ZeroMQ's CURVE options take.
The broker generates a key pair at every start, so this module's top-level imports stay light:
the TOML libraries are imported only by the functions that read or write files.

A secret key is never logged or printed: `Certificate` leaves it out of its repr, and no error
message includes a key's text.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from typing import TYPE_CHECKING

import nacl.public
import zmq
from zmq.utils import z85

from tbon.errors import TbonError
from tbon.record import Record

if TYPE_CHECKING:  # loaded to read or write a certificate file: a broker that makes its keys
    from pathlib import Path  # in memory never loads pathlib (and urllib.parse, ipaddress)

KEY_BYTES = 32
"""A Curve25519 key, public or secret, is 32 bytes."""
KEY_Z85_LENGTH = 40
"""Z85 encodes 32 bytes as 40 characters (5 for every 4 bytes)."""
MAX_CERTIFICATE_BYTES = 64 * 1024
"""A certificate is a few hundred bytes; a larger file is refused rather than read."""

_Z85_ALPHABET = frozenset(z85.Z85CHARS.decode("ascii"))


def generate_keypair() -> tuple[str, str]:
    """Make a fresh CURVE key pair and return it as ``(public_z85, secret_z85)``: libzmq's own
    (libsodium's Curve25519, Z85 in C), a fifth of what PyNaCl and pyzmq's Z85 in Python cost
    every broker, each of which makes one as it starts."""
    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


def public_from_secret(secret_z85: str) -> str:
    """Return the Z85 public key that belongs to a Z85 secret key.

    Raises ValueError if ``secret_z85`` is not a well-formed key; the message never quotes it.
    """
    secret = nacl.public.PrivateKey(decode_key(secret_z85))
    return _encode(bytes(secret.public_key))


def fingerprint(public_z85: str) -> str:
    """Return a short, stable fingerprint of a public key, for people to compare by eye.

    The fingerprint is ``"SHA256:"`` followed by the first 16 hex digits (64 bits) of the SHA-256
    digest of the raw 32-byte key. It depends only on the key, never on the file or its metadata,
    so the same key shows the same fingerprint everywhere. Raises ValueError for a malformed key.
    """
    import hashlib  # here, not at the top: a broker that shows no fingerprint starts faster

    return "SHA256:" + hashlib.sha256(decode_key(public_z85)).hexdigest()[:16]


def is_key(key_z85: str) -> bool:
    """Whether `key_z85` is a key in the canonical form `decode_key` accepts."""
    try:
        decode_key(key_z85)
    except ValueError:
        return False
    return True


def decode_key(key_z85: str) -> bytes:
    """Decode a Z85 key to its 32 raw bytes, accepting only the canonical 40-character form.

    pyzmq's decoder raises KeyError or struct.error on bad input, so the checks are done here, and
    every failure is a ValueError that does not quote the key (it may be a secret).
    """
    if not isinstance(key_z85, str):
        raise ValueError(f"a key must be a string, not {type(key_z85).__name__}")
    if len(key_z85) != KEY_Z85_LENGTH:
        raise ValueError(f"a key must be {KEY_Z85_LENGTH} Z85 characters, not {len(key_z85)}")
    if not _Z85_ALPHABET.issuperset(key_z85):
        raise ValueError("a key must contain only Z85 characters")
    overflow = "a key is not valid Z85 (a group of 5 characters overflows 32 bits)"
    try:
        raw = z85.decode(key_z85)
    except struct.error:
        raise ValueError(overflow) from None
    if len(raw) != KEY_BYTES or _encode(raw) != key_z85:  # defensive: the checks above exclude it
        raise ValueError(overflow)
    return raw


def encode_key(raw: bytes) -> str:
    """The Z85 form of a raw 32-byte key."""
    return _encode(raw)


def _encode(raw: bytes) -> str:
    return z85.encode(raw).decode("ascii")


class Certificate(Record):
    """A CURVE key pair (or a public key alone) with where, when and by what it was made.

    ``secret`` is None for a public-only certificate. It is left out of the repr and str so that
    logging a certificate cannot leak it.
    """

    __slots__ = __match_args__ = ("public", "secret", "name", "hostname", "created", "version")

    def __init__(
        self, public: str, secret: str | None, name: str, hostname: str, created: str, version: str
    ) -> None:
        self.public, self.secret, self.name = public, secret, name
        self.hostname, self.created, self.version = hostname, created, version

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__ if f != "secret")
        return f"Certificate({shown})"

    __str__ = __repr__


def new_certificate(name: str | None = None) -> Certificate:
    """Make a certificate with a fresh key pair, named after this host unless ``name`` is given."""
    import socket
    from datetime import UTC, datetime

    hostname = socket.gethostname()
    public, secret = generate_keypair()
    return Certificate(
        public=public,
        secret=secret,
        name=hostname if name is None else name,
        hostname=hostname,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        version=_tbon_version(),
    )


def _tbon_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tbon")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def write_certificate(path: str | os.PathLike[str], cert: Certificate, force: bool = False) -> None:
    """Write ``cert`` to ``path`` as TOML, mode 0600 from the moment the file exists.

    The file is written to a temporary file in the same directory, created with mode 0600 and
    fchmod'ed to 0600 whatever the umask, then moved into place, so a reader never sees it
    half-written or with looser permissions. An existing file is kept (TbonError) unless ``force``.
    """
    from pathlib import Path

    import tomli_w

    target = Path(path)
    document: dict[str, dict[str, str]] = {
        "metadata": {
            "name": cert.name,
            "hostname": cert.hostname,
            "time": cert.created,
            "tbon-version": cert.version,
        },
        "curve": {"public-key": cert.public},
    }
    if cert.secret is not None:
        document["curve"]["secret-key"] = cert.secret
    data = tomli_w.dumps(document).encode("utf-8")

    directory = target.parent
    if not directory.is_dir():
        problem = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise TbonError(_line(f"cannot write {target}: directory {directory} {problem}"))
    if not force and os.path.lexists(target):
        raise TbonError(_line(f"{target} already exists: use --force to overwrite it"))

    temporary = directory / f".{target.name}.{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise TbonError(_line(f"cannot write {target}: {_reason(error)}")) from None
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        _move_into_place(temporary, target, force)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _move_into_place(temporary: Path, target: Path, force: bool) -> None:
    """Rename ``temporary`` to ``target``; without ``force``, never replace an existing file."""
    exists = TbonError(_line(f"{target} already exists: use --force to overwrite it"))
    try:
        if force:
            os.replace(temporary, target)
            return
        try:
            # A hard link fails if the target exists, closing the race with the check above.
            os.link(temporary, target)
        except FileExistsError:
            raise exists from None
        except OSError:
            # The file system has no hard links: fall back to check-then-rename.
            if os.path.lexists(target):
                raise exists from None
            os.replace(temporary, target)
            return
        _remove_quietly(temporary)
    except OSError as error:
        raise TbonError(_line(f"cannot write {target}: {_reason(error)}")) from None


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def load_certificate(path: str | os.PathLike[str]) -> Certificate:
    """Read and check a certificate file; every failure is a one-line TbonError naming the file.

    ``[curve] public-key`` is required; ``secret-key`` may be absent (a public-only certificate).
    A file holding a secret key must not be readable or writable by group or others, and its
    public key must be the one that belongs to its secret key. The metadata is informational:
    a missing field reads as an empty string, but a present one must be a string.
    """
    import tomllib
    from pathlib import Path

    source = Path(path)
    chunks: list[bytes] = []

    def fail(problem: str) -> TbonError:
        return TbonError(_line(f"{source}: {problem}"))

    try:
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as error:
        raise fail(f"cannot open: {_reason(error)}") from None
    try:
        info = os.fstat(fd)  # the mode of the file actually read, even if the path is replaced
        if not stat.S_ISREG(info.st_mode):
            raise fail("not a regular file")
        if info.st_size > MAX_CERTIFICATE_BYTES:
            raise fail(f"too large for a certificate ({info.st_size} bytes)")
        remaining = MAX_CERTIFICATE_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as error:
        raise fail(f"cannot read: {_reason(error)}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CERTIFICATE_BYTES:
        raise fail("too large for a certificate")

    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise fail("not a certificate (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as error:
        raise fail(f"not a certificate (not valid TOML: {error})") from None

    curve = document.get("curve")
    if not isinstance(curve, dict):
        raise fail("not a certificate (no [curve] table)")
    metadata = document.get("metadata", {})
    if not isinstance(metadata, dict):
        raise fail("[metadata] must be a table")

    if "public-key" not in curve:
        raise fail("missing [curve] public-key")
    public = curve["public-key"]
    try:
        decode_key(public)
    except ValueError as error:
        raise fail(f"bad [curve] public-key: {error}") from None

    secret = curve.get("secret-key")
    if secret is not None:
        try:
            expected = public_from_secret(secret)
        except ValueError as error:
            raise fail(f"bad [curve] secret-key: {error}") from None
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            access = "readable" if mode & 0o044 else "writable"
            raise fail(
                f"holds a secret key but is {access} by group or others (mode {mode:04o}):"
                f" run chmod 600 {source}"
            )
        if expected != public:
            raise fail("[curve] public-key does not match secret-key")

    def text(key: str) -> str:
        value = metadata.get(key, "")
        if key == "time" and hasattr(value, "isoformat"):  # a bare TOML date-time
            return str(value.isoformat())
        if not isinstance(value, str):
            raise fail(f"[metadata] {key} must be a string")
        return value

    return Certificate(
        public=public,
        secret=secret,
        name=text("name"),
        hostname=text("hostname"),
        created=text("time"),
        version=text("tbon-version"),
    )


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _line(message: str) -> str:
    """Keep an error on one line even if a path or a parser message holds a newline."""
    return " ".join(message.splitlines())
