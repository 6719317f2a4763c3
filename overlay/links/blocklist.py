"""Addresses whose new connections the tree port drops in the kernel, while they flood it.

Closing a stranger over its cap (strangers.py) does not stop a flood: its sender opens another
at once, and each costs ZeroMQ's I/O thread an accept and the broker's loop a monitor event, as
fast as both can go. So an address that went past its cap is blocked: a classic BPF filter on
the tree port's listening socket drops the packets that would open a connection from it (a
connection made before keeps the filter it was accepted with, which never names its own
address), and its sender is left retrying in the kernel's back-off, at no cost to the broker.
The block is lifted once an interval (`every`, the handshake timeout) has passed with no
stranger of that address closed over the cap. IPv4 listeners only: an IPv6 one is not filtered.

`Blocklist` is the decision (pure); `filter_program` the BPF instructions, `attach` the one
system call; children.py finds the listener and carries it out.
"""

from __future__ import annotations

import contextlib
import socket
import struct

SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
MAX_BLOCKED = 250  # a jump over the tests to the drop is at most 255 instructions
_NET_SOURCE = -0x100000 + 12  # SKF_NET_OFF + the IPv4 header's source address
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_KEEP, _DROP = 0xFFFFFFFF, 0
_INSTRUCTION = struct.Struct("=HBBI")  # struct sock_filter: code, jt, jf, k


class Blocklist:
    """Which addresses to block: those that went past their cap in this interval or the last."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.blocked: frozenset[str] = frozenset()
        self._now: set[str] = set()  # went past their cap in this interval
        self._until = float("-inf")  # end of this interval

    def over(self, sources: list[str], now: float) -> frozenset[str] | None:
        """`sources` went past their cap: the new set to block, if it changed."""
        fresh = [s for s in sources if s != "?" and s not in self.blocked]
        self._now.update(s for s in sources if s != "?")
        if not fresh:
            return None
        if self._until == float("-inf"):
            self._until = now + self.every
        room = MAX_BLOCKED - len(self.blocked)
        self.blocked = self.blocked | frozenset(fresh[: max(0, room)])
        return self.blocked

    def tick(self, now: float) -> frozenset[str] | None:
        """At the end of an interval, an address quiet throughout it is let in again: the new
        set to block, if it changed."""
        if now < self._until:
            return None
        keep = frozenset(s for s in self.blocked if s in self._now)
        self._now = set()
        self._until = now + self.every if keep else float("-inf")
        if keep == self.blocked:
            return None
        self.blocked = keep
        return keep

    def next_deadline(self) -> float | None:
        return None if self._until == float("-inf") else self._until


def filter_program(blocked: frozenset[str]) -> bytes:
    """A socket filter that drops IPv4 packets from the `blocked` addresses, keeps the rest."""
    addresses = sorted(struct.unpack("!I", socket.inet_aton(a))[0] for a in blocked)
    code = [(_LD_W_ABS, 0, 0, _NET_SOURCE & 0xFFFFFFFF)]
    for place, address in enumerate(addresses):
        to_drop = len(addresses) - place  # over the other tests and the keep
        code.append((_JEQ_K, to_drop, 0, address))
    code += [(_RET_K, 0, 0, _KEEP), (_RET_K, 0, 0, _DROP)]
    return b"".join(_INSTRUCTION.pack(*instruction) for instruction in code)


def attach(fd: int, blocked: frozenset[str]) -> None:
    """Put the filter for `blocked` on the listening socket `fd` (none if it is empty)."""
    sock = socket.socket(fileno=fd)
    try:
        if not blocked:
            with contextlib.suppress(OSError):  # none was attached
                sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            return
        program = filter_program(blocked)
        import ctypes  # only once a flood is blocked: a broker that never sees one never loads it

        buffer = ctypes.create_string_buffer(program)
        fprog = struct.pack("HL", len(program) // _INSTRUCTION.size, ctypes.addressof(buffer))
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    finally:
        sock.detach()
