"""Wire-up by PMI: learn rank and size, swap business cards, authorize children, then connect.

The order matters for security and speed: every parent binds and puts its card, all meet at a
barrier, each parent authorizes exactly its children's keys, all meet again, and only then do the
children connect. No child ever knocks on a door that is not yet expecting it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tbon.overlay.boot.pmi_client import PmiClient
from tbon.overlay.boot.wireup import FIRST_INCARNATION, BusinessCard, Wireup, instance_size
from tbon.overlay.state.rankevents import UNKNOWN_HOST
from tbon.overlay.state.topology import Topology


def card_key(rank: int) -> str:
    return f"tbon-card-{rank}"


def pmi_wireup(
    pmi: PmiClient,
    topo: str,
    requested_size: int | None,
    hostname: str,
    public_key: str,
    bind: Callable[[Topology, int], str],
    authorize: Callable[[int, int, str], None],
) -> Wireup:
    """Run the two-barrier exchange; `bind` is called only by brokers that have children.

    Rank 0 reads no other rank's card: each broker's Online brings its host, and rank 0's table
    shows UNKNOWN_HOST until then. Reading all N-1 cards here (one blocking round trip each,
    which no known server lets a client pipeline: Slurm reads one request per read()) held
    rank 0 for seconds at 1,024 ranks while its children knocked. The hosts of ranks that never
    come online are read later, and only theirs (`started_on`)."""
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
    pmi.barrier()
    if rank == 0:
        wireup.hosts = [hostname] + [UNKNOWN_HOST] * (launched - 1)
    return wireup


def started_on(pmi: PmiClient, ranks: Iterable[int]) -> list[tuple[int, str]]:
    """The host each of `ranks`' brokers was started on, from its business card: for rank 0,
    of the ranks that never came online (the cards stay in the key-value space until rank 0
    finalizes). One blocking round trip per rank."""
    return [(rank, BusinessCard.decode(pmi.get(card_key(rank))).host) for rank in ranks]
