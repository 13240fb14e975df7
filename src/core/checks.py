"""Parameter checks shared by every strategy: a clear ``ValueError`` naming the parameter and its range.

Every message reads "NAME must be ..., got VALUE", so a caller sees at once which argument
is wrong and what would be accepted.
"""

from __future__ import annotations

import inspect
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
    """``value`` is ``True`` or ``False`` (a truthy string such as ``"false"`` is refused)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def is_async_callable(value: object) -> bool:
    """``value`` is a coroutine function, or an object whose ``__call__`` is one.

    ``inspect.iscoroutinefunction`` sees through ``functools.partial`` and bound methods;
    a callable object is judged by its ``__call__``. A plain function that happens to
    return an awaitable is not recognised: it could not be told from one that does not.
    """
    if inspect.iscoroutinefunction(value):
        return True
    return callable(value) and inspect.iscoroutinefunction(type(value).__call__)


def require_async_callable(name: str, value: object, *, kind: str = "an async callable") -> None:
    """``value`` is awaited when called: see :func:`is_async_callable`.

    A sync callable would fail only later, inside the ``await`` of some pass; refusing it
    here names the parameter instead. ``kind`` describes what is wanted in the message.
    """
    if not is_async_callable(value):
        raise ValueError(
            f"{name} must be {kind} (an async def function or an object with async __call__), got {value!r}"
        )


def require_sync_callable(name: str, value: object, *, kind: str = "a callable") -> None:
    """``value`` is a callable whose result is used as it is, never awaited.

    A coroutine function would return a coroutine that is never awaited: its work would
    silently not happen (and a coroutine is truthy, so a predicate would always hold).
    """
    if not callable(value) or is_async_callable(value):
        raise ValueError(f"{name} must be {kind} that is not async, got {value!r}")


def require_tokenizer(name: str, value: object) -> None:
    """``value`` has a synchronous ``count_tokens(text) -> int`` method."""
    count = getattr(value, "count_tokens", None)
    if not callable(count) or is_async_callable(count):
        raise ValueError(f"{name} must have a count_tokens(text) -> int method that is not async, got {value!r}")


def describe_value(value: object) -> str:
    """A wrong value, short, for an error message: ``None``, or its type and (cut) repr."""
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"
