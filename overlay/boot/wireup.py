"""What every bootstrap produces: a broker's rank, its tree, and where its parent is.

Four bootstraps fill it in, each in a module of its own: PMI (pmi.py), a config file
(config_file.py), FLUB, joining a running instance (flub.py), and a broker alone (singleton.py).
"""

from __future__ import annotations

from tbon.errors import TbonError, UsageError
from tbon.overlay.state.topology import Topology
from tbon.record import Record

FIRST_INCARNATION = 1


class BusinessCard(Record):
    """What a broker tells the others through the PMI KVS: where it is and who it is."""

    __slots__ = __match_args__ = ("host", "public_key", "endpoint")

    def __init__(self, host: str, public_key: str, endpoint: str) -> None:
        # the key in Z85; the endpoint empty for a broker that has no children
        self.host, self.public_key, self.endpoint = host, public_key, endpoint

    def encode(self) -> str:
        # Hex, not Z85: Z85's alphabet holds '=' and other characters PMI servers may not pass.
        return f"{self.host};{self.public_key.encode().hex()};{self.endpoint}"

    @staticmethod
    def decode(text: str) -> BusinessCard:
        parts = text.split(";")
        if len(parts) != 3:
            raise TbonError(f"PMI: malformed business card {text!r}")
        host, key_hex, endpoint = parts
        try:
            public = bytes.fromhex(key_hex).decode()
        except ValueError:
            raise TbonError(f"PMI: malformed key in business card {text!r}") from None
        return BusinessCard(host, public, endpoint)


class Wireup:
    __slots__ = ("hosts", "incarnation", "launched", "parent", "peer", "rank", "size", "topology")

    def __init__(
        self,
        rank: int,
        size: int,
        launched: int,
        topology: Topology,
        parent: BusinessCard | None = None,
        hosts: list[str] | None = None,
        incarnation: int = FIRST_INCARNATION,
        peer: int | None = None,
    ) -> None:
        self.rank, self.size, self.launched, self.topology = rank, size, launched, topology
        self.parent = parent
        self.hosts: list[str] = [] if hosts is None else hosts
        self.incarnation = incarnation
        # the parent's rank where it is not the topology's: a rank 0 refilled after a takeover
        # joins under the root that took over (docs/protocol.md §13.6)
        self.peer = peer


def instance_size(requested: int | None, launched: int, by_pmi: bool = True) -> int:
    """The instance's size: the brokers launched, or more with `-S size=S` (the rest spares)."""
    if requested is None:
        return launched
    if by_pmi and requested <= launched:
        raise UsageError(
            f"size={requested} must exceed the {launched} brokers launched by PMI "
            "(the extra ranks are spares); leave size out for exactly "
            f"{launched}"
        )
    return requested
