"""The PMI-1 server that tbon's local launcher runs for the brokers it starts.

``PmiServer`` is the protocol as a plain object (bytes in, replies out, no I/O) so it can be
tested directly; ``SocketPmiServer`` (pmi_sockets.py) wires it to one socketpair per rank and a
selector.

Replies use the exact field order of MPICH's Hydra 3 / gforker servers (for instance
``cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0`` and
``cmd=get_result rc=0 msg=success value=V``), because some PMI-1 clients match replies with
``sscanf`` patterns rather than parsing fields. Maxes are Hydra's: kvsname 256, key 64, value
1024, each a C buffer size including the NUL.

A rank that closes its connection, or finalizes, can never enter another barrier. Rather than
leave the others blocked until the launcher notices the exit and kills them, a barrier that can
no longer complete is failed: each waiting rank gets ``cmd=barrier_out rc=-1 msg=...`` naming
the missing rank (Slurm and Flux likewise answer a failed barrier with ``rc`` non-zero), so
their PMI clients raise and the brokers exit. The launcher still learns of the exit itself
from ``waitpid``.
"""

from __future__ import annotations

import contextlib

from tbon.overlay.wire.pmi import LineBuffer, PmiProtocolError, format_command, parse_line

__all__ = ["PmiClientError", "PmiServer"]

KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024

Reply = tuple[int, bytes]

# Known PMI-1 requests this server does not implement, with the reply name a client waits for.
_UNSUPPORTED = {
    "initack": "initack",
    "publish_name": "publish_result",
    "unpublish_name": "unpublish_result",
    "lookup_name": "lookup_result",
    "spawn": "spawn_result",
    "create_kvs": "newkvs",
    "destroy_kvs": "kvs_destroyed",
    "getbyidx": "getbyidx_results",
    "singinit": "singinit_info",
}
# Reply names for the requests this server implements (used to answer a malformed request).
_RESPONSES = {
    "init": "response_to_init",
    "get_maxes": "maxes",
    "get_appnum": "appnum",
    "get_my_kvsname": "my_kvsname",
    "get_universe_size": "universe_size",
    "put": "put_result",
    "get": "get_result",
    "barrier_in": "barrier_out",
    "finalize": "finalize_ack",
}
_STATELESS = frozenset({"init", "get_maxes", "get_appnum", "get_my_kvsname", "get_universe_size"})
"""Requests whose reply depends on the request's line alone (PmiServer._stateless)."""
_ANSWERS_KEPT = 64
"""Distinct stateless request lines whose replies are kept: clients send one or two forms each,
and a client that varies its lines must not grow the server."""
_PUT_DONE = format_command("put_result", rc=0, msg="success")
_BARRIER_OUT = format_command("barrier_out")
_FINALIZE_ACK = format_command("finalize_ack")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class PmiClientError(PmiProtocolError):
    """A rank sent bytes that are not PMI-1; its connection should be closed.

    ``replies`` holds what the lines before the garbage produced (possibly a completed barrier
    for other ranks): the caller must still send them.
    """

    def __init__(self, message: str, rank: int, replies: list[Reply]) -> None:
        super().__init__(message)
        self.rank = rank
        self.replies = replies


def _error(cmd: str, msg: str) -> bytes:
    return format_command(cmd, rc=-1, msg=msg)


def _salvage_cmd(raw: bytes) -> str | None:
    """The command name of a line that failed to parse, if it starts like ``cmd=NAME``."""
    if not raw.startswith(b"cmd="):
        return None
    name = raw[4:].split(b" ", 1)[0]
    try:
        text = name.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if text and set(text) <= _NAME_CHARS else None


class PmiServer:
    """The PMI-1 protocol for ``size`` ranks sharing one KVS, as a sans-I/O state machine.

    Feed each rank's bytes to ``receive``; send back the ``(rank, line)`` pairs it returns.
    Call ``disconnect`` when a rank's connection closes.
    """

    def __init__(self, size: int, kvsname: str = "tbon", appnum: int = 0) -> None:
        if size < 1:
            raise ValueError(f"PMI job size must be at least 1, not {size}")
        if (
            not kvsname
            or len(kvsname.encode("utf-8")) >= KVSNAME_MAX
            or any(ch in kvsname for ch in " \n\r\t\0\\")
        ):
            raise ValueError(f"unusable PMI kvsname {kvsname!r}")
        self.size = size
        self.kvsname = kvsname
        self.appnum = appnum
        self.kvs: dict[str, str] = {}
        self.finalized: set[int] = set()
        self.aborted: tuple[int, int, str] | None = None
        self.disconnected: set[int] = set()
        self.in_barrier: set[int] = set()
        self.barriers_completed = 0
        self._buffers: dict[int, LineBuffer] = {}
        self._answers: dict[bytes, bytes] = {}  # a stateless request's reply, by its exact line

    # ----------------------------------------------------------------- events

    def receive(self, rank: int, data: bytes) -> list[Reply]:
        """Process bytes read from ``rank``'s connection; return the replies to send.

        Bad requests get an error reply. Only bytes that cannot be read as PMI-1 at all raise
        ``PmiClientError`` (carrying the replies owed so far); lines after the bad one in the
        same ``data`` are dropped, as the caller is expected to close that connection.
        """
        self._check_rank(rank)
        if rank in self.disconnected:
            return []
        buffer = self._buffers.setdefault(rank, LineBuffer())
        try:
            lines = buffer.feed(data)
        except PmiProtocolError as exc:
            raise PmiClientError(f"PMI rank {rank}: {exc}", rank, []) from None
        replies: list[Reply] = []
        for line in lines:
            try:
                replies.extend(self._handle_line(rank, line))
            except PmiProtocolError as exc:
                raise PmiClientError(
                    f"PMI rank {rank} sent garbage: {exc}", rank, self._deliverable(replies)
                ) from None
        return self._deliverable(replies)

    def disconnect(self, rank: int) -> list[Reply]:
        """``rank``'s connection closed: forget it, and fail a barrier it can no longer join."""
        self._check_rank(rank)
        if rank in self.disconnected:
            return []
        self.disconnected.add(rank)
        self._buffers.pop(rank, None)
        self.in_barrier.discard(rank)
        return self._deliverable(self._settle_barrier())

    # ----------------------------------------------------------------- protocol

    def _handle_line(self, rank: int, raw: bytes) -> list[Reply]:
        known = self._answers.get(raw)
        if known is not None:  # every rank asks the same: answered once, then by its bytes
            return [(rank, known)]
        if not raw.strip(b" \r"):
            return []
        if raw == b"cmd=abort" or raw.startswith(b"cmd=abort "):
            self._abort(rank, raw)
            return []
        try:
            fields = parse_line(raw)
        except PmiProtocolError:
            cmd = _salvage_cmd(raw)
            if cmd is None:
                raise
            name = _RESPONSES.get(cmd) or _UNSUPPORTED.get(cmd)
            if name is None:
                raise
            return [(rank, _error(name, "malformed_request"))]
        cmd = fields["cmd"]
        if cmd in _STATELESS:
            line = self._stateless(cmd, fields)
            if len(self._answers) < _ANSWERS_KEPT:
                self._answers[raw] = line
            return [(rank, line)]
        if cmd == "put":
            return [(rank, self._put(fields))]
        if cmd == "get":
            return [(rank, self._get(fields))]
        if cmd == "barrier_in":
            if rank in self.in_barrier:
                return []  # already counted; the client is waiting for barrier_out
            self.in_barrier.add(rank)
            return self._settle_barrier()
        if cmd == "finalize":
            self.finalized.add(rank)
            self.in_barrier.discard(rank)
            return [(rank, _FINALIZE_ACK), *self._settle_barrier()]
        if cmd in _UNSUPPORTED:
            return [(rank, _error(_UNSUPPORTED[cmd], "unsupported_command"))]
        return [(rank, _error(f"{cmd}_response", "unknown_command"))]

    def _stateless(self, cmd: str, fields: dict[str, str]) -> bytes:
        """The reply to a request that asks about the job, not its state: the same line for
        the same request, whichever rank asks and whenever."""
        if cmd == "init":
            return self._init(fields)
        if cmd == "get_maxes":
            return format_command(
                "maxes", kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX, vallen_max=VALLEN_MAX
            )
        if cmd == "get_appnum":
            return format_command("appnum", appnum=self.appnum)
        if cmd == "get_my_kvsname":
            return format_command("my_kvsname", kvsname=self.kvsname)
        assert cmd == "get_universe_size"
        return format_command("universe_size", size=self.size)

    def _init(self, fields: dict[str, str]) -> bytes:
        version, subversion = fields.get("pmi_version"), fields.get("pmi_subversion")
        ok = version == "1" and subversion is not None and subversion in ("0", "1")
        if ok:
            return format_command("response_to_init", pmi_version=1, pmi_subversion=1, rc=0)
        return format_command(
            "response_to_init",
            pmi_version=1,
            pmi_subversion=1,
            rc=-1,
            msg=f"unsupported_version_{version}.{subversion}",
        )

    def _check_kvsname(self, fields: dict[str, str]) -> bool:
        name = fields.get("kvsname")
        return name is None or name == self.kvsname

    def _put(self, fields: dict[str, str]) -> bytes:
        key, value = fields.get("key"), fields.get("value")
        if not self._check_kvsname(fields):
            return _error("put_result", "unknown_kvsname")
        if not key:
            return _error("put_result", "missing_key")
        if not value:
            return _error("put_result", "missing_value")
        if len(key.encode("utf-8")) >= KEYLEN_MAX:
            return _error("put_result", "key_too_long")
        if len(value.encode("utf-8")) >= VALLEN_MAX:
            return _error("put_result", "value_too_long")
        old = self.kvs.get(key)
        if old is not None and old != value:
            return _error("put_result", f"duplicate_key_{key}")
        self.kvs[key] = value
        return _PUT_DONE

    def _get(self, fields: dict[str, str]) -> bytes:
        key = fields.get("key")
        if not self._check_kvsname(fields):
            return _error("get_result", "unknown_kvsname")
        if not key:
            return _error("get_result", "missing_key")
        value = self.kvs.get(key)
        if value is None:
            return _error("get_result", f"key_{key}_not_found")
        return format_command("get_result", rc=0, msg="success", value=value)

    def _abort(self, rank: int, raw: bytes) -> None:
        """Record an abort. Parsed by hand: clients put a free-text message, possibly with
        spaces, last on the line (``message=`` in MPICH, ``error_msg=`` in Flux)."""
        text = raw.decode("utf-8", errors="replace")
        head, message = text, ""
        for marker in (" message=", " error_msg="):
            at = text.find(marker)
            if at >= 0:
                head, message = text[:at], text[at + len(marker) :]
                break
        code = 1  # Hydra's default when exitcode is absent
        for token in head.split(" "):
            name, _, value = token.partition("=")
            if name == "exitcode":
                with contextlib.suppress(ValueError):
                    code = int(value)
        if self.aborted is None:
            self.aborted = (rank, code, message)

    def _settle_barrier(self) -> list[Reply]:
        """Release the barrier if everyone is in, or fail it if someone never can be."""
        if not self.in_barrier:
            return []
        if len(self.in_barrier) == self.size:
            waiting = sorted(self.in_barrier)
            self.in_barrier.clear()
            self.barriers_completed += 1
            return [(r, _BARRIER_OUT) for r in waiting]
        gone = sorted((self.disconnected | self.finalized) - self.in_barrier)
        if not gone:
            return []
        missing = gone[0]
        why = "exited" if missing in self.disconnected else "finalized"
        line = _error("barrier_out", f"rank_{missing}_{why}_before_the_barrier")
        waiting = sorted(self.in_barrier)
        self.in_barrier.clear()
        return [(r, line) for r in waiting]

    def _deliverable(self, replies: list[Reply]) -> list[Reply]:
        return [(r, line) for r, line in replies if r not in self.disconnected]

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside this PMI job of size {self.size}")
