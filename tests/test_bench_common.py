"""The benchmarks' shared helpers (benchmarks/common.py), where a wrong answer would mislead a
measurement rather than fail one: run in a process of their own, since they patch tbon's
modules in place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import child_env

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

WRAPPED = """
import sys
sys.path.insert(0, sys.argv[1])
from common import wrap_each
from tbon.overlay.links import children
from tbon.overlay.wire import message

calls = []

def wrap(name, function):
    def counted(*a, **k):
        calls.append(name)
        return function(*a, **k)
    return counted

wrap_each([("tbon.overlay.wire.message", n) for n in ("decode_frames", "encode")], wrap)
import zmq
ping = message.Message(message.Kind.REQUEST, "broker.ping", {})
children.decode_frames([zmq.Frame(f) for f in children.encode(ping)])  # as its link calls them
message.decode_frames([zmq.Frame(f) for f in message.encode(ping)])
print(sorted(calls))
"""


def test_a_wrapped_function_is_timed_through_the_names_it_was_imported_by() -> None:
    """profile_exec.py --split times decode_frames and encode, which a broker's links call
    through names of their own (children.py imports both): every call is counted."""
    ran = subprocess.run(
        [sys.executable, "-c", WRAPPED, str(BENCHMARKS)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    want = ["decode_frames", "decode_frames", "encode", "encode"]
    assert ran.stdout.strip() == str(want), ran.stdout
