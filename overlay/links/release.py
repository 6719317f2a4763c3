"""Give the memory a dropped client's buffers held back to the system, not just to the heap.

Freeing a client's queue returns its buffers to the C allocator, which keeps most of them: glibc
raises its mmap threshold after large frees, so later buffers of that size come from arenas, and
arenas give back only what lies free at their top. After 100 MB of queues went, a broker could
stay 25 MB larger for good. `malloc_trim(0)` returns the free pages of every arena; it walks the
heap, so it is called only after a drop or a close freed much (LocalServer.release), once per
turn of the loop. Without glibc (musl, say), there is nothing to call and nothing is done.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

TRIM_ABOVE = 4 << 20  # bytes freed by drops and closes before a trim is worth its walk


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes  # at the first trim: a broker that drops no client never loads it
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def give_back() -> None:
    """Return the allocator's free pages to the system, where it can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
