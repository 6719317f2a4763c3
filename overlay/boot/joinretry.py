"""When a FLUB joiner tries its boot servers again, and when it gives up.

A boot server that answers "I cannot reach the root now" (its way to the root is being healed:
`EHOSTUNREACH` to `flub.allocate`, as a standby answers while the root group elects after the
root's death; or grants paused or a root superseded: `ETIMEDOUT`) may be able to grant a moment
later. Such a round of the list is *unsettled*: the joiner pauses and tries the whole list
again, the pause doubling from FIRST_PAUSE up to LONGEST_PAUSE, until its own
`broker.join-timeout` from the start of the join would be over. A round in which every boot
server was unreachable, went away or stayed silent is not retried: that is the instance gone,
and the joiner exits 75 at once, as it always has (docs/flub.md §2, "Failover between boot
servers"; docs/protocol.md §13.4)."""

from __future__ import annotations

FIRST_PAUSE = 0.05
"""Seconds before the first new round (a takeover takes about 0.6 s: a few rounds cover it)."""

LONGEST_PAUSE = 1.0
"""The longest pause between two rounds."""


def pause_before_round(done: int, unsettled: bool, left: float) -> float | None:
    """The seconds to pause before the next round of the boot servers, after `done` rounds
    (1 or more) that all failed, the last `unsettled` or not, with `left` seconds of the join's
    deadline still to run; None to give up (nothing suggests a later answer, or no time for
    one)."""
    if not unsettled or done < 1:
        return None
    pause = min(LONGEST_PAUSE, FIRST_PAUSE * 2 ** min(done - 1, 16))
    return pause if pause < left else None
