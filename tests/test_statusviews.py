"""The views rank 0 computes (overlay/state/statusviews.py) say what the whole table says.

Random event sequences drive a table; after them, the table's pages put together are its
status object, and `--summary`, `--errors` (grouped and `-v`) and `--down` drawn from rank 0's
views read line for line as the same views drawn from the whole object (cli/render.py's
functions of the table, the oracle: simpler, and what small instances were drawn with).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from test_rankentries import build, events, prelude

from tbon.cli import render
from tbon.overlay.state import statusviews
from tbon.overlay.state.heldtable import HeldPages, whole
from tbon.overlay.state.onlineview import OnlinePages, from_status
from tbon.overlay.state.rankevents import Online
from tbon.overlay.state.ranktable import RankTable
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.state.statesview import RankStates
from tbon.overlay.state.topology import Topology


def held_pages(table: RankTable, now: float, budget: int) -> dict[str, object]:
    """The held view read a page at a time, as a command reads it, put together."""
    pages = HeldPages()
    start = 0
    while True:
        page = statusviews.held(table, now, start, budget)
        assert page["ranks"] and page["start"] == start
        view = pages.take(page)
        if view is not None:
            assert page["next"] is None
            return view
        assert page["next"] > page["ranks"][-1]["rank"]
        start = page["next"]


def test_thousands_of_held_ranks_go_in_pages_that_rebuild_the_table() -> None:
    """More ranks held than the 8192 a table is sent whole with: every held entry is in one
    page, each page is bounded, and the spares in between are made up as rank 0 shows them."""
    size, launched = 40_000, 20_000
    table = RankTable(Topology("kary:32", size), [f"node{r}" for r in range(launched)], 10.0)
    now = 12.0
    first = statusviews.held(table, now)
    assert first["next"] is not None and "spares" not in first  # a page, not the view
    assert len(json.dumps(first)) < 2 * statusviews.PAGE_BYTES
    view = held_pages(table, now, statusviews.PAGE_BYTES)
    assert len(view["ranks"].held) == launched  # type: ignore[attr-defined]
    for rank in (0, 1, launched - 1, launched, size - 1):
        assert view["ranks"][rank] == snapshot_entry(table, rank, now)  # type: ignore[index]


def snapshot_entry(table: RankTable, rank: int, now: float) -> dict[str, object]:
    from tbon.overlay.state.snapshot import shown

    return shown(table, rank, now)


def plain(lines: list[object]) -> list[str]:
    return [text.plain for text in lines]  # type: ignore[attr-defined]


@settings(max_examples=120, deadline=None)
@given(
    st.integers(2, 40).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.integers(1, size),
            st.sampled_from(["kary:0", "kary:1", "kary:2", "kary:3", "binomial"]),
            st.lists(events(size), max_size=50),
            st.integers(1, 400),
        )
    )
)
def test_views_computed_at_rank_0_read_as_the_whole_table_does(
    case: tuple[int, int, str, list[tuple[str, int, int, int, int]], int],
) -> None:
    size, launched, spec, stream, budget = case
    stream = prelude(size, launched) + stream
    table = RankTable(Topology(spec, size), [f"node{r}" for r in range(launched)], 10.0)
    now = 10.0
    for step, (kind, rank, offset, pid, other) in enumerate(stream):
        now = 10.0 + step * 0.5
        table.apply(build(kind, rank, offset, pid, other, table), now)  # type: ignore[arg-type]
        for lapse in table.expired(now):
            table.apply(lapse, now)
    now += 1.0
    status = snapshot(table, now)
    pages, start = [], 0
    while start < size:
        data, after = statusviews.page(table, now, start, budget)
        assert after > start
        pages.append(data)
        start = after
    assert json.loads(b"[" + b",".join(pages) + b"]") == status["ranks"]
    rebuilt = whole(statusviews.held(table, now))
    assert [rebuilt["ranks"][r] for r in range(size)] == status["ranks"]
    paged = held_pages(table, now, budget)
    assert [paged["ranks"][r] for r in range(size)] == status["ranks"]
    states = RankStates(statusviews.states(table))  # exec's view: each rank's state alone
    assert [states.state(r) for r in range(size)] == [e["state"] for e in status["ranks"]]
    assert states.reattaching == any(e.get("reattaching") for e in status["ranks"])
    for state in {e["state"] for e in status["ranks"]}:
        assert states.ranks(state) == [e["rank"] for e in status["ranks"] if e["state"] == state]
    for old in (status, rebuilt):  # as exec reads a broker that knows no `states` view
        read = RankStates.from_status(old)
        assert [read.state(r) for r in range(size)] == [states.state(r) for r in range(size)]
        assert read.reattaching == states.reattaching
    for entry in status["ranks"]:  # the held view's pages are cut by a bound, not encoded
        assert len(json.dumps(entry, separators=(",", ":"))) + 1 <= statusviews.entry_bound(entry)
    online = online_pages(table, budget)  # expand's view: the online ranks' pids
    assert online == [
        (e["rank"], e["pid"], e["incarnation"]) for e in status["ranks"] if e["state"] == "online"
    ]
    assert from_status(status) == from_status(rebuilt) == online  # from a broker without it
    for root in range(size):
        summary = statusviews.summary(table, now, root)
        assert render.summary_of(summary).plain == render.summary(status, root).plain
        grouped = render.errors_of(statusviews.errors(table, now, root))
        assert plain(grouped) == plain(render.not_online(status, root))
        each = statusviews.errors(table, now, root, each=True)
        assert plain(render.errors_of(each, verbose=True)) == plain(
            render.not_online(status, root, verbose=True)
        )
        assert plain(render.errors_of(each, paths=True)) == plain(
            render.not_online(status, root, paths=True)
        )
        items = [*each["entries"], *statusviews.errors(table, now, root)["groups"]]
        items += statusviews.tree(table, now, root)["items"]
        for item in items:  # what cuts these views is a bound, not each one encoded
            assert statusviews._size(item) <= statusviews._item_bound(item)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 40).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.integers(1, size),
            st.sampled_from(["kary:0", "kary:1", "kary:2", "kary:3", "binomial"]),
            st.lists(events(size), max_size=50),
        )
    )
)
def test_the_tree_draws_every_rank_once(
    case: tuple[int, int, str, list[tuple[str, int, int, int, int]]],
) -> None:
    """Every rank is drawn once, as a line of its own or in a run, under the rank the whole
    table draws it under; runs of ranks read the same but for their number."""
    size, launched, spec, stream = case
    stream = prelude(size, launched) + stream
    table = RankTable(Topology(spec, size), [f"node{r}" for r in range(launched)], 10.0)
    for step, (kind, rank, offset, pid, other) in enumerate(stream):
        table.apply(build(kind, rank, offset, pid, other, table), 10.0 + step)  # type: ignore[arg-type]
    status = snapshot(table, 100.0)
    from tbon.overlay.parse.idset import parse_idset

    for root in (0, size - 1):
        answer = statusviews.tree(table, 100.0, root)
        drawn: list[int] = []
        for item in answer["items"]:
            ranks = list(parse_idset(item["ranks"])) if "ranks" in item else [item["entry"]["rank"]]
            assert "count" not in item or item["count"] == len(ranks)
            drawn += ranks
        assert sorted(drawn) == render.subtree(status, root)
        assert len(drawn) == len(set(drawn))
        assert len(render.tree_of(answer)) == len(answer["items"])


def test_errors_group_by_state_and_reason_as_the_table_does() -> None:
    from tbon.overlay.state.ranktable import Departed, Lost, Online, Void

    table = RankTable(Topology("kary:2", 9), [f"node{r % 3}" for r in range(7)], 10.0)
    for rank in range(7):
        table.apply(Online(rank, 1, f"node{rank % 3}", 100 + rank), 11.0)
    table.apply(Lost(3, 1, "connection dropped", 1), 12.0)
    table.apply(Lost(4, 1, "connection dropped", 1), 12.0)
    table.apply(Void(5, 1, "a test"), 12.0)
    table.apply(Departed(6, 1, 2), 12.0)
    status = snapshot(table, 13.0)
    lines = plain(render.errors_of(statusviews.errors(table, 13.0, 0)))
    assert lines == plain(render.not_online(status, 0))
    assert lines == [
        "3-4 node[0-1]: lost: connection dropped",
        "5 node2: lost: voided: a test",
        "6 node0: vacant: said goodbye (exit status 0)",
        "7-8: vacant: spares never held",
    ]


def test_foster_children_and_own_children_are_not_one_run() -> None:
    """Rank 1 lost, its four leaves fostered by rank 0, beside rank 0's own leaves 2-4: the
    foster children are one run (`fostered, home is rank 1`), rank 0's own leaves each a line of
    their own (fewer than MERGE_RUN): a run says only what is true of every rank in it."""
    from tbon.overlay.state.ranktable import Lost, Online

    table = RankTable(Topology("kary:4", 9), [f"node{r}" for r in range(9)], 10.0)
    for rank in range(9):
        table.apply(Online(rank, 1, "node", 100 + rank, None, f"key{rank}"), 11.0)
    table.apply(Lost(1, 1, "connection dropped", parent=0), 12.0)
    for rank in range(5, 9):
        assert table.apply(Online(rank, 1, "node", 100 + rank, 0, f"key{rank}"), 13.0).applied
    items = statusviews.tree(table, 14.0, 0)["items"]
    drawn = [item.get("ranks", str(item["entry"]["rank"])) for item in items]
    assert drawn == ["0", "1", "2", "3", "4", "5-8"]
    lines = plain(render.tree_of(statusviews.tree(table, 14.0, 0)))
    assert lines[-1].endswith("5-8 node: full (fostered, home is rank 1)"), lines


def online_pages(table: RankTable, budget: int) -> list[tuple[int, int | None, int]]:
    """The online view read a page at a time, as expand reads it, put together."""
    pages = OnlinePages()
    start = 0
    while True:
        page = statusviews.online(table, start, budget)
        assert page["start"] == start
        text = json.dumps(page["online"], separators=(",", ":"))
        assert len(text) <= budget + statusviews.ONLINE_BYTES  # the bound, never an encoding
        found = pages.take(page)
        if found is not None:
            assert page["next"] is None
            return found
        assert page["online"] and page["next"] > page["online"][-1][0]
        start = page["next"]


@given(st.text(max_size=40), st.text(max_size=40), st.integers(-(10**30), 10**30))
def test_an_entrys_bound_is_never_less_than_its_json(host: str, reason: str, pid: int) -> None:
    """Any host or reason (quotes, backslashes, control and astral characters) and any pid:
    entry_bound, which pages the held view, is at least the entry's JSON and its comma."""
    table = RankTable(Topology("kary:2", 8), [host] * 8, 10.0)
    assert table.apply(Online(0, 1, host, pid), 11.0).applied
    entry = snapshot_entry(table, 0, 12.0)
    for fields in (entry, {**entry, "reason": reason, "last_pid": pid, "retired": True}):
        text = json.dumps(fields, separators=(",", ":"))
        assert len(text) + 1 <= statusviews.entry_bound(fields)
    full = {**entry, "reason": reason, "last_pid": pid, "via": [262_143, 8191, 255, 7, 0]}
    for item in (
        {"depth": 999_999, "last": False, "entry": full, "ranks": "1-3,5", "count": 262_144},
        {"depth": 0, "last": True, "entry": entry, "more": True},
        {"state": "lost", "ranks": "0-7", "hosts": f"{host}[0-7]", "entry": full},
        full,  # an errors -v entry, with its path
    ):
        assert statusviews._size(item) <= statusviews._item_bound(item)


@settings(max_examples=40, deadline=None)
@given(st.integers(200, 60_000))
def test_a_tree_or_errors_past_the_budget_is_cut_where_its_real_size_says(limit: int) -> None:
    """The bounds cut nothing sooner than the items' JSON: a view is cut only once the items
    taken, encoded as the wire encodes them, reach the budget, and then just after."""
    from unittest.mock import patch

    whole_tree = statusviews.tree(WIDE, 12.0, 0, merge=False)["items"]
    whole_each = statusviews.errors(WIDE, 12.0, 0, each=True)["entries"]
    with patch.object(statusviews, "VIEW_BYTES", limit):
        tree = statusviews.tree(WIDE, 12.0, 0, merge=False)
        each = statusviews.errors(WIDE, 12.0, 0, each=True)
    for uncut, items, cut in (
        (whole_tree, tree["items"], tree.get("cut")),
        (whole_each, each["entries"], each.get("cut")),
    ):
        sizes = [statusviews._size(item) for item in items]
        assert items == uncut[: len(items)] and sum(sizes[:-1]) < limit
        if cut:
            assert sum(sizes) >= limit and len(items) < len(uncut)
        else:
            assert len(items) == len(uncut)


def _wide() -> RankTable:
    """300 ranks online, under 8 lost (so `errors -v` has entries): some 60 kB of tree."""
    from tbon.overlay.state.rankevents import Lost

    table = RankTable(Topology("kary:4", 300), [f"node{r}" for r in range(300)], 10.0)
    for rank in range(300):
        assert table.apply(Online(rank, 1, f"node{rank}", 100 + rank), 11.0).applied
    for rank in range(200, 260):
        assert table.apply(Lost(rank, 1, "connection dropped", (rank - 1) // 4), 11.5).applied
    return table


WIDE = _wide()
