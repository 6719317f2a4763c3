"""`tbon relay PATH`: carry a client's messages between an ssh session and a broker's socket.

A command given an `ssh://host/PATH` URI runs `tbon relay PATH` on that host over ssh, and the
relay passes framed messages (frames.py) from its stdin to the broker's local socket and back to
its stdout. It ends when its stdin does (the client went away). Started by ssh, never by hand.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import zmq

from tbon.overlay.wire.frames import FrameError, FrameReader, encode_frames, write_all


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pmi"]:  # a broker of tbon alloc --launcher ssh, PMI over this session
        from tbon.overlay.launch.pmi_shim import main as shim_main

        return shim_main(argv[1:])
    if len(argv) != 1 or not argv[0].startswith("/"):
        print("usage: tbon relay PATH (a broker's local socket; started over ssh)", file=sys.stderr)
        return 2
    from tbon.errors import TbonError
    from tbon.overlay.connectors.client import (
        _probe,  # the same clear errors as a local client gets
        _refused,
    )
    from tbon.overlay.links.monitor import read_event

    path = argv[0]
    try:
        _probe(path, f"local://{path}")
    except TbonError as error:
        print(f"tbon relay: {error}", file=sys.stderr)
        return 1
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.rcvhwm = dealer.sndhwm = 0
    # The broker's end of the connection, watched: a relay that outlived its broker would
    # leave the client waiting for answers that never come (the session itself stays up).
    monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
    dealer.connect(f"ipc://{path}")

    def gone() -> str | None:
        """Why the broker's end is gone, from the monitor's news; None if it is not."""
        why = None
        while monitor.poll(0):
            event, _ = read_event(monitor.recv_multipart())
            if event == zmq.EVENT_DISCONNECTED:
                why = "the broker ended it"
            elif event == zmq.EVENT_CONNECT_RETRIED and why is None and _refused(path):
                why = "the broker no longer listens there"
        return why

    try:
        return _pump(dealer, monitor, gone, sys.stdin.fileno(), sys.stdout.fileno(), path)
    except BrokenPipeError:
        return 0  # the client went away while we answered
    finally:
        dealer.disable_monitor()
        monitor.close(linger=0)
        dealer.close(linger=0)
        context.term()


def _pump(
    dealer: zmq.Socket,
    monitor: zmq.Socket,
    gone: Callable[[], str | None],
    stdin: int,
    stdout: int,
    path: str,
) -> int:
    poller = zmq.Poller()
    poller.register(dealer, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    poller.register(stdin, zmq.POLLIN)
    reader = FrameReader()
    while True:
        for ready, _ in poller.poll():
            if ready is dealer or ready is monitor:
                while dealer.poll(0):
                    write_all(stdout, encode_frames(dealer.recv_multipart()))
                # what the broker sent before its end went is passed on first (above)
                if ready is monitor and (why := gone()) is not None:
                    print(
                        f"tbon relay: lost the connection to local://{path}: {why}", file=sys.stderr
                    )
                    return 1
                continue
            data = os.read(stdin, 65536)
            if not data:
                return 0  # the client went away
            reader.feed(data)
            try:
                while (frames := reader.next()) is not None:
                    dealer.send_multipart(frames)
            except FrameError as error:
                print(f"tbon relay: garbled input ({error}): closing", file=sys.stderr)
                return 1
