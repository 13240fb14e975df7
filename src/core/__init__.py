"""The pure core: immutable values in, values out; no framework, no I/O, no state.

This is the public API for a host that runs its own agent loop (another framework, a
plain OpenAI-format message list, a server that keeps history in its own database). It
imports no agent_framework module. docs/core.md shows a host's loop; the names below are
covered by the same compatibility promise as the rest of ``maf_compaction``.

- **Messages and history**: :class:`Part`, :class:`MessageRecord`, :data:`History` and
  :func:`history`; the builders that count a message as the core does (:func:`text_part`,
  :func:`call_part`, :func:`result_part`, :func:`reasoning_part`, :func:`media_part`,
  :func:`message`), and :func:`prompt` / :func:`unchanged` to apply an answer.
- **Configuration**: :class:`AnchoredConfig`, :class:`RecordConfig`,
  :class:`UserSummaryConfig`, :class:`CompositionConfig` (invalid values raise ``ValueError``).
- **Steps**: one pure ``step(config, state, history, measure, *, memo=None)`` per strategy
  (:func:`anchored_step`, :func:`records_step`, :func:`user_summaries_step`,
  :func:`composition_step`) answering :class:`Needs` or :class:`Done`, and each one's check
  of a restored state against its history (``*_check``).
- **Effects**: :class:`Request` (with its :class:`RequestKind` and :class:`Route`), answered
  into the state by :func:`absorb`, each sent with the output cap :func:`max_answer_tokens`
  gives (an answer cut at it is no answer: pass ``None``, or over the cached prefix what :func:`cut_answer` makes
  of it);
  a record strategy's recall protocol around each model request: :func:`record_rule`,
  :func:`request_starting`, :func:`request_sent`.
- **Prompt caches with breakpoints** (Anthropic's ``cache_control``): :func:`strategy_marks`
  answers which messages of a pass's history a request should mark (:class:`CacheMarks`).
- **State**: :class:`State` (records, the composition, user-turn summaries) and
  :class:`AnchoredSnapshot` (the anchored strategy), frozen values that serialize with
  ``to_dict()`` and read back strictly with :func:`read_state` / :func:`read_snapshot`.
"""

from __future__ import annotations

from .anchored import AnchoredConfig
from .anchored import Report as AnchoredReport
from .anchored import check as anchored_check
from .anchored import step as anchored_step
from .answers import absorb, answer_room, cut_answer, max_answer_tokens
from .breakpoints import CacheMarks, strategy_marks
from .composition import CompositionConfig, CompositionReport
from .composition import check as composition_check
from .composition import step as composition_step
from .counting import Measure
from .effects import Request, Route
from .errors import CompactionBudgetExceeded, SnapshotError, SnapshotVersionError
from .host import (
    call_part,
    media_part,
    message,
    prompt,
    read_snapshot,
    read_state,
    reasoning_part,
    record_rule,
    request_sent,
    request_starting,
    result_part,
    text_part,
    unchanged,
)
from .model import History, MessageRecord, Part, history
from .protocol import Done, Needs, Step, sent_tokens
from .recall import PinRule
from .records import RecordConfig, RecordReport
from .records import check as records_check
from .records import step as records_step
from .state import AnchoredSnapshot, Answer, RequestKind, State
from .user_summaries import Outcome, UserReport, UserSummaryConfig
from .user_summaries import check as user_summaries_check
from .user_summaries import step as user_summaries_step

__all__ = [
    "AnchoredConfig",
    "AnchoredReport",
    "AnchoredSnapshot",
    "Answer",
    "CacheMarks",
    "CompactionBudgetExceeded",
    "CompositionConfig",
    "CompositionReport",
    "Done",
    "History",
    "Measure",
    "MessageRecord",
    "Needs",
    "Outcome",
    "Part",
    "PinRule",
    "RecordConfig",
    "RecordReport",
    "Request",
    "RequestKind",
    "Route",
    "SnapshotError",
    "SnapshotVersionError",
    "State",
    "Step",
    "UserReport",
    "UserSummaryConfig",
    "absorb",
    "anchored_check",
    "anchored_step",
    "answer_room",
    "call_part",
    "composition_check",
    "composition_step",
    "cut_answer",
    "history",
    "max_answer_tokens",
    "media_part",
    "message",
    "prompt",
    "read_snapshot",
    "read_state",
    "reasoning_part",
    "record_rule",
    "records_check",
    "records_step",
    "request_sent",
    "request_starting",
    "result_part",
    "sent_tokens",
    "strategy_marks",
    "text_part",
    "unchanged",
    "user_summaries_check",
    "user_summaries_step",
]
