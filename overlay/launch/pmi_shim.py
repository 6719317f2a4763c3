"""The far end of `tbon alloc --launcher ssh`: run one broker with PMI carried over ssh.

`tbon relay --pmi RANK SIZE -- COMMAND...` (started by ssh, never by hand) gives COMMAND one end
of a socketpair as PMI_FD, with PMI_RANK and PMI_SIZE, as Hydra would, and carries that PMI
traffic and COMMAND's standard output over its own stdin and stdout as framed messages
(frames.py): [b"pmi", bytes] both ways, [b"out", bytes] and finally [b"exit", status] from here.
No port is opened: PMI reaches only the broker this session started. When stdin ends (the
launcher is gone) the broker is terminated, so that nothing is left running on the host.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

from tbon.overlay.wire.frames import FrameError, FrameReader, encode_frames, write_all

STOP_GRACE = 10.0  # after SIGTERM, how long the broker has to shut its subtree down


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[0].isdigit() or not argv[1].isdigit():
        print("usage: tbon relay --pmi RANK SIZE -- COMMAND... (started by ssh)", file=sys.stderr)
        return 2
    rank, size, command = argv[0], argv[1], argv[3:]
    here, there = socket.socketpair()
    env = {**os.environ, "PMI_FD": str(there.fileno()), "PMI_RANK": rank, "PMI_SIZE": size}
    try:
        broker = subprocess.Popen(
            command, env=env, pass_fds=[there.fileno()], stdout=subprocess.PIPE
        )
    except OSError as error:
        print(f"tbon relay: {command[0]}: {error.strerror}", file=sys.stderr)
        return 127
    there.close()
    code = _carry(broker, here, sys.stdin.fileno(), sys.stdout.fileno())
    _send(sys.stdout.fileno(), [b"exit", str(code).encode()])
    return 0


def _carry(broker: subprocess.Popen[bytes], pmi: socket.socket, stdin: int, stdout: int) -> int:
    """Pump until the broker exits; returns its status (128+N for a signal)."""
    assert broker.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(pmi, selectors.EVENT_READ, "pmi")
    selector.register(broker.stdout, selectors.EVENT_READ, "out")
    selector.register(stdin, selectors.EVENT_READ, "in")
    reader = FrameReader()
    stopping_since: float | None = None
    open_streams = 2
    while open_streams or broker.poll() is None:
        if stopping_since is not None and time.monotonic() > stopping_since + STOP_GRACE:
            broker.kill()
        for key, _ in selector.select(timeout=0.5):
            if key.data == "in":
                data = os.read(stdin, 65536)
                if not data:  # the launcher is gone: so must the broker be
                    selector.unregister(stdin)
                    broker.send_signal(signal.SIGTERM)
                    stopping_since = time.monotonic()
                    continue
                reader.feed(data)
                try:
                    while (frames := reader.next()) is not None:
                        if frames[:1] == [b"pmi"] and len(frames) == 2:
                            pmi.sendall(frames[1])
                except (FrameError, OSError):
                    broker.send_signal(signal.SIGTERM)
                    stopping_since = time.monotonic()
                continue
            source = key.fileobj
            data = source.recv(65536) if source is pmi else os.read(broker.stdout.fileno(), 65536)
            if not data:
                selector.unregister(source)
                open_streams -= 1
                continue
            _send(stdout, [key.data.encode(), data])
    broker.wait()
    code = broker.returncode
    return 128 - code if code < 0 else code


def _send(fd: int, frames: list[bytes]) -> None:
    """Write a framed message; the launcher may be gone, and then nobody is listening."""
    with contextlib.suppress(OSError):  # BrokenPipeError among them
        write_all(fd, encode_frames(frames))
