"""What the bench's commands share: argument types, the program's name, install hints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from ..core.extras import install_hint as extras_hint

#: Optional dependencies outside the ``bench`` extra -> the extra that installs them.
EXTRAS: Final = {"matplotlib": "plot", "redis": "redis"}


def program_name() -> str:
    """``maf-compaction`` when run by the console script, else ``python -m maf_compaction.bench``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "maf-compaction" if name.startswith("maf-compaction") else "python -m maf_compaction.bench"


def install_hint(*modules: str) -> str:
    """How to install the extras that bring ``modules`` (``bench``, or ``plot`` for matplotlib)."""
    extras = ",".join(sorted({EXTRAS.get(module.split(".", maxsplit=1)[0], "bench") for module in modules}))
    return extras_hint(extras)


def positive_int(text: str) -> int:
    """An ``argparse`` type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
