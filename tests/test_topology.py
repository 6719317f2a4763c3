"""Tests of `tbon.overlay.state.topology`: tree shapes are a pure function of (spec, size)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.errors import UsageError
from tbon.overlay.state.topology import (
    DEFAULT_SPEC,
    Topology,
    explicit_parents,
    parse_spec,
    spec_from_fanout,
)

SPECS = st.sampled_from(["kary:0", "kary:1", "kary:2", "kary:3", "kary:7", "kary:32", "binomial"])
FAST = settings(max_examples=60, deadline=None)


def brute_parent(spec: str, rank: int) -> int | None:
    """The parent of `rank` straight from the definitions in docs/design.md and the module
    docstring."""
    if rank == 0:
        return None
    if spec == "binomial":
        return rank - (1 << (rank.bit_length() - 1))
    k = int(spec.split(":")[1])
    if k == 0:
        return 0
    if k == 1:
        return rank - 1
    return (rank - 1) // k


def path_to_root(topology: Topology, rank: int) -> list[int]:
    path = [rank]
    while (parent := topology.parent(path[-1])) is not None:
        path.append(parent)
    return path


def tree_distance(topology: Topology, a: int, b: int) -> int:
    up_a, up_b = path_to_root(topology, a), path_to_root(topology, b)
    common = set(up_a) & set(up_b)
    meet = next(rank for rank in up_a if rank in common)
    return up_a.index(meet) + up_b.index(meet)


# --- parse_spec / spec_from_fanout ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("kary:0", "kary:0"),
        ("kary:1", "kary:1"),
        ("kary:2", "kary:2"),
        ("kary:32", "kary:32"),
        ("kary:007", "kary:7"),
        ("  kary:4\n", "kary:4"),
        ("binomial", "binomial"),
        (" binomial ", "binomial"),
        (DEFAULT_SPEC, "kary:32"),
    ],
)
def test_parse_spec_accepts_and_normalises(text: str, normal: str) -> None:
    assert parse_spec(text) == normal


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "kary",
        "kary:",
        "kary:-1",
        "kary:+2",
        "kary: 2",
        "kary:2.0",
        "kary:two",
        "KARY:2",
        "kary:2:3",
        "kary=2",
        "Binomial",
        "binomial:2",
        "tree",
        "2",
        "kary:2x",
    ],
)
def test_parse_spec_refuses_with_a_clear_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_spec(text)
    message = str(caught.value)
    assert repr(text) in message
    assert "kary:K" in message and "binomial" in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(("fanout", "spec"), [("0", "kary:0"), ("1", "kary:1"), ("16", "kary:16")])
def test_spec_from_fanout(fanout: str, spec: str) -> None:
    assert spec_from_fanout(fanout) == spec
    assert parse_spec(spec_from_fanout(fanout)) == spec


@pytest.mark.parametrize("fanout", ["", "-1", "two", "2.5", "kary:2", "1e3", "0x10"])
def test_spec_from_fanout_refuses(fanout: str) -> None:
    with pytest.raises(UsageError, match=r"tbon\.fanout"):
        spec_from_fanout(fanout)


def test_spec_from_fanout_refuses_non_decimal_digits() -> None:
    with pytest.raises(UsageError):
        spec_from_fanout("²")


@given(st.text(max_size=12))
@FAST
def test_parse_spec_only_ever_raises_usage_error(text: str) -> None:
    try:
        normal = parse_spec(text)
    except UsageError:
        return
    assert normal == "binomial" or normal.startswith(("kary:", "parents:"))
    assert parse_spec(normal) == normal


def test_an_empty_parent_list_is_the_one_rank_tree() -> None:
    """`parents:` names no parent: the tree of rank 0 alone, refused for any larger size."""
    assert parse_spec("parents:") == "parents:"
    assert Topology("parents:", 1).size == 1
    with pytest.raises(UsageError, match="0 parents for size 3"):
        Topology("parents:", 3)


# --- shapes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -1, -100])
def test_size_below_one_is_refused(size: int) -> None:
    with pytest.raises(UsageError, match="at least one rank"):
        Topology("kary:2", size)


def test_bad_spec_is_refused_by_topology() -> None:
    with pytest.raises(UsageError):
        Topology("kary:x", 4)


def test_spec_is_normalised() -> None:
    assert Topology(" kary:02 ", 3).spec == "kary:2"


def test_size_one_is_just_the_root() -> None:
    for spec in ("kary:0", "kary:1", "kary:5", "binomial"):
        topology = Topology(spec, 1)
        assert topology.parent(0) is None
        assert topology.children(0) == ()
        assert topology.descendants(0) == []
        assert list(topology.ancestors(0)) == []
        assert topology.level(0) == 0
        assert topology.max_level() == 0
        assert topology.next_hop(0, 0) == 0


@pytest.mark.parametrize("k", [2, 3, 4, 32])
def test_kary_parent(k: int) -> None:
    topology = Topology(f"kary:{k}", 200)
    for rank in range(1, 200):
        assert topology.parent(rank) == (rank - 1) // k
    assert topology.children(0) == tuple(range(1, min(k, 199) + 1))


def test_kary_2_known_shape() -> None:
    topology = Topology("kary:2", 7)
    assert [topology.parent(r) for r in range(7)] == [None, 0, 0, 1, 1, 2, 2]
    assert topology.children(1) == (3, 4)
    assert topology.descendants(0) == [1, 3, 4, 2, 5, 6]  # pre-order
    assert topology.max_level() == 2


def test_kary_0_is_flat() -> None:
    topology = Topology("kary:0", 50)
    assert topology.children(0) == tuple(range(1, 50))
    for rank in range(1, 50):
        assert topology.parent(rank) == 0
        assert topology.children(rank) == ()
        assert topology.level(rank) == 1
    assert topology.max_level() == 1


def test_kary_1_is_a_chain() -> None:
    topology = Topology("kary:1", 10)
    for rank in range(1, 10):
        assert topology.parent(rank) == rank - 1
        assert topology.level(rank) == rank
    assert topology.children(9) == ()
    assert topology.children(4) == (5,)
    assert topology.descendants(6) == [7, 8, 9]
    assert list(topology.ancestors(3)) == [2, 1, 0]
    assert topology.max_level() == 9


def test_binomial_parent_clears_the_highest_set_bit() -> None:
    topology = Topology("binomial", 16)
    expected = [None, 0, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]
    assert [topology.parent(r) for r in range(16)] == expected
    assert topology.children(0) == (1, 2, 4, 8)
    assert topology.children(1) == (3, 5, 9)
    assert topology.children(4) == (12,)
    assert topology.children(8) == ()
    assert topology.max_level() == 4
    for rank in range(1, 16):
        assert topology.level(rank) == bin(rank).count("1")


@pytest.mark.parametrize("bad", [-1, 5, 100])
def test_ranks_outside_the_instance_are_refused(bad: int) -> None:
    topology = Topology("kary:2", 5)
    for query in (topology.parent, topology.children, topology.level, topology.descendants):
        with pytest.raises(ValueError):
            query(bad)
    with pytest.raises(ValueError):
        topology.next_hop(0, bad)


@given(SPECS, st.integers(1, 150))
@FAST
def test_shape_consistency(spec: str, size: int) -> None:
    topology = Topology(spec, size)
    seen_children: list[int] = []
    for rank in range(size):
        parent = topology.parent(rank)
        assert parent == brute_parent(topology.spec, rank)
        if parent is not None:
            assert 0 <= parent < rank
            assert rank in topology.children(parent)
        children = topology.children(rank)
        assert list(children) == sorted(children)
        for child in children:
            assert topology.parent(child) == rank
        seen_children.extend(children)
        ancestors = list(topology.ancestors(rank))
        assert ancestors == path_to_root(topology, rank)[1:]
        assert topology.level(rank) == len(ancestors)
        assert (ancestors[-1] if ancestors else rank) == 0
        descendants = topology.descendants(rank)
        assert len(set(descendants)) == len(descendants)
        assert set(descendants) == {r for r in range(size) if rank in topology.ancestors(r)}
        for other in range(size):
            assert topology.is_ancestor(rank, other) == (other in descendants)
    # every rank but the root is somebody's child, exactly once
    assert sorted(seen_children) == list(range(1, size))
    assert topology.max_level() == max(topology.level(r) for r in range(size))


@st.composite
def routes(draw: st.DrawFn) -> tuple[Topology, int, int]:
    spec = draw(SPECS)
    size = draw(st.integers(1, 300))
    rank = draw(st.integers(0, size - 1))
    target = draw(st.integers(0, size - 1))
    return Topology(spec, size), rank, target


@given(routes())
@settings(max_examples=150, deadline=None)
def test_next_hop_reaches_the_target_in_exactly_the_tree_distance(
    case: tuple[Topology, int, int],
) -> None:
    topology, rank, target = case
    distance = tree_distance(topology, rank, target)
    current, steps = rank, 0
    while current != target:
        hop = topology.next_hop(current, target)
        # one edge: a neighbour of the current rank
        assert hop == topology.parent(current) or hop in topology.children(current)
        assert tree_distance(topology, hop, target) == tree_distance(topology, current, target) - 1
        current, steps = hop, steps + 1
        assert steps <= distance
    assert steps == distance
    assert topology.next_hop(target, target) == target


def test_next_hop_examples() -> None:
    topology = Topology("kary:2", 15)
    assert topology.next_hop(0, 14) == 2
    assert topology.next_hop(2, 14) == 6
    assert topology.next_hop(6, 14) == 14
    assert topology.next_hop(14, 0) == 6
    assert topology.next_hop(3, 4) == 1  # a sibling goes through the parent
    assert topology.next_hop(1, 4) == 4


# --- post-order: the order a roll-up from the leaves must walk ---------------------------------


@st.composite
def shuffled_parents(draw: st.DrawFn) -> Topology:
    """A random tree whose ranks are numbered in any order: a parent may follow its child."""
    size = draw(st.integers(1, 40))
    order = draw(st.permutations(range(1, size)))
    parents = [0] * size
    for index, rank in enumerate(order):
        parents[rank] = draw(st.sampled_from([0, *order[:index]]))
    return Topology(explicit_parents(parents[1:]), size)


@given(st.one_of(st.builds(Topology, SPECS, st.integers(1, 150)), shuffled_parents()))
@FAST
def test_postorder_puts_every_rank_after_its_descendants(topology: Topology) -> None:
    order = topology.postorder()
    assert sorted(order) == list(range(topology.size))
    assert order[-1] == 0
    position = {rank: index for index, rank in enumerate(order)}
    for rank in range(topology.size):
        for below in topology.descendants(rank):
            assert position[below] < position[rank], (rank, below)


def test_postorder_of_a_parent_numbered_after_its_child() -> None:
    # rank 1's parent is rank 3, and rank 2's parent is rank 1:  0 - 3 - 1 - 2
    topology = Topology("parents:3,1,0", 4)
    assert topology.children(3) == (1,)
    assert topology.postorder() == (2, 1, 3, 0)
    assert Topology("kary:2", 7).postorder() == (3, 4, 1, 5, 6, 2, 0)
    assert Topology("kary:1", 50_000).postorder()[:2] == (49_999, 49_998)  # no recursion limit


# --- a broker asks only about its own neighbourhood: no whole-tree table for that -------------


@given(SPECS, st.integers(1, 300))
@FAST
def test_arithmetic_children_match_the_same_tree_drawn_by_hand(spec: str, size: int) -> None:
    topology = Topology(spec, size)
    drawn = Topology(explicit_parents([brute_parent(spec, r) or 0 for r in range(1, size)]), size)
    for rank in range(size):
        assert topology.children(rank) == drawn.children(rank)


@pytest.mark.parametrize("spec", ["kary:0", "kary:1", "kary:32", "binomial"])
def test_a_brokers_own_queries_build_no_whole_tree_table(spec: str) -> None:
    # What wire-up asks (parent, children, next hop) is O(children) or O(depth) per broker, so
    # N brokers do not each build an N-rank table; only rank 0's roll-ups (postorder) build one.
    topology = Topology(spec, 4096)
    for rank in (0, 1, 77, 4095):
        topology.parent(rank)
        topology.children(rank)
        topology.next_hop(rank, 4095 - rank)
    assert "_children" not in vars(topology)
    assert len(topology.postorder()) == 4096
    assert "_children" in vars(topology)


@given(SPECS, st.integers(1, 300), st.data())
def test_split_below_groups_every_target_by_its_next_hop(
    spec: str, size: int, data: st.DataObject
) -> None:
    """Rank 0 splits an exec request's targets in one pass: the same groups, each in the same
    order, as asking next_hop of every target (any rank splitting, any targets, itself too)."""
    topo = Topology(spec, size)
    rank = data.draw(st.integers(0, size - 1))
    targets = data.draw(st.lists(st.integers(0, size - 1), max_size=40))
    expected: dict[int, list[int]] = {}
    for target in targets:
        expected.setdefault(topo.next_hop(rank, target), []).append(target)
    assert topo.split_below(rank, targets) == expected
