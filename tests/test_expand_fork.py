"""`tbon expand` forks its brokers from one process that imported the broker once
(overlay/launch/forker.py): what a user sees of them must be what a broker started on its own
shows, its whole title (which names its run directory and boot servers) and its log."""

from __future__ import annotations

import json
import os

from brokers import title
from conftest import process_gone, tbon, wait_for


def test_a_forked_joiner_shows_its_whole_title_and_logs_to_its_file(instance) -> None:
    inst = instance(2, "size=3")
    rank0_dir = os.path.dirname(inst.uri[len("local://") :])
    joined = tbon("expand", inst.uri, "-n", "1", "--json")
    assert joined.returncode == 0, joined.stderr
    [broker] = json.loads(joined.stdout)["joined"]
    try:
        shown = title(broker["pid"])
        assert shown.startswith("tbon broker rank 2/3 -S broker.boot-server=local://"), shown
        assert f"-S broker.rundir={rank0_dir}{os.sep}" in shown, shown  # not cut short
        [log] = (os.path.join(rank0_dir, "expand", name) for name in _logs(rank0_dir))
        with open(log) as text:
            assert "FLUB: reserved rank 2" in text.read()
    finally:
        inst.stop()
        wait_for(lambda: process_gone(broker["pid"]), "the joined broker to leave")


def _logs(rundir: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(rundir, "expand")) if n.endswith(".log")]
