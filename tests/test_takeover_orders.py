"""Orders and requests after a takeover (docs/protocol.md §13.3, §13.4), with real brokers in a
chain (kary:1: the standbys reach each other below the root)."""

from __future__ import annotations

import os
import signal

from conftest import child_env, start_tbon, tbon, wait_for
from test_takeover import CHAIN, all_uris, status_through, wait_taken_over


def test_explore(instance) -> None:
    inst = instance(5, "size=6", *CHAIN)
    uris = all_uris(inst)
    env = {**child_env(), "TBON_URI": uris}
    os.kill(inst.pid(0), signal.SIGKILL)
    wait_taken_over(inst, uris)
    ran = tbon("exec", "-r", "all", "echo", "hi", env=env)
    print("EXEC", ran.returncode, repr(ran.stdout), repr(ran.stderr))
    retired = tbon("retire", "4", env=env)
    print("RETIRE", retired.returncode, repr(retired.stdout), repr(retired.stderr))
    joiner = inst.join(boot=uris.split(","))
    try:
        wait_for(lambda: (s := status_through(uris)) is not None and s["ranks"][5]["state"] == "online", "join", timeout=20)
        print("JOINED")
    except AssertionError as e:
        print("JOIN FAIL", e)
    print(status_through(uris))
    print(inst.stderr()[-5000:])
    assert False
