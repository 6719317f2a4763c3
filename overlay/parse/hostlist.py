"""Host lists as batch systems write them: `node[1-4,7]`, `rack[1-2]n[01-16]`, `login,node3`;
and written back in that short form (encode_hostlist), as `flux overlay errors` names hosts.

Numbers keep their zero padding (`n[08-10]` is n08, n09, n10); bracket groups multiply out, left
to right; commas outside brackets separate host expressions. Order is kept, as written.
"""

from __future__ import annotations

import re

from tbon.errors import UsageError

MAX_HOSTS = 1 << 16  # far beyond any allocation: a typo must not eat the memory
_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """Every host in `text`, in order; a UsageError naming the problem for anything else."""
    hosts: list[str] = []
    for expression in _split_top_level(text):
        hosts += _expand_one(expression, text)
        if len(hosts) > MAX_HOSTS:
            raise UsageError(f"invalid host list {text!r}: more than {MAX_HOSTS} hosts")
    return hosts


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"invalid host list {text!r}: ']' without '['")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"invalid host list {text!r}: '[' without ']'")
    parts.append("".join(current))
    for part in parts:
        if not part.strip():
            raise UsageError(f"invalid host list {text!r}: an empty host name")
    return [part.strip() for part in parts]


def _expand_one(expression: str, text: str) -> list[str]:
    if any(char.isspace() for char in expression):
        raise UsageError(f"invalid host list {text!r}: bad host name {expression!r}")
    match = _GROUP.search(expression)
    if match is None:
        if any(c.isspace() for c in expression) or "[" in expression or "]" in expression:
            raise UsageError(f"invalid host list {text!r}: bad host name {expression!r}")
        return [expression]
    head, tail = expression[: match.start()], expression[match.end() :]
    rests = _expand_one(tail, text) if tail else [""]
    return [f"{head}{number}{rest}" for number in _numbers(match.group(1), text) for rest in rests]


def _numbers(group: str, text: str) -> list[str]:
    numbers: list[str] = []
    for item in group.split(","):
        low, dash, high = item.strip().partition("-")
        if (
            not low.isdigit()
            or not low.isascii()
            or (dash and not (high.isdigit() and high.isascii()))
        ):
            raise UsageError(f"invalid host list {text!r}: bad range [{group}]")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise UsageError(f"invalid host list {text!r}: range {item.strip()} runs backwards")
        if last - first >= MAX_HOSTS:
            raise UsageError(f"invalid host list {text!r}: more than {MAX_HOSTS} hosts")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        numbers += [str(n).zfill(width) for n in range(first, last + 1)]
    return numbers


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def encode_hostlist(hosts: list[str]) -> str:
    """The short form of `hosts` that expand_hostlist reads back (each host once): names that
    differ only in a trailing number share one bracket group, `node[1-3,7]`, and keep their zero
    padding, `n[08-09]`. Groups come in the order their first host does."""
    groups: dict[tuple[str, int], list[int]] = {}  # (prefix, padded width or 0) -> numbers
    order: dict[tuple[str, int] | str, None] = {}
    for host in hosts:
        match = _NUMBERED.match(host)
        if match is None:
            order[host] = None
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), []).append(int(digits))
        order[(prefix, width)] = None
    parts = []
    for key in order:
        if isinstance(key, str):
            parts.append(key)
            continue
        prefix, width = key
        numbers = sorted(set(groups[key]))
        runs = _runs(numbers, width)
        if len(numbers) == 1:
            parts.append(f"{prefix}{runs}")
        else:
            parts.append(f"{prefix}[{runs}]")
    return ",".join(parts)


def _runs(numbers: list[int], width: int) -> str:
    """`1-3,7` for [1, 2, 3, 7], each number padded to `width`."""
    runs: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        low, high = f"{start:0{width}d}", f"{previous:0{width}d}"
        runs.append(low if start == previous else f"{low}-{high}")
        if number is not None:
            start = previous = number
    return ",".join(runs)
