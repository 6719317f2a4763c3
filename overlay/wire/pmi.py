"""The PMI-1 wire format: one ``cmd=NAME key=value ...`` line per message.

This is the "simple PMI" text protocol that MPICH's Hydra serves over ``PMI_FD``, that Slurm's
``--mpi=pmi2`` plugin and Flux also accept from PMI-1 clients, and that tbon's own launcher serves.
A line is tokens separated by spaces; each token is ``key=value`` split at the first ``=`` (values
may contain ``=``, e.g. Z85 text); there is no quoting, so no value may hold a space or a newline.

Only the codec lives here (no sockets) so the client and the server share one parser, and both
can be tested without I/O.
"""

from __future__ import annotations

from tbon.errors import TbonError

__all__ = [
    "MAX_LINE_BYTES",
    "LineBuffer",
    "PmiProtocolError",
    "format_command",
    "parse_line",
]

# A bound on one line, far above anything PMI-1 sends (MPICH's own lines are < 1 KiB), so a peer
# that never sends a newline cannot make us buffer without limit.
MAX_LINE_BYTES = 64 * 1024

_FORBIDDEN_IN_VALUE = (" ", "\n")
_FORBIDDEN_IN_KEY = (" ", "\n", "=")


class PmiProtocolError(TbonError):
    """Bytes that are not a PMI-1 line: the peer is broken or not speaking PMI-1."""


def _show(text: str | bytes, limit: int = 80) -> str:
    """A short, single-line rendering of peer data for error messages (no raw newlines)."""
    shown = repr(text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _check_token(what: str, text: str, forbidden: tuple[str, ...]) -> None:
    for ch in forbidden:
        if ch in text:
            raise PmiProtocolError(
                f"PMI-1 {what} {_show(text)} contains {ch!r}, which the line format cannot carry"
            )


def format_command(cmd: str, **fields: str | int) -> bytes:
    """Encode one PMI-1 line, ``cmd`` first and then ``fields`` in the order given.

    Order matters in practice: some clients (e.g. Flux's old simple client) match server replies
    with ``sscanf`` patterns, so a server must be able to emit fields in a fixed order.
    """
    if not cmd:
        raise PmiProtocolError("PMI-1 command name is empty")
    _check_token("command name", cmd, _FORBIDDEN_IN_KEY)
    parts = [f"cmd={cmd}"]
    for key, raw in fields.items():
        if not key:
            raise PmiProtocolError("PMI-1 field name is empty")
        _check_token("field name", key, _FORBIDDEN_IN_KEY)
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise PmiProtocolError(f"PMI-1 field {key!r} must be str or int, not {type(raw)!r}")
        value = str(raw)
        _check_token(f"value of field {key!r}", value, _FORBIDDEN_IN_VALUE)
        parts.append(f"{key}={value}")
    return (" ".join(parts) + "\n").encode("utf-8")


def parse_line(line: bytes) -> dict[str, str]:
    """Decode one PMI-1 line (with or without its trailing newline) into its fields.

    The result always has ``"cmd"``. Runs of spaces separate tokens, as in MPICH's parser.
    Raises ``PmiProtocolError`` on anything that is not a well-formed line: bad UTF-8, an embedded
    newline, a token without ``=``, an empty key, a repeated key, or a first token other than
    ``cmd=NAME``.
    """
    if line.endswith(b"\n"):
        line = line[:-1]
    if len(line) > MAX_LINE_BYTES:
        raise PmiProtocolError(f"PMI-1 line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise PmiProtocolError(f"PMI-1 line is not UTF-8: {_show(line)}") from None
    if "\n" in text:
        raise PmiProtocolError(f"PMI-1 line has an embedded newline: {_show(text)}")
    tokens = [tok for tok in text.split(" ") if tok]
    if not tokens:
        raise PmiProtocolError("PMI-1 line is empty")
    fields: dict[str, str] = {}
    for tok in tokens:
        key, eq, value = tok.partition("=")
        if not eq:
            raise PmiProtocolError(f"PMI-1 token {_show(tok)} has no '=' in line {_show(text)}")
        if not key:
            raise PmiProtocolError(f"PMI-1 token {_show(tok)} has an empty key in {_show(text)}")
        if key in fields:
            raise PmiProtocolError(f"PMI-1 line repeats key {_show(key)}: {_show(text)}")
        fields[key] = value
    first = tokens[0].partition("=")[0]
    if first != "cmd" or not fields["cmd"]:
        raise PmiProtocolError(f"PMI-1 line does not start with cmd=NAME: {_show(text)}")
    return fields


class LineBuffer:
    """Accumulates stream bytes and hands back complete lines, refusing unbounded lines.

    Needed because a socket read may end mid-line or carry several lines (Hydra's initack reply
    is four lines in one write).
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self.max_line = max_line
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes held that do not yet form a complete line (non-zero at EOF means a torn line)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the lines it completes, without their newlines, in order.

        Raises ``PmiProtocolError`` once a line (complete or not) exceeds ``max_line`` bytes; the
        buffer is then cleared, since the stream can no longer be trusted to be in sync.
        """
        start = len(self._buf)
        self._buf += data
        lines: list[bytes] = []
        begin = 0
        search = start  # what was buffered before holds no newline
        while True:
            nl = self._buf.find(b"\n", search)
            if nl < 0:
                break
            if nl - begin > self.max_line:
                self._buf.clear()
                raise PmiProtocolError(f"PMI-1 line exceeds {self.max_line} bytes")
            lines.append(bytes(self._buf[begin:nl]))
            begin = nl + 1
            search = begin
        del self._buf[:begin]
        if len(self._buf) > self.max_line:
            self._buf.clear()
            raise PmiProtocolError(f"PMI-1 line exceeds {self.max_line} bytes without a newline")
        return lines
