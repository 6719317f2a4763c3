"""When rank 0 reads the hosts of brokers that never came online (overlay/boot/latehosts.py)."""

from __future__ import annotations

from tbon.overlay.boot.latehosts import LateHosts


def test_the_read_waits_for_a_quiet_table() -> None:
    late = LateHosts(100.0, quiet=5.0)
    late.saw(3, 100.0)
    assert not late.is_due(104.9) and late.next_deadline() == 105.0
    late.saw(4, 103.0)  # the table changed: put off
    assert not late.is_due(107.9) and late.is_due(108.0)
    late.saw(4, 107.0)  # unchanged: the deadline stays
    assert late.next_deadline() == 108.0
