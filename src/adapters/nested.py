"""Finding a strategy inside a composition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

T = TypeVar("T")


def find_nested_strategy(strategy: object, kind: type[T]) -> T | None:
    """The first instance of ``kind`` in ``strategy`` or the strategies it composes.

    The walk is breadth-first over ``.strategies`` sequences (the framework's
    ``TokenBudgetComposedStrategy``; any composition that lists its parts there), with a guard
    against cycles. It does not follow a record strategy's ``fallback``: the fallback is
    not part of the composition the middleware serves. A composition is not an instance
    of its parts, so wiring ``reforce`` to the record half needs this.

    Args:
        strategy: A strategy, or a composition of strategies.
        kind: The class to look for.

    Returns:
        The first match, or ``None``.

    Raises:
        ValueError: ``kind`` is not a class.
    """
    given: object = kind  # checked as given, without narrowing ``kind``
    if not isinstance(given, type):
        raise ValueError(f"kind must be a class, got {kind!r}")
    pending: list[object] = [strategy]
    seen: set[int] = set()
    for current in pending:  # breadth-first: the list grows as the walk goes
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        children = getattr(current, "strategies", None)
        if isinstance(children, Sequence) and not isinstance(children, (str, bytes)):
            pending.extend(cast("Sequence[object]", children))
    return None
