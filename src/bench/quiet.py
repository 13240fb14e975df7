"""Silencing the strategies' WARNINGs while the bench runs (its own output reports what they did)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

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
