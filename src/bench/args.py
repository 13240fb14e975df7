"""Argument types shared by the bench's commands."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An ``argparse`` type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
