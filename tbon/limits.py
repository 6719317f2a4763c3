"""Limits that the broker and the commands share: how many ranks an instance may have.

Each command that is told a number of ranks or brokers (`tbon start --test-size`, `tbon alloc -N`
and `--size`, `tbon expand -n`, `-S size=S`) checks it here before it starts anything, so that a
typo is a usage error and never an attempt. Imported by the broker: no typer, no rich.
"""

from __future__ import annotations

import os

from tbon.errors import UsageError

MAX_SIZE = 8192
"""The most ranks an instance may have.

Rank 0 answers `status.get`, and pushes every `status.watch` update, as one message that holds an
entry for every rank, and a message may not exceed 4 MiB (MAX_MESSAGE_BYTES in
overlay/wire/message.py; a link drops frames over 8 MiB). Measured on the encoded `status.get`
response: 160-176 bytes per rank with host names of 8 to 20 characters, and 284 bytes per rank in
the worst case we could build (64-character host names, HOST_NAME_MAX on Linux; seven-digit pids;
six-digit incarnations; every rank `reserved`, with its joiner and expiry). 8192 ranks at 284
bytes is 2.3 MB, 56% of the limit, which leaves room for fields added later; 16384 would need
4.6 MB and not fit. Tests (tests/test_limits.py) build such a table and check that it fits.
"""


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
