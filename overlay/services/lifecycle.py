"""Where this broker is in its life: what several services must know before taking on work."""

from __future__ import annotations


class Lifecycle:
    """Written by the broker's loop, read by its services."""

    __slots__ = ("retiring", "stopping")

    def __init__(self, stopping: bool = False, retiring: bool = False) -> None:
        self.stopping = stopping  # shutting its subtree down: no new work, no new children
        self.retiring = retiring  # told to retire: no new work; it leaves once its jobs are done

    def refusing_work(self, rank: int) -> str:
        """Why this broker takes no new exec work, or ""."""
        if self.stopping:
            return f"rank {rank} is shutting down"
        if self.retiring:
            return f"rank {rank} is retiring: it takes no new work"
        return ""
