"""Parameter checks shared by every strategy: a clear ``ValueError`` naming the parameter and its range."""

from __future__ import annotations

import math


def is_number(value: object) -> bool:
    """A finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def require_int(name: str, value: object, *, minimum: int) -> None:
    """``value`` is an integer (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_optional_int(name: str, value: object, *, minimum: int) -> None:
    """``value`` is ``None`` or an integer (not a bool) of at least ``minimum``."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < minimum):
        raise ValueError(f"{name} must be an integer >= {minimum} or None, got {value!r}")


def require_fraction(name: str, value: object, *, low_open: bool = True) -> None:
    """``value`` is a finite number in (0, 1] (``low_open``) or in [0, 1]."""
    span = "(0, 1]" if low_open else "[0, 1]"
    if not is_number(value):
        raise ValueError(f"{name} must be a number in {span}, got {value!r}")
    number = float(value)  # pyright: ignore[reportArgumentType]
    if (number <= 0 if low_open else number < 0) or number > 1:
        raise ValueError(f"{name} must be in {span}, got {value!r}")


def require_bool(name: str, value: object) -> None:
    """``value`` is ``True`` or ``False`` (not a truthy stand-in such as ``'false'``)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
