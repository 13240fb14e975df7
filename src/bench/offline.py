"""Try an agent without a provider key: the real OpenAI client against a scripted model on 127.0.0.1.

:class:`OfflineProvider` serves the OpenAI Responses and Chat Completions APIs on a loopback
port (:class:`~.loopback.LoopbackProvider`) with a scripted model that plays the
:class:`Question` s it is given: for each question it calls the named tool with the given
arguments, then answers by quoting the expected values it can still see. Its simulated
provider bills every call with a prompt cache. Point any framework OpenAI client at
:attr:`OfflineProvider.base_url` (``OpenAIChatClient(..., base_url=offline.base_url)``, or
``OPENAI_BASE_URL``), run your agent, and :meth:`OfflineProvider.report` says, call by call,
how large the prompt was, how much of it the cache served, what each compaction request was
(a record, a summary, a merge, a fold), and what compaction took out of the prompt before the
call and why (the lines the strategies log on the ``maf_compaction`` logger); it ends with the
totals (:meth:`OfflineProvider.totals`): the cost, the cached share, and the same conversation
without compaction, priced alongside.

It needs the ``bench`` extra. The model is a script, not a language model: it answers compaction
requests as the bench's plausible model does (prose, then the values it finds by a generic rule:
identifiers, numbers with units, key=value pairs), so your own values get records; it is there to
show what compaction does to the requests, not what a model would answer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal

from .args import install_hint

try:
    from .loopback import LoopbackProvider
    from .model import ModelOptions, ScriptedModel
    from .provider import TASK, CallRecord, SimulatedProvider, default_ttl
    from .rendering import RenderedRequest
    from .scenario import Probe, Scenario, ToolCall, ToolSpec, Turn
    from .simulator import get_profile
except ModuleNotFoundError as error:  # a dependency of the bench extra: named, with the command that installs it
    if not error.name or error.name.startswith("maf_compaction"):
        raise
    raise ImportError(
        f"maf_compaction.bench.offline needs {error.name}, which the bench extra installs: {install_hint(error.name)}",
        name=error.name,
    ) from error

_LOGGER = "maf_compaction"
_SHORTENED = "[... removed by compaction: "
_PREVIEW_CHARS = 48
_PREVIEWS = 2


def _preview(rendered: str) -> str:
    """``role "first words…"`` of a rendered message (``<|role|>`` then its text)."""
    head, _, body = rendered.partition("\n")
    role = head.removeprefix("<|").removesuffix("|>") if head.startswith("<|") else "item"
    text = " ".join(body.split()) if head.startswith("<|") else " ".join(rendered.split())
    if len(text) > _PREVIEW_CHARS:
        text = text[: _PREVIEW_CHARS - 1] + "…"
    return f'{role} "{text}"'


@dataclass(frozen=True, slots=True)
class Question:
    """A user message the offline model answers.

    Attributes:
        text: The message, exactly as the agent is asked it (texts must be unique).
        tool: The tool the model calls first, or ``None`` to answer at once.
        arguments: The call's arguments.
        expected: Values the answer quotes when the model can still see them (in the tool's
            result, or in a record or summary that kept them).
    """

    text: str
    tool: str | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict[str, Any])
    expected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OfflineCall:
    """One request the offline provider answered, and what compaction logged before it.

    Attributes:
        number: 1-based, in arrival order.
        prompt_tokens: Tokens of the request as the provider renders it.
        cached_tokens: Of those, served from the simulated prompt cache.
        messages: Messages the request carried.
        rewritten: Of the previous request's messages, how many this one no longer carries
            byte for byte anywhere (shortened, replaced or removed; context a provider injects
            for one call, such as the harness's todo list, counts too).
        compaction: The ``maf_compaction`` log lines emitted since the previous request
            (what left the prompt and why).
        left: A short preview (role and first words) of each message counted in ``rewritten``,
            so a change compaction did not make (the harness's todo list leaving a call inside
            the tool loop) is told apart from one it did.
        shortened: Messages this request carries, and the previous one did not, with a
            shortening marker (``[... removed by compaction: N characters]``): results
            shortened as they aged into the band, which the strategies do not log.
    """

    number: int
    prompt_tokens: int
    cached_tokens: int
    messages: int
    rewritten: int
    compaction: tuple[str, ...]
    left: tuple[str, ...] = ()
    shortened: int = 0
    label: str = TASK

    @property
    def cached_share(self) -> float:
        """The share of the prompt the cache served, in [0, 1]."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def what(self) -> str:
        """What the request was: ``the agent's call``, or the compaction request it was (``a record``...)."""
        return _WHAT.get(self.label, f"a {self.label} request")


#: How the report names each kind of request.
_WHAT: Final = {
    TASK: "the agent's call",
    "record": "a record request",
    "summary": "a summary request",
    "record+summary": "a record and summary request",
    "merge": "a record merge",
    "rewrite": "a record rewrite",
    "fold": "a summary fold",
}


@dataclass(frozen=True, slots=True)
class OfflineTotals:
    """What the conversation cost so far, and what it would have cost without compaction.

    Attributes:
        calls: Requests answered.
        requests: Of those, compaction requests, by kind (``record``, ``summary``...).
        cost: Dollars at the default prices (ratios are what matter: input 1.00, cached input
            0.10, output 4.00 per million tokens).
        cached_share: Cached share of every request's input.
        uncompacted_cost: The agent's own calls again, each carrying every message the
            conversation gave so far with nothing taken out, and no compaction request.
        uncompacted_cached_share: Their cached share.
        uncompacted_over_window: How many of those would not fit the window.
    """

    calls: int
    requests: Mapping[str, int]
    cost: float
    cached_share: float
    uncompacted_cost: float
    uncompacted_cached_share: float
    uncompacted_over_window: int

    def lines(self) -> list[str]:
        """The totals as the report ends with them."""
        asked = ", ".join(f"{kind} {count}" for kind, count in sorted(self.requests.items()))
        compaction = f" ({sum(self.requests.values())} compaction request(s): {asked})" if self.requests else ""
        over = f"; {self.uncompacted_over_window} of its calls would not fit the window" * bool(
            self.uncompacted_over_window
        )
        ratio = f", {self.cost / self.uncompacted_cost:.2f}x" if self.uncompacted_cost else ""
        return [
            f"total: {self.calls} call(s){compaction}, ${self.cost:.4f}, {self.cached_share:.0%} cached",
            f"without compaction: ${self.uncompacted_cost:.4f}, {self.uncompacted_cached_share:.0%} cached"
            f"{over} (with compaction{ratio})",
        ]


#: The API an :class:`OfflineProvider` serves: OpenAI's (Responses and Chat Completions) or Anthropic's Messages.
Wire = Literal["openai", "anthropic"]


class _Lines(logging.Handler):
    """Collects ``maf_compaction`` log lines, each tagged with the requests answered before it."""

    def __init__(self, server: Any) -> None:
        super().__init__(logging.INFO)
        self._server = server
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((len(self._server.requests), f"{record.levelname}: {record.getMessage()}"))


class OfflineProvider:
    """A scripted model behind the real OpenAI or Anthropic wire on ``127.0.0.1``, with a simulated prompt cache.

    Use it as a context manager, ``with`` (the server runs on a thread of its own, so
    synchronous code and ``asyncio.run`` can call it) or ``async with`` (in the running
    loop), or call :meth:`start` and :meth:`stop` (a script that points
    ``OPENAI_BASE_URL`` or ``ANTHROPIC_BASE_URL`` at it before building its client). While it runs it records the
    ``maf_compaction`` logger's lines that the host's logging levels let through: WARNINGs (what left the prompt)
    by default, and each decision's INFO line once the host sets
    ``logging.getLogger("maf_compaction").setLevel(logging.INFO)``. It never changes a level itself.

    Args:
        questions: What the agent will be asked, in any order.
        window: The simulated context window, in tokens (a request over it is flagged).
        encoder: Tokenizes requests for the simulated provider (anything with
            ``encode(text) -> list[int]``); by default ``TiktokenTokenizer()``.
        model: How the scripted model writes records and summaries (the bench's plausible
            model by default; ``ModelOptions(model="oracle")`` for the minimal, perfect one).
        wire: ``"openai"`` (the default) serves the Responses and Chat Completions APIs, billed
            by the OpenAI cache rule; ``"anthropic"`` serves Anthropic's Messages API for
            agent-framework-anthropic's ``AnthropicClient`` (validated as Anthropic does: a request it
            would refuse gets its 400, listed in ``server.rejected``), billed from the
            ``cache_control`` marks each request carries, at Anthropic's 5-minute write and read prices.
    """

    def __init__(
        self,
        questions: Sequence[Question],
        *,
        window: int = 128_000,
        encoder: Any = None,
        model: ModelOptions | None = None,
        wire: Wire = "openai",
    ) -> None:
        if wire not in ("openai", "anthropic"):
            raise ValueError(f"wire must be 'openai' or 'anthropic', got {wire!r}")
        if not questions:
            raise ValueError("questions must name at least one question, got none")
        if encoder is None:
            from ..adapters.tiktoken import TiktokenTokenizer  # noqa: PLC0415 - the default only

            encoder = TiktokenTokenizer()
        tools = sorted({q.tool for q in questions if q.tool is not None})
        turns = tuple(
            Turn(
                q.text,
                calls=(ToolCall(q.tool, dict(q.arguments), ""),) if q.tool is not None else (),
                probe=Probe(q.text, tuple(q.expected)),
            )
            for q in questions
        )
        scenario = Scenario("offline", "", tuple(ToolSpec(name, "") for name in tools), turns)
        profile = "default" if wire == "openai" else "anthropic-5m"
        self.provider = SimulatedProvider(
            encoder=encoder,
            window=window,
            profile=get_profile(profile),
            cache="openai" if wire == "openai" else "anthropic",
            ttl=default_ttl(profile),
        )
        self.wire: Wire = wire
        scripted = ScriptedModel(scenario, model)
        if wire == "anthropic":
            from .anthropic_wire import AnthropicLoopback  # noqa: PLC0415 - needs the anthropic client's SDK

            self.server: LoopbackProvider | AnthropicLoopback = AnthropicLoopback(scripted, self.provider)
        else:
            self.server = LoopbackProvider(scripted, self.provider)
        self._lines = _Lines(self.server)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serving = False  # started in a running loop (``async with``)

    # -- running ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The ``base_url`` to give the client: an OpenAI client's (``http://127.0.0.1:<port>/v1``), or an
        ``AnthropicClient``'s (``ANTHROPIC_BASE_URL``) with ``wire="anthropic"``."""
        return self.server.base_url("model")

    async def __aenter__(self) -> OfflineProvider:
        """Start serving in the running loop and start recording compaction's log lines."""
        self._refuse_running()
        await self.server.__aenter__()
        self._serving = True
        self._watch()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop serving and recording."""
        self._unwatch()
        self._serving = False
        await self.server.__aexit__(exc_type, exc, tb)

    def _refuse_running(self) -> None:
        if self._thread is not None or self._serving:
            raise RuntimeError("this OfflineProvider is already running")

    def __enter__(self) -> OfflineProvider:
        """Start serving on a thread of its own and start recording compaction's log lines."""
        self._refuse_running()
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failures: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.server.__aenter__())
            except BaseException as error:  # handed to the caller below
                failures.append(error)
                return
            finally:
                started.set()
            loop.run_forever()

        thread = threading.Thread(target=serve, name="maf-compaction-offline", daemon=True)
        thread.start()
        started.wait(timeout=30)
        if failures or not started.is_set():
            if not started.is_set():  # still starting: stop the loop from its own thread before closing it
                loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            why = "failed" if failures else "did not answer within 30 s"
            raise RuntimeError(f"the offline provider did not start ({why})") from (failures[0] if failures else None)
        self._loop, self._thread = loop, thread
        self._watch()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop serving and recording."""
        self._unwatch()
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.server.__aexit__(None, None, None), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        self._loop = self._thread = None

    def start(self) -> OfflineProvider:
        """Start serving on a thread of its own (``with`` without the block); :meth:`stop` ends it."""
        return self.__enter__()

    def stop(self) -> None:
        """Stop what :meth:`start` started."""
        self.__exit__(None, None, None)

    def _watch(self) -> None:
        logging.getLogger(_LOGGER).addHandler(self._lines)

    def _unwatch(self) -> None:
        logging.getLogger(_LOGGER).removeHandler(self._lines)

    # -- what happened ---------------------------------------------------------------------

    @property
    def records(self) -> list[CallRecord]:
        """The simulated provider's bill of every request, in arrival order."""
        return list(self.provider.calls)

    def calls(self) -> list[OfflineCall]:
        """Every request so far, with the compaction lines logged before it."""
        found: list[OfflineCall] = []
        previous: tuple[str, ...] = ()
        for number, (record, rendered) in enumerate(
            zip(self.provider.calls, self.server.rendered, strict=False), start=1
        ):
            lines = tuple(line for before, line in self._lines.lines if before == number - 1)
            messages = rendered.messages
            carried = set(messages)
            gone = [message for message in previous if message not in carried]
            before = set(previous)
            shortened = sum(1 for message in messages if message not in before and _SHORTENED in message)
            found.append(
                OfflineCall(
                    number,
                    record.input_tokens,
                    record.cached_tokens,
                    len(messages),
                    len(gone),
                    lines,
                    tuple(_preview(message) for message in gone),
                    shortened if number > 1 else 0,
                    record.label,
                )
            )
            if record.label == TASK:  # a compaction request is no step of the conversation
                previous = messages
        return found

    def totals(self) -> OfflineTotals:
        """The totals so far: cost and cached share, beside the same conversation without compaction."""
        calls = list(self.provider.calls)
        shadow = SimulatedProvider(
            encoder=self.provider.encoder,
            window=self.provider.window,
            profile=self.provider.profile,
            cache=self.provider.cache,
            ttl=self.provider.ttl,
        )
        priced: list[CallRecord] = []
        for record, request in uncompacted(calls, self.server.rendered):
            shadow.clock = record.at
            # The same answer: its tokens billed as output, as the real call's were.
            priced.append(shadow.call(request, output="", reasoning_tokens=record.output_tokens))
        requests: dict[str, int] = {}
        for record in calls:
            if record.compaction:
                requests[record.label] = requests.get(record.label, 0) + 1
        return OfflineTotals(
            calls=len(calls),
            requests=requests,
            cost=sum(c.cost for c in calls),
            cached_share=_share(calls),
            uncompacted_cost=sum(c.cost for c in priced),
            uncompacted_cached_share=_share(priced),
            uncompacted_over_window=sum(c.over_window for c in priced),
        )

    @staticmethod
    def _names(previews: tuple[str, ...]) -> str:
        """The first previews, and how many more."""
        named = ", ".join(previews[:_PREVIEWS])
        more = len(previews) - _PREVIEWS
        return f"{named} and {more} more" if more > 0 else named

    def report(self) -> str:
        """Call by call: prompt size, cached share, and what left the prompt before it and why."""
        rows: list[str] = []
        for call in self.calls():
            changed = (
                "the first call"
                if call.number == 1
                else f"{call.rewritten} of the previous call's messages changed or left: {self._names(call.left)}"
                if call.rewritten
                else "carries every message of the previous call"
            )
            if call.label != TASK:
                changed = "not part of the conversation: its answer enters history as compaction's"
            what = "" if call.label == TASK else f" ({call.what})"
            rows.append(
                f"call {call.number}{what}: prompt {call.prompt_tokens:,} tokens in {call.messages} messages, "
                f"{call.cached_share:.0%} cached; {changed}"
            )
            if call.shortened:
                rows.append(f"  {call.shortened} result(s) shortened by compaction ('{_SHORTENED}N characters]')")
            rows.extend(f"  {line}" for line in call.compaction)
        after = [line for before, line in self._lines.lines if before >= len(self.provider.calls)]
        if after:
            rows.append("after the last call:")
            rows.extend(f"  {line}" for line in after)
        if not rows:
            return "no calls yet"
        if not logging.getLogger(_LOGGER).isEnabledFor(logging.INFO):
            rows.append(f"(WARNINGs only: each decision's INFO line shows here once the {_LOGGER!r} logger is at INFO)")
        return "\n".join([*rows, *self._unplaced(), *self.totals().lines()])

    def _unplaced(self) -> list[str]:
        """User messages the offline model was given no question for, named: it answers only the questions it has.

        One it answered "Understood." (nothing else in the request told it what was asked), and one it took for a
        compaction instruction (it ended a request that showed tool results) that later requests carry as a turn
        of the conversation.
        """
        lines = [
            f"a user message matches no Question and was answered 'Understood.': {text[:80]!r}"
            for text in self.server.model.unmatched
        ]
        calls, rendered = self.provider.calls, self.server.rendered
        later: set[str] = set()
        for number in range(min(len(calls), len(rendered)) - 1, -1, -1):
            record, messages = calls[number], rendered[number].messages
            if record.label != TASK and messages and messages[-1] in later:
                what = _WHAT.get(record.label, "a compaction request")
                named = _preview(messages[-1])
                lines.append(f"call {number + 1} took a user message that matches no Question for {what}: {named}")
            elif record.label == TASK:
                later.update(messages)
        return lines


def _share(calls: Sequence[CallRecord]) -> float:
    total = sum(c.input_tokens for c in calls)
    return sum(c.cached_tokens for c in calls) / total if total else 0.0


def uncompacted(
    calls: Sequence[CallRecord], rendered: Sequence[RenderedRequest]
) -> list[tuple[CallRecord, RenderedRequest]]:
    """The agent's own calls, each as it would have been sent with nothing compacted away.

    Each call's request carries every message the conversation gave up to it (the previous
    call's uncompacted conversation, then what the call carries after the newest conversation
    message the previous call had: what arrived since), after the context the host put before
    the conversation for this call alone (a harness's todo list on a turn's first call: the
    messages that lead a request and are gone from the next one), which a request without
    compaction carries as this one does. Compaction requests are left out, and so is what
    compaction wrote into history (records and summaries stand before that message).
    """
    own = [(record, request) for record, request in zip(calls, rendered, strict=False) if record.label == TASK]
    own = [(record, request) for record, request in own if record.kind == "model"]
    out: list[tuple[CallRecord, RenderedRequest]] = []
    kept: list[str] = []
    last: tuple[str, ...] = ()
    for number, (record, request) in enumerate(own):
        following = set(own[number + 1][1].messages) if number + 1 < len(own) else set(request.messages)
        lead = 0  # the messages before the first one the next call carries too: context of this call alone
        while lead < len(request.messages) - 1 and request.messages[lead] not in following:
            lead += 1
        messages = request.messages[lead:]
        if not last:
            kept = list(messages)
        elif last[-1] in messages:
            at = len(messages) - 1 - messages[::-1].index(last[-1])
            kept += messages[at + 1 :]
        else:  # the newest message changed: take what neither earlier request carried
            seen = {*kept, *last}
            kept += [m for m in messages if m not in seen]
        last = messages
        sent = (*request.messages[:lead], *kept)
        out.append((record, RenderedRequest(request.instructions, request.tools, sent, request.head, request.media)))
    return out
