"""``measure_agent_overhead``: what an agent sends beside the conversation, in tokens.

The strategies' budget (``max_input_tokens``) counts conversation messages only. A
request also carries the agent's instructions, the JSON schema of every tool it
declares, and context that providers inject for one call (the harness's todo list, its
mode and file-memory instructions). None of that is history, so no compaction can
shrink it, and the budget must leave room for it:
``budget = window - max_output_tokens - overhead.total - margin``.

The measurement replays what the framework does before a new session's first model
call: the agent's default instructions and tools, then every context provider's
``before_run`` (in order) on a throwaway session, without loading history or compacting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_framework import (
    AgentSession,
    CompactionProvider,
    ContextProvider,
    FileMemoryProvider,
    FunctionTool,
    HistoryProvider,
    InMemoryAgentFileStore,
    SessionContext,
)

from ..core.checks import AtLeastOne, AtLeastZero, require
from ..core.counting import compact_json
from .counting import Tokenizer, as_estimator

_T = TypeVar("_T")

#: The throwaway session's id: one fixed id, so providers that key storage by session
#: (the harness's file memory creates a folder) leave one entry however often you measure.
MEASURE_SESSION_ID = "maf-compaction-overhead"


@dataclass(frozen=True, slots=True)
class AgentOverhead:
    """Tokens an agent's requests carry beside the conversation messages.

    Attributes:
        instructions_tokens: The instructions the client receives (the agent's own, the
            harness's, and those providers add), joined as the framework joins them.
        tools_tokens: The tool declarations: each tool's JSON schema as compact JSON.
        context_tokens: Messages providers inject for one call (the harness's todo list),
            counted as the strategies count messages.
        tools: Tokens of each declared tool, by name, in declaration order (which tool is
            expensive).
        instructions: The instructions text that was measured.
    """

    instructions_tokens: int
    tools_tokens: int
    context_tokens: int
    tools: Mapping[str, int] = field(default_factory=dict[str, int])
    instructions: str = ""

    @property
    def total(self) -> int:
        """Everything sent beside the messages: instructions, tool schemas and injected context."""
        return self.instructions_tokens + self.tools_tokens + self.context_tokens

    def budget(self, context_window: int, max_output_tokens: int, *, margin: int = 0) -> int:
        """The messages' budget: ``context_window - max_output_tokens - total - margin``.

        The ``margin`` covers what this measurement cannot see: the provider's own framing
        of messages and tools (a few tokens each), and tools or instructions added later.

        Raises:
            ValueError: ``context_window`` is not a whole number >= 1, ``max_output_tokens`` or ``margin`` not a
                whole number >= 0, or nothing would be left for the conversation.
        """
        require("context_window", context_window, AtLeastOne)
        require("max_output_tokens", max_output_tokens, AtLeastZero)
        require("margin", margin, AtLeastZero)
        budget = context_window - max_output_tokens - self.total - margin
        if budget <= 0:
            raise ValueError(
                f"no room for the conversation: window {context_window:,} - output {max_output_tokens:,} - "
                f"overhead {self.total:,} - margin {margin:,} = {budget:,}"
            )
        return budget

    def __str__(self) -> str:
        return (
            f"{self.total:,} tokens beside the messages: instructions {self.instructions_tokens:,}, "
            f"{len(self.tools)} tool schema(s) {self.tools_tokens:,}, injected context {self.context_tokens:,}"
        )


def measure_agent_overhead(agent: Any, tokenizer: Tokenizer) -> AgentOverhead:
    """Measure what ``agent`` sends beside the conversation on a new session's first model call.

    Works for any framework ``Agent``, including those ``create_harness_agent`` builds:
    the harness's instructions, its todo/mode/file-memory tools and instructions and the
    injected todo list are all counted. Each context provider's ``before_run`` runs once
    on a throwaway ``AgentSession`` (id :data:`MEASURE_SESSION_ID`; history providers and compaction providers are
    skipped: history is what the budget counts), exactly as before a run. The harness's
    file memory runs on a copy over an in-memory store, so measuring writes nothing to
    disk (its ``agent-file-memory`` folder is not created); another provider with side
    effects in ``before_run`` has them. Tool schemas and instructions are counted as plain compact JSON and
    text; a provider's framing adds a few tokens per tool, so keep a margin.

    Call it from synchronous code; from inside a running event loop it runs the
    providers on a helper thread with its own loop.

    Args:
        agent: The configured agent (``Agent`` or ``create_harness_agent(...)``).
        tokenizer: The tokenizer the strategies count with.

    Returns:
        The measured :class:`AgentOverhead`.
    """
    return _run(_measure(agent, tokenizer))


async def _measure(agent: Any, tokenizer: Tokenizer) -> AgentOverhead:
    defaults: Mapping[str, Any] = getattr(agent, "default_options", None) or {}
    session = AgentSession(session_id=MEASURE_SESSION_ID)
    context = SessionContext(session_id=session.session_id, input_messages=[], options={})
    for provider in getattr(agent, "context_providers", None) or ():
        if isinstance(provider, HistoryProvider | CompactionProvider):
            continue
        await _measured(provider).before_run(
            agent=agent, session=session, context=context, state=session.state.setdefault(provider.source_id, {})
        )
    instructions = _instructions(defaults.get("instructions"), context.instructions)
    tools = _tool_tokens([*(defaults.get("tools") or ()), *context.tools], tokenizer)
    estimator = as_estimator(tokenizer)
    return AgentOverhead(
        instructions_tokens=tokenizer.count_tokens(instructions) if instructions else 0,
        tools_tokens=sum(tools.values()),
        context_tokens=sum(estimator.count_message_tokens(m) for m in context.get_messages()),
        tools=tools,
        instructions=instructions,
    )


def _measured(provider: ContextProvider) -> ContextProvider:
    """``provider`` as the measurement runs it: the file memory on a copy over an in-memory store.

    Its ``before_run`` creates the session's folder in its store (for the harness, under the
    working directory); the copy has the same instructions, tools and scope, and a fresh
    throwaway session has no memories to index either way.
    """
    if not isinstance(provider, FileMemoryProvider):
        return provider
    measured = copy.copy(provider)
    measured.store = InMemoryAgentFileStore()
    return measured


def _instructions(own: object, added: Sequence[str]) -> str:
    """The instructions as the framework joins them (its own, then the providers', one per line)."""
    if isinstance(own, str) or not own:
        text = str(own or "")
    else:  # a provider-native structured form: count what it says
        text = json.dumps(own, ensure_ascii=False, sort_keys=True, default=str)
    return "\n".join([text, *added] if text else added)


def _tool_tokens(tools: Sequence[object], tokenizer: Tokenizer) -> dict[str, int]:
    counted: dict[str, int] = {}
    for index, tool in enumerate(tools):
        if isinstance(tool, FunctionTool):
            spec, name = tool.to_json_schema_spec(), tool.name
        elif isinstance(tool, Mapping):
            spec, name = tool, str(tool.get("name") or tool.get("type") or f"tool {index}")  # pyright: ignore[reportUnknownMemberType]
        else:  # a hosted tool object or a plain callable: what its declaration would say
            to_dict = getattr(tool, "to_dict", None)
            spec = to_dict() if callable(to_dict) else {"name": getattr(tool, "__name__", repr(tool))}
            name = str(getattr(tool, "name", None) or getattr(tool, "__name__", None) or f"tool {index}")
        counted[name if name not in counted else f"{name} ({index})"] = tokenizer.count_tokens(compact_json(spec))
    return counted


def _run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
