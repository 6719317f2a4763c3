"""An instance of 262,144 ranks, four of them launched (issue 26): every status view, the
table's pages, a joiner at the highest rank and its retirement, as a user sees them.

No answer may take the whole table: tests/test_limits.py builds the largest answers and checks
that each fits one message.
"""

from __future__ import annotations

import json
import re

from conftest import tbon

from tbon.limits import MAX_SIZE

SIZE = MAX_SIZE


def test_status_views_at_the_largest_size(instance) -> None:
    inst = instance(4, f"size={SIZE}")
    last = SIZE - 1
    summary = tbon("status", inst.uri, "--summary")
    assert summary.returncode == 0, summary.stderr
    assert re.fullmatch(
        rf"0 \S+: partial \({SIZE} ranks: 4 online, {SIZE - 4} vacant\)\n", summary.stdout
    )
    errors = tbon("status", inst.uri, "--errors")
    assert errors.stdout == f"4-{last}: vacant: spares never held\n", errors.stderr
    down = tbon("status", inst.uri, "--down")
    assert down.stdout == f"4-{last}: vacant: spares never held\n", down.stderr
    tree = tbon("status", inst.uri).stdout.splitlines()
    # kary:32: ranks 1-3 online, each above its own spares; 4-32 and all below them: spares
    assert len(tree) == 8, tree
    assert re.fullmatch(r"0 \S+: partial", tree[0])
    assert re.fullmatch(r"├─ 1 \S+: partial", tree[1])
    assert tree[2] == "│  └─ 33-64,1057-2080,33825-66592 extra: vacant"
    assert tree[-1] == "└─ 4-32,129-1056,4129-33824,132129-262143 extra: vacant"
    shallow = tbon("status", inst.uri, "--depth", "1").stdout.splitlines()
    assert re.fullmatch(r"├─ 1 \S+: partial \.\.\.", shallow[1]), shallow
    assert len(shallow) == 5
    subtree = tbon("status", inst.uri, "-r", "8191").stdout.splitlines()
    assert subtree == ["8191 extra8187: vacant", f"└─ 262113-{last} extra: vacant"]
    assert tbon("status", inst.uri, "-r", str(SIZE)).returncode == 68


def test_the_json_table_streams_in_pages_as_one_object(instance) -> None:
    inst = instance(4, f"size={SIZE}")
    shown = tbon("status", inst.uri, "--json", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("\n") == 1  # one line, as a single status.get gives it
    table = json.loads(shown.stdout)
    assert list(table) == ["size", "topo", "root", "standbys", "ranks"]
    assert (table["size"], table["topo"], table["root"], table["standbys"]) == (
        SIZE,
        "kary:32",
        0,
        [],
    )
    assert [entry["rank"] for entry in table["ranks"]] == list(range(SIZE))
    assert [entry["state"] for entry in table["ranks"][:5]] == ["online"] * 4 + ["vacant"]
    assert table["ranks"][SIZE - 1] | {"since": 0} == {
        "rank": SIZE - 1,
        "state": "vacant",
        "host": f"extra{SIZE - 5}",
        "pid": None,
        "incarnation": 0,
        "parent": (SIZE - 2) // 32,
        "children": [],
        "subtree": "offline",
        "torpid": False,
        "since": 0,
    }
    with inst.client() as client:
        pages = list(client.table_pages())
    assert len(pages) > 8  # many bounded pages, not one message
    assert all(len(data) < 2 * (1 << 20) for _header, data in pages)
    assert pages[-1][0]["next"] is None


def test_a_joiner_takes_the_highest_rank_and_retires(instance) -> None:
    """A flat tree, so that the highest rank's parent (rank 0) is online."""
    inst = instance(4, f"size={SIZE}", "tbon.topo=kary:0")
    last = SIZE - 1
    joined = tbon("expand", inst.uri, "--ranks", str(last), "--json", timeout=120)
    assert joined.returncode == 0, joined.stderr
    assert [r["rank"] for r in json.loads(joined.stdout)["joined"]] == [last]
    assert "also starting" not in joined.stderr
    tree = tbon("status", inst.uri).stdout.splitlines()
    assert tree[-2:] == [f"├─ 4-{last - 1} extra: vacant", tree[-1]]
    assert re.fullmatch(rf"└─ {last} \S+: full", tree[-1])
    summary = tbon("status", inst.uri, "--summary").stdout
    assert f"({SIZE} ranks: 5 online, {SIZE - 5} vacant)" in summary
    retired = tbon("retire", inst.uri, str(last))
    assert retired.returncode == 0, retired.stderr
    assert f"rank {last}: retired" in retired.stdout
    errors = tbon("status", inst.uri, "--errors").stdout.splitlines()
    assert re.fullmatch(rf"{last} \S+: vacant: retired", errors[0]), errors
    assert errors[1] == f"4-{last - 1}: vacant: spares never held"


def test_expand_into_the_highest_rank_starts_its_vacant_parents_too(instance) -> None:
    """The default tree (kary:32): rank 262143 hangs from 8191, 255 and 7, all spares. Its
    broker cannot come online below a vacant parent, so expand starts theirs too, and says so;
    then they retire, the deepest first."""
    inst = instance(4, f"size={SIZE}")
    last = SIZE - 1
    joined = tbon("expand", inst.uri, "--ranks", str(last), "--json", timeout=120)
    assert joined.returncode == 0, joined.stderr
    assert "also starting brokers for ranks 7,255,8191 above the ranks asked for" in (
        joined.stderr
    )
    assert [r["rank"] for r in json.loads(joined.stdout)["joined"]] == [7, 255, 8191, last]
    subtree = tbon("status", inst.uri, "-r", "8191").stdout.splitlines()
    assert re.fullmatch(r"8191 \S+: partial", subtree[0]), subtree
    assert re.fullmatch(rf"└─ {last} \S+: full", subtree[-1]), subtree
    summary = tbon("status", inst.uri, "--summary").stdout
    assert f"({SIZE} ranks: 8 online, {SIZE - 8} vacant)" in summary
    for rank in (last, 8191, 255, 7):
        retired = tbon("retire", inst.uri, str(rank))
        assert retired.returncode == 0, retired.stderr
        assert f"rank {rank}: retired" in retired.stdout
    held = inst.status()
    assert [held["ranks"][r]["state"] for r in (7, 255, 8191, last)] == ["vacant"] * 4
