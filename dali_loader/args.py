"""Argument checks shared by the library and its tools (Keras-style `Received:` messages)."""

from __future__ import annotations


def positive_int(name: str, value, *, allow_none: bool = False):
    """Returns `value` if it is a positive integer (or None when allowed), else raises.

    Raises:
        ValueError: naming the argument and echoing the value.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or None" if allow_none else ""
        raise ValueError(f"`{name}` must be a positive integer{extra}. Received: {name}={value!r}")
    return value
