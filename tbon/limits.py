"""Limits that the broker and the commands share: how many ranks an instance may have.

Each command that is told a number of ranks or brokers (`tbon start --test-size`, `tbon alloc -N`
and `--size`, `tbon expand -n`, `-S size=S`) checks it here before it starts anything, so that a
typo is a usage error and never an attempt. Imported by the broker: no typer, no rich.
"""

from __future__ import annotations

import os

from tbon.errors import UsageError

MAX_SIZE = 262144
"""The most ranks an instance may have: 2^18, so that the largest machines fit (Fugaku has
158,976 nodes, El Capitan 11,136).

Why no more. Nothing sends the whole rank table in one message any more above WHOLE_TABLE_MAX:
`status.get` answers in pages of at most PAGE_BYTES, and the views (`status.summary`,
`status.errors`, `status.tree`) are computed at rank 0, so no message grows with the size but a
few that name ranks as idsets. What grows with the size is rank 0's memory and time: the table
keeps an entry only for ranks that were launched or touched (overlay/state/rankentries.py), but
its subtree roll-up keeps a few words per rank (rankstates.Rollup), and a tree of 2^18 ranks
walked once (a status page of every rank, a fully held instance) costs rank 0 seconds of Python.
2^18 ranks, most vacant, keep rank 0 under 128 MB (benchmarks/status.py); and the one entry
that grows with the size, rank 0's `children` in a flat tree (`kary:0`), takes 1.8 MB of JSON at
2^18 ranks, within one page's message. Past that, a flat tree's root entry alone would approach
the 4 MiB limit (MAX_MESSAGE_BYTES in overlay/wire/message.py). tests/test_limits.py builds the
worst answers at this size and checks that each fits.
"""

WHOLE_TABLE_MAX = 8192
"""The largest table rank 0 sends whole, in one `status.get` answer or `status.watch` update,
the shape older clients read. An entry takes at most about 316 bytes (64-character host names,
seven-digit pids, every rank lost with a 64-character reason): 8192 entries are 2.6 MB, 62% of a
4 MiB message; 16384 would not fit. A larger table is read in pages (docs/protocol.md §7)."""

PAGE_BYTES = 1 << 20
"""What one page of the table (`status.get` with `start`) holds at most, in encoded entries,
besides the one entry that may cross it: a quarter of a message."""


def _shown(text: str) -> str:
    """A number as typed, cut short if it is very long: the error stays one readable line."""
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def check_size(value: int, what: str) -> int:
    """`value` if an instance may have that many ranks; else a UsageError naming `what`."""
    if not 1 <= value <= MAX_SIZE:
        # str() refuses ints of over 4300 digits: show those by their size alone.
        shown = _shown(str(value)) if abs(value) < 10**24 else f"of {value.bit_length()} bits"
        raise UsageError(
            f"invalid {what} {shown}: out of range (an instance has 1 to {MAX_SIZE} ranks)"
        )
    return value


def parse_size(text: str, what: str) -> int:
    """A rank count typed as text (`-S size=S`): ASCII digits, 1 to MAX_SIZE."""
    value = _whole(text, what, f"from 1 to {MAX_SIZE}")
    if not 1 <= value <= MAX_SIZE:
        raise UsageError(
            f"invalid {what} {_shown(text)!r}: out of range (an instance has 1 to {MAX_SIZE} ranks)"
        )
    return value


def parse_rank(text: str, what: str) -> int:
    """A rank typed as text (`-S broker.rank=R`): ASCII digits, 0 to MAX_SIZE - 1."""
    value = _whole(text, what, f"from 0 to {MAX_SIZE - 1}")
    if value >= MAX_SIZE:
        raise UsageError(
            f"invalid {what} {_shown(text)!r}: out of range (ranks go from 0 to {MAX_SIZE - 1})"
        )
    return value


def _whole(text: str, what: str, expected: str) -> int:
    """The number in `text`, all ASCII digits, or a UsageError; anything over 24 digits comes
    back as 10**24 (int() refuses over 4300 digits, and such a number is out of range anyway)."""
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"invalid {what} {text!r}: use a whole number {expected}")
    return int(text) if len(text) <= 24 else 10**24


MAX_DURATION = 24 * 86400.0
"""The longest duration a broker attribute or a command's --timeout may be: 24 days.

That is about 2^31 ms, the longest timeout a C int of milliseconds carries (poll(2), ZeroMQ
socket options), so no timer overflows whatever layer it reaches. Unbounded, a tbon.heartbeat of
30 digits stopped every broker with an OverflowError in zmq_poll. Where 0 means "off"
(tbon.torpid, tbon.timeout), 0 is the way to say "never".
"""


def check_duration(seconds: float, what: str) -> float:
    """`seconds` if it is at most MAX_DURATION; else a UsageError naming `what`."""
    if not seconds <= MAX_DURATION:  # NaN and inf included
        raise UsageError(f"{what} is out of range: at most {MAX_DURATION / 86400:g}d")
    return seconds


ENV_LIMIT = 1 << 20
"""Bytes an exec.start's `env` may take, counted as execve(2) does (NAME=VALUE and a NUL each):
a quarter of a message, and half of what Linux lets a program's arguments and environment take
with the usual 8 MiB stack. Here, not in the exec service, so that the CLI checks it cheaply."""


def environment_size(env: dict[str, str]) -> int:
    """What `env` takes in a process, as execve(2) counts it."""
    return sum(len(os.fsencode(name)) + len(os.fsencode(value)) + 2 for name, value in env.items())
