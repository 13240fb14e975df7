"""Parameter checks shared by every strategy: a clear ``ValueError`` naming the parameter and its range.

Every message reads "NAME must be ..., got VALUE", so a caller sees at once which argument
is wrong and what would be accepted.

A configuration declares each field's constraint once, in its annotation (the range types
below, ``bool``, a ``Literal``, or ``Optional`` of one), and calls :func:`validate` from
``__post_init__``; only rules between fields stay explicit.
"""

from __future__ import annotations

import fractions
import functools
import inspect
import math
import re
import reprlib
from dataclasses import fields
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from msgspec import Meta

#: Token and count parameters: an integer of at least 1, or of at least 0.
AtLeastOne = Annotated[int, Meta(ge=1)]
AtLeastZero = Annotated[int, Meta(ge=0)]
#: A share of something that must not be empty: in (0, 1].
Fraction = Annotated[float, Meta(gt=0, le=1)]
#: A floor that 0 turns off and 1 would make impossible: in [0, 1).
Floor = Annotated[float, Meta(ge=0, lt=1)]
#: Instructions and other text that must say something.
NonEmpty = Annotated[str, Meta(pattern=r"\S")]


def share_of(count: int, fraction: float) -> int:
    """The least whole number at or above ``fraction`` of ``count``, computed exactly (``0.8`` of 5 is 4, never 5
    by a float's rounding)."""
    return math.ceil(count * fractions.Fraction(str(fraction)))


def is_number(value: object) -> bool:
    """A finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_async_callable(value: object) -> bool:
    """``value`` is a coroutine function, or an object whose ``__call__`` is one.

    ``inspect.iscoroutinefunction`` sees through ``functools.partial`` and bound methods;
    a callable object is judged by its ``__call__``. A plain function that happens to
    return an awaitable is not recognised: it could not be told from one that does not.
    """
    return inspect.iscoroutinefunction(value) or (callable(value) and inspect.iscoroutinefunction(type(value).__call__))


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


def _short_repr() -> reprlib.Repr:
    """How much of a wrong value an error message shows: a few levels, items and characters, whatever its size."""
    short = reprlib.Repr()  # keyword settings arrived in Python 3.12
    short.maxlevel, short.maxstring, short.maxother = 3, 60, 60
    short.maxdict = short.maxlist = short.maxtuple = short.maxset = short.maxfrozenset = 4
    return short


_SHORT = _short_repr()


def describe_value(value: object) -> str:
    """A wrong value, short, for an error message: ``None``, or its type and (cut) repr.

    Only the first levels and items are shown (``reprlib``), so a value nested a hundred thousand deep or a
    million items long is described in the time and stack a small one takes.
    """
    return "None" if value is None else f"{type(value).__name__} {shown(value, 80)}"


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, of its first levels and items only (see :func:`describe_value`)."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # a repr of the host's own that fails (or recurses without end) still gets a description
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def validate(instance: object) -> None:
    """Check every field of the dataclass ``instance`` against its annotation (see :func:`require`)."""
    for name, declared in _fields(type(instance)):
        require(name, getattr(instance, name), declared)


def require(name: str, value: object, declared: object) -> None:
    """``value`` meets ``declared``: a range type above, ``bool``, a ``Literal``, or one of them ``| None``.

    Raises:
        ValueError: "NAME must be WANTED[ or None], got VALUE". Other annotations declare nothing.
    """
    constraint = _constraint(declared)
    if constraint is None or (value is None and constraint[0]):
        return
    optional, hint, meta = constraint
    wanted = _wanted(hint, meta, value)
    if wanted is not None:
        raise ValueError(f"{name} must be {wanted}{' or None' if optional else ''}, got {value!r}")


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, object], ...]:
    """The fields of the dataclass ``cls`` and their annotations."""
    hints = get_type_hints(cls, include_extras=True)
    return tuple((field.name, hints[field.name]) for field in fields(cls))


@functools.cache
def _constraint(declared: Any) -> tuple[bool, object, Meta] | None:
    """Whether ``declared`` allows ``None``, its type and its bounds; ``None`` when it declares nothing."""
    optional = get_origin(declared) in (Union, UnionType) and NoneType in get_args(declared)
    hint: Any = declared
    if optional:
        rest = [arg for arg in get_args(declared) if arg is not NoneType]
        hint = rest[0] if len(rest) == 1 else object
    meta = Meta()
    if get_origin(hint) is Annotated:
        meta = next(m for m in hint.__metadata__ if isinstance(m, Meta))
        hint = get_args(hint)[0]
    if hint in (bool, float) or get_origin(hint) is Literal or (hint in (int, str) and meta != Meta()):
        return optional, hint, meta
    return None


def _wanted(hint: object, meta: Meta, value: object) -> str | None:
    """What ``value`` should have been under ``hint`` and ``meta``, or ``None`` when it is fine."""
    if hint is bool:
        return None if isinstance(value, bool) else "True or False"
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool) and _within(value, meta):
            return None
        return f"an integer >= {meta.ge}" if meta.le is None else f"an integer in [{meta.ge}, {meta.le}]"
    if hint is float:
        low = f"({meta.gt}" if meta.gt is not None else f"[{meta.ge}"
        high = f"{meta.lt})" if meta.lt is not None else f"{meta.le}]"
        return None if is_number(value) and _within(value, meta) else f"in {low}, {high}"
    if hint is str:
        if isinstance(value, str) and re.search(meta.pattern or "", value):
            return None
        return "a non-empty string" if meta.pattern == r"\S" else f"a string matching {meta.pattern!r}"
    choices = get_args(hint)
    return None if value in choices else f"one of {', '.join(map(str, choices))}"


def _within(number: Any, meta: Meta) -> bool:
    """``number`` meets the bounds of ``meta``."""
    return (
        (meta.gt is None or number > meta.gt)
        and (meta.ge is None or number >= meta.ge)
        and (meta.lt is None or number < meta.lt)
        and (meta.le is None or number <= meta.le)
    )
