"""Strict input on a broker's local socket (docs/protocol.md section 2.3), through a real broker.

A malformed message is dropped, never answered; the broker goes on. Each test sends the bad
input and then a good ping on the same connection: the broker reads them in order, so an answer
to the bad input would arrive before the ping's. No test waits for a silence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DEADLINE
from rawlocal import RawClient

MARK = 8888  # the tag of the good ping that closes each exchange


@pytest.fixture
def local(instance) -> Iterator[tuple[Any, RawClient]]:
    """A one-rank instance and a raw client on its local socket."""
    inst = instance(1)
    with RawClient(inst.uri) as dealer:
        yield inst, dealer


def head(**fields: Any) -> bytes:
    return json.dumps({"v": 1, "k": "request", "n": 0, **fields}).encode()


def exchange(dealer: RawClient, frames: list[bytes]) -> list[list[bytes]]:
    """Send `frames`, then a ping; every answer that came before the ping's."""
    dealer.send_multipart(frames)
    dealer.send_multipart([head(t="broker.ping", g=MARK), b""])
    answers = []
    while dealer.poll(int(DEADLINE * 1000)):
        answer = dealer.recv_multipart()
        if json.loads(answer[0]).get("g") == MARK:
            return answers
        answers.append(answer)
    raise AssertionError(f"no answer to the ping within {DEADLINE}s")


PING = {"v": 1, "k": "request", "t": "broker.ping", "n": 0, "g": 7}


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"\xff\xfe" + json.dumps(PING).encode("utf-16-le"), b""], id="utf-16-bom"),
        pytest.param([json.dumps(PING).encode("utf-32"), b""], id="utf-32"),
        pytest.param([b"\xef\xbb\xbf" + json.dumps(PING).encode(), b""], id="utf-8-bom"),
        pytest.param([json.dumps(PING).encode(), b'{"x":NaN}'], id="nan"),
        pytest.param([json.dumps(PING).encode(), b'{"x":[-Infinity]}'], id="infinity"),
        pytest.param([json.dumps(PING).encode(), b'{"x":1e400}'], id="overflow"),
    ],
)
def test_input_that_is_not_strict_json_is_dropped_unanswered(local, frames) -> None:
    inst, dealer = local
    assert exchange(dealer, [json.dumps(PING).encode(), b""])  # the same ping, well formed
    assert exchange(dealer, frames) == []
    assert inst.status()["ranks"][0]["state"] == "online"


def exec_start(dealer: RawClient, **payload: Any) -> dict[str, Any]:
    frames = [head(t="exec.start", g=9), json.dumps({"targets": [0], **payload}).encode()]
    answers = exchange(dealer, frames)
    assert len(answers) == 1, answers
    return json.loads(answers[0][1])


@pytest.mark.parametrize("cwd", [5, True, [], {"d": "/"}, "/tmp\u0000x", "/\ud800"])
def test_exec_start_with_a_cwd_that_is_not_a_path_is_refused(local, cwd: Any) -> None:
    _inst, dealer = local
    answer = exec_start(dealer, id=f"j{cwd!r}", argv=["true"], cwd=cwd)
    assert answer == {"rank": 0, "error": "exec.start: cwd must be a directory's path or null"}


@pytest.mark.parametrize(
    "argv", [["/bin/tr\u0000ue"], ["tr\u0000ue"], ["true", "a\u0000b"], ["\ud800"], [3]]
)
def test_exec_start_with_an_argv_the_system_cannot_take_is_refused(local, argv: list[Any]) -> None:
    """Not an OS error: before, `/bin/tr\\0ue` stopped rank 0 with a ValueError."""
    inst, dealer = local
    answer = exec_start(dealer, id=f"a{argv!r}", argv=argv, cwd=None)
    assert answer == {"rank": 0, "error": "exec.start: bad argv or a duplicate id"}
    assert inst.status()["ranks"][0]["state"] == "online"


def exec_answers(dealer) -> list[dict]:
    """A raw client's exec answers up to the exit; a data frame, if any, as "data" (bytes)."""
    answers: list[dict] = []
    while not any("exit" in a for a in answers):
        assert dealer.poll(int(DEADLINE * 1000)), answers
        frames = dealer.recv_multipart()
        answer = json.loads(frames[1])
        answer.pop("seq", None)  # each answer's number (protocol section 7.1), not what is tested
        if len(frames) == 3:
            answer["data"] = frames[2]
        answers.append(answer)
    return answers


def test_a_good_cwd_and_a_null_one_still_run(local, tmp_path) -> None:
    _inst, dealer = local
    for job, cwd in (("here", str(tmp_path)), ("default", None)):
        frames = [
            head(t="exec.start", g=10),
            json.dumps({"targets": [0], "id": job, "argv": ["pwd"], "cwd": cwd}).encode(),
        ]
        dealer.send_multipart(frames)
        answers = exec_answers(dealer)
        assert answers[-1] == {"rank": 0, "exit": 0}
        if cwd is not None:
            assert answers[0] == {"rank": 0, "stream": "stdout", "data": f"{cwd}\n".encode()}


def test_a_path_that_is_not_there_is_named_as_tbon_exec_names_it(local) -> None:
    _inst, dealer = local
    frames = [
        head(t="exec.start", g=11),
        json.dumps({"targets": [0], "id": "gone", "argv": ["bogus://x"], "cwd": None}).encode(),
    ]
    dealer.send_multipart(frames)
    assert exec_answers(dealer) == [
        {"rank": 0, "exit": 127, "note": "bogus://x: No such file or directory"}
    ]
