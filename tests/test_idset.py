"""Tests of `tbon.overlay.parse.idset`: rank sets as users write them
(`tbon expand --ranks 0,3-7`)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon import exitcodes
from tbon.errors import UsageError
from tbon.overlay.parse.idset import format_idset, idset_runs, parse_idset

FAST = settings(max_examples=150, deadline=None)


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("0", [0]),
        ("7", [7]),
        ("0,3-7,9", [0, 3, 4, 5, 6, 7, 9]),
        ("3-3", [3]),
        ("9,1,5", [1, 5, 9]),
        ("1-3,2-4", [1, 2, 3, 4]),
        ("2,2,2", [2]),
        (" 1 , 4-5 ", [1, 4, 5]),
        ("007", [7]),
        ("10-12", [10, 11, 12]),
        ("[0-2]", [0, 1, 2]),  # Flux's bracketed form
        ("[0,3-5]", [0, 3, 4, 5]),
        ("[7]", [7]),
        (" [ 1 , 4-5 ] ", [1, 4, 5]),
    ],
)
def test_parse_idset(text: str, ranks: list[int]) -> None:
    assert parse_idset(text) == ranks


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 3, 4, 5, 6, 7, 9], "0,3-7,9"),
        ([1, 2], "1-2"),
        ([5, 1, 3, 2], "1-3,5"),
        ({4, 0, 1}, "0-1,4"),
        ([3, 3, 3], "3"),
        ([0, 2, 4], "0,2,4"),
        ([9, 10, 11, 100], "9-11,100"),
    ],
)
def test_format_idset(ranks: list[int] | set[int], text: str) -> None:
    assert format_idset(ranks) == text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "use ranks and ranges like 0,3-7"),
        ("a", "use ranks and ranges like 0,3-7"),
        ("3-1", "range 3-1 runs backwards"),
        ("1-", "use ranks and ranges like 0,3-7"),
        ("-1", "use ranks and ranges like 0,3-7"),
        (",", "use ranks and ranges like 0,3-7"),
        ("²", "use ranks and ranges like 0,3-7"),
        ("1,,2", "use ranks and ranges like 0,3-7"),
        ("1-2-3", "use ranks and ranges like 0,3-7"),
        ("+1", "use ranks and ranges like 0,3-7"),
        ("1.5", "use ranks and ranges like 0,3-7"),
        ("all", "use ranks and ranges like 0,3-7"),
        ("1\n2", "use ranks and ranges like 0,3-7"),
        ("٣", "use ranks and ranges like 0,3-7"),  # an Arabic-Indic digit: not ASCII
        ("[]", "use ranks and ranges like 0,3-7 or [0,3-7]"),
        ("[0-2", "']' after '['"),
        ("0-2]", "'[' before ']'"),
        ("[[0-2]]", "brackets go around the whole set, once"),
        ("[0],[2]", "brackets go around the whole set, once"),
        ("0,[2]", "'[' before ']'"),
        ("[2-0]", "range 2-0 runs backwards"),
    ],
)
def test_parse_idset_refuses(text: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_idset(text)
    message = str(caught.value)
    assert message.startswith(f"invalid rank set {text!r}: ")
    assert words in message
    assert "\n" not in message  # one line, even when the input has a newline (repr escapes it)
    assert caught.value.exit_code == exitcodes.USAGE == 2


RANK_SETS = st.sets(st.integers(0, 300), max_size=40)


@given(RANK_SETS)
@FAST
def test_parse_of_format_is_the_sorted_set(ranks: set[int]) -> None:
    text = format_idset(ranks)
    if ranks:
        assert parse_idset(text) == sorted(ranks)
    else:
        assert text == ""  # the empty set has no form parse_idset takes
    assert format_idset(sorted(ranks)) == format_idset(list(ranks)) == text


@given(RANK_SETS.filter(bool))
@FAST
def test_format_is_the_shortest_form(ranks: set[int]) -> None:
    """No two parts touch or overlap: each run of consecutive ranks is one part."""
    parts = format_idset(ranks).split(",")
    bounds = [tuple(map(int, part.split("-"))) for part in parts]
    for bound in bounds:
        assert len(bound) == 1 or bound[0] < bound[1]
    for before, after in itertools.pairwise(bounds):
        assert after[0] > before[-1] + 1


@given(
    st.lists(
        st.tuples(st.integers(0, 200), st.integers(0, 20), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([",", " ,", ", "]),
)
@FAST
def test_round_trip_from_text(parts: list[tuple[int, int, bool]], separator: str) -> None:
    text = separator.join(f"{low}-{low + span}" if dash else str(low) for low, span, dash in parts)
    ranks = parse_idset(text)
    assert ranks == sorted(set(ranks))
    expected = set()
    for low, span, dash in parts:
        expected.update(range(low, low + span + 1) if dash else [low])
    assert ranks == sorted(expected)
    canonical = format_idset(ranks)
    assert format_idset(parse_idset(canonical)) == canonical
    assert parse_idset(canonical) == ranks


@given(RANK_SETS.filter(bool), st.sampled_from(["[{}]", " [{}] ", "[ {} ]"]))
@FAST
def test_brackets_around_a_set_change_nothing(ranks: set[int], form: str) -> None:
    """Flux prints a rank set in brackets, `[0-2,5]`; pasted back, it means the same ranks."""
    text = format_idset(ranks)
    assert parse_idset(form.format(text)) == parse_idset(text) == sorted(ranks)


@given(st.text(alphabet="0123456789,- a²[]", max_size=7))  # no huge ranges
@FAST
def test_parse_idset_raises_only_usage_error(text: str) -> None:
    try:
        ranks = parse_idset(text)
    except UsageError as error:
        assert "\n" not in str(error)
        return
    assert ranks == sorted(set(ranks)) and all(r >= 0 for r in ranks)


@FAST
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), min_size=1, max_size=12))
def test_runs_are_the_ranks_of_the_set_merged_in_order(parts: list[tuple[int, int]]) -> None:
    text = ",".join(f"{first}-{first + span}" if span else str(first) for first, span in parts)
    runs = idset_runs(text)
    assert [r for first, last in runs for r in range(first, last + 1)] == parse_idset(text)
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(runs))  # apart: none touch


def test_runs_of_a_client_s_repeated_huge_ranges_are_one() -> None:
    """An exec.start's targets are a client's text (docs/protocol.md §7): the root reads its
    ranges without listing them, so a range of a million ranks a hundred thousand times is one
    run, not 10^11 set insertions."""
    assert idset_runs(",".join(["0-1048575"] * 100_000)) == [(0, 1048575)]
    with pytest.raises(UsageError):
        idset_runs("0-1048576")
