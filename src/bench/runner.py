"""Run a scenario through one row and measure it; run a grid of cells in parallel.

A *cell* is one (row, fill, seed), run the way a user builds an agent (``docs/bench.md``,
"How one cell runs"); every figure comes from the simulated provider's records, the final
stored history and the probe answers, never from a strategy's own counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import random
import statistics
import time
import uuid
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from agent_framework import AgentSession, CompactionStrategy, Content, Message, create_harness_agent

from ..adapters.tiktoken import TiktokenTokenizer
from . import workload_file
from .causes import tally
from .client import SimulatedChatClient, media_contents, scenario_tools
from .lost import LostFact, collect_warnings, lost_facts
from .model import ModelKnobs, ModelOptions, ScriptedModel, context_text
from .provider import CacheKind, CallRecord, SimulatedProvider, default_ttl
from .quiet import TimedStrategy, quiet_logs
from .rows import RowContext, RowFactory, RowFactoryError, resolve_rows, setup_of
from .scenario import DEFAULT_THINK_SECONDS, GeneratorOptions, ResultsKind, Scenario, generate, think_seconds
from .simulator import PriceProfile, get_profile

logger = logging.getLogger("maf_compaction")

ClientMode = Literal["inprocess", "openai-responses", "openai-chat", "anthropic"]
CLIENT_MODES: tuple[ClientMode, ...] = ("inprocess", "openai-responses", "openai-chat", "anthropic")
#: What ``--anthropic-cache`` makes the Anthropic client send: the request-level automatic ``cache_control``
#: (``auto``), that and our breakpoints (``ours``: ``maf_compaction.cache_breakpoints`` on the client), or none
#: (``none``, the framework's default).
AnthropicCacheMode = Literal["auto", "ours", "none"]
ANTHROPIC_CACHE_MODES: tuple[AnthropicCacheMode, ...] = ("auto", "ours", "none")

#: The loopback server's id seed in every cell: the ids it issues (and so the opaque reasoning markers the cache
#: counts) are the same from run to run, so the figures are reproducible.
LOOPBACK_ID_SEED: Final = 0

#: Framework modules that draw identities from ``uuid4`` (imported by name): function-call occurrences
#: (``af-call-...``, which the framework's own strategies count), stored message ids, the Chat client's call
#: identities.
_FRAMEWORK_ID_MODULES: Final = (
    "agent_framework._tools",
    "agent_framework._agents",
    "agent_framework._in_memory",
    "agent_framework_openai._chat_completion_client",
)


@contextlib.contextmanager
def seeded_framework_ids(seed: int) -> Iterator[None]:
    """The framework's random identities drawn from ``seed`` for the length of the block (one cell).

    The framework gives every function-call occurrence a fresh ``uuid4`` identity, and its
    ``ContextWindowCompactionStrategy`` counts it: near its trigger the draw decided whether
    it compacted a turn earlier, so the framework's rows moved from run to run (measured in
    ``docs/bench.md``). Drawn from a seeded generator, every run of a cell gives the same figures,
    as the loopback server's seeded ids do (:data:`LOOPBACK_ID_SEED`). Cells run one at a time
    per process; a nested block keeps the outer one's generator.
    """
    modules = [importlib.import_module(name) for name in _FRAMEWORK_ID_MODULES]
    if any(getattr(module, "uuid4", None) is not uuid.uuid4 for module in modules):
        yield  # already seeded by an enclosing block (or the framework no longer draws them this way)
        return
    draw = random.Random(seed)

    def uuid4() -> uuid.UUID:
        return uuid.UUID(int=draw.getrandbits(128), version=4)

    for module in modules:
        module.uuid4 = uuid4  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in modules:
            module.uuid4 = uuid.uuid4  # type: ignore[attr-defined]


#: Harness features that would move the prompt head on their own (see framework-api.md §5).
QUIET_HARNESS: Mapping[str, bool] = {
    "disable_todo": True,
    "disable_mode": True,
    "disable_file_memory": True,
    "disable_web_search": True,
}


@dataclass(frozen=True, slots=True)
class Settings(ModelKnobs):
    """Everything a cell needs besides its row, fill and seed (picklable): the model's knobs, then the rest."""

    context_window: int = 32_000
    max_output_tokens: int = 2_048
    cache: CacheKind = "openai"
    profile: str = "default"
    tool_share: float = 0.6
    tool_turns: int = 6
    markers_per_tool: int = 8
    results: ResultsKind = "synthetic"
    think_time: float | None = None
    ttl: float | None = None
    client: ClientMode = "inprocess"
    stream: bool = False
    thinking: bool = False
    anthropic_cache: AnthropicCacheMode = "auto"
    workload: str | None = None
    session: str | None = None
    facts: str | None = None
    strategies: Mapping[str, str] = field(default_factory=dict[str, str])

    @property
    def budget(self) -> int:
        """The input budget strategies get."""
        return self.context_window - self.max_output_tokens

    @property
    def think_median(self) -> float:
        """Median seconds between user turns: ``think_time``, else the model's (60 s plausible, none for the oracle)."""
        if self.think_time is not None:
            return self.think_time
        return DEFAULT_THINK_SECONDS if self.model == "plausible" else 0.0

    @property
    def cache_ttl(self) -> float:
        """Seconds a cache entry lives unused: ``ttl``, else the price profile's (an hour for ``anthropic-1h``)."""
        return self.ttl if self.ttl is not None else default_ttl(self.profile)

    def model_options(self, seed: int) -> ModelOptions:
        """The scripted model's options for a cell of ``seed``."""
        return ModelOptions(seed=seed, **self.knobs())


@dataclass(frozen=True, slots=True)
class Cell:
    """One (row, fill, seed) of a grid."""

    row: str
    fill: float
    seed: int


@dataclass(slots=True)
class CellResult:
    """Every figure of one cell (JSON-safe through :func:`dataclasses.asdict`).

    Attributes:
        row, fill, seed: The cell.
        cost: Dollars over every call, summarizer calls included.
        input_tokens, cached_tokens, output_tokens: Sums over every call.
        breaks: Model calls that were not a prefix extension of the previous one.
        max_prompt: The largest request, in tokens.
        window: The context window.
        dq: Calls whose request exceeded the window.
        facts_kept, facts_total: Planted values present in the final stored history's
            included messages (records and summaries count; excluded originals do not).
        facts_lost: Planted values the conversation gave that the final prompt lacks
            (see :func:`~.lost.lost_facts`; a value of a turn never finished is not lost).
        lost_unnamed: Of those, values no ``maf_compaction`` WARNING named a carrying
            message of, by id.
        lost_cut_in_place: Of those, values cut from a message that stays in the prompt (a
            tool result the anchored rules shortened in place: its removal marker is the
            notice, by design). ``lost_unnamed - lost_cut_in_place`` is what left silently.
        lost: Each lost value, its carrying messages and whether one was named.
        correct, asked: Expected probe values quoted, and asked for (0 for a workload
            without probes: then :attr:`accuracy` is ``None``).
        model_calls, summarizer_calls: Calls by kind.
        pass_ms: Every compaction pass, in milliseconds (both phases).
        prompts, cached: Per model call: request tokens and cached tokens (for plots).
        counters: The row's own counters after the run (records, forced calls...).
        error: A failure that ended the run early, or ``None``.
        seconds: Wall time of the cell.
        floor: Dollars of each model call's new input and its output alone (see ``_floor``).
        pinned_cost: Dollars of the model calls whose ``tool_choice`` forced a function (pinned records).
        summarizer_cost: Dollars of the summarizer calls.
        break_causes: Of :attr:`breaks`, how many each cause accounts for (``docs/wire-cache.md``).
        spend: Where the cost went, in dollars (:func:`spend`; its parts add up to :attr:`cost`, but
            ``expiry``, which is part of the others).
        requests: Compaction requests by what the model took them for (``record``, ``summary``...).
        rejected: Requests the Anthropic loopback refused as Anthropic would (a 400; ``--client anthropic``).
        rejections: Of those, how many each validation rule refused (``anthropic_wire.RULES``).
        rejection_messages: The first error message sent for each rule, by rule.
    """

    row: str
    fill: float
    seed: int
    cost: float = 0.0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    breaks: int = 0
    max_prompt: int = 0
    window: int = 0
    dq: int = 0
    facts_kept: int = 0
    facts_total: int = 0
    facts_lost: int = 0
    lost_unnamed: int = 0
    lost_cut_in_place: int = 0
    lost: list[LostFact] = field(default_factory=list[LostFact])
    correct: int = 0
    asked: int = 0
    model_calls: int = 0
    summarizer_calls: int = 0
    pass_ms: list[float] = field(default_factory=list[float])
    prompts: list[int] = field(default_factory=list[int])
    cached: list[int] = field(default_factory=list[int])
    counters: dict[str, float] = field(default_factory=dict[str, float])
    error: str | None = None
    seconds: float = 0.0
    floor: float = 0.0
    pinned_cost: float = 0.0
    summarizer_cost: float = 0.0
    break_causes: dict[str, int] = field(default_factory=dict[str, int])
    spend: dict[str, float] = field(default_factory=dict[str, float])
    requests: dict[str, int] = field(default_factory=dict[str, int])
    rejected: int = 0
    rejections: dict[str, int] = field(default_factory=dict[str, int])
    rejection_messages: dict[str, str] = field(default_factory=dict[str, str])

    @property
    def hit(self) -> float:
        """Cached share of all input tokens."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def accuracy(self) -> float | None:
        """Share of expected probe values quoted; ``None`` when nothing was asked (no probes)."""
        return self.correct / self.asked if self.asked else None

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-safe."""
        return {**asdict(self), "hit": self.hit, "accuracy": self.accuracy}


@functools.cache
def _tokenizer() -> TiktokenTokenizer:
    """One o200k_base tokenizer per process (loading the vocabulary takes a while)."""
    return TiktokenTokenizer()


def bench_tokenizer() -> TiktokenTokenizer:
    """The o200k_base tokenizer the bench counts with (loaded once per process; tests replace ``_tokenizer``)."""
    return _tokenizer()


def load_scenario(settings: Settings, fill: float, seed: int) -> Scenario:
    """The cell's scenario: generated, or from ``--workload`` / ``--session``."""
    if settings.workload is not None:
        return workload_file.load_workload(settings.workload)
    if settings.session is not None:
        return workload_file.load_session(settings.session, settings.facts)
    shared = ("context_window", "tool_share", "tool_turns", "markers_per_tool", "results")
    return _generated(GeneratorOptions(fill=fill, seed=seed, **{name: getattr(settings, name) for name in shared}))


@functools.lru_cache(maxsize=16)
def _generated(options: GeneratorOptions) -> Scenario:
    """A generated scenario, once per worker process for all the rows of a (fill, seed): it is a pure function
    of its options (a ``stdlib`` workload reads and tokenizes source files to make one)."""
    return generate(options)


def _row_context(settings: Settings, summarizer: Any) -> RowContext:
    return RowContext(
        budget=settings.budget,
        window=settings.context_window,
        output_tokens=settings.max_output_tokens,
        tokenizer=_tokenizer(),
        summarizer=summarizer,
    )


def _user_message(text: str, scenario: Scenario) -> Message | str:
    turn = scenario.turn_for(text)
    if turn is None or not turn.media:
        return text
    return Message("user", [Content.from_text(text), *media_contents(turn.media)])


def stored_messages(session: AgentSession) -> list[Message]:
    """The history the session's in-memory provider stored."""
    for value in session.state.values():
        if isinstance(value, dict) and "messages" in value:
            messages: object = value["messages"]  # pyright: ignore[reportUnknownVariableType]
            if isinstance(messages, list):
                return [m for m in messages if isinstance(m, Message)]  # pyright: ignore[reportUnknownVariableType]
    return []


def _included_text(messages: Sequence[Message]) -> str:
    return context_text([m for m in messages if not m.additional_properties.get("_excluded", False)])


async def run_cell(
    cell: Cell, settings: Settings, *, factory: RowFactory | None = None, scenario: Scenario | None = None
) -> CellResult:
    """Run one cell in process and measure it."""
    return (await play_cell(cell, settings, factory=factory, scenario=scenario))[0]


async def play_cell(
    cell: Cell,
    settings: Settings,
    *,
    factory: RowFactory | None = None,
    scenario: Scenario | None = None,
    keep_requests: bool = False,
) -> tuple[CellResult, SimulatedProvider]:
    """Run one cell and measure it; also return its provider (with every priced request if ``keep_requests``)."""
    started = time.perf_counter()
    scenario = scenario or load_scenario(settings, cell.fill, cell.seed)
    tokenizer = _tokenizer()
    provider = SimulatedProvider(
        encoder=tokenizer,
        window=settings.context_window,
        profile=get_profile(settings.profile),
        cache=settings.cache,
        keep_requests=keep_requests,
        ttl=settings.cache_ttl,
    )
    model = ScriptedModel(scenario, settings.model_options(cell.seed))
    result = CellResult(row=cell.row, fill=cell.fill, seed=cell.seed, window=settings.context_window)
    if factory is None:
        factory = resolve_rows([cell.row], settings.strategies)[cell.row]
    with seeded_framework_ids(cell.seed):
        async with _clients(settings, model, provider) as (client, summarizer, agent_options, refused):
            context = _row_context(settings, summarizer)
            setup = setup_of(factory, context, row=cell.row)
            timed: dict[int, TimedStrategy] = {}

            def wrap(strategy: CompactionStrategy | None) -> CompactionStrategy | None:
                if strategy is None:
                    return None
                if id(strategy) not in timed:
                    timed[id(strategy)] = TimedStrategy(strategy, result.pass_ms)
                return timed[id(strategy)]

            options: dict[str, Any] = {"default_options": agent_options}
            if setup.disable_compaction:
                options["disable_compaction"] = True
                options["default_options"]["max_tokens"] = settings.max_output_tokens
            else:
                options.update(
                    max_context_window_tokens=settings.context_window,
                    max_output_tokens=settings.max_output_tokens,
                    tokenizer=tokenizer,
                    before_compaction_strategy=wrap(setup.before),
                    after_compaction_strategy=wrap(setup.after),
                )
            agent = create_harness_agent(
                client,
                agent_instructions=scenario.system,
                tools=[*scenario_tools(scenario), *setup.tools],
                middleware=list(setup.middleware) or None,
                **QUIET_HARNESS,
                **options,
            )
            session = agent.create_session()
            replies: list[str] = []
            with collect_warnings() as warned:
                for number, turn in enumerate(scenario.turns, start=1):
                    provider.turn = number
                    provider.pause(think_seconds(cell.seed, number, settings.think_median))
                    try:
                        response = await run_turn(
                            agent, _user_message(turn.user, scenario), session=session, stream=settings.stream
                        )
                    except Exception as error:  # a strategy or tool failure ends the row, reported
                        result.error = f"turn {number}: {type(error).__name__}: {error}"
                        break
                    replies.append(response.text)
            if result.error is not None:  # after collecting: the bench's own line names no message
                logger.warning("row %s stopped at %s", cell.row, result.error)
            if setup.counters is not None:
                result.counters = {name: float(value) for name, value in setup.counters().items()}
            for rule, message in refused():
                result.rejected += 1
                result.rejections[rule] = result.rejections.get(rule, 0) + 1
                result.rejection_messages.setdefault(rule, message)
    _fill_figures(
        result, scenario, provider.calls, replies, stored_messages(session), warned=warned, profile=provider.profile
    )
    result.floor = _floor(provider.profile, provider.calls)
    result.seconds = time.perf_counter() - started
    return result, provider


async def run_turn(agent: Any, message: Any, *, session: Any, stream: bool) -> Any:
    """One user turn through ``agent``, streamed to its end or not; the final response."""
    if stream:
        updates = agent.run(message, session=session, stream=True)
        async for _ in updates:
            pass
        return await updates.get_final_response()
    return await agent.run(message, session=session)


def _floor(profile: PriceProfile, calls: Sequence[CallRecord]) -> float:
    """Each model call's new input tokens and its output alone, in dollars: no strategy can cost less.

    Exact for the control row (its prompts only grow); a compacting row's own prompts would
    understate what each call brings, so the table takes the control's figure.
    """
    previous = 0
    new = output = 0
    for call in calls:
        if call.kind != "model":
            continue
        new += max(call.input_tokens - previous, 0)
        output += call.output_tokens
        previous = call.input_tokens
    return (new * profile.input + output * profile.output) / 1_000_000


#: Where a cell's cost goes (:func:`spend`), in the order reports print it.
SPEND: Final = (
    "task input",
    "task output",
    "compaction input",
    "instructions",
    "compaction output",
    "reasoning",
    "expiry",
)


def spend(calls: Sequence[CallRecord], profile: PriceProfile) -> dict[str, float]:
    """Where the cost of ``calls`` went, in dollars (:data:`SPEND`).

    ``task input`` and ``task output``: the agent's own calls (output without reasoning).
    ``compaction input``: what compaction requests re-read (the cached prefix, or a summarizer's
    transcript); ``instructions``: their instruction, at the input price; ``compaction output``:
    the records and summaries written. ``reasoning``: reasoning tokens of every call, at the
    output price. ``expiry``: what cache entries that expired between uses added, inside the
    other parts (so the parts but ``expiry`` add up to the cost).
    """
    parts: dict[str, float] = dict.fromkeys(SPEND, 0.0)
    for call in calls:
        output = call.output_tokens * profile.output / 1_000_000
        reasoning = call.reasoning_tokens * profile.output / 1_000_000
        paid_input = call.cost - output
        parts["reasoning"] += reasoning
        parts["expiry"] += call.expiry_cost
        if call.compaction:
            instruction = min(call.instruction_tokens * profile.input / 1_000_000, paid_input)
            parts["instructions"] += instruction
            parts["compaction input"] += paid_input - instruction
            parts["compaction output"] += output - reasoning
        else:
            parts["task input"] += paid_input
            parts["task output"] += output - reasoning
    return parts


def _fill_figures(
    result: CellResult,
    scenario: Scenario,
    calls: Sequence[CallRecord],
    replies: Sequence[str],
    stored: list[Message],
    *,
    warned: Sequence[str],
    profile: PriceProfile,
) -> None:
    for call in calls:
        result.cost += call.cost
        result.input_tokens += call.input_tokens
        result.cached_tokens += call.cached_tokens
        result.output_tokens += call.output_tokens
        result.max_prompt = max(result.max_prompt, call.input_tokens)
        result.dq += call.over_window
        if call.kind == "model":
            result.model_calls += 1
            result.breaks += call.broke
            result.prompts.append(call.input_tokens)
            result.cached.append(call.cached_tokens)
            result.pinned_cost += call.cost if call.pinned else 0.0
        else:
            result.summarizer_calls += 1
            result.summarizer_cost += call.cost
    result.break_causes = tally(call.cause for call in calls if call.kind == "model")
    result.spend = spend(calls, profile)
    result.requests = dict(Counter(call.label for call in calls if call.compaction))
    text = _included_text(stored)
    values = {f.value for f in scenario.facts}
    result.facts_total = len(values)
    result.facts_kept = sum(1 for v in values if v in text)
    result.lost = lost_facts(scenario, stored, text, answered=len(replies), warnings=warned)
    result.facts_lost = len(result.lost)
    result.lost_unnamed = sum(1 for fact in result.lost if not fact.named)
    result.lost_cut_in_place = sum(1 for fact in result.lost if not fact.named and fact.cut_in_place)
    for turn, reply in zip(scenario.turns, replies, strict=False):
        if turn.probe is not None:
            result.asked += len(turn.probe.expected)
            result.correct += sum(1 for v in turn.probe.expected if v in reply)
    unanswered = scenario.turns[len(replies) :]
    result.asked += sum(len(t.probe.expected) for t in unanswered if t.probe is not None)


@contextlib.asynccontextmanager
async def _clients(
    settings: Settings, model: ScriptedModel, provider: SimulatedProvider
) -> AsyncIterator[tuple[Any, Any, dict[str, Any], Callable[[], list[tuple[str, str]]]]]:
    """The model client, the summarizer client, the agent's default options and the refused requests so far
    (``(rule, message)`` pairs: only the Anthropic loopback refuses any), in process or over loopback."""
    if settings.client == "inprocess":
        summarizer = SimulatedChatClient(model=model, provider=provider, kind="summarizer")
        yield SimulatedChatClient(model=model, provider=provider), summarizer, {}, list
        return
    if settings.client == "anthropic":
        async with _anthropic_clients(settings, model, provider) as clients:
            yield clients
        return
    from .loopback import (  # noqa: PLC0415 - needs the openai extras
        LoopbackProvider,
        agent_options,
        close_client,
        make_client,
    )

    async with LoopbackProvider(model, provider, id_seed=LOOPBACK_ID_SEED) as server:
        kind = settings.client
        client = make_client(kind, server.base_url("model"))
        summarizer = make_client(kind, server.base_url("summarizer"))
        try:
            yield client, summarizer, agent_options(kind), list
        finally:  # before the cell's event loop ends, or the garbage collector closes them on a closed loop
            await close_client(client)
            await close_client(summarizer)


@contextlib.asynccontextmanager
async def _anthropic_clients(
    settings: Settings, model: ScriptedModel, provider: SimulatedProvider
) -> AsyncIterator[tuple[Any, Any, dict[str, Any], Callable[[], list[tuple[str, str]]]]]:
    """agent-framework-anthropic's clients against the Anthropic loopback (``docs/bench.md``)."""
    from ..adapters.breakpoints import cache_breakpoints  # noqa: PLC0415
    from . import anthropic_wire  # noqa: PLC0415 - needs the anthropic extras

    async with anthropic_wire.AnthropicLoopback(model, provider, id_seed=LOOPBACK_ID_SEED) as server:
        client = anthropic_wire.make_client(server.base_url("model"))
        if settings.anthropic_cache == "ours":
            cache_breakpoints(client)
        summarizer = anthropic_wire.make_client(server.base_url("summarizer"))
        options = anthropic_wire.agent_options(cache=settings.anthropic_cache, thinking=settings.thinking)
        try:
            yield client, summarizer, options, lambda: [(r.rule, r.message) for r in server.rejected]
        finally:
            await anthropic_wire.close_client(client)
            await anthropic_wire.close_client(summarizer)


# ----------------------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------------------


class CellError(RuntimeError):
    """A cell could not run (its row's factory failed, say); the one-line message names the cell."""


def check_factory(row: str, factory: RowFactory, settings: Settings) -> None:
    """Call ``factory`` once, as a cell would, so a broken row fails before any cell runs.

    Raises:
        RowFactoryError: The factory raised or returned something that is not a strategy.
    """
    scenario = Scenario("factory check", "", (), ())
    provider = SimulatedProvider(encoder=_tokenizer(), window=settings.context_window, profile=get_profile("default"))
    summarizer = SimulatedChatClient(model=ScriptedModel(scenario), provider=provider, kind="summarizer")
    context = _row_context(settings, summarizer)
    with warnings.catch_warnings(), quiet_logs():
        warnings.simplefilter("ignore")
        setup_of(factory, context, row=row)


def _run_in_worker(cell: Cell, settings: Settings) -> CellResult:
    # The table reports what the strategies did; their WARNINGs would only bury it.
    with warnings.catch_warnings(), quiet_logs():
        warnings.simplefilter("ignore")
        try:
            return asyncio.run(run_cell(cell, settings))
        except RowFactoryError as error:
            raise CellError(str(error)) from None
        except Exception as error:  # one line naming the cell, not a worker traceback
            where = f"row {cell.row!r}, fill {cell.fill:g}, seed {cell.seed}"
            raise CellError(f"{where}: {type(error).__name__}: {error}") from None


def run_grid(
    cells: Sequence[Cell],
    settings: Settings,
    *,
    jobs: int = 1,
    progress: Callable[[int, int, CellResult], None] | None = None,
) -> list[CellResult]:
    """Run every cell (in ``jobs`` worker processes when > 1); results in cell order."""
    return run_batches([(cells, settings)], jobs=jobs, progress=progress)[0]


def run_batches(
    batches: Sequence[tuple[Sequence[Cell], Settings]],
    *,
    jobs: int = 1,
    progress: Callable[[int, int, CellResult], None] | None = None,
) -> list[list[CellResult]]:
    """Run several grids, each with its own settings, in one pool (so no grid waits for another's tail).

    Returns each batch's results in its cell order.
    """
    work = [(index, cell, settings) for index, (cells, settings) in enumerate(batches) for cell in cells]
    results: dict[tuple[int, Cell], CellResult] = {}
    if jobs <= 1:
        for index, cell, settings in work:
            results[(index, cell)] = _run_in_worker(cell, settings)
            if progress is not None:
                progress(len(results), len(work), results[(index, cell)])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_run_in_worker, cell, settings): (index, cell) for index, cell, settings in work}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if progress is not None:
                    progress(len(results), len(work), results[futures[future]])
    return [[results[(index, cell)] for cell in cells] for index, (cells, _) in enumerate(batches)]


@dataclass(frozen=True, slots=True)
class RowSummary:
    """A row at one fill, averaged over seeds.

    ``facts_lost``, ``lost_unnamed`` and ``lost_cut_in_place`` are means per seed (see
    :class:`CellResult`); ``accuracy`` is the mean over the seeds that asked something
    (``None`` when none did);
    ``errors`` holds ``"seed N: turn M: Exception: message"`` for each cell that stopped early;
    ``pinned_cost`` and ``summarizer_cost`` are the mean dollars of pinned record calls and of
    summarizer calls (parts of ``cost``); ``rejected`` and ``rejections`` the mean requests per seed
    the Anthropic loopback refused (by rule), ``rejection_messages`` an error message per rule.
    """

    row: str
    fill: float
    seeds: int
    cost: float
    vs_none: float | None
    hit: float
    breaks: float
    max_prompt_share: float
    dq: int
    dq_seeds: int
    facts_kept: float
    facts_total: int
    facts_lost: float
    lost_unnamed: float
    accuracy: float | None
    model_calls: float
    summarizer_calls: float
    pass_ms_median: float | None
    pass_ms_max: float | None
    errors: tuple[str, ...]
    counters: dict[str, float] = field(default_factory=dict[str, float])
    floor: float | None = None
    gap_closed: float | None = None
    lost_cut_in_place: float = 0.0
    pinned_cost: float = 0.0
    summarizer_cost: float = 0.0
    spend: dict[str, float] = field(default_factory=dict[str, float])
    requests: dict[str, float] = field(default_factory=dict[str, float])
    rejected: float = 0.0
    rejections: dict[str, float] = field(default_factory=dict[str, float])
    rejection_messages: dict[str, str] = field(default_factory=dict[str, str])


#: The figures a summary averages over seeds, cell by cell.
_MEANS: Final = (
    "cost",
    "hit",
    "breaks",
    "facts_kept",
    "facts_lost",
    "lost_unnamed",
    "lost_cut_in_place",
    "model_calls",
    "summarizer_calls",
    "pinned_cost",
    "summarizer_cost",
    "rejected",
)


def _mean_counters(cells: Sequence[CellResult]) -> dict[str, float]:
    return {name: statistics.fmean(c.counters.get(name, 0.0) for c in cells) for name in cells[0].counters}


def _mean_of(tables: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per key, the mean over ``tables`` (a key a table lacks counts 0)."""
    keys = dict.fromkeys(key for table in tables for key in table)
    return {key: statistics.fmean(table.get(key, 0.0) for table in tables) for key in keys}


def summarize(results: Sequence[CellResult]) -> list[RowSummary]:
    """One summary per (fill, row), rows in the order first seen; ``vs none`` per seed, then averaged."""
    groups: dict[tuple[float, str], list[CellResult]] = {}
    for result in results:
        groups.setdefault((result.fill, result.row), []).append(result)
    none_cost = {(r.fill, r.seed): r.cost for r in results if r.row == "none"}
    floor = {(r.fill, r.seed): r.floor for r in results if r.row == "none"}
    summaries: list[RowSummary] = []
    for (fill, row), cells in groups.items():
        ratios = [c.cost / none_cost[(fill, c.seed)] for c in cells if none_cost.get((fill, c.seed))]
        floors = [floor[(fill, c.seed)] for c in cells if (fill, c.seed) in floor]
        gaps = [
            (none_cost[(fill, c.seed)] - c.cost) / (none_cost[(fill, c.seed)] - floor[(fill, c.seed)])
            for c in cells
            if (fill, c.seed) in floor and none_cost[(fill, c.seed)] > floor[(fill, c.seed)]
        ]
        passes = [ms for c in cells for ms in c.pass_ms]
        means = {name: statistics.fmean(getattr(c, name) for c in cells) for name in _MEANS}
        asked = [c.accuracy for c in cells if c.accuracy is not None]
        summaries.append(
            RowSummary(
                row=row,
                fill=fill,
                seeds=len(cells),
                vs_none=statistics.fmean(ratios) if ratios else None,
                max_prompt_share=max(c.max_prompt / c.window for c in cells),
                dq=sum(c.dq for c in cells),
                dq_seeds=sum(1 for c in cells if c.dq),
                facts_total=max(c.facts_total for c in cells),
                pass_ms_median=statistics.median(passes) if passes else None,
                pass_ms_max=max(passes) if passes else None,
                errors=tuple(f"seed {c.seed}: {c.error}" for c in cells if c.error),
                counters=_mean_counters(cells),
                spend=_mean_of([c.spend for c in cells]),
                requests=_mean_of([{k: float(v) for k, v in c.requests.items()} for c in cells]),
                rejections=_mean_of([{k: float(v) for k, v in c.rejections.items()} for c in cells]),
                rejection_messages={k: v for c in reversed(cells) for k, v in c.rejection_messages.items()},
                floor=statistics.fmean(floors) if floors else None,
                gap_closed=statistics.fmean(gaps) if gaps else None,
                accuracy=statistics.fmean(asked) if asked else None,
                **means,
            )
        )
    return summaries
