"""encode_hostlist: host names in the short form that expand_hostlist reads back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbon.overlay.parse.hostlist import encode_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("hosts", "text"),
    [
        (["node1", "node2", "node3", "node7"], "node[1-3,7]"),
        (["node3", "node1", "node2"], "node[1-3]"),
        (["n08", "n09", "n10"], "n[08-09],n10"),  # padding kept: n10 is not padded
        (["login", "node4", "login"], "login,node4"),
        (["vm", "vm", "vm"], "vm"),
        (["rack1n2", "rack1n3"], "rack1n[2-3]"),
        (["c9", "c10", "c11"], "c[9-11]"),
        ([], ""),
    ],
)
def test_encode(hosts: list[str], text: str) -> None:
    assert encode_hostlist(hosts) == text


NAMES = st.lists(
    st.tuples(
        st.sampled_from(["node", "n", "login", "r1n", "a-b"]),
        st.one_of(st.none(), st.integers(0, 40)),
        st.booleans(),
    ).map(lambda t: t[0] + ("" if t[1] is None else (f"{t[1]:03d}" if t[2] else str(t[1])))),
    min_size=1,
    max_size=30,
)


@given(NAMES)
@settings(max_examples=200, deadline=None)
def test_expanding_the_encoding_gives_each_host_once(hosts: list[str]) -> None:
    back = expand_hostlist(encode_hostlist(hosts))
    assert sorted(back) == sorted(set(hosts))
