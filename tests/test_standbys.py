"""`tbon.standbys`: which ranks stand by for the root, the attribute's refusals, and what
`tbon status` shows of the root and its standbys (text and JSON), through real instances."""

from __future__ import annotations

import json
import re

import pytest
from conftest import tbon

from tbon.errors import UsageError
from tbon.overlay.config.attributes import DEFAULTS, broker_config
from tbon.overlay.state.standbys import (
    DEFAULT_STANDBYS,
    MAX_STANDBYS,
    kept_standbys,
    standby_ranks,
)
from tbon.overlay.state.topology import Topology


@pytest.mark.parametrize(
    ("spec", "size", "count", "expected"),
    [
        ("kary:2", 8, 2, (1, 2)),
        ("kary:2", 8, 4, (1, 2, 3, 4)),  # past the root's children: the next level, in order
        ("kary:32", 8, 3, (1, 2, 3)),
        ("kary:0", 262144, 4, (1, 2, 3, 4)),  # flat: the root's 2^18 children are not listed
        ("kary:1", 8, 3, (1, 2, 3)),  # a chain
        ("binomial", 16, 4, (1, 2, 4, 8)),  # breadth-first is not rank order here
        ("binomial", 16, 3, (1, 2, 4)),
        ("parents:0,0,1,1", 5, 3, (1, 2, 3)),
        ("kary:2", 3, 4, (1, 2)),  # clamped to size - 1
        ("kary:2", 1, 4, ()),  # a singleton has none
        ("kary:2", 8, 0, ()),
    ],
)
def test_standbys_are_the_first_ranks_after_the_root_breadth_first(
    spec: str, size: int, count: int, expected: tuple[int, ...]
) -> None:
    assert standby_ranks(Topology(spec, size), count) == expected


def test_the_attribute_defaults_to_the_named_constant() -> None:
    assert DEFAULTS["tbon.standbys"] == str(DEFAULT_STANDBYS)
    assert broker_config({}).standbys == DEFAULT_STANDBYS
    for k in range(MAX_STANDBYS + 1):
        assert broker_config({"tbon.standbys": str(k)}).standbys == k


@pytest.mark.parametrize("bad", ["5", "-1", "", "two", "1.5", " 1", "²", "9" * 5000, "04"])
def test_the_attribute_refuses_anything_but_0_to_4(bad: str) -> None:
    with pytest.raises(UsageError) as raised:
        broker_config({"tbon.standbys": bad})
    message = str(raised.value)
    assert message.startswith("invalid tbon.standbys") and "0 to 4" in message
    assert len(message) < 200 and "\n" not in message


@pytest.mark.parametrize("command", [["start", "--test-size=2"], ["broker"]])
def test_commands_refuse_a_bad_standbys_with_one_line_and_exit_2(command: list[str]) -> None:
    result = tbon(*command, "-S", "tbon.standbys=5", "true")
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid tbon.standbys '5'" in lines[0], result.stderr


def test_status_shows_the_root_and_its_standbys(instance) -> None:
    inst = instance(4, "tbon.standbys=2", "tbon.topo=kary:2")
    assert tbon("attr", inst.uri, "get", "tbon.standbys").stdout == "2\n"
    status = json.loads(tbon("status", inst.uri, "--json").stdout)
    assert (status["root"], status["standbys"]) == (0, [1, 2])
    assert len(status["ranks"]) == 4
    tree = tbon("status", inst.uri, "--no-pretty").stdout.splitlines()
    assert re.fullmatch(r"0 \S+: full \(root\)", tree[0]), tree
    assert re.fullmatch(r"  1 \S+: full \(standby\)", tree[1]), tree
    assert re.fullmatch(r"    3 \S+: full", tree[2]), tree
    assert re.fullmatch(r"  2 \S+: full \(standby\)", tree[3]), tree
    summary = tbon("status", inst.uri, "--summary").stdout
    assert re.fullmatch(
        r"0 \S+: full \(root\) \(4 ranks: 4 online; root 0, standbys 1-2\)\n", summary
    ), summary
    below = tbon("status", inst.uri, "--summary", "--rank", "1").stdout
    assert re.fullmatch(
        r"1 \S+: full \(standby\) \(2 ranks: 2 online; root 0, standbys 1-2\)\n", below
    ), below


def test_status_without_standbys_reads_as_before(instance) -> None:
    """K=0: the root is rank 0, drawn first as ever; no mark, but the JSON still says so."""
    inst = instance(2)
    status = json.loads(tbon("status", inst.uri, "--json").stdout)
    assert (status["root"], status["standbys"]) == (0, [])
    assert re.fullmatch(r"0 \S+: full\n└─ 1 \S+: full\n", tbon("status", inst.uri).stdout)
    summary = tbon("status", inst.uri, "--summary").stdout
    assert re.fullmatch(r"0 \S+: full \(2 ranks: 2 online\)\n", summary), summary


def test_standbys_past_the_size_are_clamped_and_the_group_kept_odd(instance) -> None:
    """4 asked of a size of 3: 2 kept. Of a size of 2: 1 there is, and a group of two (root
    and one standby) adds no failover (protocol §13.1): none kept, and the broker says why."""
    inst = instance(3, "tbon.standbys=4")
    status = json.loads(tbon("status", inst.uri, "--json").stdout)
    assert (status["root"], status["standbys"]) == (0, [1, 2])
    inst = instance(2, "tbon.standbys=4")
    status = json.loads(tbon("status", inst.uri, "--json").stdout)
    assert (status["root"], status["standbys"]) == (0, [])
    assert "tbon.standbys=4 (1 in a size of 2) adds no failover" in inst.stderr()


@pytest.mark.parametrize(
    ("asked", "kept"), [(0, ()), (1, ()), (2, (1, 2)), (3, (1, 2)), (4, (1, 2, 3, 4))]
)
def test_the_root_group_is_odd(asked: int, kept: tuple[int, ...]) -> None:
    ranks, note = kept_standbys(Topology("kary:4", 64), asked)
    assert ranks == kept
    assert (note is None) == (len(kept) == asked)


def test_roles_at_the_largest_size(instance) -> None:
    """262,144 ranks, 4 launched, 4 standbys asked for: a spare never stands by (it has no
    broker, and would count against every majority), so ranks 1-3 could, and the group kept
    odd makes it 1 and 2; the views and the paged JSON say so without the table sent whole."""
    from tbon.limits import MAX_SIZE

    inst = instance(4, f"size={MAX_SIZE}", "tbon.standbys=4")
    summary = tbon("status", inst.uri, "--summary").stdout
    assert re.fullmatch(
        rf"0 \S+: partial \(root\) \({MAX_SIZE} ranks: 4 online, {MAX_SIZE - 4} vacant; "
        r"root 0, standbys 1-2\)\n",
        summary,
    ), summary
    tree = tbon("status", inst.uri, "--depth", "1").stdout.splitlines()
    assert re.fullmatch(r"0 \S+: partial \(root\)", tree[0]), tree
    for rank in (1, 2):  # their spares below are hidden by --depth
        assert re.fullmatch(rf"├─ {rank} \S+: partial \(standby\) \.\.\.", tree[rank]), tree
    assert re.fullmatch(r"├─ 3 \S+: partial \.\.\.", tree[3]), tree
    shown = tbon("status", inst.uri, "--json", timeout=120)
    head = shown.stdout[:200]
    assert head.startswith(f'{{"size":{MAX_SIZE},"topo":"kary:32","root":0,"standbys":[1,2],')


def test_a_spare_never_stands_by() -> None:
    """Only launched ranks are standbys: with 2 launched, 2 asked, none (a group of two adds
    no failover); with 4 launched, 4 asked, 1 and 2 (3 could, and the group is kept odd)."""
    assert kept_standbys(Topology("kary:4", 64), 2, launched=2)[0] == ()
    ranks, note = kept_standbys(Topology("kary:4", 64), 4, launched=4)
    assert ranks == (1, 2) and note is not None and "(3 in 4 launched ranks)" in note
    assert kept_standbys(Topology("kary:4", 64), 4, launched=64) == ((1, 2, 3, 4), None)
