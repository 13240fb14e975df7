"""The summary coverage rule (:mod:`maf_compaction.core.summary_check`) and what the user-turn strategy does with it.

A user-turn summary is kept only when it carries the replaced turns' distinctive values, their requirement,
constraint and correction lines, and something of what they say; otherwise one more request names what it left
out, and failing that the turns stay verbatim with a WARNING naming them. Properties, one sentence each:

- the items themselves, verbatim, always pass, and so does any answer that contains a passing one;
- what the rule names is always the items': their values and their directive lines, never anything else.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import pytest
from agent_framework import Message
from hypothesis import given
from hypothesis import strategies as st

from maf_compaction.core.summary_check import Omission, directive_lines, omissions, owed, reask_prompt
from maf_compaction.core.user_summaries import VERBATIM_HEADING, Outcome
from maf_compaction.core.values import distinctive_values
from test_user_summaries import (
    ScriptedSummarizer,
    conversation,
    excluded,
    extractive,
    numbered_items,
    over_budget,
    run,
    strategy,
    summaries,
)

REQUIREMENTS = """Requirements for this session:
- R1 (RQ-1A2B3C): every rollout goes region by region.
- R2 (RQ-4D5E6F): reports go through the batch pipeline.
Also, thanks for the quick turnaround."""


def test_directive_lines_are_the_lines_that_state_requirements_and_the_list_under_them() -> None:
    assert directive_lines(REQUIREMENTS) == (
        "Requirements for this session:",
        "- R1 (RQ-1A2B3C): every rollout goes region by region.",
        "- R2 (RQ-4D5E6F): reports go through the batch pipeline.",
    )
    assert directive_lines("Never drain more than one shard at a time.\nNice weather today.") == (
        "Never drain more than one shard at a time.",
    )
    assert directive_lines("Correction: R2 now goes through the streaming pipeline instead.") != ()
    assert directive_lines("Looks good, thanks.") == ()


def test_a_summary_that_paraphrases_but_keeps_every_value_and_line_passes() -> None:
    summary = (
        "Session requirements: R1 RQ-1A2B3C, rollouts region by region; R2 RQ-4D5E6F, reports go via the batch "
        "pipeline."
    )
    assert not omissions([REQUIREMENTS], summary)


def test_a_summary_that_drops_a_value_or_a_line_or_says_nothing_is_named() -> None:
    dropped = omissions([REQUIREMENTS], "R1 (RQ-1A2B3C): rollouts go region by region. Requirements noted.")
    assert dropped.values == ("RQ-4D5E6F",)
    assert dropped.lines == ("- R2 (RQ-4D5E6F): reports go through the batch pipeline.",)
    assert not dropped.substance
    # A line with values is carried by them, however tersely; one without needs half of its words.
    bare = omissions([REQUIREMENTS], "RQ-1A2B3C RQ-4D5E6F")
    assert bare == Omission(lines=("Requirements for this session:",))
    constraint = "Never drain more than one shard at a time."
    assert omissions([constraint], "Drains: one shard at a time.") == Omission()
    assert omissions([constraint], "Drain carefully.").lines == (constraint,)
    nothing = omissions(["Add a CSV header to the export, and sort the rows by date."], "Understood.")
    assert nothing == Omission(substance=True)
    assert "anything of what it replaces" in nothing.described()


def test_the_one_more_request_names_what_was_left_out() -> None:
    missing = omissions([REQUIREMENTS], "Requirements: R1 RQ-1A2B3C rollout region by region.")
    prompt = reask_prompt("Summarise the items.", missing)
    assert prompt.startswith("Summarise the items.\n\n")
    assert "Quote exactly: RQ-4D5E6F." in prompt
    assert "Keep: - R2 (RQ-4D5E6F): reports go through the batch pipeline." in prompt


_LINES = st.sampled_from(
    [
        "Requirements for the export:",
        "- totals stay in EUR, never USD",
        "Never drain more than one shard at a time (limit 1).",
        "Correction: RQ-77AB12 replaces RQ-11CD34 from now on.",
        "The report goes out on 2026-12-01 at the latest.",
        "Thanks, that looks fine.",
        "Use build v1.23.4 for the canary only.",
        "We talked about the dashboard yesterday.",
        "",
    ]
)
_ITEMS = st.lists(st.lists(_LINES, min_size=1, max_size=6).map("\n".join), min_size=1, max_size=4)


@given(_ITEMS, st.text(max_size=80))
def test_the_items_verbatim_pass_and_adding_to_a_passing_answer_keeps_it_passing(items: list[str], extra: str) -> None:
    verbatim = "\n".join(items)
    assert not omissions(items, verbatim)
    assert not omissions(items, f"{extra}\n{verbatim}\n{extra}")


@given(_ITEMS, _ITEMS.map("\n".join))
def test_what_is_named_missing_is_always_the_items_own(items: list[str], answer: str) -> None:
    missing = omissions(items, answer)
    assert set(missing.values) <= set(distinctive_values("\n".join(items)))
    assert set(missing.lines) <= {line for item in items for line in directive_lines(item)}


@given(_ITEMS)
def test_what_a_summary_owes_quotes_every_value_and_is_never_longer_than_the_items(items: list[str]) -> None:
    """:func:`owed` (what a summary's size is estimated from) holds every value the rule asks for, and no more
    words than the items have."""
    least = owed(items)
    assert not omissions(items, least).values
    assert len(least.split()) <= len("\n".join(items).split())


def test_a_line_with_a_value_owes_the_value_and_one_without_owes_half_its_content_words() -> None:
    least = owed(["Use build v1.23.4 for the canary only.", "- totals stay in EUR, never USD"]).split()
    assert "v1.23.4" in least
    assert "canary" not in least  # the value names the line: it owes nothing more
    assert len(least) == 1 + 1  # half of "totals" and "stay" (EUR and USD are under four letters)


# ----------------------------------------------------------------------------- the strategy


def dropping(first_only: bool) -> ScriptedSummarizer:
    """A lossy summarizer: the faithful summary without its first requirement line (only on the first request, when
    ``first_only``: asked once more naming it, it carries it)."""

    def script(messages: Sequence[Message]) -> str:
        faithful = extractive(messages).split("\n")
        named_again = "left out what follows" in messages[0].text
        return "\n".join(faithful if first_only and named_again else faithful[1:])

    return ScriptedSummarizer(script)


def test_a_summary_that_left_a_requirement_out_is_asked_once_more_and_kept_when_it_carries_it() -> None:
    messages = conversation(8)
    client = dropping(first_only=True)
    worker = strategy(client, budget=over_budget(messages), min_band_share=0)
    assert run(worker, messages) is True
    assert client.calls == 2
    assert "Keep: Requirement RQ-" in client.requests[1][0].text  # the second request names the line
    assert worker.last_report is not None
    assert worker.last_report.outcome is Outcome.SUMMARIZED
    assert worker.last_report.reasked
    assert worker.user_summaries_reasked == 1
    first_line = numbered_items(client.requests[0][-1].text)[0].split("\n")[0]
    assert first_line in summaries(messages)[0].text


def test_what_a_summarizer_keeps_leaving_out_follows_the_summary_verbatim_and_a_warning_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = conversation(8)
    client = dropping(first_only=False)
    worker = strategy(client, budget=over_budget(messages), min_band_share=0)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        assert run(worker, messages) is True
    assert client.calls == 2
    assert worker.last_report is not None
    assert worker.last_report.outcome is Outcome.SUMMARIZED
    assert worker.last_report.missing is not None
    assert worker.user_summaries_repaired == 1
    (summary,) = summaries(messages)
    left_out = worker.last_report.missing.lines
    assert left_out
    assert summary.text.endswith("\n".join([VERBATIM_HEADING, *left_out]))
    assert not omissions([numbered_items(client.requests[0][-1].text)[0]], summary.text)
    (warning,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "copied verbatim from the turns" in warning
    # Both lists and later passes replay it: no third request.
    assert run(worker, copy.deepcopy(messages)) is False
    assert client.calls == 2


def test_a_summary_that_with_what_it_left_out_is_no_smaller_keeps_the_turns_and_a_warning_names_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages = conversation(8)
    padded = ScriptedSummarizer(lambda m: "\n".join(extractive(m).split("\n")[1:]) + "\n" + "filler " * 400)
    worker = strategy(padded, budget=over_budget(messages), min_band_share=0)
    with caplog.at_level(logging.WARNING, logger="maf_compaction"):
        assert run(worker, messages) is False
    assert worker.last_report is not None
    assert worker.last_report.outcome is Outcome.INCOMPLETE
    assert (worker.user_summaries_incomplete, worker.user_summary_failures) == (1, 1)
    assert not summaries(messages)
    assert not any(excluded(m) for m in messages)
    (warning,) = [r.getMessage() for r in caplog.records if "refused: the" in r.getMessage()]
    assert "stay verbatim: u1, u2" in warning
    assert run(worker, messages) is False
    assert padded.calls == 2


def test_an_answer_that_says_nothing_of_the_turns_never_replaces_them() -> None:
    """The plain-Agent case: "Understood." once replaced ten user turns because it was smaller."""
    messages = conversation(10)
    client = ScriptedSummarizer(lambda _: "Understood.")
    worker = strategy(client, budget=over_budget(messages), min_band_share=0)
    assert run(worker, messages) is False
    assert worker.last_report is not None
    assert worker.last_report.outcome is Outcome.INCOMPLETE
    assert worker.last_report.missing is not None
    assert worker.last_report.missing.substance
    assert not summaries(messages)


# ----------------------------------------------------------------------------- records: an answer that saves nothing


def test_a_record_answer_as_long_as_the_results_it_was_shown_is_refused() -> None:
    """Issue 34: a verbatim echo wedged the composition from turn 8, a 200,000-word answer a session for good. A
    record is kept only when it quotes a value of the results it was shown AND is shorter than they are."""
    from maf_compaction.core import call_part, history, message, result_part
    from maf_compaction.core.effects import Request, Route
    from maf_compaction.core.records import RECORD_PREFIX, kept_record
    from maf_compaction.core.state import RequestKind
    from maf_compaction.testing import estimate_tokens

    result = "region=westeurope release=2026.11.3 code_1=TL-3FA9C2 " + "status line ok " * 40
    view = history(
        [
            message("user", [], message_id="u0"),
            message("assistant", [call_part("c1", "lookup", {"service": "svc-a"}, estimate_tokens)]),
            message("tool", [result_part("c1", result, estimate_tokens)]),
        ]
    )
    asked = Request("r1", RequestKind.RECORD, Route.CACHED_PREFIX, message_id="rec_1", view=view)
    kept = kept_record(asked, "lookup svc-a: code_1=TL-3FA9C2, release 2026.11.3")
    assert kept is not None
    assert kept.text == "lookup svc-a: code_1=TL-3FA9C2, release 2026.11.3"
    assert kept_record(asked, f"{RECORD_PREFIX}\n{result}") is None  # an echo
    assert kept_record(asked, "TL-3FA9C2 " + "and so on " * 20_000) is None  # a runaway answer
    assert kept_record(asked, "Understood.") is None  # no value of what it was shown
