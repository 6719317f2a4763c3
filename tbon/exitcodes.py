"""Broker exit codes (docs/design.md), chosen so that a supervisor knows whether to restart."""

SHUTDOWN = 0  # instance shut down, or this broker was retired: do not restart
INTERNAL = 1  # internal error: restart with back-off
USAGE = 2  # usage error: do not restart
NO_RANK = 69  # FLUB: no rank available: do not restart
LOST = 75  # lost its parent or the instance: a new process may rejoin by FLUB
REFUSED = 77  # refused (superseded, a retired key back, expired reservation, bad key): no restart
