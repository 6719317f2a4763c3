"""ZeroMQ socket-monitor events, read without zmq.utils.monitor.

That helper imports zmq.asyncio, and with it asyncio and ssl: tens of milliseconds of start-up
that a broker never uses. The event format is small and fixed (zmq_socket_monitor(3)): a first
frame of a 16-bit event number and a 32-bit value (a file descriptor for connection events), both
in host byte order, then a frame with the endpoint.
"""

from __future__ import annotations

import struct

_EVENT = struct.Struct("=HI")


def read_event(frames: list[bytes]) -> tuple[int, int]:
    """(event, value) from one monitor message."""
    if not frames or len(frames[0]) != _EVENT.size:
        raise ValueError("not a ZeroMQ monitor event")
    event, value = _EVENT.unpack(frames[0])
    return event, value
