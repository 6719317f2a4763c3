"""Multipart messages on a byte stream (an ssh session's stdin and stdout).

A message is a 4-byte count of frames, then each frame as a 4-byte length and its bytes, all
big-endian. The reader is a plain buffer: feed it what arrived, take out whole messages.
"""

from __future__ import annotations

import os
import struct

MAX_FRAME = 8 * 1024 * 1024  # as a broker's maxmsgsize: a garbled stream is refused, not eaten
MAX_FRAMES = 64
_U32 = struct.Struct(">I")


class FrameError(ValueError):
    """The stream is not a sequence of framed messages."""


def encode_frames(frames: list[bytes]) -> bytes:
    parts = [_U32.pack(len(frames))]
    for frame in frames:
        parts += [_U32.pack(len(frame)), frame]
    return b"".join(parts)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd`, however many writes a pipe takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FrameReader:
    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> list[bytes] | None:
        """The next whole message, or None until more has arrived."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (count,) = _U32.unpack_from(buffer, 0)
        if not 0 < count <= MAX_FRAMES:
            raise FrameError(f"a message of {count} frames")
        offset, frames = 4, []
        for _ in range(count):
            if len(buffer) < offset + 4:
                return None
            (length,) = _U32.unpack_from(buffer, offset)
            if length > MAX_FRAME:
                raise FrameError(f"a frame of {length} bytes")
            if len(buffer) < offset + 4 + length:
                return None
            frames.append(bytes(buffer[offset + 4 : offset + 4 + length]))
            offset += 4 + length
        del buffer[:offset]
        return frames
