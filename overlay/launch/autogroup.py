"""The weight of `tbon expand`'s booting brokers against other sessions (Linux autogroup).

Where Linux shares CPU time between sessions (autogroup, sched(7)), the joiners of one expand
share one session (launch/forker.py), which weighs as much as the session of a user's `tbon
ping` and as much as rank 0's. On two cores, booting joiners always want the CPU, so a command
run meanwhile got half of what it had idle, and rank 0 waited for a CPU twice as long as it ran
(measured during `tbon expand -n 256`): the joins the joiners waited for came later too.

While they boot, their session's nice (its weight against other sessions, not any process's
own nice) is raised to BOOT_NICE, and set back to 0 when expand has followed them: what Linux
allows any user both ways (only a nice below 0 needs privilege), unlike a process's nice, which
an unprivileged broker could never lower again. Best effort: where there is no autogroup, or
the write is refused, nothing changes.
"""

from __future__ import annotations

import contextlib
import time

BOOT_NICE = 3
"""The joiners' session's nice while they boot: weight 335 against a session's 1024 (sched(7)),
so that a busy session of another terminal keeps three quarters of its CPU, and an idle one's
command (or rank 0's turn) comes first when it wakes."""

_RETRIES = 5
_RETRY_S = 0.11
"""Linux refuses an unprivileged caller (EAGAIN) a second write within 0.1 s of the last, by
anyone: wait that long and try again, a few times."""


def set_session_nice(pid: int, nice: int) -> bool:
    """Set the nice of `pid`'s session's autogroup; whether it was."""
    for _ in range(_RETRIES):
        try:
            with open(f"/proc/{pid}/autogroup", "w") as autogroup:
                autogroup.write(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: too soon after another write
            time.sleep(_RETRY_S)
        except OSError:  # no autogroup here, the process gone, or not ours
            return False
    return False


def restore(pid: int) -> None:
    """The session of `pid` back to an ordinary weight (nice 0), if it was raised."""
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/autogroup") as autogroup:
            if autogroup.read().split()[-1:] == ["0"]:
                return
        set_session_nice(pid, 0)
