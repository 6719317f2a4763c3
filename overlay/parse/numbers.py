"""Whole numbers typed by users or carried in text fields."""

from typing import TypeGuard


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() alone also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer: bool is an int in Python, never in the protocol. (A TypeGuard: after it,
    the value is an int to a type checker too.)"""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number, whole or not: again, bool is not one (and again a TypeGuard)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


_BINARY = {
    "": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GIB": 1 << 30,
}


def parse_bytes(text: str) -> int | None:
    """A size such as 65536, 64K, 64M or 1GiB (binary multiples); None if it is not one."""
    digits = text.strip()
    unit = digits.lstrip("0123456789")
    number = digits[: len(digits) - len(unit)]
    scale = _BINARY.get(unit.strip().upper())
    if not number or not is_decimal(number) or scale is None or len(number) > 15:
        return None
    return int(number) * scale
