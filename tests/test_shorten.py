"""Examples of ``maf_compaction.core.shorten``: head and tail kept, an exact marker line between."""

from __future__ import annotations

import re

import pytest

from maf_compaction.core.shorten import is_shortened, shorten

# --- helpers ---------------------------------------------------------------------------------

MARKER_LINE = re.compile(r"\n\[\.\.\. removed by compaction: ([\d,]+) characters\]\n")


def measure(text: str) -> int:
    """Four characters per token, at least one: the framework's character estimate."""
    return max(1, len(text) // 4)


def words(text: str) -> int:
    """A tokenizer whose characters-per-token ratio varies wildly along a text."""
    return max(1, len(text.split()))


def marker(removed: int) -> str:
    return f"\n[... removed by compaction: {removed:,} characters]\n"


def split_shortened(text: str) -> tuple[str, int, str]:
    """(head, removed characters, tail) of a shortened text."""
    found = MARKER_LINE.search(text)
    assert found is not None, "the text carries no marker line"
    return text[: found.start()], int(found.group(1).replace(",", "")), text[found.end() :]


def code_lines(count: int) -> str:
    return "".join(f"code_{i}=TL-{i:06X}\n" for i in range(count))


# --- texts that stay as they are ---------------------------------------------------------------


def test_text_within_budget_is_returned_unchanged() -> None:
    text = "x" * 400

    assert shorten(text, 150, measure) is text


def test_text_exactly_at_budget_is_returned_unchanged() -> None:
    text = "x" * 600  # 150 tokens

    assert shorten(text, 150, measure) is text


def test_negative_budget_leaves_text_unchanged() -> None:
    text = "x" * 4_000

    assert shorten(text, -1, measure) is text


def test_zero_budget_keeps_only_the_marker_line() -> None:
    text = "x" * 4_000

    assert shorten(text, 0, measure) == "\n[... removed by compaction: 4,000 characters]\n"


def test_cut_that_would_not_save_tokens_keeps_the_original() -> None:
    # 160 tokens cut to 155: the 20 removed characters cost less than the marker line.
    text = "x" * 640

    assert shorten(text, 155, measure) is text


def test_given_token_count_is_trusted_instead_of_measuring() -> None:
    text = "x" * 4_000  # 1,000 tokens, but the caller says 100

    assert shorten(text, 150, measure, tokens=100) is text


# --- the shape of a shortened text ---------------------------------------------------------------


def test_long_text_becomes_head_marker_and_tail() -> None:
    shortened = shorten("x" * 4_000, 150, measure)

    assert shortened == "x" * 300 + "\n[... removed by compaction: 3,400 characters]\n" + "x" * 300


def test_odd_budget_gives_the_extra_token_to_the_tail() -> None:
    shortened = shorten("x" * 4_000, 151, measure)

    assert shortened == "x" * 300 + marker(3_396) + "x" * 304


def test_removed_count_below_a_thousand_has_no_comma() -> None:
    shortened = shorten("x" * 2_000, 300, measure)

    assert shortened == "x" * 600 + marker(800) + "x" * 600


def test_marker_counts_exactly_the_characters_removed() -> None:
    text = code_lines(400)

    head, removed, tail = split_shortened(shorten(text, 150, measure))

    assert removed == len(text) - len(head) - len(tail)


def test_head_is_a_prefix_and_tail_a_suffix_of_the_original() -> None:
    text = code_lines(400)

    head, _, tail = split_shortened(shorten(text, 150, measure))

    assert (text.startswith(head), text.endswith(tail)) == (True, True)


def test_removed_count_uses_thousands_commas() -> None:
    shortened = shorten("x" * 40_000, 150, measure)

    assert "\n[... removed by compaction: 39,400 characters]\n" in shortened


def test_head_keeps_half_the_budget_and_tail_the_rest() -> None:
    head, _, tail = split_shortened(shorten("x" * 40_000, 1_001, measure))

    assert (measure(head), measure(tail)) == (500, 501)


@pytest.mark.parametrize(
    "text",
    ["a " * 3_000 + "b" * 20_000, "b" * 20_000 + " a" * 3_000],
    ids=["dense-head", "dense-tail"],
)
def test_kept_ends_stay_within_their_budgets_for_an_uneven_tokenizer(text: str) -> None:
    head, _, tail = split_shortened(shorten(text, 151, words))

    assert (words(head) <= 75, words(tail) <= 76) == (True, True)


def test_shortened_text_costs_about_the_budget_plus_the_marker() -> None:
    shortened = shorten("x" * 40_000, 1_000, measure)

    assert measure(shortened) == 1_000 + measure(marker(39_000))


def test_cuts_snap_to_line_boundaries() -> None:
    text = code_lines(400)
    lines = set(text.splitlines(keepends=True))

    head, _, tail = split_shortened(shorten(text, 150, measure))

    kept = head.splitlines(keepends=True) + tail.splitlines(keepends=True)
    assert (head.endswith("\n"), all(line in lines for line in kept)) == (True, True)


# --- idempotence -----------------------------------------------------------------------------------


def test_shortened_text_is_never_shortened_again() -> None:
    shortened = shorten("x" * 40_000, 1_000, measure)

    assert shorten(shortened, 150, measure) is shortened


def test_is_shortened_recognises_our_output() -> None:
    assert is_shortened(shorten("x" * 4_000, 150, measure)) is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("head\n[... removed by compaction: 12 characters]\ntail", True),
        ("head\n[... removed by compaction: 1,234,567 characters]\ntail", True),
        ("the log says: removed by compaction", False),
        ("[... removed by compaction: 12 characters]", False),
        ("head\n[... removed by compaction: twelve characters]\ntail", False),
        ("x" * 4_000, False),
    ],
    ids=["digits", "commas", "mention", "no-newlines", "words", "plain"],
)
def test_is_shortened_requires_the_exact_marker_line(text: str, expected: bool) -> None:
    assert is_shortened(text) is expected
