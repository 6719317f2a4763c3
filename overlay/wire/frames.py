"""Multipart messages on a byte stream: a broker's local socket, an ssh session's stdin and stdout.

A message is a 4-byte count of frames, then each frame as a 4-byte length and its bytes, all
big-endian (docs/protocol.md §1.3). The reader is a plain buffer: feed it what arrived, take out
whole messages; it refuses a stream that cannot be framed (a count or a length out of bounds) the
moment the bad number arrives, so it never buffers more than one bounded message and a read.
The writer's side is `frame_parts`, the pieces to hand to `sendmsg` (a large frame goes as it
is, never copied), and `Outbox`, what a non-blocking stream could not take yet.
"""

from __future__ import annotations

import collections
import itertools
import os
import struct
from collections.abc import Callable, Iterable, Sequence

MAX_FRAME = 8 * 1024 * 1024  # as a broker's maxmsgsize: a garbled stream is refused, not eaten
MAX_FRAMES = 64
COPY_BELOW = 16 * 1024  # a smaller frame is copied beside its length; a larger one goes alone
IOV_MAX = 512  # buffers given to one sendmsg call (the system allows 1024)
_U32 = struct.Struct(">I")

Buffer = bytes | bytearray | memoryview


class FrameError(ValueError):
    """The stream is not a sequence of framed messages."""


def frame_parts(frames: Sequence[Buffer]) -> list[Buffer]:
    """A message as buffers to write in order: the counts and small frames joined, each large
    frame as it is (a job's output goes to the socket without a copy)."""
    parts: list[Buffer] = []
    small = bytearray(_U32.pack(len(frames)))
    for frame in frames:
        small += _U32.pack(len(frame))
        if len(frame) < COPY_BELOW:
            small += frame
        else:
            parts += [small, frame]
            small = bytearray()
    if small:
        parts.append(small)
    return parts


def encode_frames(frames: Sequence[Buffer]) -> bytes:
    return b"".join(frame_parts(frames))


def write_all(fd: int, data: Buffer) -> None:
    """All of `data` to `fd`, however many writes a pipe takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FrameReader:
    """Whole messages out of a stream read in pieces of any size.

    `max_message` bounds the frames of one message together, so that what a peer can make the
    reader hold is bounded too (a partial message, and what was read after it)."""

    def __init__(self, max_message: int = MAX_FRAMES * MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max_message = max_message
        self._need = 4  # bytes to have before the next message can be whole: skips re-parsing

    def __len__(self) -> int:
        """Bytes held: a partial message, or messages not taken out yet."""
        return len(self._buffer)

    def feed(self, data: Buffer) -> None:
        self._buffer += data

    def next(self) -> list[bytes] | None:
        """The next whole message, or None until more has arrived."""
        buffer = self._buffer
        if len(buffer) < self._need:
            return None
        spans = self._spans(buffer)
        if spans is None:
            return None
        with memoryview(buffer) as view:
            frames = [view[start:end].tobytes() for start, end in spans]
        del buffer[: spans[-1][1]]
        self._need = 4
        return frames

    def drain(self) -> list[list[bytes]]:
        """Every whole message held."""
        messages = []
        while (frames := self.next()) is not None:
            messages.append(frames)
        return messages

    def _spans(self, buffer: bytearray) -> list[tuple[int, int]] | None:
        """Where the frames of the first message lie, or None (noting how much more is needed)
        if it has not all arrived; FrameError as soon as a number in it is out of bounds."""
        (count,) = _U32.unpack_from(buffer, 0)
        if not 0 < count <= MAX_FRAMES:
            raise FrameError(f"a message of {count} frames")
        offset, total, spans = 4, 0, []
        for _ in range(count):
            if len(buffer) < offset + 4:
                self._need = offset + 4
                return None
            (length,) = _U32.unpack_from(buffer, offset)
            total += length
            if length > MAX_FRAME:
                raise FrameError(f"a frame of {length} bytes")
            if total > self._max_message:
                raise FrameError(f"a message of over {self._max_message} bytes")
            spans.append((offset + 4, offset + 4 + length))
            offset += 4 + length
        if len(buffer) < offset:
            self._need = offset
            return None
        return spans


class Outbox:
    """What a non-blocking stream has not taken yet: buffers in order, the first perhaps partly
    written. `size` is the bytes still to go. Each push is one message, so that the messages
    not begun yet can be given up without cutting one in two (`give_up`)."""

    def __init__(self) -> None:
        self._parts: collections.deque[Buffer] = collections.deque()
        self.size = 0
        self._pushed = 0  # bytes ever queued
        self._ends: collections.deque[int] = collections.deque()  # _pushed at each message's end
        self._done = 0  # _pushed at the end of the last message written out

    def __bool__(self) -> bool:
        return self.size > 0

    def push(self, parts: Iterable[Buffer]) -> None:
        """Queue one message's parts."""
        for part in parts:
            if length := len(part):
                self._parts.append(part)
                self.size += length
                self._pushed += length
        if self._pushed != (self._ends[-1] if self._ends else self._done):
            self._ends.append(self._pushed)

    def give_up(self) -> int:
        """Drop every queued message not begun yet, keeping the rest of the one being written
        (cut short, it would garble the stream); the bytes freed."""
        written = self._pushed - self.size
        partial = self._ends[0] - written if self._ends and written > self._done else 0
        freed = self.size - partial
        if not freed:
            return 0
        kept: collections.deque[Buffer] = collections.deque()
        left = partial
        while left > 0:
            part = self._parts.popleft()
            kept.append(part)
            left -= len(part)
        self._parts = kept
        self.size = partial
        self._pushed -= freed
        self._ends = collections.deque([self._pushed]) if partial else collections.deque()
        return freed

    def send(self, parts: list[Buffer], sendmsg: Callable[[list[Buffer]], int]) -> None:
        """Queue `parts` and write what the stream takes: straight from `parts` when nothing
        waits before them (the common case, one call), else behind what does."""
        if not self._parts and len(parts) <= IOV_MAX:
            try:
                sent = sendmsg(parts)
            except BlockingIOError:
                sent = 0
            if sent == sum(len(part) for part in parts):
                return
            self.push(parts)
            self.consume(sent)
        else:
            self.push(parts)
        self.flush(sendmsg)

    def flush(self, sendmsg: Callable[[list[Buffer]], int]) -> None:
        """Write what the stream takes (`sendmsg` raises BlockingIOError when it takes no
        more); other errors are the caller's."""
        while self._parts:
            try:
                sent = sendmsg(list(itertools.islice(self._parts, IOV_MAX)))
            except BlockingIOError:
                return
            if not sent:
                return  # took nothing: try again when polled
            self.consume(sent)

    def consume(self, sent: int) -> None:
        """`sent` bytes from the front have been written."""
        self.size -= sent
        written, ends = self._pushed - self.size, self._ends
        while ends and ends[0] <= written:
            self._done = ends.popleft()
        parts = self._parts
        while sent:
            first = parts[0]
            if sent < len(first):
                parts[0] = memoryview(first)[sent:]
                return
            sent -= len(first)
            parts.popleft()
