"""The online ranks as rank 0's `online` view says them, for `tbon expand`.

While expand follows its joiners it reads nothing of the table but the online ranks: a joiner
it started here is found by its pid, one started on another host by its rank and an incarnation
newer than the one it replaced. Rank 0 sends just that (statusviews.online), some 20 bytes a
rank, in pages of at most PAGE_BYTES; `OnlinePages` puts the pages of one update together. A
broker of an older tbon refuses that view, and answers the `held` view, which `from_status`
reads the same way.
"""

from __future__ import annotations

from typing import Any

from tbon.overlay.state.heldtable import said

Online = list[tuple[int, int | None, int]]
"""The online ranks, in rank order: (rank, pid, incarnation)."""


class OnlinePages:
    """An `online` view put together from its pages (`start`, `next`), in the order they come:
    a page from rank 0 begins an update, the one whose `next` is None ends it."""

    def __init__(self) -> None:
        self.online: Online = []

    def take(self, page: dict[str, Any]) -> Online | None:
        """Every online rank once `page` ends an update; else None."""
        if not page.get("start"):
            self.online = []
        self.online += [(int(r), p, int(i)) for r, p, i in page["online"]]
        if page.get("next") is not None:
            return None
        found, self.online = self.online, []
        return found


def from_status(status: dict[str, Any]) -> Online:
    """The online ranks of a status object (a `held` view put together, or a whole table)."""
    return [
        (int(e["rank"]), e["pid"], int(e["incarnation"]))
        for e in said(status)
        if e["state"] == "online"
    ]
