"""The topics of the root group's messages (docs/protocol.md §13.2), apart from their codec
(groupwire.py): the broker's topic table lists them, and a broker that is no member of the group
(every broker of an instance without standbys) never loads the member machine they carry."""

from __future__ import annotations

APPEND, APPEND_REPLY, VOTE, VOTE_REPLY = (
    "group.append",
    "group.append-reply",
    "group.vote",
    "group.vote-reply",
)
TOPICS = (APPEND, APPEND_REPLY, VOTE, VOTE_REPLY)
"""One-way requests between members; `group.state` (answered) is the members' query."""
