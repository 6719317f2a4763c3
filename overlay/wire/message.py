"""The overlay message: a JSON header, a JSON payload and, for bulk bytes, a raw data frame.

The data frame carries what `tbon exec` moves (a job's output, its input) as the bytes they are:
no JSON escaping, nothing decoded or re-encoded by the brokers it passes through.

docs/protocol.md is the reference. Decoding is strict: anything malformed raises MessageError, and
nothing else, which a broker logs and drops; it never reaches a handler and never stops the
broker.
"""

from __future__ import annotations

import json
import json.encoder
import math
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = 3
"""Raised when brokers of two versions can no longer work together: 3 since reports went up
in batches (a `report` carries a list of events, docs/protocol.md section 5.4)."""
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
ANY_RANK = -1
SEPARATORS = (",", ":")
"""How encode() writes JSON: compact. A sender that encodes a payload itself (`Message.body`)
writes it so too."""


Buffer = bytes | memoryview
"""Bulk data as received (a view into ZeroMQ's frame: not copied) or as made here."""


class MessageError(ValueError):
    """A message that cannot be decoded or is not of this protocol."""


class Kind(StrEnum):
    REQUEST = "request"
    RESPONSE = "response"
    EVENT = "event"
    CONTROL = "control"


_KINDS: dict[str, Kind] = {kind.value: kind for kind in Kind}
"""Each kind by its wire name: a lookup, where Kind(name) is an enum call per message."""


class Message:
    """One overlay message.

    `nodeid` is the destination rank of a request (ANY_RANK: the first broker that receives it).
    `route` is the way back: each broker that forwards a request appends one hop, and each hop is
    popped as the response travels back. A response with `streaming` set is one of several.
    `term` is the root's term on its orders, welcomes and lineages, kept as the header had it:
    it is not checked here (a bad one is refused by the order's receiver, state/terms.py).
    `body`, if set, is `payload` as encode() would put it, made once by whoever sends many
    copies that differ little (exec's fan-out, services/exec.py): the payload is not encoded
    again then, so the two must say the same.

    Not a dataclass (tbon/record.py says why) but equal and shown as one: by its fields. Not a
    Record either: it is mutable (a forwarding broker appends a hop to `route`, a reply gets its
    `errnum`), and so not hashable.
    """

    __slots__ = __match_args__ = (
        "kind",
        "topic",
        "payload",
        "nodeid",
        "tag",
        "route",
        "errnum",
        "errstr",
        "streaming",
        "version",
        "data",
        "term",  # header `term` as it came (state/terms.py judges it); None: absent
        "body",  # the payload already encoded (the sender's promise), or None
    )
    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as the dataclass was

    def __init__(
        self,
        kind: Kind,
        topic: str,
        payload: dict[str, Any] | None = None,
        nodeid: int = ANY_RANK,
        tag: int = 0,
        route: list[str] | None = None,
        errnum: int = 0,
        errstr: str = "",
        streaming: bool = False,
        version: int = PROTOCOL_VERSION,
        data: Buffer = b"",
        term: object = None,
        body: bytes | None = None,
    ) -> None:
        self.kind, self.topic, self.nodeid, self.tag = kind, topic, nodeid, tag
        self.payload: dict[str, Any] = {} if payload is None else payload
        self.route: list[str] = [] if route is None else route
        self.errnum, self.errstr, self.streaming, self.version = errnum, errstr, streaming, version
        self.data, self.term, self.body = data, term, body

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Message({fields})"

    def respond(self, payload: dict[str, Any] | None = None, *, streaming: bool = False) -> Message:
        return Message(
            Kind.RESPONSE,
            self.topic,
            payload or {},
            nodeid=self.nodeid,
            tag=self.tag,
            route=list(self.route),
            streaming=streaming,
        )

    def fail(self, errnum: int, errstr: str) -> Message:
        reply = self.respond()
        reply.errnum, reply.errstr = errnum, errstr
        return reply


def encode(message: Message) -> list[Buffer]:
    # the member's _value_, not .value: that is a Python property of Enum, on every message
    header: dict[str, Any] = {"v": message.version, "k": message.kind._value_, "t": message.topic}
    if message.nodeid != ANY_RANK:
        header["n"] = message.nodeid
    if message.tag:
        header["g"] = message.tag
    if message.route:
        header["r"] = message.route
    if message.errnum:
        header["e"] = message.errnum
        header["es"] = message.errstr
    if message.streaming:
        header["s"] = True
    if message.term is not None:
        header["term"] = message.term
    body = message.body
    if body is None and message.payload:
        body = _dumps(message.payload)
    elif body is None:
        body = b""
    head = _dumps(header)
    return [head, body, message.data] if message.data else [head, body]


_C_ENCODER = json.encoder.c_make_encoder  # type: ignore[attr-defined]  # _json's, or None
_DEFAULT = json.JSONEncoder().default  # what json.dumps does with what JSON cannot say


def _dumps(value: object) -> bytes:
    """json.dumps(value, separators=SEPARATORS).encode(), to the byte, without the three Python
    calls json.dumps makes to build an encoder each time (every message every broker sends):
    the C encoder json.dumps ends in, made here with the same settings and a fresh dict for
    its check of circular references."""
    if _C_ENCODER is None:  # a Python without the _json accelerator
        return json.dumps(value, separators=SEPARATORS).encode()
    encoder = _C_ENCODER(
        {}, _DEFAULT, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    return "".join(encoder(value, 0)).encode()


HEARTBEAT_FRAMES: tuple[bytes, bytes] = (
    json.dumps({"v": PROTOCOL_VERSION, "k": "control", "t": "heartbeat"}, separators=SEPARATORS)
    .encode(),
    b"",
)
"""A heartbeat as encode() puts it on the wire, made once: the one message an idle link carries,
sent and recognised without building or parsing a Message (issue 26, idle is free)."""


def is_heartbeat(frames: Sequence[Any]) -> bool:
    """Whether frames received without copying are exactly a heartbeat of this version (one of
    another version, or spelt otherwise, is decoded as any message and judged as such)."""
    return (
        len(frames) == 2
        and len(frames[1]) == 0
        and frames[0].bytes == HEARTBEAT_FRAMES[0]
    )


def canonical_head(kind: Kind, topic: str) -> bytes:
    """The header encode() writes for a message of `kind` and `topic` with nothing else set
    (no nodeid, tag, route, error, streaming or term), as it goes on the wire."""
    return encode(Message(kind, topic))[0]  # type: ignore[return-value]  # encode makes bytes


REPORT_HEAD = canonical_head(Kind.CONTROL, "report")
"""A report's header as every broker writes it: rank 0 reads hundreds at a wire-up, and knows one
by this without parsing it (`decode_payload`)."""


def decode_payload(frames: Sequence[Any], head: bytes) -> dict[str, Any] | None:
    """For frames received without copying that are a message whose header is exactly `head`
    (a canonical_head): its payload, checked as decode() checks it (MessageError if it is bad),
    without parsing the header or building a Message. None for any other frames: decode them.
    What it returns is what decode_frames(frames).payload would be (tests/test_message.py)."""
    if len(frames) != 2 or frames[0].bytes != head:
        return None
    body = frames[1].bytes
    if len(head) + len(body) > MAX_MESSAGE_BYTES:
        raise MessageError("message too large")
    if not body:
        return {}
    try:
        payload = _json(body)
    except (ValueError, RecursionError) as error:
        raise MessageError(f"not JSON: {type(error).__name__}") from None
    if not isinstance(payload, dict):
        raise MessageError("header and payload must be JSON objects")
    return payload


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)
"""Made once: json.loads with these hooks would build a decoder for every frame."""


_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # its scanner, _json's C one
# what json's decoder takes around a value; it always matches, if only the empty string
_SPACE: Callable[[str, int], re.Match[str]] = re.compile(r"[ \t\n\r]*").match  # type: ignore


def _json(frame: bytes) -> Any:
    """JSON as RFC 8259 has it on the wire: UTF-8 without a byte-order mark (json.loads on bytes
    would also take UTF-16 and UTF-32, and a BOM), and numbers only: no NaN, Infinity or
    -Infinity, nor a number too large for a double (1e400 would be read as infinity).
    _DECODER.decode's steps, spelt out (its decode and raw_decode are two Python calls per
    frame, two frames per message): the value, with only whitespace around it."""
    text = frame.decode("utf-8")
    try:
        value, end = _SCAN(text, _SPACE(text, 0).end())
    except StopIteration as error:
        raise json.JSONDecodeError("Expecting value", text, error.value) from None
    if _SPACE(text, end).end() != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def decode_frames(frames: Sequence[Any]) -> Message:
    """decode() for frames ZeroMQ gave without copying (recv_multipart(copy=False)): header and
    payload are copied out to be parsed, the data frame is only viewed."""
    if len(frames) == 2:  # most messages: no data frame
        return decode((frames[0].bytes, frames[1].bytes))
    return decode([f.buffer if i == 2 else f.bytes for i, f in enumerate(frames)])


def decode_sized(frames: Sequence[Buffer]) -> tuple[int, Message | None]:
    """What a client reads off a byte stream (a local socket, an ssh session): the message's size
    on the wire, which counts toward its `client.ack` whether it decodes or not, and the message,
    or None if it is malformed."""
    size = sum(len(frame) for frame in frames)
    try:
        return size, decode(frames)
    except MessageError:
        return size, None


def decode(frames: Sequence[Buffer]) -> Message:
    """The message in `frames` (routing envelope already removed), or MessageError.

    Any protocol version decodes, so that a broker can answer a peer of another version with a
    clear refusal: the header keys v, k and t keep their meaning in every version.
    """
    if len(frames) not in (2, 3):
        raise MessageError(f"expected 2 or 3 frames, got {len(frames)}")
    head_bytes, body = bytes(frames[0]), bytes(frames[1])
    data = frames[2] if len(frames) == 3 else b""
    if len(head_bytes) + len(body) + len(data) > MAX_MESSAGE_BYTES:
        raise MessageError("message too large")
    if len(frames) == 3 and not data:
        raise MessageError("an empty data frame")
    try:
        header = _json(head_bytes)
        payload = _json(body) if body else {}
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise MessageError(f"not JSON: {type(error).__name__}") from None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise MessageError("header and payload must be JSON objects")
    # `type(x) is int` is is_int for what JSON gives (an int, never a subclass but bool), in
    # no call: every message every broker reads comes here (a leaf, twice per exec job)
    version = header.get("v")
    if type(version) is not int or version < 1:
        raise MessageError(f"bad protocol version {version!r}")
    kind = _KINDS.get(k) if type(k := header.get("k")) is str else None
    if kind is None:  # absent: unknown, as any other value
        raise MessageError(f"unknown message kind {k!r}")
    topic, nodeid, tag = header.get("t"), header.get("n", ANY_RANK), header.get("g", 0)
    route, errnum, errstr = header.get("r", []), header.get("e", 0), header.get("es", "")
    if not isinstance(topic, str) or not topic:
        raise MessageError("missing topic")
    integers = type(nodeid) is int and type(tag) is int and type(errnum) is int
    if not integers or nodeid < ANY_RANK:
        raise MessageError("nodeid, tag and errnum must be integers")
    if not isinstance(route, list) or not all(isinstance(hop, str) for hop in route):
        raise MessageError("route must be a list of strings")
    if not isinstance(errstr, str):
        raise MessageError("errstr must be a string")
    return Message(
        kind,
        topic,
        payload,
        nodeid=nodeid,
        tag=tag,
        route=route,
        errnum=errnum,
        errstr=errstr,
        streaming=bool(header.get("s", False)),
        version=version,
        data=data,
        term=header.get("term"),
    )
