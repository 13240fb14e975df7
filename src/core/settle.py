"""How a pass's result settles with what the recall middleware changed while the pass ran.

A pass reads the conversation's state, may await effects (the summarizer), and writes its
result back. The recall middleware shares that state and may move it meanwhile, but only
in two ways: the recall protocol's state and the ``taken`` flag of the outstanding ask
(``take_reforce``: False to True, once per ask). A pass changes the recall protocol's
state only where it asks over the cached prefix: it spends ``asking`` and judges whether
the model followed the instruction. The rule:

- the recall protocol's state is the middleware's: the current one stands, with the
  pass's ask spent and its verdict on the instructions (a disabled route stays disabled);
- every decision is the pass's, except that an ask the pass still holds stays taken when
  the middleware took that same ask meanwhile (one ask pins one request).

Both rules only keep changes; nothing the pass or the middleware did is lost.
"""

from __future__ import annotations

from dataclasses import replace

from .record_decisions import Ask
from .records import RecordState


def same_ask(one: Ask, other: Ask) -> bool:
    """Whether two asks are the same ask (its ``taken`` flag aside)."""
    return (one.targets, one.records_at_ask, one.responses_at_ask) == (
        other.targets,
        other.records_at_ask,
        other.responses_at_ask,
    )


def settle(passed: RecordState, current: RecordState) -> RecordState:
    """The state a pass writes back: its result ``passed`` settled with the shared state ``current``."""
    decisions = passed.decisions
    ask, meanwhile = decisions.ask, current.decisions.ask
    if ask is not None and not ask.taken and meanwhile is not None and meanwhile.taken and same_ask(ask, meanwhile):
        decisions = replace(decisions, ask=replace(ask, taken=True))
    mine, theirs = passed.recall, current.recall
    recall = replace(
        theirs,
        asking=None if mine.asking is None else theirs.asking,
        ignored_instructions=mine.ignored_instructions,
        prefix_disabled=mine.prefix_disabled or theirs.prefix_disabled,
        summaries_prefix_disabled=mine.summaries_prefix_disabled or theirs.summaries_prefix_disabled,
    )
    return replace(passed, decisions=decisions, recall=recall)
