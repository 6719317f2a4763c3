"""Whole numbers typed by users or carried in text fields."""


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() alone also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()
