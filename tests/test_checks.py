"""One generic check reads each parameter's constraint from its annotation and names the parameter and its range."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pytest
from msgspec import Meta

from maf_compaction.core.checks import AtLeastOne, AtLeastZero, Floor, Fraction, NonEmpty, require, validate


@dataclass(frozen=True)
class Parameters:
    tokens: AtLeastOne = 1
    groups: AtLeastZero = 0
    cap: AtLeastOne | None = None
    share: Fraction = 1.0
    floor: Floor = 0.0
    switch: bool = True
    mode: Literal["a", "b"] = "a"
    text: NonEmpty = "x"
    free: object = None  # no declared constraint: never checked

    def __post_init__(self) -> None:
        validate(self)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokens": 0}, r"^tokens must be an integer >= 1, got 0$"),
        ({"tokens": True}, r"^tokens must be an integer >= 1, got True$"),
        ({"tokens": 1.0}, r"^tokens must be an integer >= 1, got 1\.0$"),
        ({"groups": -1}, r"^groups must be an integer >= 0, got -1$"),
        ({"cap": 0}, r"^cap must be an integer >= 1 or None, got 0$"),
        ({"share": 0}, r"^share must be in \(0, 1\], got 0$"),
        ({"share": float("nan")}, r"^share must be in \(0, 1\], got nan$"),
        ({"share": "0.5"}, r"^share must be in \(0, 1\], got '0\.5'$"),
        ({"floor": 1}, r"^floor must be in \[0, 1\), got 1$"),
        ({"floor": False}, r"^floor must be in \[0, 1\), got False$"),
        ({"switch": "false"}, r"^switch must be True or False, got 'false'$"),
        ({"mode": "c"}, r"^mode must be one of a, b, got 'c'$"),
        ({"text": "  "}, r"^text must be a non-empty string, got '  '$"),
        ({"text": None}, r"^text must be a non-empty string, got None$"),
    ],
)
def test_a_value_outside_its_declared_range_is_refused_naming_the_parameter_and_the_range(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Parameters(**changes)


def test_the_bounds_of_each_range_and_undeclared_fields_are_accepted() -> None:
    Parameters(tokens=1, groups=0, cap=1, share=1, floor=0, switch=False, mode="b", text=" x ", free=object())
    Parameters(share=1e-9, floor=0.999, cap=None)


def test_a_loose_parameter_is_checked_against_the_same_declarations() -> None:
    require("x", None, AtLeastOne | None)
    with pytest.raises(ValueError, match=r"^x must be an integer >= 1 or None, got 0$"):
        require("x", 0, AtLeastOne | None)
    with pytest.raises(ValueError, match=r"^x must be an integer in \[1, 9\], got 10$"):
        require("x", 10, Annotated[int, Meta(ge=1, le=9)])
    with pytest.raises(ValueError, match=r"^x must be a string matching '\^a', got 'b'$"):
        require("x", "b", Annotated[str, Meta(pattern="^a")])
    require("x", "anything", str)  # declares nothing
