"""Where a prompt cache with explicit breakpoints (Anthropic's ``cache_control``) should be marked.

Anthropic caches a prompt only at the blocks a request marks: at most four marks, each
written as a cache entry, and read back by a later request whose own mark finds the
entry within 20 blocks before it. A compaction that changes a message re-writes the
whole prompt from that message on, at the write premium, and re-reads what precedes it
only when an earlier request left an entry there. Our strategies know which prefix they
keep byte-stable, so they mark it, on every request, before they touch what follows:

1. **The last message** of the conversation as the pass leaves it: the next request
   extends this one and re-reads all of it. Context injected for one call after it (a
   to-do list, a memory) stays outside the entry, so it never spoils it.
2. **The frontier**: the message before the first one the strategy's next decision may
   change: the user's first turn past the head and the last standing summary still in the
   prompt (a turn before that summary, a short one a composition left verbatim, never
   changes; in ``recompact`` mode, the first standing summary or turn, which a recompact
   replaces) for user-turn summaries;
   the first tool group still in the prompt for records; the first band group for the
   anchored rules. Summaries, records and the replies between them stand before it, so
   the next summary or record breaks the prompt after this mark and re-reads all of it.
3. **The end of the head**: the first ``keep_head_groups`` groups (or
   ``keep_head_user_turns`` user turns, with the tools and instructions before them),
   never touched by any rule. A decision that rewrites compacted output (a fold of
   summaries, a merge of records, a shed under the budget) breaks after it.

The answer is a pure function of the history a pass produced, so every replica marks
the same places; marks on prefixes shorter than a model's minimum cacheable length are
harmless (the provider ignores them), and with the last message marked, an extra mark
never raises the bill: tokens up to the last mark are written once whatever the count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from .anchored import AnchoredConfig
from .composition import CompositionConfig
from .grouping import group_records
from .model import GroupKind, History, MessageRecord
from .records import RecordConfig
from .user_summaries import UserSummaryConfig

#: The configurations whose heads :func:`strategy_marks` knows.
StrategyConfig: TypeAlias = AnchoredConfig | RecordConfig | UserSummaryConfig | CompositionConfig

#: The most ``cache_control`` marks one Anthropic request may carry (the request-level one included).
MAX_BREAKPOINTS = 4


@dataclass(frozen=True, slots=True)
class CacheMarks:
    """The messages whose end a request should mark, as indices into the pass's history.

    Attributes:
        last: The last message of the conversation (``None`` for a history with none).
        frontier: The end of the settled run after the head (``None`` when no insert or note
            follows the head, or the run reaches the last message).
        head: The end of the head (``None`` when the head is the whole conversation).
    """

    last: int | None
    frontier: int | None
    head: int | None

    def ordered(self, *, last: bool = True) -> tuple[int, ...]:
        """The marks by priority, distinct, without ``last`` when the request marks its end already
        (request-level automatic caching): a request short of slots keeps the first ones."""
        wanted = (self.last if last else None, self.frontier, self.head)
        chosen = [i for i in wanted if i is not None]
        return tuple(dict.fromkeys(chosen))


def _sendable(record: MessageRecord) -> bool:
    """A message the request carries as a conversation turn (not excluded, not the instructions)."""
    return not record.excluded and record.role != "system"


def _own(record: MessageRecord) -> bool:
    """A message of the conversation itself: neither context injected for one call, nor our insert or note."""
    return record.in_conversation and not record.inserted


#: Group kinds the record rules change (their fallback's rules on text run only when the budget fails).
RECORD_KINDS: Final[frozenset[GroupKind]] = frozenset({"tool_call"})


def cache_marks(
    history: History,
    *,
    keep_head_groups: int | None = None,
    group_kinds: frozenset[GroupKind] | None = None,
    keep_head_user_turns: int | None = None,
    summaries_move: bool = False,
) -> CacheMarks:
    """Where to mark the request ``history`` becomes (see the module's rules).

    A strategy's rules are given by its heads: ``keep_head_groups`` groups of the
    conversation (our inserts and notes aside) before the groups of ``group_kinds`` (every
    kind when ``None``) its next decision may change, the first of them still in the
    prompt; ``keep_head_user_turns`` user turns before the first of the user's own turns a
    summary may replace next (or the first standing summary, when ``summaries_move``: the
    recompact mode replaces those too). A strategy with both halves gives both: its head is the
    shorter, and its next change the earlier.
    """
    sendable = [i for i, r in enumerate(history) if _sendable(r)]
    conversation = [i for i in sendable if history[i].in_conversation]
    if not conversation:
        return CacheMarks(last=None, frontier=None, head=None)
    halves = [
        *([] if keep_head_groups is None else [_groups_half(history, keep_head_groups, group_kinds)]),
        *(
            []
            if keep_head_user_turns is None
            else [_turns_half(history, keep_head_user_turns, summaries_move=summaries_move)]
        ),
    ]
    end = min((head for head, _ in halves), default=-1)
    change = min((change for _, change in halves), default=len(history))
    last = conversation[-1]
    head = next((i for i in reversed(conversation) if i <= end and _own(history[i])), None)
    frontier = next((i for i in reversed(conversation) if end < i < change), None)
    return CacheMarks(
        last=last,
        frontier=None if frontier is None or frontier >= last else frontier,
        head=None if head is None or head >= last else head,
    )


def _groups_half(history: History, keep: int, kinds: frozenset[GroupKind] | None) -> tuple[int, int]:
    """``(head end, next change)``: the index of the head's last message (-1: no head), and the first message
    still in the prompt of the first group past it of ``kinds`` (``len(history)``: none yet).

    Groups are every conversation message's but our inserts, excluded ones and instructions
    included, as every strategy counts them (their positions never move)."""
    own = [i for i, r in enumerate(history) if _own(r)]
    groups = group_records([history[i] for i in own])
    if keep >= len(groups):
        return len(history) - 1, len(history)
    # The head's run: a later group's message among the head's (a late result joins its call's group) ends it.
    later = min(m for g in groups[keep:] for m in g.members)
    end = own[later - 1] if later > 0 else -1
    changing = (
        own[m]
        for g in groups[keep:]
        if kinds is None or g.kind in kinds
        for m in sorted(g.members)
        if not history[own[m]].excluded
    )
    return end, next(changing, len(history))


def _turns_half(history: History, keep: int, *, summaries_move: bool) -> tuple[int, int]:
    """``(head end, next change)``: the index of the last message before the user's own turn ``keep + 1`` (-1: no
    head), and the first of the user's turns from there still in the prompt (``len(history)``: none yet), or
    the first summary there when ``summaries_move`` (a recompact replaces the standing summaries too)."""
    turns = [i for i, r in enumerate(history) if r.role == "user" and r.in_conversation and not r.summary]
    if keep >= len(turns):
        return len(history) - 1, len(history)
    end = max((i for i in range(turns[keep]) if _own(history[i])), default=-1) if keep > 0 else -1
    band = frozenset(turns[keep:])
    # Past the head, a summary is asked only for turns after the last one standing (unless summaries move): a turn
    # before it (a short one a composition left verbatim before its first summary) never changes.
    last = max((i for i in range(end + 1, len(history)) if history[i].summary and not history[i].excluded), default=end)
    start = end + 1 if summaries_move else last + 1
    changing = (
        i
        for i in range(start, len(history))
        if not history[i].excluded and (i in band or (summaries_move and history[i].summary))
    )
    return end, next(changing, len(history))


def strategy_marks(config: StrategyConfig, history: History) -> CacheMarks:
    """:func:`cache_marks` with the head of the strategy ``config`` configures."""
    if isinstance(config, CompositionConfig):
        return cache_marks(
            history,
            keep_head_groups=config.records.keep_head_groups,
            group_kinds=RECORD_KINDS,
            keep_head_user_turns=config.users.keep_head_user_turns,
            summaries_move=config.users.summary_mode == "recompact",
        )
    if isinstance(config, UserSummaryConfig):
        return cache_marks(
            history,
            keep_head_user_turns=config.keep_head_user_turns,
            summaries_move=config.summary_mode == "recompact",
        )
    if isinstance(config, RecordConfig):
        return cache_marks(history, keep_head_groups=config.keep_head_groups, group_kinds=RECORD_KINDS)
    return cache_marks(history, keep_head_groups=config.keep_head_groups)
