"""Wire-up by PMI: learn rank and size, swap business cards, authorize children, then connect.

The order matters for security and speed: every parent binds and puts its card, all meet at a
barrier, each parent authorizes exactly its children's keys, all meet again, and only then do the
children connect. No child ever knocks on a door that is not yet expecting it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tbon.errors import TbonError, UsageError
from tbon.overlay.boot.config_file import BootConfig
from tbon.overlay.boot.pmi_client import PmiClient
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


def card_key(rank: int) -> str:
    return f"tbon-card-{rank}"


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


def pmi_wireup(
    pmi: PmiClient,
    topo: str,
    requested_size: int | None,
    hostname: str,
    public_key: str,
    bind: Callable[[Topology, int], str],
    authorize: Callable[[int, int, str], None],
) -> Wireup:
    """Run the two-barrier exchange; `bind` is called only by brokers that have children."""
    pmi.init()
    rank, launched = pmi.rank, pmi.size
    topology = Topology(topo, instance_size(requested_size, launched))
    endpoint = bind(topology, rank) if topology.children(rank) else ""
    pmi.put(card_key(rank), BusinessCard(hostname, public_key, endpoint).encode())
    pmi.barrier()
    wireup = Wireup(rank, topology.size, launched, topology)
    parent = topology.parent(rank)
    if parent is not None:
        wireup.parent = BusinessCard.decode(pmi.get(card_key(parent)))
    for child in topology.children(rank):
        if child < launched:
            authorize(
                child, FIRST_INCARNATION, BusinessCard.decode(pmi.get(card_key(child))).public_key
            )
    if rank == 0:
        wireup.hosts = [hostname] + [
            BusinessCard.decode(pmi.get(card_key(other))).host for other in range(1, launched)
        ]
    pmi.barrier()
    return wireup


def config_wireup(
    boot: BootConfig,
    topo: str,
    requested_size: int | None,
    hostname: str,
    public_key: str,
    bind: Callable[[Topology, int, str], str],
    share: Callable[[], None],
) -> Wireup:
    """Config-file bootstrap: everything is in the file, so there is nothing to exchange. The
    rank is this host's place in `hosts`; every rank holds the instance's one key pair."""
    rank = boot.rank_of(hostname)
    launched = len(boot.hosts)
    size = launched if requested_size is None else requested_size
    if size < launched:
        raise UsageError(f"size={size} is smaller than the {launched} hosts of {boot.path}")
    topology = boot.topology(topo, size)
    if topology.children(rank):
        bind(topology, rank, boot.hosts[rank].bind)
        share()  # its config-booted children hold the instance's key
    parent = topology.parent(rank)
    card = None
    if parent is not None:
        entry = boot.hosts[parent]
        card = BusinessCard(entry.host, public_key, entry.connect)
    hosts = [entry.host for entry in boot.hosts]
    return Wireup(rank, size, launched, topology, parent=card, hosts=hosts)


def singleton_wireup(
    topo: str, requested_size: int | None, hostname: str, bind: Callable[[Topology, int], str]
) -> Wireup:
    """No PMI: this broker is rank 0 of an instance it launched alone (others may join later)."""
    topology = Topology(topo, instance_size(requested_size, 1, by_pmi=False))
    if topology.children(0):
        bind(topology, 0)
    return Wireup(0, topology.size, 1, topology, hosts=[hostname])
