"""Records: small value classes that a broker defines by the dozen and creates by the thousand.

A record's fields are its `__slots__`, in order, set once by its own `__init__`; two records are
equal when they are of one type with equal fields, and hash alike then. Plain classes rather than
dataclasses, for start-up time: a broker defines every such type at each start, and a frozen
dataclass costs half a millisecond to define, a record a few microseconds. Treat them as frozen.
"""

from __future__ import annotations

from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __str__(self) -> str:
        """As a log line shows it to people: `lost (rank 3, incarnation 1, reason: gone)`."""
        name = "".join(f" {c}" if c.isupper() else c for c in type(self).__name__).strip()
        values = [(field, getattr(self, field)) for field in self.__slots__]
        values = [(f, v) for f, v in values if v is not None and v != ""]  # unset: not news
        words = [f"{f}: {v}" if isinstance(v, str) else f"{f} {v}" for f, v in values]
        return f"{name.lower()} ({', '.join(words)})"


def replaced(record: R, **changes: Any) -> R:
    """`record` with some fields changed, a new one of its type, as dataclasses.replace made it
    (for a record whose `__init__` takes its fields by their names)."""
    fields = {name: getattr(record, name) for name in record.__slots__}
    return type(record)(**{**fields, **changes})
