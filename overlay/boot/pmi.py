"""Wire-up by PMI: learn rank and size, swap business cards, authorize children, then connect.

The order matters for security and speed: every parent binds and puts its card, all meet at a
barrier, each parent authorizes exactly its children's keys, all meet again, and only then do the
children connect. No child ever knocks on a door that is not yet expecting it.
"""

from __future__ import annotations

from collections.abc import Callable

from tbon.overlay.boot.pmi_client import PmiClient
from tbon.overlay.boot.wireup import FIRST_INCARNATION, BusinessCard, Wireup, instance_size
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

    Rank 0 reads every rank's host, for its rank table, only after the second barrier: the
    values stay in the key-value space until finalize, and the other brokers then connect and
    are welcomed while it reads (N-1 reads in a row, about 0.5 s at 1,024 ranks)."""
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
    if rank == 0:  # after the barrier: the others connect meanwhile, not wait for these N-1
        wireup.hosts = [hostname] + [
            BusinessCard.decode(pmi.get(card_key(other))).host for other in range(1, launched)
        ]
    return wireup
