"""`tbon relay PATH`: carry a client's messages between an ssh session and a broker's socket.

A command given an `ssh://host/PATH` URI runs `tbon relay PATH` on that host over ssh. The session
and the broker's socket carry the same framed stream (frames.py), so the relay passes bytes both
ways as they come, without reading them: the broker checks the framing, and closes a garbled
stream with a last notice that comes back through here. The relay ends when its stdin does (the
client went away), or when the broker's end closes (it says so on stderr, after passing on what
the broker sent before). Started by ssh, never by hand.
"""

from __future__ import annotations

import _socket  # the socket client.open_socket makes: the C type, as the client's docstring says
import os
import select
import sys

from tbon.overlay.wire.frames import write_all

CHUNK = 256 << 10
GONE = "the broker ended it"


def help_text() -> str:
    """`tbon relay --help`, laid out as every command's (tbon/helptext.py)."""
    from tbon.helptext import HelpPage, Section, render

    return render(
        HelpPage(
            "tbon relay PATH",
            "Carry a client's messages between this ssh session (standard input and output) "
            "and the broker socket PATH. A command given an ssh://HOST/PATH URI runs it on HOST "
            "over ssh; it is not meant to be run by hand.",
            [
                Section("Arguments", [("PATH", "A broker's local socket (absolute).")]),
                Section("Options", [("-h, --help", "Show this message and exit.")]),
                Section(
                    "Exit status",
                    [
                        ("0", "The client went away."),
                        ("1", "The socket could not be reached, or the broker ended it."),
                        ("2", "A usage error."),
                    ],
                ),
            ],
            "See tbon-relay(1).",
        )
    )


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(help_text())
        return 0
    if len(argv) != 1 or not argv[0].startswith("/"):
        print("usage: tbon relay PATH (a broker's local socket; started over ssh)", file=sys.stderr)
        return 2
    from tbon.errors import TbonError
    from tbon.overlay.connectors.client import open_socket  # the errors a local client gets

    path = argv[0]
    try:
        sock = open_socket(path)
    except TbonError as error:
        print(f"tbon relay: {error}", file=sys.stderr)
        return 1
    try:
        if _pump(sock, sys.stdin.fileno(), sys.stdout.fileno()):
            return 0
        print(f"tbon relay: lost the connection to local://{path}: {GONE}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0  # the client went away while we answered
    finally:
        sock.close()


def _pump(sock: _socket.socket, stdin: int, stdout: int) -> bool:
    """Carry bytes until one side ends: True if the client's (stdin) did, False if the
    broker's did (what it sent before is passed on first)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(stdin, select.POLLIN)
    buffer = bytearray(CHUNK)
    with memoryview(buffer) as view:
        while True:
            ready = dict(poller.poll())
            if sock.fileno() in ready:  # the broker's first: its last words before an end
                if not (size := _recv(sock, buffer)):
                    return False
                write_all(stdout, view[:size])
            if stdin in ready:
                data = os.read(stdin, CHUNK)
                if not data:
                    return True  # the client went away
                try:
                    sock.sendall(data, _socket.MSG_NOSIGNAL)
                except OSError:
                    _drain(sock, buffer, stdout)
                    return False


def _recv(sock: _socket.socket, buffer: bytearray) -> int:
    """Bytes read from the broker; 0 once its end has closed (or been reset)."""
    try:
        return sock.recv_into(buffer)
    except ConnectionResetError:
        return 0


def _drain(sock: _socket.socket, buffer: bytearray, stdout: int) -> None:
    """The broker's end is closed: pass on what it sent before."""
    with memoryview(buffer) as view:
        while size := _recv(sock, buffer):
            write_all(stdout, view[:size])
