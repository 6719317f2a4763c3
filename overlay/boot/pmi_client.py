"""A blocking PMI-1 client, so a broker started by mpiexec (Hydra), srun --mpi=pmi2 (Slurm) or
tbon's own launcher can learn its rank and exchange addresses with its peers.

Start-up path of a broker: keep imports to the standard library and ``tbon.overlay``. The module
is one protocol's client, a little over 400 lines because half of it is the checks that keep
each request within what every known server accepts.

Interoperability notes, each checked against the servers' sources:

* ``PMI_FD`` (an inherited ``AF_UNIX`` socketpair end) with ``PMI_RANK`` and ``PMI_SIZE`` is how
  Hydra and Slurm start a PMI-1 process; Hydra may instead set ``PMI_PORT=host:port`` and
  ``PMI_ID``, which needs the ``cmd=initack pmiid=ID`` handshake followed by three
  ``cmd=set size=``/``rank=``/``debug=`` lines. Old Hydra answers ``cmd=initack`` alone; MPICH 4
  answers ``cmd=initack rc=0 rank= size= appnum= debug=``; both then send the three ``set`` lines.
* Replies may carry extra fields, put them in any order, and may or may not carry ``rc``
  (absent means success, as in MPICH's client). Missing-key replies differ: Hydra 3 sends
  ``rc=-1 msg=key_K_not_found``, MPICH 4 Hydra ``rc=1`` with no ``msg``, Slurm ``rc=1``.
* One request at a time, each in a single write: Slurm reads a PMI-1 request with one ``read()``
  of at most 1024 bytes, and MPICH's own client never sends a line longer than that
  (``PMIU_MAXLINE``). Key and value maxes from ``get_maxes`` are C buffer sizes including the
  terminating NUL, so the longest key is ``keylen_max - 1`` bytes.
* MPICH 4 Hydra forwards puts upstream as ``key=value`` tokens whose keys its parser limits to
  letters, digits, ``_``, ``-`` and ``/``; it treats ``\\`` in values as an escape and reserves
  keys starting with ``PMI_``. Keys and values are checked against all of this before sending.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from types import TracebackType

from tbon.errors import TbonError
from tbon.overlay.parse.numbers import is_decimal
from tbon.overlay.wire.pmi import LineBuffer, PmiProtocolError, format_command, parse_line

__all__ = ["WIRE_LINE_MAX", "PmiClient", "PmiError"]

# The longest request line (newline included) that every known PMI-1 server reads in one piece:
# MPICH's PMIU_MAXLINE and Slurm's MAX_READLINE are both 1024.
WIRE_LINE_MAX = 1024

_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-/")
_BAD_VALUE_CHARS = {
    " ": "a space",
    "\n": "a newline",
    "\r": "a carriage return",
    "\t": "a tab",
    "\0": "a NUL byte",
    "\\": "a backslash",
}
_RECV_SIZE = 4096


class PmiError(TbonError):
    """A PMI-1 exchange failed; the message names the operation and the cause on one line."""


def _show(text: str | bytes, limit: int = 120) -> str:
    shown = repr(text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _env_int(env: Mapping[str, str], name: str, why: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise PmiError(f"{name} is not set although {why}")
    try:
        return int(raw.strip())
    except ValueError:
        raise PmiError(f"{name}={_show(raw)} is not an integer") from None


def _reply_int(reply: Mapping[str, str], field: str, what: str) -> int:
    raw = reply.get(field)
    if raw is None:
        raise PmiError(f"PMI reply to {what} lacks {field}=: {_show(_fmt(reply))}")
    try:
        return int(raw)
    except ValueError:
        raise PmiError(f"PMI reply to {what} has non-integer {field}={_show(raw)}") from None


def _fmt(reply: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in reply.items())


class PmiClient:
    """One process's PMI-1 session over a connected stream socket (which it owns and closes).

    Call ``init()`` first; then ``put``/``barrier``/``get`` as PMI requires (values put before a
    barrier are visible to every rank after it), and ``finalize()`` once done. ``timeout`` bounds
    each wait for a reply (``None`` waits for ever, which a barrier may legitimately need).

    ``rank``, ``size`` and ``debug`` come from the environment or the initack handshake;
    ``init()`` fills ``kvsname``, ``kvsname_max``, ``keylen_max`` and ``vallen_max``;
    ``universe_size()`` asks the server when it is wanted (Hydra reports -1 for an unlimited
    universe), as MPICH's PMI_Get_universe_size does, and not at every start.
    """

    def __init__(
        self,
        sock: socket.socket,
        rank: int,
        size: int,
        *,
        timeout: float | None = None,
        debug: int = 0,
    ) -> None:
        if size < 1 or not 0 <= rank < size:
            raise PmiError(f"PMI rank {rank} is not within a job of size {size}")
        self.rank = rank
        self.size = size
        self.debug = debug
        self.timeout = timeout
        self.kvsname = ""
        self.kvsname_max = 0
        self.keylen_max = 0
        self.vallen_max = 0
        self.initialized = False
        self._sock: socket.socket | None = sock
        self._lines = LineBuffer()
        self._ready: list[bytes] = []
        try:
            sock.settimeout(timeout)
        except OSError as exc:
            raise PmiError(f"PMI socket is unusable: {exc.strerror or exc}") from None

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_environment(
        cls, env: Mapping[str, str] = os.environ, *, timeout: float | None = None
    ) -> PmiClient | None:
        """Connect as the environment says, or return ``None`` when there is no PMI server.

        ``PMI_FD`` (with ``PMI_RANK``, ``PMI_SIZE``) wins over ``PMI_PORT`` as in MPICH's
        client; with neither set the process is a singleton and the caller boots alone.
        """
        if "PMI_FD" in env:
            fd = _env_int(env, "PMI_FD", "")
            why = "PMI_FD is (launchers that pass PMI_FD also set PMI_RANK and PMI_SIZE)"
            rank = _env_int(env, "PMI_RANK", why)
            size = _env_int(env, "PMI_SIZE", why)
            if fd < 0:
                raise PmiError(f"PMI_FD={fd} is not a file descriptor")
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                raise PmiError(
                    f"PMI_FD={fd} is not an open socket: {exc.strerror or exc}"
                ) from None
            try:
                return cls(sock, rank, size, timeout=timeout)
            except PmiError:
                sock.close()
                raise
        if "PMI_PORT" in env:
            return cls._from_port(env, timeout)
        return None

    @classmethod
    def _from_port(cls, env: Mapping[str, str], timeout: float | None) -> PmiClient:
        """Hydra's ``PMI_PORT=host:port`` mode: connect, then the initack handshake if PMI_ID."""
        port_spec = env["PMI_PORT"]
        host, sep, port_text = port_spec.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not is_decimal(port_text):
            raise PmiError(f"PMI_PORT={_show(port_spec)} is not host:port")
        pmi_id = _env_int(env, "PMI_ID", "") if "PMI_ID" in env else None
        if pmi_id is None:
            why = "PMI_PORT is set without PMI_ID, so the rank and size come from the environment"
            rank = _env_int(env, "PMI_RANK", why)
            size = _env_int(env, "PMI_SIZE", why)
        else:
            rank, size = 0, 1  # replaced by the handshake
        try:
            sock = socket.create_connection((host, int(port_text)), timeout=timeout)
        except OSError as exc:
            raise PmiError(
                f"cannot connect to the PMI server at PMI_PORT={port_spec}: {exc.strerror or exc}"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = cls(sock, rank, size, timeout=timeout)
            if pmi_id is not None:
                client._initack(pmi_id)
        except BaseException:
            sock.close()
            raise
        return client

    def _initack(self, pmi_id: int) -> None:
        what = f"initack for PMI_ID={pmi_id}"
        self._send(format_command("initack", pmiid=pmi_id), what)
        reply = self._read_reply(what)
        self._expect(reply, "initack", what)
        got: dict[str, int] = {}
        for _ in range(3):
            line = self._read_reply(what)
            if line["cmd"] != "set":
                raise PmiError(f"PMI {what}: expected cmd=set, got {_show(_fmt(line))}")
            names = [k for k in ("size", "rank", "debug") if k in line]
            if len(names) != 1:
                raise PmiError(f"PMI {what}: unexpected line {_show(_fmt(line))}")
            got[names[0]] = _reply_int(line, names[0], what)
        if set(got) != {"size", "rank", "debug"}:
            raise PmiError(f"PMI {what}: expected size, rank and debug, got {sorted(got)}")
        if got["size"] < 1 or not 0 <= got["rank"] < got["size"]:
            raise PmiError(f"PMI {what}: rank {got['rank']} is not within size {got['size']}")
        self.size, self.rank, self.debug = got["size"], got["rank"], got["debug"]

    # ----------------------------------------------------------------- PMI operations

    def init(self) -> None:
        """Handshake version 1.1 and learn the maxes and the KVS name: three round trips."""
        reply = self._request("init", "response_to_init", pmi_version=1, pmi_subversion=1)
        version = reply.get("pmi_version", "1")
        if version != "1":
            raise PmiError(f"PMI server speaks version {_show(version)}, not PMI-1")
        maxes = self._request("get_maxes", "maxes")
        self.kvsname_max = _reply_int(maxes, "kvsname_max", "get_maxes")
        self.keylen_max = _reply_int(maxes, "keylen_max", "get_maxes")
        self.vallen_max = _reply_int(maxes, "vallen_max", "get_maxes")
        if min(self.kvsname_max, self.keylen_max, self.vallen_max) < 2:
            raise PmiError(f"PMI server sent unusable maxes: {_show(_fmt(maxes))}")
        kvs = self._request("get_my_kvsname", "my_kvsname")
        kvsname = kvs.get("kvsname", "")
        if not kvsname:
            raise PmiError(f"PMI reply to get_my_kvsname lacks kvsname=: {_show(_fmt(kvs))}")
        self.kvsname = kvsname
        self.initialized = True

    def universe_size(self) -> int:
        """How many processes the job may grow to, as the server says (-1: unlimited)."""
        self._require_init("get_universe_size")
        universe = self._request("get_universe_size", "universe_size")
        return _reply_int(universe, "size", "get_universe_size")

    def put(self, key: str, value: str) -> None:
        """Publish ``key=value`` in the job's KVS; peers may read it after the next barrier."""
        self._require_init("put")
        self._check_key(key)
        self._check_value(key, value)
        line = format_command("put", kvsname=self.kvsname, key=key, value=value)
        if len(line) > WIRE_LINE_MAX:
            raise PmiError(
                f"PMI put of key {key!r} is a {len(line)}-byte line; PMI-1 servers read at most "
                f"{WIRE_LINE_MAX} (shorten the value)"
            )
        self._exchange(line, "put_result", f"put of key {key!r}")

    def get(self, key: str) -> str:
        """Read ``key`` from the job's KVS; a missing key is a ``PmiError`` naming it."""
        self._require_init("get")
        self._check_key(key)
        what = f"get of key {key!r}"
        reply = self._exchange(
            format_command("get", kvsname=self.kvsname, key=key), "get_result", what
        )
        if reply.get("found", "TRUE").upper() == "FALSE":
            raise PmiError(f"PMI {what} failed: key not found")
        value = reply.get("value")
        if value is None:
            raise PmiError(f"PMI reply to {what} has no value: {_show(_fmt(reply))}")
        return value

    def barrier(self) -> None:
        """Wait until every rank has entered the barrier (``barrier_in`` / ``barrier_out``)."""
        self._require_init("barrier")
        self._request("barrier_in", "barrier_out")

    def finalize(self) -> None:
        """Tell the server this rank is done with PMI, then close the connection."""
        self._require_init("finalize")
        try:
            self._request("finalize", "finalize_ack")
        finally:
            self.close()

    def abort(self, code: int, message: str) -> None:
        """Ask the server to abort the whole job with exit ``code``; returns without a reply.

        Servers do not answer (Hydra and Slurm kill the job; MPICH's client sends and returns),
        so the caller should exit afterwards. The message loses characters the line format
        cannot carry (each becomes ``_``) and is cut to fit one line.
        """
        text = "".join("_" if ch in _BAD_VALUE_CHARS else ch for ch in message)
        fields: dict[str, str | int] = {"exitcode": int(code)}
        if text:
            head = len(format_command("abort", exitcode=int(code), message=""))
            room = WIRE_LINE_MAX - head
            encoded = text.encode("utf-8")[:room]
            fields["message"] = encoded.decode("utf-8", errors="ignore")
        self._send(format_command("abort", **fields), "abort")

    def close(self) -> None:
        """Close the PMI connection (idempotent); further requests raise ``PmiError``."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> PmiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- validation

    def _require_init(self, what: str) -> None:
        if not self.initialized:
            raise PmiError(f"PMI {what} before init()")

    def _check_key(self, key: str) -> None:
        if not isinstance(key, str) or not key:
            raise PmiError(f"PMI key must be a non-empty string, not {key!r}")
        bad = sorted(set(key) - _KEY_CHARS)
        if bad:
            raise PmiError(
                f"PMI key {_show(key)} contains {_show(''.join(bad))}; keys may use only "
                "letters, digits, '_', '-' and '/' (no spaces, newlines or '=')"
            )
        if key.startswith("PMI_"):
            raise PmiError(f"PMI key {key!r} starts with PMI_, a prefix reserved by PMI servers")
        if len(key.encode("utf-8")) >= self.keylen_max:
            raise PmiError(
                f"PMI key {_show(key)} is {len(key)} bytes; this server allows at most "
                f"{self.keylen_max - 1} (keylen_max={self.keylen_max})"
            )

    def _check_value(self, key: str, value: str) -> None:
        if not isinstance(value, str):
            raise PmiError(f"PMI value for key {key!r} must be a string, not {type(value)!r}")
        if not value:
            raise PmiError(f"PMI value for key {key!r} is empty, which PMI-1 cannot carry")
        for ch, name in _BAD_VALUE_CHARS.items():
            if ch in value:
                raise PmiError(f"PMI value for key {key!r} contains {name}, which PMI-1 forbids")
        size = len(value.encode("utf-8"))
        if size >= self.vallen_max:
            raise PmiError(
                f"PMI value for key {key!r} is {size} bytes; this server allows at most "
                f"{self.vallen_max - 1} (vallen_max={self.vallen_max})"
            )

    # ----------------------------------------------------------------- I/O

    def _request(self, cmd: str, expect: str, **fields: str | int) -> dict[str, str]:
        return self._exchange(format_command(cmd, **fields), expect, cmd)

    def _exchange(self, line: bytes, expect: str, what: str) -> dict[str, str]:
        """Send one request and return its reply, checked for the expected name and rc."""
        self._send(line, what)
        reply = self._read_reply(what)
        self._expect(reply, expect, what)
        return reply

    @staticmethod
    def _expect(reply: dict[str, str], expect: str, what: str) -> None:
        if reply["cmd"] != expect:
            raise PmiError(
                f"unexpected reply to PMI {what}: wanted cmd={expect}, got {_show(_fmt(reply))}"
            )
        rc_text = reply.get("rc", "0")
        try:
            rc = int(rc_text)
        except ValueError:
            raise PmiError(f"PMI reply to {what} has non-integer rc={_show(rc_text)}") from None
        if rc != 0:
            msg = reply.get("msg") or reply.get("errmsg") or "no message"
            raise PmiError(f"PMI {what} failed: server returned rc={rc} ({msg[:200]})")

    def _send(self, line: bytes, what: str) -> None:
        sock = self._sock
        if sock is None:
            raise PmiError(f"PMI {what} after the connection was closed")
        try:
            sock.sendall(line)
        except TimeoutError:
            raise PmiError(f"PMI {what}: server did not accept the request in time") from None
        except OSError as exc:
            raise PmiError(
                f"PMI {what}: connection to the PMI server failed: {exc.strerror or exc}"
            ) from None

    def _read_reply(self, what: str) -> dict[str, str]:
        """The next non-blank line from the server, parsed; EOF and timeouts are PmiErrors."""
        while True:
            while self._ready:
                raw = self._ready.pop(0)
                if not raw.strip():
                    continue  # e.g. Flux answers abort with an empty line
                try:
                    return parse_line(raw)
                except PmiProtocolError as exc:
                    raise PmiError(f"PMI server sent garbage in reply to {what}: {exc}") from None
            sock = self._sock
            if sock is None:
                raise PmiError(f"PMI {what} after the connection was closed")
            try:
                data = sock.recv(_RECV_SIZE)
            except TimeoutError:
                raise PmiError(
                    f"no reply to PMI {what} within {self.timeout:g}s from the PMI server"
                ) from None
            except OSError as exc:
                raise PmiError(
                    f"PMI {what}: connection to the PMI server failed: {exc.strerror or exc}"
                ) from None
            if not data:
                raise PmiError(f"PMI server closed the connection while waiting for {what}")
            try:
                self._ready.extend(self._lines.feed(data))
            except PmiProtocolError as exc:
                raise PmiError(f"PMI server sent garbage in reply to {what}: {exc}") from None
