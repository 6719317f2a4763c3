"""Seeking the root group (docs/protocol.md §13.4, step 4), without sockets: the group's cards
as they travel with the lineage (links/cards.py), who seeks whom (upward.group_seeks) and that
no two brokers ever seek each other, and the parent side's machine acting on them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tbon.overlay.links.cards import MAX_GROUP, BadCards, decode_group, encode_group
from tbon.overlay.links.parent import _group
from tbon.overlay.links.upward import (
    Exit,
    GoingHome,
    LineageChanged,
    LineageSaid,
    LinkLost,
    Open,
    Refused,
    RootKnown,
    Seeking,
    Tick,
    Upward,
    Welcomed,
    group_seeks,
)


def card(rank: int) -> tuple[int, str, str]:
    return (rank, f"tcp://127.0.0.1:{2000 + rank}", f"{rank % 10}" * 40)


GROUP = (card(0), card(1), card(2))  # kary:4, two standbys: rank 0 and its children 1 and 2


# --- the codec -----------------------------------------------------------------------------------


def test_a_group_round_trips_in_rank_order() -> None:
    wire = encode_group((card(2), card(0), card(1)))
    assert decode_group(wire) == GROUP


def test_no_group_is_an_empty_one() -> None:
    assert decode_group(None) == ()


@pytest.mark.parametrize(
    "value",
    [
        "cards",
        {"0": [0, "tcp://x:1", "0" * 40]},
        [list(card(r)) for r in range(MAX_GROUP + 1)],  # more than a root and four standbys
        [list(card(0)), [1, "udp://127.0.0.1:1", "1" * 40]],  # not a tree endpoint
        [list(card(0)), [1, "tcp://127.0.0.1:1", "short"]],  # not a key
        [list(card(0)), [-1, "tcp://127.0.0.1:1", "1" * 40]],  # not a rank
        [list(card(0)), [True, "tcp://127.0.0.1:1", "1" * 40]],
        [list(card(0)), [1, "tcp://127.0.0.1:1"]],
        [list(card(1)), list(card(1))],  # a rank twice
    ],
)
def test_a_malformed_group_is_refused_whole(value: object) -> None:
    with pytest.raises(BadCards):
        decode_group(value)
    assert _group(value) is None  # the link ignores it (and says so), keeping what it knew


# --- who seeks whom ------------------------------------------------------------------------------


def ranks(cards: list[tuple[int, str, str]]) -> list[int]:
    return [c[0] for c in cards]


def test_a_non_member_seeks_every_member_in_rank_order() -> None:
    assert ranks(group_seeks(3, GROUP, None)) == [0, 1, 2]


def test_a_member_seeks_only_the_members_below_it() -> None:
    assert ranks(group_seeks(1, GROUP, None)) == [0]  # it waits to be elected
    assert ranks(group_seeks(2, GROUP, None)) == [0, 1]


def test_a_member_seeks_the_known_root_too_but_never_itself() -> None:
    assert ranks(group_seeks(1, GROUP, 2)) == [0, 2]
    assert ranks(group_seeks(2, GROUP, 2)) == [0, 1]
    assert ranks(group_seeks(1, GROUP, 7)) == [0]  # not a member: no card to seek it by


def test_no_group_no_one_to_seek() -> None:
    assert group_seeks(3, (), None) == []


@given(
    size=st.sampled_from([3, 5]),
    root=st.one_of(st.none(), st.integers(0, 4)),
    outsiders=st.lists(st.integers(5, 40), max_size=4, unique=True),
)
def test_no_broker_seeks_one_that_seeks_it_back(
    size: int, root: int | None, outsiders: list[int]
) -> None:
    """Who may be sought by whom forms no cycle: the root (which has no parent, so seeks
    nobody) aside, a member seeks only lower members and the root; a non-member is sought by
    nobody."""
    group = tuple(card(r) for r in range(size))
    root = root if root is None or root < size else None
    seeks = {
        rank: set(ranks(group_seeks(rank, group, root)))
        for rank in [*range(size), *outsiders]
        if rank != root
    }
    assert all(not seeks.get(o) & set(outsiders) for o in outsiders)  # nobody seeks outsiders
    seen: set[int] = set()

    def reaches(start: int, goal: int, path: frozenset[int]) -> bool:
        return any(
            nxt == goal or (nxt not in path and reaches(nxt, goal, path | {nxt}))
            for nxt in seeks.get(start, set())
        )

    for rank in seeks:
        assert not reaches(rank, rank, frozenset({rank})), (rank, seeks)
        seen.add(rank)


# --- the machine ---------------------------------------------------------------------------------

REATTACH = 5.0


def welcomed_under_rank0(rank: int, group: tuple = GROUP) -> Upward:
    """Rank `rank`, a child of rank 0, welcomed with rank 0's lineage and the group."""
    m = Upward(rank, 0, 1, REATTACH)
    out = m.handle(Welcomed(0, 0, 1, (card(0),), group), 0.0)
    assert LineageChanged((card(0),)) in out
    return m


def opened(out: list) -> list[int]:
    return [i.card[0] for i in out if isinstance(i, Open)]


def test_a_non_member_whose_root_died_asks_the_members_at_once() -> None:
    m = welcomed_under_rank0(3)
    out = m.handle(LinkLost(0, "lost the connection to the parent"), 1.0)
    assert opened(out) == [0, 1, 2]  # its ancestor first, then the members
    assert isinstance(m.state, Seeking) and m.state.until == 1.0 + REATTACH


def test_a_standby_asks_the_members_below_it_and_rank_1_only_its_ancestor() -> None:
    two = welcomed_under_rank0(2)
    assert opened(two.handle(LinkLost(0, "dropped"), 1.0)) == [0, 1]
    one = welcomed_under_rank0(1)
    assert opened(one.handle(LinkLost(0, "dropped"), 1.0)) == [0]


def test_without_a_group_a_child_of_the_root_seeks_only_the_root() -> None:
    m = welcomed_under_rank0(3, group=())
    assert opened(m.handle(LinkLost(0, "dropped"), 1.0)) == [0]


def test_a_broker_with_no_ancestor_but_a_group_seeks_instead_of_ending() -> None:
    m = Upward(3, 0, 1, REATTACH)
    m.handle(Welcomed(0, 0, 1, (), GROUP), 0.0)  # a lineage naming no one but the group
    out = m.handle(LinkLost(0, "dropped"), 1.0)
    assert not any(isinstance(i, Exit) for i in out)
    assert opened(out) == [0, 1, 2]


def test_a_root_learned_while_seeking_is_asked_at_once_and_once() -> None:
    m = welcomed_under_rank0(1)
    m.handle(LinkLost(0, "dropped"), 1.0)
    assert opened(m.handle(RootKnown(2), 1.2)) == [2]
    assert m.handle(RootKnown(2), 1.3) == []
    assert m.root == 2


def test_a_member_refusing_the_key_is_asked_again_soon() -> None:
    m = welcomed_under_rank0(3)
    out = m.handle(LinkLost(0, "dropped"), 1.0)
    link1 = next(i.link for i in out if isinstance(i, Open) and i.card[0] == 1)
    m.handle(Refused(link1, 77, "key refused", key=True), 1.01)
    assert opened(m.handle(Tick(), 1.1)) == [1]


def test_welcomed_by_a_member_it_keeps_the_group() -> None:
    m = welcomed_under_rank0(3)
    out = m.handle(LinkLost(0, "dropped"), 1.0)
    link1 = next(i.link for i in out if isinstance(i, Open) and i.card[0] == 1)
    m.handle(Welcomed(link1, 1, 1, (card(1),), GROUP), 1.5)
    assert m.peer == 1 and m.group == GROUP and m.lineage == (card(1),)


def test_a_malformed_group_keeps_the_cards_known() -> None:
    m = welcomed_under_rank0(3)
    out = m.handle(LineageSaid(0, (card(0),), None), 1.0)
    assert m.group == GROUP and out == [LineageChanged((card(0),))]
    m.handle(LineageSaid(0, (card(0),), ()), 2.0)  # said with none: there is none now
    assert m.group == ()


def test_a_group_that_changes_alone_is_passed_on() -> None:
    m = welcomed_under_rank0(3, group=())
    assert m.handle(LineageSaid(0, (card(0),), GROUP), 1.0) == [LineageChanged((card(0),))]


# --- the new root's table: it holds what the dead root held --------------------------------------


def taken_over(size: int = 13) -> tuple:
    """kary:4, two standbys, every rank online with a key, rank 0's Lost applied by rank 1."""
    from tables import bring_up, started

    from tbon.overlay.services.rankpath import RankPath
    from tbon.overlay.state.rankevents import Lost

    table = started("kary:4", size)
    table.members = (0, 1, 2)
    bring_up(table, list(range(1, size)))
    for rank in range(1, size):
        table.entries[rank].key = f"{rank % 10}" * 40
    path = RankPath(table)
    applied = path.handle(Lost(0, 1, "the root died; rank 1 took over in term 2", parent=1), 102.0)
    return table, applied


def test_the_member_that_took_over_fosters_every_rank_the_dead_root_held() -> None:
    from tbon.overlay.services.actions import Call

    table, applied = taken_over()
    assert table.root == 1 and table.entry(0).state == "lost"
    orders = [a.request for a in applied.actions if isinstance(a, Call)]
    assert orders and all(o.topic == "heal.foster" and o.nodeid == 1 for o in orders), orders
    fostered = {r for o in orders for r, _, _ in o.payload["ranks"]}
    assert {2, 3, 4} <= fostered and not fostered & {1, 5, 6, 7, 8}  # rank 1's own stay


def test_the_new_root_holds_a_sibling_and_nobody_else_does() -> None:
    from tbon.overlay.state.rankevents import Online

    table, _ = taken_over()
    entry = table.entry(2)
    sibling = Online(2, entry.incarnation, "node2", 1002, parent=1, key=entry.key or "")
    assert table.apply(sibling, 103.0).applied
    assert table.entry(2).attached_to == 1 and table.reachable(9)
    cousin = Online(3, table.entry(3).incarnation, "node3", 1003, parent=2, key="")
    assert not table.apply(cousin, 103.0).applied  # rank 2 is no ancestor of 3, nor the root


def test_a_member_left_under_another_member_goes_to_the_root_once_known() -> None:
    """K=4: rank 3, seeking, was welcomed by member 2 first; once rank 1 is known to lead, rank
    3 goes to it as a rank goes home (the table would not believe rank 2's word on rank 3)."""
    group = (card(0), card(1), card(2), card(3), card(4))
    m = welcomed_under_rank0(3, group)
    out = m.handle(LinkLost(0, "dropped"), 1.0)
    link2 = next(i.link for i in out if isinstance(i, Open) and i.card[0] == 2)
    m.handle(Welcomed(link2, 2, 1, (card(2),), group), 1.1)
    assert m.peer == 2
    assert opened(m.handle(RootKnown(1), 1.5)) == [1]
    home = m.state
    assert isinstance(home, GoingHome) and home.card == card(1)
    again = m.handle(Welcomed(home.trying, 1, 1, (card(1),), group), 1.6)
    assert m.peer == 1 and not opened(again)
    assert m.handle(RootKnown(1), 1.7) == []  # under the root already


def test_a_non_member_or_a_member_under_the_root_stays() -> None:
    group = (card(0), card(1), card(2), card(3), card(4))
    five = welcomed_under_rank0(5, group)  # no member: the new root fosters it, as ever
    out = five.handle(LinkLost(0, "dropped"), 1.0)
    link2 = next(i.link for i in out if isinstance(i, Open) and i.card[0] == 2)
    five.handle(Welcomed(link2, 2, 1, (card(2),), group), 1.1)
    assert five.handle(RootKnown(1), 1.5) == []
    two = welcomed_under_rank0(2, group)
    out = two.handle(LinkLost(0, "dropped"), 1.0)
    link1 = next(i.link for i in out if isinstance(i, Open) and i.card[0] == 1)
    two.handle(Welcomed(link1, 1, 1, (card(1),), group), 1.1)
    assert two.handle(RootKnown(1), 1.5) == []
