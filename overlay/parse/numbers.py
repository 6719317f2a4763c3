"""Whole numbers typed by users or carried in text fields."""


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() alone also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def is_int(value: object) -> bool:
    """A JSON integer: bool is an int in Python, never in the protocol."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A JSON number, whole or not: again, bool is not one."""
    return isinstance(value, int | float) and not isinstance(value, bool)
