"""Tests of `tbon.overlay.wire.message`: the two-frame JSON codec, strict on input."""

from __future__ import annotations

import json
from typing import Any

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.wire.message import (
    ANY_RANK,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    REPORT_HEAD,
    Kind,
    Message,
    MessageError,
    _json,
    decode,
    decode_payload,
    encode,
)

FAST = settings(max_examples=80, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
hops = st.one_of(
    st.just("p"),
    st.integers(0, 10_000).map(lambda r: f"c{r}"),
    st.binary(min_size=1, max_size=8).map(lambda b: "l" + b.hex()),
    st.text(max_size=6),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    errnum = draw(st.integers(-(2**31), 2**31))
    return Message(
        draw(st.sampled_from(list(Kind))),
        draw(st.text(min_size=1, max_size=30)),
        draw(payloads),
        nodeid=draw(st.integers(ANY_RANK, 2**40)),
        tag=draw(st.integers(-(2**40), 2**40)),
        route=draw(st.lists(hops, max_size=6)),
        errnum=errnum,
        # the header carries errstr only with a non-zero errnum
        errstr=draw(st.text(max_size=30)) if errnum else "",
        streaming=draw(st.booleans()),
        version=draw(st.integers(1, 10)),
        data=draw(st.binary(max_size=64)),
    )


def header(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def good(**overrides: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "k": "request", "t": "broker.ping", **overrides}


# --- round trip ---------------------------------------------------------------------------------


@given(messages())
@settings(max_examples=200, deadline=None)
def test_round_trip(message: Message) -> None:
    frames = encode(message)
    assert len(frames) == (3 if message.data else 2)
    assert all(isinstance(frame, bytes) for frame in frames)
    assert decode(frames) == message
    # and decoding is stable: re-encoding the decoded message gives the same bytes
    assert encode(decode(frames)) == frames


def test_minimal_encoding() -> None:
    head, body = encode(Message(Kind.REQUEST, "broker.ping"))
    assert json.loads(head) == {"v": PROTOCOL_VERSION, "k": "request", "t": "broker.ping"}
    assert body == b""
    assert decode([head, body]).payload == {}


def test_full_encoding_uses_the_documented_keys() -> None:
    message = Message(
        Kind.RESPONSE,
        "status.watch",
        {"a": 1},
        nodeid=3,
        tag=7,
        route=["l0a", "c3"],
        errnum=2,
        errstr="no",
        streaming=True,
    )
    head, body = encode(message)
    assert json.loads(head) == {
        "v": PROTOCOL_VERSION,
        "k": "response",
        "t": "status.watch",
        "n": 3,
        "g": 7,
        "r": ["l0a", "c3"],
        "e": 2,
        "es": "no",
        "s": True,
    }
    assert json.loads(body) == {"a": 1}


def test_defaults_when_keys_are_absent() -> None:
    message = decode([header(v=1, k="event", t="x"), b""])
    assert message.kind is Kind.EVENT
    assert message.nodeid == ANY_RANK
    assert (message.tag, message.route, message.errnum, message.errstr) == (0, [], 0, "")
    assert message.streaming is False
    assert message.payload == {}


@pytest.mark.parametrize("version", [2, 3, 99, 2**40])
def test_other_protocol_versions_decode_with_their_version(version: int) -> None:
    message = decode([header(**good(v=version, k="control", t="hello")), b'{"rank":1}'])
    assert message.version == version
    assert message.topic == "hello"
    assert message.payload == {"rank": 1}
    assert json.loads(encode(message)[0])["v"] == version


def test_a_newer_peer_may_add_header_keys() -> None:
    message = decode([header(**good(v=2, extra={"x": 1})), b""])
    assert message.version == 2


# --- respond / fail -----------------------------------------------------------------------------


@given(messages(), payloads, st.booleans())
@FAST
def test_respond_copies_route_tag_and_nodeid(
    original: Message, payload: dict[str, Any], streaming: bool
) -> None:
    reply = original.respond(payload, streaming=streaming)
    assert reply.kind is Kind.RESPONSE
    assert reply.topic == original.topic
    assert reply.payload == payload
    assert (reply.tag, reply.route, reply.nodeid) == (original.tag, original.route, original.nodeid)
    assert reply.streaming is streaming
    assert (reply.errnum, reply.errstr) == (0, "")
    assert reply.version == PROTOCOL_VERSION
    # the route is a copy: popping a hop from the reply leaves the request alone
    before = list(original.route)
    reply.route.append("x")
    assert original.route == before


@given(messages(), st.integers(1, 200), st.text(max_size=20))
@FAST
def test_fail_copies_route_and_tag(original: Message, errnum: int, errstr: str) -> None:
    reply = original.fail(errnum, errstr)
    assert reply.kind is Kind.RESPONSE
    assert (reply.tag, reply.route, reply.nodeid) == (original.tag, original.route, original.nodeid)
    assert reply.route is not original.route
    assert (reply.errnum, reply.errstr) == (errnum, errstr)
    assert reply.payload == {}
    assert reply.streaming is False
    assert decode(encode(reply)) == reply


def test_respond_without_payload_is_empty() -> None:
    original = Message(Kind.REQUEST, "t", {"x": 1}, tag=4, route=["p"])
    assert original.respond().payload == {}
    assert original.respond(None).payload == {}


# --- malformed input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [header(**good())],
        [header(**good()), b"", b""],  # a data frame is never empty
        [header(**good()), b"", b"x", b"y"],
        [header(**good()), b"", b"x" * (4 * 1024 * 1024)],
        [b"", b""],
        [b"not json", b""],
        [b"\xff\xfe\x00", b""],
        [header(**good()), b"not json"],
        [header(**good()), b"\xff"],
        [b"[]", b""],
        [b"null", b""],
        [b'"text"', b""],
        [header(**good()), b"[1, 2]"],
        [header(**good()), b"null"],
        [header(**good()), b"0"],
        [header(**good(v=0)), b""],
        [header(**good(v=-1)), b""],
        [header(**good(v="1")), b""],
        [header(**good(v=1.0)), b""],
        [header(**good(v=True)), b""],
        [header(**good(v=None)), b""],
        [header(k="request", t="x"), b""],
        [header(**good(k="req")), b""],
        [header(**good(k="REQUEST")), b""],
        [header(**good(k=None)), b""],
        [header(**good(k=["request"])), b""],
        [header(**good(k={"a": 1})), b""],
        [header(v=1, k="request"), b""],
        [header(**good(t="")), b""],
        [header(**good(t=5)), b""],
        [header(**good(t=None)), b""],
        [header(**good(n="3")), b""],
        [header(**good(n=-2)), b""],
        [header(**good(n=1.5)), b""],
        [header(**good(n=True)), b""],
        [header(**good(g="7")), b""],
        [header(**good(g=False)), b""],
        [header(**good(e="2")), b""],
        [header(**good(e=None)), b""],
        [header(**good(r="p")), b""],
        [header(**good(r=[1])), b""],
        [header(**good(r=["p", None])), b""],
        [header(**good(r={"p": 1})), b""],
        [header(**good(es=3)), b""],
        [b'{"v":1,"k":"request","t":"x","n":1e400}', b""],
        [b'{"v":NaN,"k":"request","t":"x"}', b""],
        [b'{"v":Infinity,"k":"request","t":"x"}', b""],
        [b'{"v":1,"k":"request","t":"x","n":' + b"9" * 5000 + b"}", b""],
        # JSON on the wire is UTF-8 without a byte-order mark (RFC 8259 section 8.1)
        [b"\xff\xfe" + json.dumps(good()).encode("utf-16-le"), b""],
        [b"\xfe\xff" + json.dumps(good()).encode("utf-16-be"), b""],
        [json.dumps(good()).encode("utf-16-le"), b""],
        [json.dumps(good()).encode("utf-32"), b""],
        [b"\xef\xbb\xbf" + header(**good()), b""],
        [header(**good()), b"\xef\xbb\xbf{}"],
        [header(**good()), b"\xff\xfe" + "{}".encode("utf-16-le")],
        [header(**good()), b'{"k":"\xe9"}'],  # Latin-1, not UTF-8
        # numbers only: no NaN or infinities, spelled out or overflowing a double
        [header(**good()), b'{"x":NaN}'],
        [header(**good()), b'{"x":Infinity}'],
        [header(**good()), b'{"x":-Infinity}'],
        [header(**good()), b'{"x":[1,{"y":NaN}]}'],
        [header(**good()), b'{"x":1e400}'],
        [header(**good()), b'{"x":-1e400}'],
        [header(**good()), b'{"x":1.0e309}'],
        [header(**good(extra=None))[:-1] + b',"y":NaN}', b""],
    ],
)
def test_malformed_frames_raise_message_error(frames: list[bytes]) -> None:
    with pytest.raises(MessageError):
        decode(frames)


@pytest.mark.parametrize(
    "number", [b"1.5e308", b"-1.7976931348623157e308", b"5e-324", b"1e-400", b"0.0", b"-0.0"]
)
def test_finite_numbers_at_the_edges_decode(number: bytes) -> None:
    message = decode([header(**good()), b'{"x":' + number + b"}"])
    assert message.payload["x"] == float(number)


def test_utf8_text_decodes() -> None:
    message = decode([header(**good(t="t\u00e9")), '{"x":"\u00e9\u20ac\U0001f600"}'.encode()])
    assert message.topic == "t\u00e9"
    assert message.payload == {"x": "\u00e9\u20ac\U0001f600"}


def test_the_data_frame_carries_bytes_as_they_are() -> None:
    """`tbon exec` moves output and input in a third frame: any bytes, not JSON."""
    raw = b"\xff\xfe\x00 raw\n" * 1000
    frames = encode(Message(Kind.RESPONSE, "exec.start", {"rank": 1}, data=raw))
    assert frames[2] == raw
    assert decode(frames).data == raw


def test_bytes_that_are_not_utf8_travel_as_surrogate_escapes() -> None:
    """`tbon exec` output that is not UTF-8 crosses as U+DC80-U+DCFF (surrogateescape), escaped
    in JSON; the strict decoder must keep taking it."""
    text = b"\xff\xfe raw".decode("utf-8", "surrogateescape")
    frames = encode(Message(Kind.RESPONSE, "exec.start", {"data": text}))
    assert decode(frames).payload["data"].encode("utf-8", "surrogateescape") == b"\xff\xfe raw"


def test_message_error_is_a_value_error() -> None:
    assert issubclass(MessageError, ValueError)


def assert_decodes_or_message_error(frames: list[bytes]) -> None:
    try:
        message = decode(frames)
    except MessageError:
        return
    # whatever decodes is a well-formed message that survives a round trip
    assert isinstance(message, Message)
    assert isinstance(message.kind, Kind)
    assert isinstance(message.topic, str) and message.topic
    assert isinstance(message.payload, dict)
    assert message.version >= 1 and message.nodeid >= ANY_RANK
    # its payload is strict JSON: no NaN or infinity came through
    json.dumps(message.payload, allow_nan=False)
    # it survives forwarding (decode, encode, decode), but for an errstr without an errnum,
    # which the encoder leaves out
    again = decode(encode(message))
    if not message.errnum:
        message.errstr = ""
    assert again == message


@given(st.lists(st.binary(max_size=40), max_size=4))
@settings(max_examples=150, deadline=None)
def test_arbitrary_bytes_never_raise_anything_but_message_error(frames: list[bytes]) -> None:
    assert_decodes_or_message_error(frames)


header_values = st.one_of(
    json_values,
    st.sampled_from(list(Kind)).map(str),
    st.integers(-3, 3),
    st.lists(st.text(max_size=4), max_size=3),
)
headers = st.dictionaries(
    st.sampled_from(["v", "k", "t", "n", "g", "r", "e", "es", "s", "x"]),
    header_values,
    max_size=9,
)


@given(st.one_of(headers, json_values), st.one_of(payloads, json_values, st.just("")))
@settings(max_examples=200, deadline=None)
def test_arbitrary_json_headers_never_raise_anything_but_message_error(
    head: Any, body: Any
) -> None:
    body_bytes = b"" if body == "" else json.dumps(body).encode()
    assert_decodes_or_message_error([json.dumps(head).encode(), body_bytes])


@given(
    st.fixed_dictionaries(
        {"v": st.integers(1, 3), "k": st.sampled_from(list(Kind)).map(str)},
        optional={
            "t": st.text(max_size=5),
            "n": st.integers(-5, 5),
            "g": st.integers(-5, 5),
            "r": st.lists(st.text(max_size=3), max_size=3),
            "e": st.integers(-5, 5),
            "es": st.text(max_size=5),
            "s": json_scalars,
        },
    )
)
@FAST
def test_nearly_valid_headers(head: dict[str, Any]) -> None:
    assert_decodes_or_message_error([json.dumps(head).encode(), b""])


@pytest.mark.parametrize("depth", [100_000])
@pytest.mark.parametrize("where", ["header", "payload"])
@pytest.mark.parametrize("bracket", [b"[", b'{"a":'])
def test_deeply_nested_json_raises_message_error(depth: int, where: str, bracket: bytes) -> None:
    nested = bracket * depth
    frames = [nested, b""] if where == "header" else [header(**good()), nested]
    assert len(b"".join(frames)) <= MAX_MESSAGE_BYTES
    with pytest.raises(MessageError):
        decode(frames)


# --- size limit ---------------------------------------------------------------------------------


def padded(total: int) -> list[bytes]:
    """A valid message of exactly `total` bytes (header plus payload)."""
    head = header(**good())
    skeleton = b'{"pad":""}'
    filler = total - len(head) - len(skeleton)
    return [head, b'{"pad":"' + b"x" * filler + b'"}']


def test_message_at_the_limit_is_accepted() -> None:
    frames = padded(MAX_MESSAGE_BYTES)
    assert sum(map(len, frames)) == MAX_MESSAGE_BYTES
    assert len(decode(frames).payload["pad"]) > MAX_MESSAGE_BYTES - 100


def test_oversize_message_is_refused() -> None:
    frames = padded(MAX_MESSAGE_BYTES + 1)
    with pytest.raises(MessageError, match="too large"):
        decode(frames)


def test_oversize_header_alone_is_refused() -> None:
    with pytest.raises(MessageError, match="too large"):
        decode([b" " * (MAX_MESSAGE_BYTES + 1), b""])


def test_limit_is_four_mebibytes() -> None:
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024


# --- strict decoding, fuzzed --------------------------------------------------------------------


@given(messages(), st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"]))
@FAST
def test_a_good_message_in_another_encoding_is_refused(message: Message, encoding: str) -> None:
    head, body = encode(message)[:2]
    with pytest.raises(MessageError):
        decode([head.decode().encode(encoding), body])


floats_of_any_kind = st.floats(allow_nan=True, allow_infinity=True)
values_with_any_floats = st.recursive(
    json_scalars | floats_of_any_kind,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(finite(item) for item in value)
    if isinstance(value, dict):
        return all(finite(item) for item in value.values())
    return True


@given(st.dictionaries(st.text(max_size=8), values_with_any_floats, max_size=4))
@FAST
def test_a_payload_is_refused_exactly_when_it_holds_nan_or_an_infinity(
    payload: dict[str, Any],
) -> None:
    body = json.dumps(payload).encode()  # Python writes NaN, Infinity and -Infinity
    if finite(payload):
        assert decode([header(**good()), body]).payload == payload
    else:
        with pytest.raises(MessageError):
            decode([header(**good()), body])


@st.composite
def damaged(draw: st.DrawFn) -> list[bytes]:
    """A good message's frames with a few bytes changed, inserted or cut."""
    frames = [bytearray(frame) for frame in encode(draw(messages()))]
    for _ in range(draw(st.integers(1, 4))):
        frame = frames[draw(st.integers(0, 1))]
        at = draw(st.integers(0, len(frame)))
        how = draw(st.sampled_from(["flip", "insert", "cut"]))
        byte = draw(
            st.sampled_from(list(b'{}[]",:\\0-9eE+-.NaIfinity \x00\x80\xbf\xc0\xef\xfe\xff'))
            | st.integers(0, 255)
        )
        if how == "insert" or not frame:
            frame[at:at] = bytes([byte])
        elif how == "flip":
            frame[min(at, len(frame) - 1)] = byte
        else:
            del frame[at:]
    return [bytes(frame) for frame in frames]


@given(damaged())
@settings(max_examples=400, deadline=None)
def test_damaged_messages_decode_whole_or_raise_only_message_error(frames: list[bytes]) -> None:
    assert_decodes_or_message_error(frames)


@given(
    st.lists(
        st.sampled_from(
            [
                b"{",
                b"}",
                b"[",
                b"]",
                b",",
                b":",
                b'"v"',
                b'"k"',
                b'"t"',
                b"1",
                b"-1",
                b"1e400",
                b"NaN",
                b"Infinity",
                b"null",
                b"true",
                b'"request"',
                b'"x"',
                b"\xef\xbb\xbf",
                b"\xff\xfe",
                b"\x00",
                b"\\ud800",
                b'"\\u0000"',
                b" ",
            ]
        ),
        max_size=30,
    ).map(b"".join),
    st.sampled_from([b"", b"{}", b'{"x":NaN}', b"\xef\xbb\xbf{}", b'{"a":[1e999]}']),
)
@settings(max_examples=300, deadline=None)
def test_json_like_token_soup_raises_only_message_error(head: bytes, body: bytes) -> None:
    assert_decodes_or_message_error([head, body])


# --- a report known by its header (decode_payload) --------------------------------------------


def outcome(decoding: Any) -> Any:
    """What a decoding gives: its value, or the MessageError it raised (by its text)."""
    try:
        return decoding()
    except MessageError as error:
        return ("MessageError", str(error))


bodies = st.one_of(
    st.binary(max_size=60),
    st.one_of(payloads, json_values).map(lambda value: json.dumps(value).encode()),
    st.sampled_from([b"", b"{}", b'{"a":NaN}', b"\xff\xfe{}", b'{"a":1e400}', b"[]"]),
)


@given(bodies)
@settings(max_examples=300, deadline=None)
def test_a_payload_known_by_its_header_is_what_decode_makes_of_it(body: bytes) -> None:
    frames = [zmq.Frame(REPORT_HEAD), zmq.Frame(body)]
    fast = outcome(lambda: decode_payload(frames, REPORT_HEAD))
    plain = outcome(lambda: decode([REPORT_HEAD, body]).payload)
    assert fast == plain


def test_a_payload_known_by_its_header_keeps_the_size_limit() -> None:
    filler = MAX_MESSAGE_BYTES + 1 - len(REPORT_HEAD) - len(b'{"pad":""}')
    body = b'{"pad":"' + b"x" * filler + b'"}'
    frames = [zmq.Frame(REPORT_HEAD), zmq.Frame(body)]
    assert len(REPORT_HEAD) + len(body) == MAX_MESSAGE_BYTES + 1
    with pytest.raises(MessageError, match="too large"):
        decode_payload(frames, REPORT_HEAD)
    at_the_limit = zmq.Frame(body[:8] + body[9:])  # one x less
    assert decode_payload([frames[0], at_the_limit], REPORT_HEAD) == {"pad": "x" * (filler - 1)}


@given(messages())
@settings(max_examples=100, deadline=None)
def test_only_the_canonical_header_is_known(message: Message) -> None:
    frames = [zmq.Frame(bytes(frame)) for frame in encode(message)]
    known = decode_payload(frames, REPORT_HEAD)
    canonical = Message(Kind.CONTROL, "report", message.payload)
    if message == canonical:
        assert known == message.payload
    elif frames[0].bytes != REPORT_HEAD or len(frames) != 2:
        assert known is None


def test_the_report_header_is_the_one_encode_writes() -> None:
    assert encode(Message(Kind.CONTROL, "report", {"events": []}))[0] == REPORT_HEAD
    assert decode([REPORT_HEAD, b""]) == Message(Kind.CONTROL, "report")



@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_a_payload_encodes_as_json_dumps_writes_it(payload: dict[str, Any]) -> None:
    """encode() writes with the C encoder made once per message (message._dumps): byte for
    byte what json.dumps with the compact separators writes."""
    body = encode(Message(Kind.REQUEST, "t", payload))[1]
    assert body == (json.dumps(payload, separators=(",", ":")).encode() if payload else b"")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=' \t\n\r{}[]":,0123456789.eE+-truefalsn\\ux', max_size=24))
def test_json_text_reads_as_json_loads_reads_it(text: str) -> None:
    """The decoder's steps spelt out (message._json): the same value as json.loads, or a
    ValueError where it raises one (or where it reads a number too large: the wire refuses
    what would be an infinity, tested above)."""
    try:
        expected: Any = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            _json(text.encode())
        return
    if "inf" in repr(expected):
        with pytest.raises(ValueError):
            _json(text.encode())
        return
    assert _json(text.encode()) == expected
