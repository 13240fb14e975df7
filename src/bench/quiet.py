"""What the bench's commands share around a strategy: its WARNINGs silenced, its passes timed."""

from __future__ import annotations

import cProfile
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from agent_framework import CompactionStrategy, Message

QUIET_LOGGERS: Final = ("maf_compaction", "agent_framework")


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Raise the package's and the framework's loggers to ERROR for the block, then restore their levels."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class TimedStrategy:
    """Wraps a strategy to append each pass's milliseconds to ``into`` (under ``profiler`` when given).

    It exposes the wrapped strategy's ``tokenizer`` (the framework reads it) and adds one
    ``await`` and two clock reads, a few microseconds.
    """

    def __init__(
        self, strategy: CompactionStrategy, into: list[float], profiler: cProfile.Profile | None = None
    ) -> None:
        self.strategy = strategy
        self.tokenizer: object = getattr(strategy, "tokenizer", None)
        self.into = into
        self.profiler = profiler

    async def __call__(self, messages: list[Message]) -> bool:
        if self.profiler is not None:
            self.profiler.enable()
        start = time.perf_counter()
        try:
            return await self.strategy(messages)
        finally:
            self.into.append((time.perf_counter() - start) * 1_000)
            if self.profiler is not None:
                self.profiler.disable()
