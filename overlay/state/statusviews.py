"""The views of the rank table that rank 0 computes, so that no answer grows with the size.

At 262,144 ranks the status object is some 50 MB of JSON. Rank 0 therefore answers:

- a *page* of it (`page`): the entries from a rank on, as JSON text of at most PAGE_BYTES, for
  `tbon status --json` to write as it reads;
- a *summary* of a subtree (`summary`): its root's entry and how many ranks are in each state;
- its *errors* (`errors`): the ranks not online, grouped by state and reason, the spares never
  held as one idset;
- its *tree* (`tree`): the tree as drawn, where sibling subtrees that no broker ever held, and
  sibling leaves that read the same, are one item each (`├─ 16-262143 extra: vacant`), cut at a
  depth if asked;
- the *held* ranks (`held`): every entry but the spares nothing happened to, in pages of at
  most PAGE_BYTES (one page, for all but the largest tables).
- every rank's *state* (`states`): one idset per state, and the ranks reattaching, which is
  all `tbon exec` reads of the table (its targets, and the ranks lost while it runs).
- the *online* ranks (`online`): each one's rank, pid and incarnation, which is all `tbon
  expand` reads of the table while it follows its joiners, in pages of at most PAGE_BYTES.

The tree as drawn is the one messages travel (cli/render.py): a connected rank attached to
another rank than its parent (fostered) is drawn under that rank, always an ancestor, so the
drawn tree has no loops. Pure functions of the table; no I/O.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from tbon.limits import PAGE_BYTES
from tbon.overlay.parse.hostlist import encode_hostlist
from tbon.overlay.parse.idset import format_idset
from tbon.overlay.state.rankstates import CONNECTED, RankState
from tbon.overlay.state.snapshot import shown

if TYPE_CHECKING:
    from tbon.overlay.state.ranktable import RankTable

EXPECTED_MISSING = (RankState.OFFLINE, RankState.RESERVED, RankState.LOST)
"""States of a rank expected to have a broker that has none (`tbon status --wait up`)."""

MISSING_NAMED = 8
"""How many missing ranks a summary names (the rest are counted)."""

MERGE_RUN = 4
"""Sibling leaves that read the same are drawn as one line from this many on; fewer, and each
has its own line (spares never held are one line however few)."""

VIEW_BYTES = 2 << 20
"""What the items of a tree, or the lines of the errors, may take in one answer (half a
message): past that it is cut, and says so (`cut`), and `--rank` or `--depth` shows the rest.
Measured by an upper bound of each item (Budget), the items encoded only past it."""


def _within(
    items: list[dict[str, Any]], bound: Callable[[dict[str, Any]], int]
) -> tuple[list[dict[str, Any]], int]:
    """The first `items` that fit VIEW_BYTES of JSON, and how many did not, each measured by
    `bound` (Budget: encoded only once the bounds pass VIEW_BYTES)."""
    budget = Budget()
    for count, item in enumerate(items):
        budget.take(items, count + 1, bound(item))
        if budget.full:
            return items[: count + 1], len(items) - count - 1
    return items, 0


ITEM_BYTES = 96
"""An upper bound on what a tree's item or an errors' group takes as JSON beyond its entry and
its idsets (ranks, hosts): its other keys, a depth or count of 6 digits at most, and its comma."""


def _item_bound(item: dict[str, Any]) -> int:
    """At least `item` as JSON: a tree's item, an errors' group, or an entry with `via`."""
    bound = ITEM_BYTES + entry_bound(item.get("entry", item))
    for key in ("ranks", "hosts"):  # an idset, a host list: text of their own
        if isinstance(text := item.get(key), str):
            bound += _text_bound(text)
    if (via := item.get("via")) is not None:
        bound += 7 * len(via)
    return bound


class Budget:
    """How much of VIEW_BYTES the items taken so far take as JSON. Each is counted by an upper
    bound of its size (`entry_bound`: a few lengths, not the encoder's walk) while their sum is
    within the budget, which it is for all but the largest views; past it, the items are encoded
    (the ones before once, together), so a view is cut where their real size says, no sooner."""

    __slots__ = ("exact", "taken")

    def __init__(self) -> None:
        self.taken = 0
        self.exact = False  # the bounds passed VIEW_BYTES: `taken` is the real size from there

    def take(self, items: list[dict[str, Any]], count: int, bound: int) -> None:
        """Count the last of the first `count` of `items` (those taken so far), of at most
        `bound` bytes."""
        if self.exact:
            self.taken += _size(items[count - 1])
            return
        self.taken += bound
        if self.taken >= VIEW_BYTES:
            self.exact = True
            self.taken = sum(_size(items[index]) for index in range(count))

    @property
    def full(self) -> bool:
        return self.taken >= VIEW_BYTES


def _size(item: dict[str, Any]) -> int:
    """`item` as the wire encodes it (compact JSON), and its comma in a list."""
    return len(_COMPACT(item)) + 1


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode
"""json.dumps as the wire's, without building an encoder at each call as json.dumps does."""


def page(table: RankTable, now: float, start: int, budget: int = PAGE_BYTES) -> tuple[bytes, int]:
    """The entries from `start` on as JSON text, comma-separated, until they take `budget`
    bytes (at least one entry), and the rank the next page starts at (`size`: none left).
    A spare nothing happened to is written from a template (`spare_text`), 20 times faster than
    its entry through the encoder: at 2^18 ranks, the pages take seconds, not a minute."""
    parts: list[str] = []
    taken = 0
    rank = start
    entries = table.entries
    spare = SpareText(table, now)
    while rank < table.size and (taken < budget or not parts):
        text = spare(rank) if entries.pristine(rank) else _COMPACT(shown(table, rank, now))
        parts.append(text)
        taken += len(text) + 1
        rank += 1
    return ",".join(parts).encode(), rank


class SpareText:
    """The JSON text of an untouched spare's entry, as `shown` would give it, from a template:
    its parent and children by arithmetic for `kary:K`, from the topology for other shapes."""

    def __init__(self, table: RankTable, now: float) -> None:
        self.topology = table.topology
        self.size = table.size
        self.launched = table.entries.launched
        self.statuses = table.rollup.statuses
        spec = table.topology.spec
        self.fanout = int(spec[len("kary:") :]) if spec.startswith("kary:") else None
        since = round(max(0.0, now - table.entries.created), 3)
        self.tail = f',"torpid":false,"since":{json.dumps(since)}}}'

    def __call__(self, rank: int) -> str:
        k = self.fanout
        if k is not None and k >= 2:
            parent: int | None = (rank - 1) // k if rank else None
            first = rank * k + 1
            kids = (
                ""
                if first >= self.size
                else ",".join(map(str, range(first, min(first + k, self.size))))
            )
        else:
            parent = self.topology.parent(rank)
            kids = ",".join(map(str, self.topology.children(rank)))
        return (
            f'{{"rank":{rank},"state":"vacant","host":"extra{rank - self.launched}","pid":null,'
            f'"incarnation":0,"parent":{"null" if parent is None else parent},'
            f'"children":[{kids}],"subtree":"{self.statuses[rank]}"{self.tail}'
        )


class Drawn:
    """The tree as drawn: each rank's children there, from the topology and the fostered."""

    def __init__(self, table: RankTable) -> None:
        self.table = table
        self.fostered: dict[int, list[int]] = {}  # a foster parent -> the ranks it holds
        self.away: set[int] = set()
        for entry in table.entries.held():
            attached = entry.attached_to
            if entry.state not in CONNECTED or attached is None or attached == entry.rank:
                continue
            if attached != table.topology.parent(entry.rank):
                self.fostered.setdefault(attached, []).append(entry.rank)
                self.away.add(entry.rank)

    def parent(self, rank: int) -> int | None:
        entry = self.table.entries.peek(rank)
        if rank in self.away:
            return entry.attached_to
        return self.table.topology.parent(rank)

    def children(self, rank: int) -> list[int]:
        mine = [c for c in self.table.topology.children(rank) if c not in self.away]
        if rank in self.fostered:
            mine = sorted(mine + self.fostered[rank])
        return mine

    def subtree(self, root: int) -> Iterator[int]:
        """`root` and every rank below it as drawn (every rank, for rank 0)."""
        if root == 0:
            yield from range(self.table.size)
            return
        stack = [root]
        while stack:
            rank = stack.pop()
            yield rank
            stack.extend(self.children(rank))

    def path(self, rank: int) -> list[int]:
        """The ranks above `rank` as drawn, up to rank 0."""
        found: list[int] = []
        parent = self.parent(rank)
        while parent is not None:
            found.append(parent)
            parent = self.parent(parent)
        return found


def summary(table: RankTable, now: float, root: int) -> dict[str, Any]:
    """`tbon status --summary` (and `--wait`): the root's entry (for the whole instance, that of
    the broker that is the root now), how many ranks of its subtree
    are in each state, and which are missing (EXPECTED_MISSING; the first MISSING_NAMED)."""
    states = table.rollup.states
    if root == 0:
        counts = +table.rollup.counts  # kept as states change: no walk of 2^18 ranks
        missing = [r.rank for r in table.entries.held() if r.state in EXPECTED_MISSING]
    else:
        ranks = list(Drawn(table).subtree(root))
        counts = Counter(states[r] for r in ranks)
        missing = sorted(r for r in ranks if states[r] in EXPECTED_MISSING)
    return {
        "size": table.size,
        "topo": table.topology.spec,
        "rank": root,
        # the whole instance's headline is its root's line: rank 0's until a takeover (§13.4)
        "entry": shown(table, table.root if root == 0 else root, now, children=False),
        "ranks": sum(counts.values()),
        "counts": {state.value: n for state, n in sorted(counts.items())},
        "missing": sum(counts[state] for state in EXPECTED_MISSING),
        "missing_ranks": [[r, states[r].value] for r in missing[:MISSING_NAMED]],
    }


Ranges = list[tuple[int, int]]
"""Ranks as (first, last) runs, in order: how the spares of 2^18 ranks are counted cheaply."""


def _held_in(table: RankTable, drawn: Drawn, root: int) -> tuple[list[int], Ranges]:
    """The ranks of `root`'s subtree whose entries say something, and the untouched spares."""
    if root == 0:
        held = [e.rank for e in table.entries.held() if not table.entries.pristine(e.rank)]
        return held, _complement(held, table.size)
    said: list[int] = []
    spares: list[int] = []
    for rank in drawn.subtree(root):
        (spares if table.entries.pristine(rank) else said).append(rank)
    return sorted(said), _ranges(sorted(spares))


def _complement(ranks: list[int], size: int) -> Ranges:
    """The ranks below `size` not in the sorted `ranks`."""
    gaps: Ranges = []
    first = 0
    for rank in ranks:
        if rank > first:
            gaps.append((first, rank - 1))
        first = rank + 1
    if first < size:
        gaps.append((first, size - 1))
    return gaps


def _ranges(ranks: list[int]) -> Ranges:
    """Sorted ranks as runs."""
    runs: Ranges = []
    for rank in ranks:
        if runs and runs[-1][1] == rank - 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def _idset(ranges: Iterable[Sequence[int]]) -> str:
    """Runs (first, last) as an idset: "0-4,6"."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def errors(table: RankTable, now: float, root: int, each: bool = False) -> dict[str, Any]:
    """`tbon status --errors`: the ranks of `root`'s subtree that are not online, grouped by
    state and reason (`groups`: the ranks, their hosts as a host list, the first one's entry);
    with `each`, every such rank's entry with `via`, its path to rank 0 as drawn (`-v`,
    `--down`). Spares nothing happened to are one idset, `spares`."""
    drawn = Drawn(table)
    said, spares = _held_in(table, drawn, root)
    answer: dict[str, Any] = {"size": table.size, "topo": table.topology.spec, "rank": root}
    peek, online = table.entries.peek, RankState.ONLINE  # an online rank is never shown here
    gone = [shown(table, r, now, children=False) for r in said if peek(r).state is not online]
    untouched = [e["rank"] for e in gone if _never_held(e)]
    gone = [e for e in gone if not _never_held(e)]
    if untouched:  # kept, yet as a spare: rare, so the runs are expanded
        spares = _ranges(sorted([r for a, b in spares for r in range(a, b + 1)] + untouched))
    answer["spares"] = _idset(spares)
    if each:
        for entry in gone:
            entry["via"] = drawn.path(entry["rank"])
        answer["entries"], cut = _within(gone, _item_bound)
        if cut:
            answer["cut"] = cut
        return answer
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in gone:
        key = (entry["state"], entry.get("reason", ""), entry.get("joiner", ""))
        groups.setdefault(key, []).append(entry)
    made = [
        {
            "state": entries[0]["state"],
            "ranks": format_idset([e["rank"] for e in entries]),
            "hosts": encode_hostlist([str(e["host"]) for e in entries]),
            "entry": entries[0],
        }
        for entries in groups.values()
    ]
    answer["groups"], cut = _within(made, _item_bound)
    if cut:
        answer["cut"] = cut
    return answer


def _never_held(entry: dict[str, Any]) -> bool:
    return entry["state"] == "vacant" and entry["incarnation"] == 0 and "reason" not in entry


def tree(
    table: RankTable,
    now: float,
    root: int,
    depth: int | None = None,
    merge: bool = True,
    apart: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    """`tbon status`'s tree under `root`, as items in the order drawn, each with its `depth`
    below the root and `last` (the last of its siblings). An item is one rank (`entry`), or a
    run of sibling subtrees (`ranks`, an idset, and `count`; `entry` is its first rank's):
    subtrees that no broker ever held, or with `merge`, leaves whose lines read the same but
    for their rank (not those `apart`). Below `depth`, an item says `more` if ranks are hidden
    under it."""
    drawn = Drawn(table)
    touched: set[int] = set()
    parent = table.topology.parent
    for kept in table.entries.held():
        if not table.entries.pristine(kept.rank):
            rank: int | None = kept.rank
            while rank is not None and rank not in touched:  # its ancestors: up to one seen
                touched.add(rank)
                rank = parent(rank)
    seen: dict[int, dict[str, Any]] = {}  # the leaves' entries _runs compared, to show them
    items: list[dict[str, Any]] = []
    stack: list[tuple[list[int], int, bool]] = [([root], 0, True)]
    budget = Budget()
    while stack and not budget.full:
        ranks, level, last = stack.pop()
        first = ranks[0]
        item: dict[str, Any] = {"depth": level, "last": last}
        entry = seen.pop(first, None) or shown(table, first, now, children=False)
        item["entry"] = entry
        bound = ITEM_BYTES + entry_bound(entry)
        if len(ranks) > 1 or (first not in touched and first != root):
            for rank in ranks[1:]:
                seen.pop(rank, None)
            members = _subtrees(table, drawn, ranks, touched)
            item["ranks"], item["count"] = members
            items.append(item)
            budget.take(items, len(items), bound + len(members[0]))
            continue
        kids = drawn.children(first)
        if depth is not None and level >= depth:
            if kids:
                item["more"] = True
            items.append(item)
            budget.take(items, len(items), bound)
            continue
        items.append(item)
        budget.take(items, len(items), bound)
        runs = _runs(table, drawn, kids, touched, merge, apart, now, seen)
        for index in range(len(runs) - 1, -1, -1):
            stack.append((runs[index], level + 1, index == len(runs) - 1))
    answer: dict[str, Any] = {"size": table.size, "topo": table.topology.spec, "rank": root}
    answer["items"] = items
    if stack:
        answer["cut"] = True
    return answer


def _runs(
    table: RankTable,
    drawn: Drawn,
    kids: list[int],
    touched: set[int],
    merge: bool,
    apart: frozenset[int],
    now: float,
    seen: dict[int, dict[str, Any]],
) -> list[list[int]]:
    """`kids` in runs of consecutive siblings drawn as one item: untouched subtrees together,
    and with `merge`, leaves that read the same but those `apart` (the root and standbys, whose
    lines are marked); any other rank alone. The leaves' entries compared (shown at `now`) are
    kept in `seen`, for the tree to draw them with."""
    runs: list[list[int]] = []
    looks: list[object] = []
    for kid in kids:
        look: object = None
        if kid not in touched:
            look = "spare"
        elif merge and kid not in apart and not drawn.children(kid):
            entry = seen[kid] = shown(table, kid, now, children=False)
            look = _look(entry)
        if look is not None and runs and looks[-1] == look:
            runs[-1].append(kid)
        else:
            runs.append([kid])
            looks.append(look)
    split: list[list[int]] = []
    for run, look in zip(runs, looks, strict=True):
        if look != "spare" and len(run) < MERGE_RUN:  # a few leaves: a line each, as ever
            split.extend([kid] for kid in run)
        else:
            split.append(run)
    return split


def _look(entry: dict[str, Any]) -> object:
    """What a leaf's line says but for its rank and clocks (a tuple of the fields drawn). Its
    parent is drawn only when it is not the broker it hangs under (fostered, home is rank P):
    a foster child and its foster parent's own child never read the same."""
    skip = ("rank", "since", "subtree_since", "pid", "last_pid", "expires", "parent")
    look = [(k, repr(v)) for k, v in entry.items() if k not in skip]
    attached, parent = entry.get("attached_to"), entry.get("parent")
    if attached is not None and parent is not None and attached != parent:
        look.append(("home", repr(parent)))
    return tuple(sorted(look))


def _subtrees(
    table: RankTable, drawn: Drawn, ranks: list[int], touched: set[int]
) -> tuple[str, int]:
    """The idset and count of the ranks in the drawn subtrees of `ranks`."""
    if all(r not in touched for r in ranks) and table.topology.spec.startswith("kary:"):
        return _kary_levels(table, ranks[0], ranks[-1])
    found: list[int] = []
    for rank in ranks:
        found.extend(drawn.subtree(rank))
    return format_idset(sorted(found)), len(found)


def _kary_levels(table: RankTable, first: int, last: int) -> tuple[str, int]:
    """The subtrees of the consecutive siblings first..last of a k-ary tree: one run of ranks
    per level, found by arithmetic (a spare's subtree is all spares, as in the topology)."""
    k = int(table.topology.spec[len("kary:") :])
    size = table.size
    if k == 1:  # a chain: one rank's subtree is every rank after it
        return _idset([(first, size - 1)]), size - first
    spans: list[tuple[int, int]] = []
    low, high = first, min(last, size - 1)
    while low < size and low <= high:
        spans.append((low, high))
        if k == 0:  # flat: every rank but 0 is a leaf
            break
        low, high = low * k + 1, min(high * k + k, size - 1)
    count = sum(b - a + 1 for a, b in spans)
    return _idset(spans), count


def held(
    table: RankTable, now: float, start: int = 0, budget: int = PAGE_BYTES
) -> dict[str, Any]:
    """A page of the entries of the ranks something happened to (`ranks`, in rank order, from
    `start` on), as many as fit `budget` bytes of JSON by an upper bound of each (`entry_bound`,
    no entry encoded twice; at least one), and `next`, the rank the
    next page starts at (None after the last): what a command that follows ranks by their
    number reads, a page at a time however many ranks are held. A view that fits one page
    (`start` 0, `next` None) says the others too, as an idset (`spares`)."""
    said = [e.rank for e in table.entries.held() if not table.entries.pristine(e.rank)]
    index = bisect_left(said, start)
    ranks: list[dict[str, Any]] = []
    taken = 0
    while index < len(said) and (taken < budget or not ranks):
        entry = shown(table, said[index], now)
        taken += entry_bound(entry)
        ranks.append(entry)
        index += 1
    answer: dict[str, Any] = {
        "size": table.size,
        "topo": table.topology.spec,
        "ranks": ranks,
        "launched": table.entries.launched,  # a spare's host is extra{rank - launched}
        "spare_since": round(max(0.0, now - table.entries.created), 3),
        "start": start,
        "next": said[index] if index < len(said) else None,
    }
    if start == 0 and answer["next"] is None:
        answer["spares"] = _idset(_complement(said, table.size))
    return answer


ENTRY_BYTES = 512
"""An upper bound on a shown entry as JSON (snapshot.shown), but for its `host`, `reason` and
`children`: every other field it may have, each key with its quotes, colon and comma, a number
at its longest (19 digits, a float's repr 24), `state`, `subtree` and `joiner` as named."""

_BIG = 10**19
"""Numbers below this in magnitude have at most 19 digits: the bounds here allow for that many."""


def _digits_beyond(value: int | None) -> int:
    """What a number a broker sent (a pid, an incarnation) takes beyond the 19 digits a bound
    allows for it: nothing, unless it is larger (counted by its digits)."""
    return 0 if value is None or -_BIG < value < _BIG else len(str(value))


def entry_bound(entry: dict[str, Any]) -> int:
    """At least the length of `entry` as JSON (and its comma in a list), without encoding it:
    what pages the held view, a few lengths an entry instead of the encoder's whole walk."""
    bound = ENTRY_BYTES + _text_bound(entry["host"]) + 7 * len(entry.get("children", ()))
    if (reason := entry.get("reason")) is not None:
        bound += _text_bound(reason)
    for key in ("pid", "incarnation", "last_pid"):  # a broker's own word: counted if too long
        bound += _digits_beyond(entry.get(key))
    return bound


def _text_bound(text: object) -> int:
    """At least the length of `text` as a JSON string (ASCII out: up to 12 bytes a character,
    a character past U+FFFF as two \\uXXXX)."""
    if not isinstance(text, str):
        return 2 + len(str(text)) * 12
    if text.isascii() and text.isprintable():
        return 2 + len(text) + text.count('"') + text.count("\\")
    return 2 + 12 * len(text)


def states(table: RankTable) -> dict[str, Any]:
    """Every rank's state, as one idset per state (`states`, each rank in exactly one, the
    spares under `vacant`), and the connected ranks that are reattaching (`reattaching`, an
    idset, "" if none): what `tbon exec` chooses its targets by and follows while its jobs
    run, some 60 bytes for 1024 online ranks where their `held` entries take 190 kB. One pass
    of the ranks held, each extending a run of its state; no entry shown or encoded."""
    runs: dict[RankState, list[list[int]]] = {}  # a state -> its runs [first, last], in order
    placed: list[list[int]] = []  # the runs of ranks in a state other than vacant
    adrift: list[int] = []
    vacant = RankState.VACANT
    for entry in table.entries.held():  # in rank order
        state = entry.state
        if state is vacant:
            continue
        rank = entry.rank
        mine = runs.get(state)
        if mine is None:
            runs[state] = [[rank, rank]]
        elif mine[-1][1] == rank - 1:
            mine[-1][1] = rank
        else:
            mine.append([rank, rank])
        if placed and placed[-1][1] == rank - 1:
            placed[-1][1] = rank
        else:
            placed.append([rank, rank])
        if entry.adrift_until is not None and state in CONNECTED:
            adrift.append(rank)
    named = {state.value: _idset(found) for state, found in sorted(runs.items())}
    spares: Ranges = []
    first = 0
    for low, high in placed:
        if low > first:
            spares.append((first, low - 1))
        first = high + 1
    if first < table.size:
        spares.append((first, table.size - 1))
    if spares:
        named[vacant.value] = _idset(spares)
    return {
        "size": table.size,
        "topo": table.topology.spec,
        "states": named,
        "reattaching": _idset(_ranges(adrift)),
    }


ONLINE_BYTES = 4 + 6 + 19 + 19
"""An upper bound on one `online` item as JSON, `[rank,pid,incarnation],`: a rank has at most
6 digits (MAX_SIZE), a pid or an incarnation at most 19 (below 2^63; a larger one is counted by
its digits). So a page is bounded without encoding its items."""


def online(table: RankTable, start: int = 0, budget: int = PAGE_BYTES) -> dict[str, Any]:
    """A page of the online ranks from `start` on (`online`, in rank order, each `[rank, pid,
    incarnation]`), as many as ONLINE_BYTES each fits `budget` (at least one), and `next`, the
    rank the next page starts at (None after the last): what `tbon expand` follows its joiners
    by (a local joiner by its pid, a remote one by its rank and a newer incarnation), some 20
    bytes a rank where their `held` entries take 190. One pass of the ranks held from `start`
    (found by bisection, not walked to); no entry shown or encoded."""
    found: list[list[int | None]] = []
    taken = 0
    after: int | None = None
    is_online = RankState.ONLINE
    held = table.entries.held()  # in rank order
    for index in range(bisect_left(held, start, key=attrgetter("rank")), len(held)):
        entry = held[index]
        if entry.state is not is_online:
            continue
        if taken >= budget and found:
            after = entry.rank
            break
        pid, incarnation = entry.pid, entry.incarnation
        taken += ONLINE_BYTES + _digits_beyond(pid) + _digits_beyond(incarnation)
        found.append([entry.rank, pid, incarnation])
    return {
        "size": table.size,
        "topo": table.topology.spec,
        "online": found,
        "start": start,
        "next": after,
    }
