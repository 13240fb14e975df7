"""The bench's model reads an instruction by its place, never by our wording (EVALUATION.md, "Scripted model").

Every instruction text the library sends (a record over the cached prefix, a record and a summary in one
request, a summary over the cached prefix, the summarizer's summary and fold prompts, the composition's merge
and rewrite prompts, the recall tool's description a pinned request points at, and the request marker) is
swapped for a paraphrase; the bench's runs then make the same decisions: the same requests of the same kinds
in the same order, the same records and summaries kept, the same history, the same facts. Only what the
instructions themselves cost may differ (their tokens), and the ids derived from an instruction.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Final

import pytest
from agent_framework import Message

from maf_compaction.adapters import recall as recall_adapter
from maf_compaction.bench import runner
from maf_compaction.bench.model import ScriptedModel, context_text
from maf_compaction.bench.runner import Cell, Settings, play_cell
from maf_compaction.core import composition, effects, records, user_summaries
from offline_tokenizers import offline_tiktoken

TOKENIZER = offline_tiktoken()

TAG: Final = "[request from compaction]"
GUIDANCE: Final = (
    "All of the earlier tool results, arranged by the tool that returned them, so that nothing disappears "
    "without notice. Copy exactly each value that could not be worked out again: identifiers, codes, names, "
    "numbers, paths, URLs, versions, states and timestamps. Reproduce Markdown table rows exactly, beneath their "
    "header and separator rows. Keep findings and conclusions as they were given. Keep any summary a tool "
    "produced as it is. Sum up everything else in a few words. Add nothing that was not there. If you must "
    "choose, choose exactness over brevity."
)
PURPOSE: Final = (
    "the parts of the earlier tool results in this conversation that have to be kept, so that they are still "
    "at hand once those results are taken out to free room."
)
#: Each instruction text the library sends: (module, attribute) -> the paraphrase.
PARAPHRASES: Final[dict[tuple[Any, str], object]] = {
    (effects, "COMPACTION_REQUEST"): TAG,
    (records, "COMPACTION_REQUEST"): TAG,
    (user_summaries, "COMPACTION_REQUEST"): TAG,
    (records, "RECORD_GUIDANCE"): GUIDANCE,
    (records, "RECORD_PURPOSE"): PURPOSE,
    (records, "RECORD_INSTRUCTION"): (
        f"{TAG} Set the task aside and call no tool for this. Put in writing {PURPOSE} Reply with that record "
        f"and nothing more (or with a single {records.RECALL_TOOL_NAME} call carrying it in its values "
        f"argument). What the record contains: {GUIDANCE}"
    ),
    (records, "WITH_SUMMARY"): "Next, below the record, put a line {section} on its own and under it a summary, so.",
    (user_summaries, "PREFIX_SUMMARY_LEAD"): "Leave the task aside.",
    (user_summaries, "PREFIX_ITEMS_HEADING"): (
        "These are the numbered items: earlier messages of this conversation, each given by the words it starts with:"
    ),
    (user_summaries, "DEFAULT_PROMPT"): (
        "You shorten the earlier turns of a conversation between a user and an assistant. Below, the numbered "
        "items are what the user wrote, oldest first (an item may itself summarise earlier user turns, or carry a "
        "description of attached media that was inferred, marked so). Write a single account, far shorter than "
        "the items, in the third person and in order, of what the user wanted. Keep each requirement, "
        "constraint, correction and preference exactly as given; when a later item corrects an earlier one, keep "
        "the correction and say what it replaces. Copy exactly each value that cannot be rebuilt: identifiers, "
        "codes, names, numbers, paths, URLs, versions, dates. Leave out greetings, repetition and details that no "
        "longer hold. Add nothing the items do not say. Answer with the account alone."
    ),
    (user_summaries, "DEFAULT_FOLD_PROMPT"): (
        "The numbered items below summarise a user's earlier turns in one conversation. Each replaces turns that "
        "are gone from the conversation: none of them is filler, and what they say exists nowhere else. Write a "
        "single account that stands in for all of them, in order, in the third person. Keep each requirement, "
        "constraint, correction and preference, and copy each identifier, code, name, number, path, URL, version "
        "and date exactly. Leave out only what a later item replaces, and name what replaced it. Answer with the "
        "account alone."
    ),
    (composition, "DEFAULT_MERGE_PROMPT"): (
        "Below, the numbered texts are compaction records: each keeps values from earlier tool results that are "
        "gone from the conversation. Write a single record that stands in for all of them. Copy each identifier, "
        "code, number, date, name and exact value exactly from each record; never reword, round, shorten or leave "
        "one out. Cut repetition and phrasing, not values. Answer with the record alone."
    ),
    (composition, "harder_prompt"): lambda attempt: (
        "Below, the numbered text is a compaction record: it keeps values from earlier tool results that are gone "
        f"from the conversation. Write it again as a single record of no more than about {round(100 * 0.6**attempt)}%"
        " of its present length. Copy each identifier, code, number, date, name and exact value exactly; never "
        "reword, round, shorten or leave one out. Cut repetition and phrasing, not values. Answer with the record "
        "alone."
    ),
}
#: A wording for the recall tool's description (the prompt a pinned request points the model at).
RECALL_DESCRIPTION: Final = (
    "Write down {purpose}\n\nAim for roughly {target:,} tokens overall, spent on values that cannot be rebuilt "
    "rather than on summaries.\n\nArgs:\n    values: {guidance}"
)


@dataclass(frozen=True, slots=True)
class Case:
    """One bench cell whose requests cover some of the instructions."""

    row: str
    results: str
    fill: float


CASES: Final = (
    Case("tool_and_user_summary_anchored", "synthetic", 3.0),  # records, summaries, both in one request
    # over the prefix, then merges, rewrites and folds (a record of value-dense results would not pay: asked anyway;
    # at 5x the window, because the shed makes room before the budget where no record is expected)
    Case("tool_and_user_summary_anchored_ungated", "dense", 5.0),
    Case("tool_and_user_summary_anchored_pinned", "synthetic", 3.0),  # pinned records; the summarizer's prompts
    Case("user_summary_anchored_fold", "synthetic", 3.0),  # the summarizer's summaries
)
#: Ids that are digests of a request, its instruction included: they may differ, the decision may not.
_DIGEST_IDS: Final = re.compile(r"(compaction_record_|call_recall_)[0-9a-f]+")


@dataclass(frozen=True, slots=True)
class Decisions:
    """What a run decided, without what the instructions themselves cost."""

    calls: tuple[tuple[str, str, bool], ...]
    counters: tuple[tuple[str, float], ...]
    facts_kept: int
    lost: tuple[str, ...]
    history: tuple[tuple[str, bool, str], ...]


@pytest.fixture(autouse=True)
def _offline_bench_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_tokenizer", lambda: TOKENIZER)


def _run(case: Case, monkeypatch: pytest.MonkeyPatch) -> Decisions:
    kept: list[list[Message]] = []
    original = runner.stored_messages

    def stored_messages(session: Any) -> list[Message]:
        found = original(session)
        kept.append(found)
        return found

    with monkeypatch.context() as patch:
        patch.setattr(runner, "stored_messages", stored_messages)
        result, provider = asyncio.run(play_cell(Cell(case.row, case.fill, 1), Settings(results=case.results)))  # type: ignore[arg-type]
    return Decisions(
        calls=tuple((c.kind, c.label, c.pinned) for c in provider.calls),
        counters=tuple(sorted(result.counters.items())),
        facts_kept=result.facts_kept,
        lost=tuple(sorted(f.value for f in result.lost)),
        history=tuple(
            (
                m.role,
                bool(m.additional_properties.get("_excluded", False)),
                _DIGEST_IDS.sub(r"\1#", context_text([m])),
            )
            for m in kept[-1]
        ),
    )


#: Further wordings: a one-word request marker (a bracketed word that opens the instruction is no section line), and
#: a summarizer prompt that itself holds a bracketed word.
VARIANTS: Final[dict[str, dict[tuple[Any, str], object]]] = {
    "paraphrase": {},
    "one-word tag": {
        key: value.replace(TAG, "[compaction]") if isinstance(value, str) else value
        for key, value in PARAPHRASES.items()
    },
    "bracketed word in the prompt": {
        (user_summaries, "DEFAULT_PROMPT"): (
            "You shorten the earlier turns of a conversation (write [none] for a turn that asks for nothing). Keep "
            "each requirement, constraint, correction and preference exactly as given, and copy exactly each "
            "value that cannot be rebuilt: identifiers, codes, names, numbers, paths, URLs, versions, dates. "
            "Answer with the account alone."
        ),
    },
}


def _paraphrased(monkeypatch: pytest.MonkeyPatch, variant: str = "paraphrase") -> None:
    for (module, name), text in {**PARAPHRASES, **VARIANTS[variant]}.items():
        assert hasattr(module, name), f"{module.__name__}.{name} is gone: the test must swap what replaced it"
        monkeypatch.setattr(module, name, text)

    def description(target_tokens: int | None = 2_000) -> str:
        return RECALL_DESCRIPTION.format(purpose=PURPOSE, target=target_tokens or 0, guidance=GUIDANCE)

    monkeypatch.setattr(recall_adapter, "recall_description", description)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", CASES, ids=[f"{c.row}-{c.results}-{c.fill:g}" for c in CASES])
def test_paraphrased_instructions_give_the_same_decisions(
    case: Case, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if variant != "paraphrase" and case != CASES[0]:
        pytest.skip("the further wordings run on the case that asks for every kind over the cached prefix")
    original = _run(case, monkeypatch)
    received: list[str] = []
    reply = ScriptedModel.reply

    def spied(model: ScriptedModel, messages: Any, **options: Any) -> Any:
        received.extend(m.text or "" for m in messages if m.role in ("user", "system"))
        return reply(model, messages, **options)

    with monkeypatch.context() as patch:
        _paraphrased(patch, variant)
        patch.setattr(ScriptedModel, "reply", spied)
        paraphrased = _run(case, patch)
    swapped = {**PARAPHRASES, **VARIANTS[variant]}
    tag = str(swapped[(records, "COMPACTION_REQUEST")])
    asked_over_prefix = [text for text in received if text.startswith(tag)]
    if any(label != "task" and kind == "model" and not pinned for kind, label, pinned in original.calls):
        assert asked_over_prefix, "no instruction the model received carries the swapped marker"
    assert not [text for text in received if text.startswith(effects.COMPACTION_REQUEST)], "an original reached it"
    assert [c for c in original.calls if c[1] != "task"], "the case asked for nothing: it tests no instruction"
    assert paraphrased.calls == original.calls
    assert paraphrased.counters == original.counters
    assert paraphrased.facts_kept == original.facts_kept
    assert paraphrased.lost == original.lost
    assert paraphrased.history == original.history


def test_the_cases_cover_every_kind_of_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Between them the cases send every instruction: records over the prefix and pinned, summaries over the
    prefix and to the summarizer, a record and a summary in one request, merges, rewrites and folds."""
    kinds = {(kind, label, pinned) for case in CASES for kind, label, pinned in _run(case, monkeypatch).calls}
    assert ("model", "record", False) in kinds  # over the cached prefix
    assert ("model", "record", True) in kinds  # pinned
    assert ("model", "summary", False) in kinds  # over the cached prefix
    assert ("model", "record+summary", False) in kinds
    assert {("summarizer", label, False) for label in ("summary", "merge", "rewrite", "fold")} <= kinds
