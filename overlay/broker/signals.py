"""Signals, turned into something the broker's poll loop can wait on."""

from __future__ import annotations

import signal
import socket
from typing import Any


class SignalPipe:
    """Signals become bytes on a socket the poll loop watches, handled between messages."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)
        self._pending: list[int] = []
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        # Under a launcher that ignores SIGINT (Ctrl-C meant for the initial program), keep
        # ignoring it, but through a handler: unlike SIG_IGN, a handler is not inherited by the
        # programs this broker starts.
        self.sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._pending.append(signum)

    def take(self) -> list[int]:
        try:
            while self.reader.recv(512):
                pass
        except BlockingIOError:
            pass
        signals, self._pending = self._pending, []
        return signals

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
