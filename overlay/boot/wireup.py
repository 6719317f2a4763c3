"""What every bootstrap produces: a broker's rank, its tree, and where its parent is.

Four bootstraps fill it in, each in a module of its own: PMI (pmi.py), a config file
(config_file.py), FLUB, joining a running instance (flub.py), and a broker alone (singleton.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tbon.errors import TbonError, UsageError
from tbon.overlay.state.topology import Topology

FIRST_INCARNATION = 1


@dataclass(frozen=True, slots=True)
class BusinessCard:
    """What a broker tells the others through the PMI KVS: where it is and who it is."""

    host: str
    public_key: str  # Z85
    endpoint: str  # empty for a broker that has no children

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


@dataclass(slots=True)
class Wireup:
    rank: int
    size: int
    launched: int
    topology: Topology
    parent: BusinessCard | None = None
    hosts: list[str] = field(default_factory=list)
    incarnation: int = FIRST_INCARNATION
    # the parent's rank where it is not the topology's: a rank 0 refilled after a takeover
    # joins under the root that took over (docs/protocol.md §13.6)
    peer: int | None = None


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
