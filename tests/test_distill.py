"""The safety net's rule: a result cut to the lines that carry its distinctive values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maf_compaction.core.distill import distill, is_distilled
from maf_compaction.core.values import distinctive_values

LOOKUP = """lookup deployments: region eu
The service answered after a short delay.
code_7=TL-3FA9C2 appears here
Nothing else of note in this block.

| name | code |
|---|---|
| alpha | none |
| beta | QX-00AB12 |
The lookup finished."""


def test_keeps_the_title_the_value_lines_and_the_headings_of_a_kept_row() -> None:
    assert distill(LOOKUP) == "\n".join(
        [
            "[compacted: 4 line(s) of this result without distinctive values were left out; "
            "the 5 below are kept verbatim and in order]",
            "lookup deployments: region eu",
            "code_7=TL-3FA9C2 appears here",
            "| name | code |",
            "|---|---|",
            "| beta | QX-00AB12 |",
        ]
    )


def test_a_table_without_a_kept_row_goes_whole() -> None:
    text = "title\n| a | b |\n|---|---|\n| x | y |\nref RQ-123456"
    assert distill(text).split("\n")[1:] == ["title", "ref RQ-123456"]


def test_a_text_with_nothing_to_leave_out_is_returned_itself() -> None:
    text = "title\ncode_1=TL-000001\n\ncode_2=TL-000002"
    assert distill(text) is text


def test_a_distilled_text_is_never_distilled_again() -> None:
    once = distill(LOOKUP)
    assert is_distilled(once)
    assert distill(once) is once
    assert not is_distilled(LOOKUP)


def test_a_result_without_values_keeps_its_title_only() -> None:
    text = "weather report\nsunny\nwarm\n"
    assert distill(text).split("\n")[1:] == ["weather report"]


def test_the_marker_carries_no_distinctive_value() -> None:
    many = "title\n" + "\n".join("a line of prose" if i % 2 else f"id=QX-{i:06X}" for i in range(5000))
    marker = distill(many).split("\n", 1)[0]
    assert "2,500" in marker
    assert distinctive_values(marker) == ()


# --- properties --------------------------------------------------------------------------------

_WORD = st.sampled_from(["the", "lookup", "answered", "region", "eu", "ok", "|", "---", "code_3=", "note:"])
_VALUE = st.from_regex(r"[A-Z]{2}-[0-9A-F]{6}", fullmatch=True)
_LINE = st.lists(st.one_of(_WORD, _VALUE), max_size=6).map(" ".join)
_ROW = st.tuples(_WORD, st.one_of(_WORD, _VALUE)).map(lambda cells: f"| {cells[0]} | {cells[1]} |")
_BLOCK = st.one_of(
    _LINE,
    st.lists(_ROW, min_size=1, max_size=4).map(lambda rows: "\n".join(["| name | code |", "|---|---|", *rows])),
)
_RESULT = st.lists(_BLOCK, max_size=12).map("\n".join)


@given(_RESULT)
def test_every_distinctive_value_stays(text: str) -> None:
    """A distilled result holds every distinctive value its text held."""
    assert set(distinctive_values(distill(text))) >= set(distinctive_values(text))


@given(_RESULT)
def test_kept_lines_are_the_texts_own_lines_in_order(text: str) -> None:
    """Below the marker, the kept lines are a subsequence of the text's lines, byte for byte."""
    out = distill(text)
    if out is text:
        return
    lines = iter(text.split("\n"))
    assert all(any(kept == line for line in lines) for kept in out.split("\n")[1:])


@given(_RESULT)
def test_distilling_is_idempotent(text: str) -> None:
    """A pass over its own output changes nothing: the same bytes on every later pass."""
    once = distill(text)
    assert distill(once) == once
