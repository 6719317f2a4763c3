"""A FLUB joiner takes the instance's tbon.standbys from its grant (docs/design.md, the joiner's
attributes), so that one refilling a standby's rank with no children binds its endpoint all the
same: without it, a refilled leaf standby said an empty card, the other members could never
reach it across a dead root, and the root's death ended the instance (found by
tests/test_takeover_members.py)."""

from __future__ import annotations

from tbon.overlay.boot.wireup import Wireup
from tbon.overlay.broker.startup import _stands_by, adopt
from tbon.overlay.config.attributes import broker_config
from tbon.overlay.services.flub import flub_attributes
from tbon.overlay.state.topology import Topology

KARY4 = Topology("kary:4", 6)  # rank 2 a standby with no children; rank 5 below rank 1


def joiner(rank: int) -> Wireup:
    return Wireup(rank, KARY4.size, 0, KARY4, incarnation=2)


def test_a_joiner_takes_the_instances_standbys_and_a_leaf_standby_binds() -> None:
    own = broker_config({"tbon.standbys": "0"})  # expand's joiners are given none
    granted = adopt(own, flub_attributes(0.2, 0.0, 2.0, 30.0, standbys=2))
    assert granted.standbys == 2
    assert _stands_by(granted, joiner(2)) and _stands_by(granted, joiner(1))
    assert not _stands_by(granted, joiner(3)) and not _stands_by(granted, joiner(5))
    assert not _stands_by(own, joiner(2))  # what the joiner did before


def test_a_grant_without_standbys_or_with_a_bad_value_keeps_the_joiners_own() -> None:
    own = broker_config({"tbon.standbys": "2"})
    older = flub_attributes(0.2, 0.0, 2.0, 30.0)
    del older["tbon.standbys"]  # a root from before the attribute was sent
    assert adopt(own, older).standbys == 2
    for bad in (-1, 5, "2", 2.0, None, True):
        attributes = {**flub_attributes(0.2, 0.0, 2.0, 30.0), "tbon.standbys": bad}
        assert adopt(own, attributes).standbys == 2, bad
