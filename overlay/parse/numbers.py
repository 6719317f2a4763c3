"""Whole numbers typed by users or carried in text fields."""


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() alone also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def is_int(value: object) -> bool:
    """A JSON integer: bool is an int in Python, never in the protocol."""
    return isinstance(value, int) and not isinstance(value, bool)
