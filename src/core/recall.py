"""The recall middleware's rules: when to pin a request to the recall tool, and when to stop.

The middleware performs (it rewrites one request's options, calls the model, retries);
the decisions are here, as pure functions of what it saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .records import RecallStatus

#: Consecutive pinned responses without a recall call after which pinning stops.
IGNORED_LIMIT: Final = 2


@dataclass(frozen=True, slots=True)
class PinRule:
    """The size and tool-group bounds of the pin rule.

    Attributes:
        trigger_tokens: Pin when the prompt is over this many tokens (and no record
            exists, or enough new tool groups arrived since the newest one).
        max_groups_before_record: Pin once this many tool groups wait for a record, even
            below the trigger; ``None`` turns the bound off.
        repeat_records: Ask for later records at all.
        min_groups_before_repeat: New tool groups a later size-triggered record waits for.
    """

    trigger_tokens: int
    max_groups_before_record: int | None = None
    repeat_records: bool = True
    min_groups_before_repeat: int = 4


def pin_due(rule: PinRule, status: RecallStatus) -> bool:
    """Pin the next request? The rule after a re-force ask (the caller checks that first).

    The first size-triggered record is asked for at once; a later one waits for
    ``min_groups_before_repeat`` new tool groups, so the trigger re-arms on new tool
    material, not on size alone. ``max_groups_before_record`` is a separate bound.
    """
    if rule.max_groups_before_record is not None and status.pending_groups >= rule.max_groups_before_record:
        return True
    if status.records and (not rule.repeat_records or status.pending_groups < rule.min_groups_before_repeat):
        return False
    return status.included_tokens > rule.trigger_tokens


def ignored_streak(streak: int, *, called_recall: bool) -> int:
    """The streak of pinned responses without a recall call, after one more pinned response."""
    return 0 if called_recall else streak + 1


def pin_disabled(streak: int) -> bool:
    """Has the provider shown it does not honour the pin?"""
    return streak >= IGNORED_LIMIT
