"""Which planted values a run lost, and whether a WARNING named the messages that carried them.

The library's promise is that nothing leaves the prompt silently: a message a strategy
removes is named (by its id) in a WARNING of the ``maf_compaction`` logger, or linked from a
marker the model sees. This module makes the WARNING half of that checkable per cell:
:func:`collect_warnings` gathers the logger's WARNING records while a cell runs, and
:func:`lost_facts` finds every planted value that the conversation gave but the final
prompt no longer carries, the stored messages that carried it, and whether one of them
was named. It reads only the stored history, the scenario and the log text, so it works
for a generated workload, a workload file and a replayed session alike.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from agent_framework import Message

from ..adapters.convert import JsonValue, original_results
from .model import context_text
from .scenario import Scenario

#: The logger whose WARNINGs name what a strategy removed.
PACKAGE_LOGGER: Final = "maf_compaction"

#: The collector of the cell whose code is running (cells may share a process and an event loop).
_CELL_WARNINGS: ContextVar[list[str] | None] = ContextVar("maf_compaction_bench_warnings", default=None)
#: What separates names in a log line (``excluded: msg_3, msg_4``, ``(msg_7)``, ``'msg_9'``).
_NAME_SEPARATORS: Final = re.compile(r"[\s,;()\[\]{}<>'\"]+")


@dataclass(frozen=True, slots=True)
class LostFact:
    """A planted value the conversation gave that the final prompt no longer carries.

    Attributes:
        label: The fact's name (``code_3_7``, ``R2``...).
        value: Its value.
        carriers: The stored messages that carried it (in their text or in an original
            result a strategy shortened and kept): their ids, or ``<role message N>`` for a
            message without one (which no log line can name by id).
        named: A WARNING of the ``maf_compaction`` logger named one of ``carriers`` by id.
        warning: The first such WARNING (it says why the message left), or ``None``.
        cut_in_place: A carrier is still in the prompt: the value was cut from a message that
            stays (a tool result shortened in place, its original kept on the message and a
            removal marker where the text was). No WARNING names such a cut; the marker the
            model sees is its notice.
    """

    label: str
    value: str
    carriers: tuple[str, ...]
    named: bool
    warning: str | None = None
    cut_in_place: bool = False


class _CellWarnings(logging.Handler):
    """Appends each WARNING record's text to the collector of the context that emits it."""

    def emit(self, record: logging.LogRecord) -> None:
        into = _CELL_WARNINGS.get()
        if into is not None:
            into.append(record.getMessage())


class _Capture:
    """The one handler on the package logger while any cell collects, and the level it found."""

    def __init__(self) -> None:
        self.handler = _CellWarnings(logging.WARNING)
        self.users = 0
        self.saved: tuple[int, bool] | None = None

    def enter(self) -> None:
        logger = logging.getLogger(PACKAGE_LOGGER)
        if self.users == 0:
            logger.addHandler(self.handler)
            if not logger.isEnabledFor(logging.WARNING):
                # Quieted (the grid's workers raise it to ERROR so the table is not buried):
                # WARNINGs must still be made for the handler, and still printed nowhere.
                self.saved = (logger.level, logger.propagate)
                logger.setLevel(logging.WARNING)
                logger.propagate = False
        self.users += 1

    def exit(self) -> None:
        self.users -= 1
        if self.users:
            return
        logger = logging.getLogger(PACKAGE_LOGGER)
        logger.removeHandler(self.handler)
        if self.saved is not None:
            logger.setLevel(self.saved[0])
            logger.propagate = self.saved[1]
            self.saved = None


_CAPTURE: Final = _Capture()


@contextmanager
def collect_warnings() -> Iterator[list[str]]:
    """The text of every WARNING (and above) the ``maf_compaction`` logger emits in this context.

    Records are attributed through a context variable, so only this code and the tasks it
    starts contribute: two cells running in one event loop each get their own. A logger
    quieted above WARNING is lowered to WARNING for the block with propagation off, so the
    records are made and still reach no other handler.
    """
    collected: list[str] = []
    _CAPTURE.enter()
    token = _CELL_WARNINGS.set(collected)
    try:
        yield collected
    finally:
        _CELL_WARNINGS.reset(token)
        _CAPTURE.exit()


def named_in(text: str) -> frozenset[str]:
    """Every name a log line mentions: its words, split at spaces, commas, brackets and quotes."""
    names: set[str] = set()
    for word in _NAME_SEPARATORS.split(text):
        if word:
            names.update((word, word.rstrip(".:")))
    return frozenset(names)


def lost_facts(
    scenario: Scenario, stored: Sequence[Message], included: str, *, answered: int, warnings: Sequence[str]
) -> list[LostFact]:
    """The planted values the run lost, each with the stored messages that carried it and whether one was named.

    A value is lost when ``included`` (the text the next request would carry) lacks it
    although the conversation gave it: a stored message carries it (its text, or an
    original result a strategy shortened and kept), or the scenario gave it in the system
    prompt or in one of the first ``answered`` turns (a user text, a call's arguments or
    result). A value of a turn the run never finished, and that no stored message
    carries, was never in the conversation and is not lost. A lost value that no stored
    message carries any more (rewritten in place, nothing kept) has no carrier, so it is
    never named. A lost value whose carrier is still in the prompt was cut from it in place
    (only its kept original carries it): ``cut_in_place``.
    """
    given = _given_text(scenario, answered)
    carried = [(_name(message, index), _carried_text(message)) for index, message in enumerate(stored)]
    in_prompt = {
        _name(message, index)
        for index, message in enumerate(stored)
        if not message.additional_properties.get("_excluded", False)
    }
    names = [(text, named_in(text)) for text in warnings]
    lost: list[LostFact] = []
    seen: set[str] = set()
    for fact in scenario.facts:
        if fact.value in seen or fact.value in included:
            continue
        seen.add(fact.value)
        carriers = tuple(name for name, text in carried if fact.value in text)
        if not carriers and fact.value not in given:
            continue
        warning = next((text for text, words in names if any(c in words for c in carriers)), None)
        cut = any(carrier in in_prompt for carrier in carriers)
        lost.append(LostFact(fact.label, fact.value, carriers, warning is not None, warning, cut_in_place=cut))
    return lost


def _name(message: Message, index: int) -> str:
    # A message without an id cannot be named by one; the angle brackets keep it from matching a log word.
    return message.message_id or f"<{message.role} message {index + 1}>"


def _carried_text(message: Message) -> str:
    return "\n".join([context_text([message]), *_strings(original_results(message))])


def _strings(value: JsonValue) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)


def _given_text(scenario: Scenario, answered: int) -> str:
    parts = [scenario.system]
    for turn in scenario.turns[:answered]:
        parts.append(turn.user)
        for call in turn.calls:
            parts += [call.result, *(str(v) for v in call.arguments.values())]
    return "\n".join(parts)
