"""Cards as they travel down the tree: a broker's rank, tree endpoint and public key, in a
parent's `lineage` (its ancestors, docs/protocol.md §5.1) and `group` (the root group's members,
§13.4). Pure: JSON values in, cards out; a value that is not shaped so is refused whole, never
half-used.
"""

from __future__ import annotations

from typing import Any

from tbon.overlay.parse.numbers import is_int

Card = tuple[int, str, str]
"""A broker as another knows it: rank, endpoint, public key (Z85)."""

MAX_GROUP = 5
"""Cards in a `group`: the root and at most four standbys (state/standbys.py, MAX_STANDBYS)."""


class BadCards(ValueError):
    """A `group` that is not a list of distinct members' cards."""


def card_ok(value: Any) -> bool:
    """Whether `value` is a card on the wire: [rank, "tcp://...", a 40-character key]."""
    return (
        isinstance(value, list)
        and len(value) == 3
        and is_int(value[0])
        and value[0] >= 0
        and isinstance(value[1], str)
        and value[1].startswith("tcp://")
        and isinstance(value[2], str)
        and len(value[2]) == 40
    )


def decode_group(value: Any) -> tuple[Card, ...]:
    """The root group's cards from a welcome or a `lineage` (None: it sent none, as with no
    standbys), in rank order; BadCards if they are not at most MAX_GROUP cards of distinct
    ranks."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_GROUP:
        raise BadCards(f"group is not a list of at most {MAX_GROUP} cards")
    if not all(card_ok(card) for card in value):
        raise BadCards("group holds something that is not a card")
    cards = tuple(sorted((int(r), str(e), str(k)) for r, e, k in value))
    if len({card[0] for card in cards}) != len(cards):
        raise BadCards("group names a rank twice")
    return cards


def encode_group(cards: tuple[Card, ...]) -> list[list[Any]]:
    return [list(card) for card in cards]
