"""Requests over the cached prefix: the conversation's own request, plus one instruction.

The core asks for them as :class:`~maf_compaction.core.effects.Request` effects routed
:attr:`~maf_compaction.core.effects.Route.CACHED_PREFIX` (a record, or a summary that
carries its view). The shell sends the messages of the view (the
conversation's last request, byte for byte, as the core cut it) with the head of the last
unpinned request as the recall middleware saw it sent (its chat client and options:
instructions, tools, ``tool_choice``, the rest), and one user message at the end, with the
output cap the core gives the request (:func:`~maf_compaction.core.max_answer_tokens`, never
above the request's own ``max_tokens``; an answer cut at it is judged as one that did not follow the
instruction, or, cut at the request's own cap below what a kept answer may hold, by its complete lines:
:func:`~maf_compaction.core.answers.cut_answer`). The
request goes to the chat client's own provider layer: no function loop runs a tool the
model calls, no middleware sees it, and nothing of it enters history but the answer.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from agent_framework import BaseChatClient, ChatResponse, Content, Message
from agent_framework._sessions import is_local_history_conversation_id

from ..core.answers import answer_room, cut_answer, max_answer_tokens
from ..core.counting import Measure
from ..core.effects import CALLED_INSTEAD, Request
from ..core.records import RECALL_TOOL_NAME
from ..core.state import RequestKind
from . import telemetry

logger = logging.getLogger("maf_compaction")


@dataclass(frozen=True, slots=True)
class SentHead:
    """The head of a request as it was sent: the chat client and the options it was sent with.

    The client is held weakly: a conversation's state must not keep its agent's client
    (and, through the client's middleware, a whole replica) alive.

    Attributes:
        client_ref: The chat client the request went through, weakly.
        options: A copy of its options (the function loop changes its own dict later).
    """

    client_ref: Callable[[], Any]
    options: Mapping[str, Any]

    @classmethod
    def of(cls, client: Any, options: Mapping[str, Any] | None) -> SentHead:
        """The head of a request sent through ``client`` with ``options`` (copied).

        The framework's local-history marker (a ``conversation_id`` the function loop sets
        within a run and strips before the provider) is left out: the provider never sees it.
        """
        try:
            client_ref: Callable[[], Any] = weakref.ref(client)
        except TypeError:  # a client that cannot be referenced weakly is held
            client_ref = lambda: client  # noqa: E731
        copied = dict(options or {})
        if is_local_history_conversation_id(copied.get("conversation_id")):
            del copied["conversation_id"]
        return cls(client_ref, copied)


async def _unchanged(messages: list[Message]) -> bool:
    """A compaction strategy that changes nothing: a client-level strategy must not run on our request."""
    del messages
    return False


async def ask_over_prefix(
    head: SentHead | None,
    sent: Sequence[Message],
    request: Request,
    owner: str,
    measure: Measure,
    *,
    on_cut: Callable[[], None] | None = None,
) -> str | None:
    """Send ``sent`` plus ``request.instruction`` with ``head``; the answer's text (empty when it has none), or
    ``None`` on a failure.

    A recall call in the answer counts as its ``values`` argument; otherwise the answer's
    text. An ordinary exception is a failure (logged, never raised: history stays as it
    is, and what no record or summary replaces stays or is kept by the safety net). An
    answer the provider cut at the request's output cap (:func:`capped_options`) is judged
    as one that did not follow the instruction (``""``): asked again, it would be cut again
    (``on_cut`` counts it). One cut at the agent's own ``max_tokens``, below what a kept answer may
    hold, is no runaway: its complete lines are judged as any answer is (a record keeps the groups
    it quotes, a summary passes the summary check or is asked again; :func:`~.core.answers.cut_answer`),
    so a host's small cap costs the records it cannot hold, never the route. Cancellation propagates.
    """
    record = request.kind is RequestKind.RECORD
    what = "a record" if record else f"a {request.kind.value}"
    stays = "the tool results stay as they are" if record else "the turns stay as they are"
    client = head.client_ref() if head is not None else None
    if head is None or client is None:
        logger.warning(
            "%s could not ask for %s over the cached prefix: no request of this conversation has been seen sent "
            "(install ToolResultRecallMiddleware on the agent), or its chat client is gone; %s",
            owner,
            what,
            stays,
        )
        return None
    messages = [*sent, Message("user", [request.instruction])]
    strategy = _unchanged if getattr(client, "compaction_strategy", None) is not None else None
    try:
        # The provider layer itself: the function loop would run a tool the model calls, and the client's
        # middleware belongs to the agent's own requests.
        options = capped_options(head.options, request, measure)
        telemetry.note_cap(options.get("max_tokens"))
        pending: Any = BaseChatClient.get_response(
            client, messages, stream=False, options=cast("Any", options), compaction_strategy=strategy
        )
        response: ChatResponse = await pending
    except Exception as error:  # the provider is outside our control; cancellation propagates
        telemetry.note_failure(error)
        logger.warning(
            "%s asked for %s over the cached prefix and the request failed (%s: %s); %s",
            owner,
            what,
            type(error).__name__,
            error,
            stays,
        )
        return None
    telemetry.note_response(response)
    if response.finish_reason == "length":
        if on_cut is not None:
            on_cut()
        written = cut_answer(request, answer_text(response), measure, limit=_own_cap(head.options)[0])
        if not written:
            # A runaway: answered, not as asked (the same request would be cut again, so it is no failure to retry).
            cut_at_cap(
                response, owner, what, options.get("max_tokens"), stays, verdict="did not follow the instruction"
            )
            return ""
        telemetry.note_cut(kept_as_written=True)
        logger.warning(
            "%s: the answer to %s reached the agent's own output cap (max_tokens=%s), below what a kept answer may "
            "hold; its complete lines are judged as any answer is",
            owner,
            what,
            options.get("max_tokens"),
        )
        return written
    text = answer_text(response)
    if text is None:  # an answer all the same (the provider is up): judged as one that ignored the instruction
        logger.warning("%s asked for %s over the cached prefix and got no text; %s", owner, what, stays)
    return text or ""


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _own_cap(options: Mapping[str, Any]) -> tuple[int | None, int]:
    """The output cap ``options`` (a request's) set, if any, and the extended-thinking budget it spends before
    answering when thinking is enabled (``thinking``), which Anthropic counts toward that cap (0 when off)."""
    thinking: Any = options.get("thinking")
    enabled = isinstance(thinking, Mapping) and thinking.get("type", "enabled") == "enabled"  # pyright: ignore[reportUnknownMemberType]
    budget = _count(thinking.get("budget_tokens")) if enabled else None  # pyright: ignore[reportUnknownMemberType]
    return _count(options.get("max_tokens")), budget or 0


def head_answer_room(head: SentHead | None) -> int | None:
    """What an answer over the cached prefix may hold when it repeats ``head`` (:func:`~.core.answers.answer_room`
    of its output cap and thinking budget; ``None``: no request seen yet, or no cap set)."""
    if head is None:
        return None
    return answer_room(*_own_cap(head.options))


def capped_options(options: Mapping[str, Any], request: Request, measure: Measure) -> dict[str, Any]:
    """``options`` (the conversation's own request's) with ``max_tokens`` set to ``request``'s output cap.

    The cap never rises above the request's own ``max_tokens``, and leaves room for an enabled
    extended-thinking budget (``thinking``), which Anthropic counts toward it.
    """
    capped = dict(options)
    own, thinking = _own_cap(capped)
    cap = max_answer_tokens(request, measure, limit=own, thinking=thinking)
    if cap is not None:
        capped["max_tokens"] = cap
    return capped


def cut_at_cap(
    response: ChatResponse, owner: str, what: str, cap: object, stays: str, *, verdict: str = "failed"
) -> bool:
    """Whether the provider cut ``response`` at its output cap (``finish_reason`` ``"length"``), warned about:
    such an answer is no record or summary (it would miss what it had left to write); the WARNING says what it
    counts as (``verdict``)."""
    if response.finish_reason != "length":
        return False
    telemetry.note_cut()
    logger.warning(
        "%s: the answer to %s reached its output cap (max_tokens=%s) and counts as one that %s; %s",
        owner,
        what,
        cap,
        verdict,
        stays,
    )
    return True


def answer_text(response: ChatResponse) -> str | None:
    """What ``response`` answers: a recall call's ``values`` argument, else its text, else the calls it made.

    A call of any other tool is a model that went on with the task instead of following
    the instruction: it is answered as a line naming the call, which the core judges (it
    quotes nothing it was asked about), and no tool runs.
    """
    calls = function_calls(response)
    for call in calls:
        if call.name != RECALL_TOOL_NAME:
            continue
        arguments: object = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return arguments.strip() or None
        if isinstance(arguments, Mapping):
            values = arguments.get("values")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
            if isinstance(values, str) and values.strip():
                return values
    text = response.text
    if isinstance(text, str) and text.strip():
        return text
    return " ".join(f"{CALLED_INSTEAD}{c.name}]" for c in calls if c.name != RECALL_TOOL_NAME) or None


def function_calls(response: ChatResponse) -> list[Content]:
    """The function calls in ``response``, in order."""
    return [content for message in response.messages for content in message.contents if content.type == "function_call"]
