"""pyzmq's per-message calls without their Python-level costs: what every broker does per frame.

pyzmq's flags are IntFlag members: `zmq.SNDMORE | flags` in send_multipart is an enum call per
frame, and every `get(option)` looks its option up as a SocketOption (an enum call inside the
Cython). recv_multipart asks RCVMORE through that same `get` after each frame, where a frame
received without copying already says whether more follow. The helpers here use plain ints and
the lowest calls pyzmq offers, with the same effect as the calls they replace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq
from zmq import zmq_poll

POLLIN, DONTWAIT = int(zmq.POLLIN), int(zmq.DONTWAIT)
SNDMORE = int(zmq.SNDMORE)
COPY_THRESHOLD = zmq.COPY_THRESHOLD  # pyzmq's default: smaller frames are copied anyway


def send_frames(sock: zmq.Socket, frames: Sequence[Any], flags: int = 0) -> None:
    """sock.send_multipart(frames, flags=flags, copy=False), in one call a frame with SNDMORE
    but the last. As pyzmq does, a frame under its copy threshold is copied and a larger one
    is sent without copying; here the small one skips the Frame path's checks. ZeroMQ takes a
    message's later frames once it took its first, as send_multipart relies on too."""
    send, more = sock.send, SNDMORE | flags
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        send(frame, more if index < last else flags, copy=len(frame) < COPY_THRESHOLD)


def receive(sock: zmq.Socket, flags: int = 0) -> list[Any]:
    """recv_multipart(flags, copy=False) less its option read after each frame: each frame
    received without copying says whether more follow."""
    recv = sock.recv
    frames = [recv(flags, copy=False)]
    while frames[-1].more:
        frames.append(recv(flags, copy=False))
    return frames


def receive_bytes(sock: zmq.Socket) -> list[bytes]:
    """recv_multipart(): the frames of one message, as bytes."""
    return [frame.bytes for frame in receive(sock)]


def readable(sock: zmq.Socket) -> bool:
    """Whether a message waits on `sock`, without waiting: `sock.poll(0)` (which builds a
    Poller and a dict) or `get(EVENTS) & POLLIN` (an enum lookup of EVENTS), in one zmq_poll."""
    return bool(zmq_poll([(sock, POLLIN)], 0))
