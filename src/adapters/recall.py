"""Recall: the tool the model writes records with, its gate, and the middleware that asks for records.

On its way out of each model call, :class:`ToolResultRecallMiddleware` reads the loaded
history and decides whether a record is due on the NEXT call. The record is then asked for
one of two ways. Over the cached prefix (``record_request="cached_prefix"``): the compaction
pass inside that call sends the conversation's own request plus one instruction (the
middleware remembers the head every unpinned request was sent with), and the answer becomes
a written record. Pinned (``"pinned"``): the call is forced to call
``recall_earlier_tool_results``; it carries only a named ``tool_choice`` (and a response cap),
because the tool's description (:func:`make_recall_tool`) is the whole prompt for the record.

The tool is registered with the agent for good, and the framework cannot hide a tool from
the model, so :class:`RecallGate` keeps it inert unless the middleware armed it for a
forced request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal

from agent_framework import (
    ChatContext,
    ChatMiddleware,
    ChatResponse,
    ChatResponseUpdate,
    FunctionTool,
    Message,
    MiddlewareFailure,
    MiddlewareTermination,
    ResponseStream,
    tool,
)

from ..core import recall as machine
from ..core import records as records_core
from ..core.checks import AtLeastOne, Fraction, require, require_sync_callable, require_tokenizer
from ..core.errors import CompactionBudgetExceeded
from ..core.recall import PinKind, PinRule
from ..core.records import (
    RECALL_TOOL_NAME,
    RECORD_RECEIPT,
    RecordConfig,
    StatusMemo,
    on_recall,
    recall_status,
    reforce_pending,
)
from ..core.stack import with_armed
from ..core.state import State
from .aligned import SentHead, function_calls
from .conversation import Conversation
from .convert import HistoryCache
from .counting import Tokenizer, as_estimator
from .loop import NOTE_KIND, tell_route

logger = logging.getLogger("maf_compaction")

#: What the tool answers when nobody asked for a record: not a record (no marker).
NOT_NEEDED_REPLY: Final = "No record is needed now: nothing was recorded and nothing was removed."
#: The record size the tool asks for: the record strategy's ``record_target_tokens`` default.
DEFAULT_TARGET_TOKENS: Final = records_core.DEFAULT_RECORD_TARGET_TOKENS
#: How a record is asked for: a pinned request (``tool_choice`` names the recall tool), or the
#: conversation's own request plus one instruction, sent by the compaction pass (its input is cached).
RecordRequest = Literal["pinned", "cached_prefix"]
#: Exceptions that stop a run on purpose, or before the request was sent (a compaction pass that
#: cannot fit the budget): like cancellation, they are never retried and never judged as the provider's.
_ABORTS: Final = (MiddlewareTermination, MiddlewareFailure, CompactionBudgetExceeded)


class RecallGate:
    """A one-shot permission for the recall tool to write a record.

    The registered tool cannot be hidden from the model, so it stays inert unless the
    middleware armed it for a forced request: a record the model volunteers at any other
    time is answered with a sentence that records nothing. :meth:`take` spends the
    permission, so one forced request yields at most one record.

    The permission is the recall protocol's ``armed`` flag in a conversation's state: the
    gate's own until a :class:`CompactionStack` attaches it to its strategy's conversation,
    so the stack's one value carries it.
    """

    def __init__(self) -> None:
        self.conversation: Conversation[State] = Conversation(State())

    @property
    def armed(self) -> bool:
        """Whether the next recall call may record."""
        return self.conversation.value.recall.armed

    def arm(self) -> None:
        """Permit one record (the middleware calls this on a forced request)."""
        self._set(True)

    def disarm(self) -> None:
        """Withdraw the permission (the middleware calls this on every unforced request)."""
        self._set(False)

    def take(self) -> bool:
        """Return whether a record is permitted, and withdraw the permission."""
        armed = self.armed
        self.disarm()
        return armed

    def attach(self, conversation: Conversation[State]) -> None:
        """Keep the permission in ``conversation``'s state from now on (a stack attaches its gate to its strategy)."""
        conversation.value = with_armed(conversation.value, self.armed)
        self.conversation = conversation

    def _set(self, armed: bool) -> None:
        self.conversation.value = with_armed(self.conversation.value, armed)


def recall_description(target_tokens: int | None = DEFAULT_TARGET_TOKENS) -> str:
    """The recall tool's description: the whole prompt the model gets for a record.

    Args:
        target_tokens: The size to aim for, or ``None`` to state no size.

    Returns:
        Three parts joined by blank lines: the purpose, the size to aim for (only with a
        target), and what ``values`` must hold.

    Raises:
        ValueError: ``target_tokens`` is not a positive integer or ``None``.
    """
    require("target_tokens", target_tokens, AtLeastOne | None)
    parts = [f"Record {records_core.RECORD_PURPOSE}"]
    if target_tokens is not None:
        parts.append(
            f"Aim for about {target_tokens:,} tokens in total, spent on the values that cannot be "
            "reconstructed rather than on summaries."
        )
    parts.append(f"Args:\n    values: {records_core.RECORD_GUIDANCE}")
    return "\n\n".join(parts)


def make_recall_tool(
    gate: RecallGate | None = None, *, target_tokens: int | None = DEFAULT_TARGET_TOKENS
) -> FunctionTool:
    """The ``recall_earlier_tool_results`` tool the model writes records with.

    Register it with the agent (it must be in the request for a named ``tool_choice`` to
    work). Its description is the entire prompt for the record: nothing else is injected.

    Args:
        gate: The gate the middleware arms. With a gate, a call records only when the gate
            was armed (one record per arming); otherwise it answers that no record is needed,
            recording and removing nothing. Without a gate every call records.
        target_tokens: The record size the description asks for; match the record
            strategy's ``record_target_tokens``. ``None`` states no size.

    Returns:
        A framework ``FunctionTool`` with one string parameter, ``values``.

    Raises:
        ValueError: ``gate`` is not a :class:`RecallGate` or ``None``, or ``target_tokens``
            is not a positive integer or ``None``.
    """
    if gate is not None and not isinstance(gate, RecallGate):
        raise ValueError(f"gate must be a RecallGate or None, got {gate!r}")

    def recall_earlier_tool_results(values: str) -> str:
        del values  # the record is the call's argument: the strategy reads it there
        return record_reply(gate)

    return recall_tool(recall_earlier_tool_results, target_tokens)


def recall_tool(function: Callable[..., Any], target_tokens: int | None) -> FunctionTool:
    """``function`` (taking ``values``) as the ``recall_earlier_tool_results`` tool, described for ``target_tokens``.

    Raises:
        ValueError: ``target_tokens`` is not a positive integer or ``None``.
    """
    return tool(
        function,
        name=RECALL_TOOL_NAME,
        description=recall_description(target_tokens),
        approval_mode="never_require",
    )


def record_reply(gate: RecallGate | None) -> str:
    """What the recall tool answers: a receipt for the record its call carries (one per arming of ``gate``; the
    prompt carries the call's arguments already, so the result does not repeat them), or that none is needed."""
    if gate is not None and not gate.take():
        return NOT_NEEDED_REPLY
    return RECORD_RECEIPT


class ToolResultRecallMiddleware(ChatMiddleware):
    """Pins the next model call to the recall tool when a record is due.

    On its way out of each model call it reads the loaded history (under
    ``create_harness_agent`` chat middleware sees only the new messages on the way in;
    the history middleware inside it has loaded the whole conversation by the time
    ``call_next`` returns) and decides whether the NEXT call is forced. The first rule
    that matches decides:

    1. ``reforce()`` returns True (the record strategy asks again for uncovered groups): pin;
    2. ``max_groups_before_record`` is set and at least that many tool groups arrived
       since the newest record: pin, even below the size trigger;
    3. a record exists, ``repeat_records`` is on, ``repeat_fraction`` is set and the tool
       groups that arrived since it send at least that share of the budget: pin, even below
       the size trigger;
    4. a record exists and ``repeat_records`` is off, or fewer than
       ``min_groups_before_repeat`` tool groups arrived since it: no pin;
    5. otherwise pin iff the prompt exceeds ``int(max_input_tokens * trigger_fraction)``.

    So the first size-triggered record is asked for at once, later ones only once enough
    new tool material exists to be worth a record.

    A decided pin is spent one of two ways (``record_request``). ``"cached_prefix"``: the
    request goes out as the caller asked, and the compaction pass inside it asks for the
    record with the conversation's own request plus one instruction (read from the
    provider's cache); this middleware remembers, after every unpinned request, the head it
    was sent with (client and options), which that request repeats. ``"pinned"``: the
    request is forced to call the recall tool. Pinned records fall back to the cached
    prefix once pins are disabled (two forced responses without a recall call, or a
    forced request that failed); records over the cached prefix fall back to pins after
    two answers that ignored the instruction; with both disabled no record is asked for.

    A forced call gets a new options dict (the caller's own is the function loop's dict
    and is never changed) with ``tool_choice`` naming the recall tool and, when
    ``record_max_tokens`` is set, that ``max_tokens``; the gate is armed for it. Forced
    streams are buffered until complete. An ordinary exception from a forced request
    disables forcing and retries once with the caller's options; cancellation and the
    framework's middleware abort signals propagate untouched.

    One instance serves one conversation: a second session raises ``RuntimeError``.

    Args:
        max_input_tokens: The input budget, as given to the record strategy.
        tokenizer: Any ``count_tokens(text) -> int`` tokenizer; the same as the strategy's.
        arm: Called before a forced request (``RecallGate.arm``).
        disarm: Called before every other request (``RecallGate.disarm``).
        trigger_fraction: Share of the budget above which a record is due, in (0, 1].
        record_max_tokens: The response cap of a forced request, or ``None`` to leave
            the caller's cap.
        max_groups_before_record: Pin after this many new tool groups even below the
            trigger; ``None`` turns the bound off.
        repeat_records: Ask for further size-triggered records after the first.
        min_groups_before_repeat: New tool groups a further size-triggered record waits for.
        repeat_fraction: Share of the budget, in (0, 1], at which the tool groups since the
            newest record make the next record due at once, however few they are and below the
            trigger too (one large result is worth a record alone: re-read on every call until
            the trigger or more groups arrive, it costs more than the record); ``None``
            (default) leaves ``min_groups_before_repeat`` and the trigger the only bounds.
        reforce: A callable returning True once per wanted record, called once per
            decision (never for the :meth:`record_due` preview).
        record_payoff_share: New tool groups make a record due only where their record would
            pay: its expected size (the group's distinct values and a little prose) at most this
            share of the group, in (0, 1]; ``None`` (default) counts every group. It must be the
            record strategy's ``record_payoff_share``.
        record_request: ``"pinned"`` (default) or ``"cached_prefix"``: how a due record is
            asked for (see above). The record strategy's
            ``take_reforce`` also makes the middleware share the strategy's state (the
            preview then reads its outstanding ask for uncovered groups), and its
            ``max_input_tokens``, ``trigger_fraction`` and ``record_payoff_share`` must be the strategy's (another
            value raises ``ValueError`` naming both); a host that wraps ``take_reforce``
            calls ``strategy.bind_recall(middleware)`` to share the state.

    Attributes:
        forced_calls: Pinned requests sent (aborted ones included).
        reforced_calls: Pinned requests whose pin came from ``reforce``.
        ignored_forced_calls: Forced responses without a recall call (truncated ones included):
            noncompliance, not its cause.
        failed_forced_calls: Forced requests that raised an ordinary exception (each was retried unpinned).
        records_truncated: Forced responses that ended at the response cap (``finish_reason == "length"``).

    Raises:
        ValueError: A parameter is outside its range (the message names it).
    """

    def __init__(
        self,
        *,
        max_input_tokens: int,
        tokenizer: Tokenizer,
        arm: Callable[[], object],
        disarm: Callable[[], object] | None = None,
        trigger_fraction: float = machine.DEFAULT_TRIGGER_FRACTION,
        record_max_tokens: int | None = machine.DEFAULT_RECORD_MAX_TOKENS,
        max_groups_before_record: int | None = None,
        repeat_records: bool = True,
        min_groups_before_repeat: int = machine.DEFAULT_MIN_GROUPS_BEFORE_REPEAT,
        repeat_fraction: float | None = None,
        reforce: Callable[[], bool] | None = None,
        record_payoff_share: float | None = None,
        record_request: RecordRequest = "pinned",
    ) -> None:
        require("max_input_tokens", max_input_tokens, AtLeastOne)  # the pin rule checks the rest
        require("trigger_fraction", trigger_fraction, Fraction)
        require("repeat_fraction", repeat_fraction, Fraction | None)
        require("record_payoff_share", record_payoff_share, Fraction | None)
        require("record_request", record_request, RecordRequest)
        require_sync_callable("arm", arm, kind="a callable taking no arguments")
        for name, value in (("disarm", disarm), ("reforce", reforce)):
            if value is not None:
                require_sync_callable(name, value, kind="a callable taking no arguments or None")
        require_tokenizer("tokenizer", tokenizer)
        self._max_input_tokens = max_input_tokens
        self._trigger_fraction = float(trigger_fraction)
        self._rule = PinRule(
            trigger_tokens=int(max_input_tokens * trigger_fraction),
            max_groups_before_record=max_groups_before_record,
            repeat_records=repeat_records,
            min_groups_before_repeat=min_groups_before_repeat,
            repeat_tokens=machine.repeat_tokens(max_input_tokens, repeat_fraction),
            record_max_tokens=record_max_tokens,
            aligned=record_request == "cached_prefix",
            payoff_share=None if record_payoff_share is None else float(record_payoff_share),
        )
        self._arm = arm
        self._disarm = disarm
        # Called once per decision, the strategy's own take_reforce as any host callable; the
        # strategy's is bound to it, and this middleware then shares its conversation.
        self._reforce = reforce
        self.conversation: Conversation[State] = Conversation(State())
        owner = getattr(reforce, "__self__", None)
        if getattr(reforce, "__name__", None) == "take_reforce" and isinstance(
            getattr(owner, "config", None), RecordConfig
        ):
            self.share(owner.conversation, owner.config)  # pyright: ignore[reportOptionalMemberAccess]
        self._histories = HistoryCache(as_estimator(tokenizer).parts)
        self._measure = tokenizer.count_tokens
        self._status_memo: StatusMemo | None = None  # the last status's grouping and payoff decisions: never a decision
        self._session_id: str | None = None
        self.forced_calls = 0
        self.reforced_calls = 0
        self.ignored_forced_calls = 0
        self.failed_forced_calls = 0
        self.records_truncated = 0

    def _agree(self, config: RecordConfig) -> None:
        """The strategy whose state this middleware shares has this middleware's budget and trigger."""
        for name, ours, theirs in (
            ("max_input_tokens", self._max_input_tokens, config.max_input_tokens),
            ("trigger_fraction", self._trigger_fraction, config.trigger_fraction),
            ("record_payoff_share", self._rule.payoff_share, config.payoff_share),
        ):
            if ours != theirs:
                raise ValueError(
                    f"ToolResultRecallMiddleware's {name} must be the {name} of the record strategy whose state it "
                    f"shares (reforce=strategy.take_reforce, or strategy.bind_recall): the strategy has {theirs!r}, "
                    f"the middleware got {ours!r}"
                )

    def share(self, conversation: Conversation[State], config: RecordConfig) -> None:
        """Read and write ``conversation`` (a record strategy's, configured by ``config``); see ``bind_recall``."""
        self._agree(config)
        conversation.value = machine.adopted(conversation.value, self.conversation.value)
        conversation.recall_shared = True
        self.conversation = conversation

    def shares(self, conversation: Conversation[State]) -> bool:
        """Whether this middleware reads and writes ``conversation`` (a record strategy's)."""
        return self.conversation is conversation

    def arms(self, gate: RecallGate) -> bool:
        """Whether ``arm`` (and ``disarm``, when given) are ``gate``'s own methods."""
        bound = [self._arm] if self._disarm is None else [self._arm, self._disarm]
        return all(getattr(method, "__self__", None) is gate for method in bound)

    # --- configuration and diagnostics --------------------------------------------------

    @property
    def max_input_tokens(self) -> int:
        """The input budget."""
        return self._max_input_tokens

    @property
    def trigger_fraction(self) -> float:
        """Share of the budget above which a size-triggered record is due."""
        return self._trigger_fraction

    @property
    def pin_rule(self) -> PinRule:
        """The pin rule's bounds: its trigger in tokens, the tool-group bounds, the pinned response cap."""
        return self._rule

    @property
    def pin_disabled(self) -> bool:
        """Forcing stopped for this session: two ignored pins in a row, a failed forced request, or (with
        ``record_request="cached_prefix"``, which never pins) the cached prefix's route disabled too."""
        return machine.pins_given_up(self.conversation.value.recall)

    @property
    def awaiting_record(self) -> bool:
        """The last completed call was forced; the record it asked for is not judged yet."""
        return self.conversation.value.recall.awaiting_record

    # --- public decisions ----------------------------------------------------------------

    def record_due(self) -> bool:
        """Whether a record would be asked for on the next request (pinned or over the cached prefix), without
        consuming anything.

        Answers from the last history seen (``False`` before any call): a pin already
        decided counts, and so does the record strategy's outstanding ask when this
        middleware shares its state (a host's own ``reforce`` callable is never called
        for a preview).
        """
        state = self.conversation.value
        return machine.record_due(self._rule, state.recall, reforce_pending=reforce_pending(state.records))

    def forget_pending(self) -> None:
        """Drop queued work: the pending pin, the awaiting flag and the session binding.

        The provider-support verdict (``pin_disabled`` and the ignored streak) stays: it
        describes the provider, not the queued work. The gate is disarmed.
        """
        self.conversation.value = machine.forget_pending(self.conversation.value)
        self._session_id = None
        self._release()

    # --- the middleware --------------------------------------------------------------------

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        """Pin this call if the previous one decided so; decide about the next on the way out.

        Args:
            context: The chat call.
            call_next: The rest of the chain.

        Raises:
            RuntimeError: The call belongs to another session than the first one seen.
        """
        self._bind(context)
        self.conversation.requests_seen += 1
        if self.conversation.head is None:
            # A conversation this instance has not seen sent (a restore, a new replica, a rebuilt stack): the
            # caller's head until the request has gone out (providers may add instructions and tools on the way).
            self._sent(context)
        action = self._advance(machine.RequestStarting(forcible=not _thinks(context.options)))
        if not isinstance(action, machine.Pin):
            self._release()
            await call_next()
            self._sent(context)
            self._decide(context.messages)
            return
        await self._forced(context, call_next, action)

    async def _forced(self, context: ChatContext, call_next: Callable[[], Awaitable[None]], pin: machine.Pin) -> None:
        caller_options = context.options
        caller_messages = list(context.messages)
        if not _declares_recall_tool(caller_options):
            self._advance(machine.ForcedAborted(pin.kind))  # the pin stands: refused again until the wiring is fixed
            raise RuntimeError(
                f"ToolResultRecallMiddleware would force this request to call {RECALL_TOOL_NAME}, but the request "
                f"declares no tool of that name (a provider rejects a tool_choice naming an undeclared tool): add "
                "the recall tool to the agent's tools (stack.tool, make_recall_tool(gate), or "
                "make_session_recall_tool(registry)), or ask for records over the cached prefix "
                '(record_request="cached_prefix"), which needs no tool'
            )

        async def call_again() -> object:
            """Run the rest of the chain again, exactly as the caller asked (no pin, no cap)."""
            context.options = caller_options
            # The history middleware rebuilt ``messages`` from the incoming ones; hand it those again.
            context.messages = list(caller_messages)
            context.result = None
            await call_next()
            return context.result

        self._arm()
        self.forced_calls += 1
        self.reforced_calls += pin.kind == "reforce"
        context.options = self._pinned_options(caller_options, pin)
        try:
            await call_next()
        except BaseException as exc:
            self._fail(exc, pin.kind)
            await call_again()
            self._decide(context.messages)
            return
        finally:
            context.options = caller_options
        result = context.result
        if isinstance(result, ResponseStream):
            context.result = self._buffered(result, context, call_again, pin.kind)
        elif isinstance(result, ChatResponse):
            self._judge(result)
        # The record this call asks for reaches history only after the tool runs, so the
        # exit of a forced call decides nothing.
        self._advance(machine.ForcedReturned())

    def _buffered(
        self,
        inner: ResponseStream[ChatResponseUpdate, ChatResponse],
        context: ChatContext,
        call_again: Callable[[], Awaitable[object]],
        pin: PinKind,
    ) -> ResponseStream[ChatResponseUpdate, ChatResponse]:
        """Hold a forced stream until it completes; on an ordinary failure, stream a retry (``call_again``) instead.

        The returned stream's source consumes the forced stream to its end, finalizer and
        result hooks included (the history middleware persists the turn in one of them),
        before it releases the first update, so a failed attempt shows the caller no
        partial text or tool call. The retry streams normally.

        The framework's ``buffer_updates()`` is not used on the forced stream: it refuses
        to release updates once a result hook returned a response (the history
        middleware's does) unless the updates can be rebuilt from the final response,
        which would not replay what the provider streamed.
        """
        # How the forced stream ended: its own final response, or the retry's stream.
        response: ChatResponse | None = None
        retry: ResponseStream[ChatResponseUpdate, ChatResponse] | None = None

        async def updates() -> AsyncIterator[ChatResponseUpdate]:
            nonlocal response, retry
            held: list[ChatResponseUpdate] = []
            try:
                async for update in inner:
                    held.append(update)
                complete = await inner.get_final_response()
            except BaseException as exc:
                self._fail(exc, pin)
                outer = context.result
                stream = await call_again()
                context.result = outer
                if not isinstance(stream, ResponseStream):
                    raise ValueError("Streaming chat middleware requires a ResponseStream result.") from exc
                retry = stream
                async with stream:
                    async for update in stream:
                        yield update
                return
            self._judge(complete)
            response = complete
            for update in held:
                yield update

        async def final(_: Sequence[ChatResponseUpdate]) -> ChatResponse:
            # The inner final response carries the continuation state the function loop
            # needs (the history middleware's conversation sentinel); return it, not a rebuild.
            if response is not None:
                return response
            if retry is not None:
                return await retry.get_final_response()
            raise RuntimeError("The forced recall stream ended before it produced a response.")

        return ResponseStream(updates(), finalizer=final)

    # --- bookkeeping -------------------------------------------------------------------------

    def _advance(self, event: machine.Event) -> machine.Action:
        """One transition of the recall protocol on the shared state."""
        before = self.conversation.value
        self.conversation.value, action = on_recall(self._rule, before, event)
        tell_route(type(self).__name__, before, self.conversation.value)
        return action

    def _bind(self, context: ChatContext) -> None:
        session = context.session
        if session is None:
            return
        if self._session_id is None:
            self._session_id = session.session_id
        elif session.session_id != self._session_id:
            raise RuntimeError(
                f"ToolResultRecallMiddleware serves one session ({self._session_id!r}) but was called for "
                f"{session.session_id!r}: build one middleware, gate and strategy per session, or use the "
                "session registry to serve many sessions."
            )

    def _sent(self, context: ChatContext) -> None:
        """Remember the head of the request just sent unpinned: a record asked over the cached prefix repeats it."""
        self.conversation.head = SentHead.of(context.client, context.options)

    def _release(self) -> None:
        if self._disarm is not None:
            self._disarm()

    def _pinned_options(self, caller: Mapping[str, Any] | None, pin: machine.Pin) -> dict[str, Any]:
        options = {**(caller or {}), "tool_choice": {"mode": "required", "required_function_name": RECALL_TOOL_NAME}}
        if pin.max_tokens is not None:
            options["max_tokens"] = pin.max_tokens
        return options

    def _fail(self, exc: BaseException, pin: PinKind) -> None:
        """Count an ordinary failure of a forced request (the caller retries it); re-raise an abort or a
        cancellation, which leaves the pin unspent."""
        if isinstance(exc, _ABORTS) or not isinstance(exc, Exception):
            self._advance(machine.ForcedAborted(pin))
            raise exc
        self.failed_forced_calls += 1
        self._advance(machine.ForcedFailed())
        self._release()
        logger.warning(
            "A request forced to call %s failed (%s: %s); forcing recall is disabled for this session "
            "and the request is retried once with the caller's own options.",
            RECALL_TOOL_NAME,
            type(exc).__name__,
            exc,
        )

    def _judge(self, response: ChatResponse) -> None:
        """The provider-support verdict on one complete forced response."""
        self.records_truncated += response.finish_reason == "length"
        called = any(call.name == RECALL_TOOL_NAME for call in function_calls(response))
        self.ignored_forced_calls += not called
        action = self._advance(machine.ForcedResponse(called_recall=called))
        if isinstance(action, machine.Disable):
            logger.warning(
                "%d consecutive responses forced to call %s did not call it; forcing recall is disabled for "
                "this session. The provider route may not honour a named tool_choice.",
                action.streak,
                RECALL_TOOL_NAME,
            )

    def _decide(self, messages: Sequence[Message]) -> None:
        history = self._histories.history(messages, note_kind=NOTE_KIND)
        status, self._status_memo = recall_status(
            history, self._status_memo, measure=self._measure, payoff_share=self._rule.payoff_share
        )
        # The reforce callable is asked once per decision (a record asked for while pins are disabled goes over
        # the cached prefix).
        reforce = self._reforce is not None and bool(self._reforce())
        self._advance(machine.HistorySeen(status, reforce=reforce))


def _thinks(options: Mapping[str, Any] | None) -> bool:
    """The request turns Anthropic's extended thinking on (``thinking``: enabled or adaptive), which forbids a
    ``tool_choice`` naming a tool: a record due on it is asked for over the cached prefix instead."""
    thinking = (options or {}).get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")  # pyright: ignore[reportUnknownMemberType]


def _declares_recall_tool(options: Mapping[str, Any] | None) -> bool:
    """The request's options declare the recall tool (a tool object or a provider-shaped declaration)."""
    for given in (options or {}).get("tools") or ():
        declared = given.get("function", given) if isinstance(given, Mapping) else given
        name = declared.get("name") if isinstance(declared, Mapping) else getattr(declared, "name", None)
        if name == RECALL_TOOL_NAME:
            return True
    return False
