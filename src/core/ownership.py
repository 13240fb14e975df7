"""Whose history is it? A list that starts with a tool result whose call it lacks is a provider's increment.

A chat client that keeps the conversation on the server (the OpenAI Responses API unless
``store=False``) sends each request as "the previous response, plus these new items": the
framework then skips loading local history and hands compaction only the new messages,
such as the result of a tool call whose call it never sees. Client-side history never
starts like that: it starts with the conversation's first turn, and the framework keeps a
call with its result. Such a list holds nothing to compact and nothing that identifies
the conversation.
"""

from __future__ import annotations

from collections.abc import Iterable

from .model import MessageRecord, conversation_records


def provider_increment(history: Iterable[MessageRecord]) -> tuple[str, ...]:
    """The call ids of the results the conversation starts with when their calls are missing, else ``()``.

    Injected context (a provider's per-call messages) and our own notes are not the
    conversation. Non-empty means ``history`` is a provider's increment of a conversation
    kept on the server, not the conversation.
    """
    records = conversation_records(history)
    if not records or records[0].role != "tool":
        return ()
    calls = {p.call_id for r in records for p in r.parts if p.kind == "function_call" and p.call_id}
    first = [p.call_id for p in records[0].parts if p.kind == "function_result" and p.call_id]
    orphans = [call_id for call_id in first if call_id not in calls]
    return tuple(dict.fromkeys(orphans)) if orphans and len(orphans) == len(first) else ()
