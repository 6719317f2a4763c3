"""The compact rank-table store (spares made up when read) behaves as the plain list.

Two tables, one per store, are fed the same random events; after each, both must answer the
same, hold the same entries, and show the same status. The plain list is the oracle: it is the
store the table kept before, one entry per rank.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.state.rankentries import CompactEntries, PlainEntries, spare
from tbon.overlay.state.ranktable import (
    Departed,
    Dropped,
    Expire,
    Lost,
    Moved,
    Online,
    RankTable,
    Reboot,
    Release,
    Reserve,
    Retire,
    Torpid,
    Void,
)
from tbon.overlay.state.snapshot import snapshot
from tbon.overlay.state.topology import Topology

KEYS = [str(n) * 40 for n in range(4)]  # Z85 keys, distinct, as FLUB would take them


@st.composite
def events(draw: st.DrawFn, size: int) -> tuple[str, int, int, int, int]:
    """An event kind, a rank, an incarnation offset (0: the current one), a pid, a parent or
    other rank: the test turns them into an event against the oracle's current entry."""
    kind = draw(
        st.sampled_from(
            [
                "online",
                "online",
                "lost",
                "departed",
                "torpid",
                "moved",
                "dropped",
                "retire",
                "expire",
                "release",
                "void",
                "reboot",
                "reserve",
                "reserve-any",
            ]
        )
    )
    rank = draw(st.integers(0, size - 1))
    return (
        kind,
        rank,
        draw(st.integers(-1, 0)),
        draw(st.integers(1, 3)),
        draw(st.integers(0, size - 1)),
    )


def build(kind: str, rank: int, offset: int, pid: int, other: int, table: RankTable) -> object:
    entry = table.entries.peek(rank)
    inc = entry.incarnation + offset
    key = KEYS[pid % len(KEYS)]
    made: dict[str, object] = {
        "online": Online(rank, inc, f"h{pid}", 1000 * pid + rank, None, key),
        "lost": Lost(rank, inc, "connection dropped", table.topology.parent(rank)),
        "departed": Departed(rank, inc, table.topology.parent(rank)),
        "torpid": Torpid(rank, inc, pid % 2 == 0, table.topology.parent(rank)),
        "moved": Moved(rank, inc, table.topology.parent(rank), other),
        "dropped": Dropped(rank, inc, other, "connection dropped"),
        "retire": Retire(rank, inc),
        "expire": Expire(rank, inc),
        "release": Release(rank, inc, key),
        "void": Void(rank, inc, "a test"),
        "reboot": Reboot(rank, inc),
        "reserve": Reserve(key, f"j{pid}", rank, 1.0),
        "reserve-any": Reserve(key, f"j{pid}", None, 1.0),
    }
    return made[kind]


def prelude(size: int, up: int) -> list[tuple[str, int, int, int, int]]:
    """Events that bring the first `up` ranks online in order (parents first), so that the
    random events after them find ranks to end, retire, foster and reserve."""
    return [("online", rank, 0, 1 + rank % 3, 0) for rank in range(min(up, size))]


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 24).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.integers(1, size),
            st.sampled_from(["kary:0", "kary:2", "kary:3", "binomial"]),
            st.booleans(),
            st.lists(events(size), max_size=60),
        )
    )
)
def test_compact_store_behaves_as_the_plain_one(
    case: tuple[int, int, str, bool, list[tuple[str, int, int, int, int]]],
) -> None:
    size, launched, spec, fixed, stream = case
    stream = prelude(size, launched) + stream
    hosts = [f"node{rank}" for rank in range(launched)]
    plain = RankTable(Topology(spec, size), hosts, 10.0, fixed=fixed, store=PlainEntries)
    compact = RankTable(Topology(spec, size), hosts, 10.0, fixed=fixed, store=CompactEntries)
    assert isinstance(compact.entries, CompactEntries)
    now = 10.0
    for step, (kind, rank, offset, pid, other) in enumerate(stream):
        now = 10.0 + step * 0.5  # leases of 1 s run out now and then
        event = build(kind, rank, offset, pid, other, plain)
        expected = plain.apply(event, now)  # type: ignore[arg-type]
        got = compact.apply(event, now)  # type: ignore[arg-type]
        assert got == expected, (kind, rank)
        # the soonest deadline, kept since the last step's asking (below), is exact
        ends = [e.lease.until if e.lease is not None else e.adrift_until for e in plain.entries]
        soonest = min((end for end in ends if end is not None), default=None)
        assert compact.next_expiry() == soonest, (kind, rank)
        for lapse in plain.expired(now):
            assert plain.apply(lapse, now) == compact.apply(lapse, now)
        assert compact.expired(now) == []
        assert [e.fields() for e in compact.entries] == [e.fields() for e in plain.entries]
        assert compact.generation == plain.generation
        assert +compact.rollup.counts == Counter(e.state for e in plain.entries)
        assert compact.next_expiry() == plain.next_expiry()
        assert compact.adrift(now + 500.0) == plain.adrift(now + 500.0)
        compact.next_expiry()  # asked after the turn, as the loop does: kept into the next
        for r in range(size):
            assert compact.entries.pristine(r) == plain.entries.pristine(r)
            assert compact.reachable(r) == plain.reachable(r)
    assert snapshot(compact, now + 1) == snapshot(plain, now + 1)


def test_a_spare_nothing_happened_to_is_not_kept() -> None:
    """262,144 ranks, 4 launched: the store keeps the 4, and a reserved spare once reserved."""
    size = 262144
    table = RankTable(Topology("kary:32", size), ["a", "b", "c", "d"], 5.0)
    assert isinstance(table.entries, CompactEntries)
    assert len(table.entries.held()) == 4
    assert table.entries.peek(size - 1) == spare(size - 1, 4, 5.0)
    assert table.entries.peek(size - 1).host == f"extra{size - 5}"
    outcome = table.apply(Reserve(KEYS[0], "joiner", size - 1, 30.0), 6.0)
    assert outcome.applied, outcome
    assert [e.rank for e in table.entries.held()] == [0, 1, 2, 3, size - 1]
    assert not table.entries.pristine(size - 1) and table.entries.pristine(size - 2)
    refused = table.apply(Lost(size - 2, 0, "connection dropped"), 6.0)
    assert not refused.applied  # a refused event keeps nothing
    assert len(table.entries.held()) == 5
