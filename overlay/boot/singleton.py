"""A broker started alone, with no PMI, config file or boot server: rank 0 of its own instance.
Others may join it later by FLUB, into the spare ranks that `-S size=S` makes."""

from __future__ import annotations

from collections.abc import Callable

from tbon.overlay.boot.wireup import Wireup, instance_size
from tbon.overlay.state.topology import Topology


def singleton_wireup(
    topo: str, requested_size: int | None, hostname: str, bind: Callable[[Topology, int], str]
) -> Wireup:
    """No PMI: this broker is rank 0 of an instance it launched alone (others may join later)."""
    topology = Topology(topo, instance_size(requested_size, 1, by_pmi=False))
    if topology.children(0):
        bind(topology, 0)
    return Wireup(0, topology.size, 1, topology, hosts=[hostname])
