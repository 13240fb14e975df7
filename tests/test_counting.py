"""Token counting on maf-compaction's basis: what the model sees, and never an opaque payload.

The framework's compaction once counted encrypted reasoning (``protected_data``) as prompt
text (the seed bug report); these tests pin that our counter never does, under every
tokenizer and through both ways a strategy reads a count.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from agent_framework import CharacterEstimatorTokenizer, Content, Message, annotate_message_groups
from agent_framework._compaction import _serialize_message

import maf_compaction.core.counting as basis
from maf_compaction import AnchoredCompactionStrategy, MediaTokenEstimator
from maf_compaction.adapters.convert import to_history
from maf_compaction.adapters.counting import (
    DEFAULT_IMAGE_TOKENS,
    DEFAULT_OTHER_MEDIA_TOKENS,
    Tokenizer,
    as_estimator,
)
from maf_compaction.core.counting import BASIS_VERSION, MESSAGE_OVERHEAD_TOKENS
from offline_tokenizers import CountingTokenizer, offline_tiktoken

Count = Callable[[Message], int]

#: The seed report's assistant answer.
ANSWER = (
    "Good bug reports make it easier for maintainers to verify and root cause the "
    "underlying problem. The better a bug report, the faster the problem will be "
    "resolved. Ideally, a bug report should contain a high-level description of the "
    "problem, a minimal reproduction, a description of the expected behavior "
    "contrasted with the actual behavior observed, and information on the environment."
)
THINKING = "The user wants the forecast for Paris, so I should call the weather tool first."
SUMMARY = "**Checking the forecast** I looked up the weather in Paris and compared two sources."
BLOB_CHARS = (1_024, 4_096, 16_384)


def fake_encrypted_content(chars: int, seed: int = 0) -> str:
    """Stand-in for a provider's encrypted reasoning payload: base64 of ciphertext, ``chars`` long."""
    blob = base64.b64encode(random.Random(seed).randbytes(chars * 3 // 4)).decode("ascii")
    assert len(blob) == chars
    return blob


# --- tokenizers and the two views of a count ------------------------------------------

BASE_TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "character": CharacterEstimatorTokenizer,
    "tiktoken": offline_tiktoken,
}
TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    **BASE_TOKENIZERS,
    "media(character)": lambda: MediaTokenEstimator(CharacterEstimatorTokenizer(), image_tokens=500),
    "media(tiktoken)": lambda: MediaTokenEstimator(offline_tiktoken(), other_media_tokens=2_048),
}


def via_estimator(estimator: MediaTokenEstimator, message: Message) -> int:
    """The count a caller gets from the estimator."""
    return estimator.count_message_tokens(message)


def via_history(estimator: MediaTokenEstimator, message: Message) -> int:
    """The count a strategy works with: the record's tokens after conversion."""
    return to_history([message], estimator._parts, note_kind="anchored")[0].tokens


VIEWS: dict[str, Callable[[MediaTokenEstimator, Message], int]] = {
    "count_message_tokens": via_estimator,
    "to_history": via_history,
}


@pytest.fixture(params=list(TOKENIZERS))
def estimator(request: pytest.FixtureRequest) -> MediaTokenEstimator:
    """A fresh estimator (own cache) over each tokenizer, as a strategy would build it."""
    return as_estimator(TOKENIZERS[request.param]())


@pytest.fixture(params=list(VIEWS))
def count(request: pytest.FixtureRequest, estimator: MediaTokenEstimator) -> Count:
    """Count one message through one of the two views."""
    view = VIEWS[request.param]
    return lambda message: view(estimator, message)


@pytest.fixture(params=list(BASE_TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    """Each plain text tokenizer."""
    return BASE_TOKENIZERS[request.param]()


def default_count(message: Message) -> int:
    """Our count with the character estimator and default media estimates."""
    return MediaTokenEstimator(CharacterEstimatorTokenizer()).count_message_tokens(message)


# --- message builders -----------------------------------------------------------------


def reasoning(
    *, text: str = "", protected_data: str | None = None, additional_properties: dict[str, Any] | None = None
) -> Content:
    return Content.from_text_reasoning(
        id="rs_1", text=text, protected_data=protected_data, additional_properties=additional_properties
    )


def turn(*contents: Content) -> Message:
    """An assistant turn: the given parts, then the seed's answer text."""
    return Message("assistant", [*contents, Content.from_text(ANSWER)], message_id="m1")


def member(blob: str | None, key: str = "encrypted_content", **fixed: object) -> dict[str, object]:
    """``fixed`` plus ``key: blob``, or just ``fixed`` when there is no blob."""
    return {**fixed, key: blob} if blob is not None else dict(fixed)


def dumped(value: object) -> str:
    return json.dumps(value)


#: Each builds the same message with (``blob``) or without (``None``) an opaque payload.
BLOB_FORMS: dict[str, Callable[[str | None], Message]] = {
    "protected_data raw (responses encrypted_content)": lambda blob: turn(reasoning(protected_data=blob)),
    "protected_data json, encrypted_content at depth 1": lambda blob: turn(
        reasoning(text=THINKING, protected_data=dumped(member(blob, id="rs_1", type="reasoning")))
    ),
    "protected_data json, encrypted_content at depth 3": lambda blob: turn(
        reasoning(
            protected_data=dumped({"format": "openai-responses-v1", "reasoning": {"item": member(blob, id="rs_1")}})
        )
    ),
    "protected_data json, encrypted_content inside a list": lambda blob: turn(
        reasoning(
            protected_data=dumped(
                [
                    {"type": "reasoning.summary", "summary": SUMMARY, "index": 0},
                    member(blob, type="reasoning.encrypted", index=1),
                ]
            )
        )
    ),
    "protected_data json, encrypted_content in a list in a dict": lambda blob: turn(
        reasoning(protected_data=dumped({"details": [member(blob, index=0)]}))
    ),
    "additional_properties encrypted_content": lambda blob: turn(
        reasoning(text=THINKING, additional_properties=member(blob))
    ),
    "additional_properties openai.encrypted_content": lambda blob: turn(
        reasoning(text=THINKING, additional_properties={"openai": member(blob)})
    ),
    "anthropic signature in protected_data": lambda blob: turn(reasoning(text=THINKING, protected_data=blob)),
    "anthropic signature in additional_properties": lambda blob: turn(
        reasoning(text=THINKING, additional_properties=member(blob, "signature"))
    ),
    "reasoning_details reasoning.text signature": lambda blob: turn(
        reasoning(protected_data=dumped([member(blob, "signature", type="reasoning.text", text=THINKING)]))
    ),
    "gemini thought_signature in additional_properties": lambda blob: turn(
        reasoning(text=THINKING, additional_properties=member(blob, "thought_signature"))
    ),
    "gemini thought_signature on a function call": lambda blob: turn(
        Content.from_function_call(
            "c1", "get_weather", arguments={"city": "Paris"}, additional_properties=member(blob, "thought_signature")
        )
    ),
    "gemini thought_signature in protected_data json": lambda blob: turn(
        reasoning(text=THINKING, protected_data=dumped(member(blob, "thought_signature")))
    ),
    "content raw_representation": lambda blob: turn(
        Content.from_text_reasoning(id="rs_1", text=THINKING, raw_representation=member(blob))
    ),
    "message additional_properties": lambda blob: Message(
        "assistant", [reasoning(text=THINKING), ANSWER], message_id="m1", additional_properties=member(blob)
    ),
}


# --- 1. the seed bug: opaque blobs count nothing ----------------------------------------


@pytest.mark.parametrize("chars", BLOB_CHARS)
@pytest.mark.parametrize("form", list(BLOB_FORMS))
def test_opaque_blob_adds_no_tokens(form: str, chars: int, count: Count) -> None:
    """Two messages that differ only by an opaque blob count exactly the same."""
    build = BLOB_FORMS[form]
    assert count(build(fake_encrypted_content(chars))) == count(build(None))


@pytest.mark.parametrize("chars", BLOB_CHARS)
def test_seed_scenario_counts_like_the_answer_alone(chars: int, count: Count) -> None:
    """The seed's turn (empty reasoning carrying a blob, then an answer) counts as the answer alone."""
    seeded = turn(reasoning(protected_data=fake_encrypted_content(chars)))
    answer_only = Message("assistant", [ANSWER], message_id="m1")
    assert count(seeded) == count(answer_only)


@pytest.mark.parametrize("chars", BLOB_CHARS)
def test_the_blobs_would_be_expensive_if_counted(chars: int, estimator: MediaTokenEstimator) -> None:
    """Sanity: each blob is worth at least a quarter token per character, so the equalities above bite."""
    assert estimator.count_tokens(fake_encrypted_content(chars)) >= chars // 4


@pytest.mark.parametrize("form", list(BLOB_FORMS))
def test_blob_forms_still_count_their_readable_text(form: str, count: Count) -> None:
    """Every form keeps the answer (and whatever else is readable): the count is not just overhead."""
    answer = Message("assistant", [ANSWER], message_id="m1")
    assert count(BLOB_FORMS[form](None)) >= count(answer)


def test_reasoning_details_encrypted_data_adds_no_tokens() -> None:
    """OpenRouter-style ``{"type": "reasoning.encrypted", "data": <ciphertext>}`` is opaque too."""

    def build(blob: str | None) -> Message:
        details = [member(blob, "data", type="reasoning.encrypted", id="rs_1", format="anthropic-claude-v1")]
        return turn(reasoning(protected_data=dumped(details)))

    assert default_count(build(fake_encrypted_content(1_024))) == default_count(build(None))


# --- 2. clear-text reasoning counts -------------------------------------------------------


def test_reasoning_text_counts(count: Count) -> None:
    """A reasoning part with text counts more than one without."""
    assert count(Message("assistant", [reasoning(text=THINKING)])) > count(Message("assistant", [reasoning()]))


def test_reasoning_text_counts_like_the_same_answer_text(count: Count) -> None:
    """Clear-text reasoning is priced like any other text the model reads."""
    assert count(Message("assistant", [reasoning(text=THINKING)])) == count(Message("assistant", [THINKING]))


@pytest.mark.parametrize("chars", BLOB_CHARS)
def test_readable_summary_beside_a_blob_counts(chars: int, count: Count) -> None:
    """``{"summary": ..., "encrypted_content": blob}`` counts its summary, and only that."""
    blob = fake_encrypted_content(chars)
    with_summary = turn(reasoning(protected_data=dumped({"summary": SUMMARY, "encrypted_content": blob})))
    blob_only = turn(reasoning(protected_data=dumped({"encrypted_content": blob})))
    summary_only = turn(reasoning(protected_data=dumped({"summary": SUMMARY})))
    assert count(with_summary) > count(blob_only)
    assert count(with_summary) == count(summary_only)


def test_summary_surplus_does_not_depend_on_blob_length(count: Count) -> None:
    """What a readable summary adds is the same whatever the length of the blob beside it."""
    surplus: set[int] = set()
    for chars in BLOB_CHARS:
        blob = fake_encrypted_content(chars)
        with_summary = turn(reasoning(protected_data=dumped({"summary": SUMMARY, "encrypted_content": blob})))
        blob_only = turn(reasoning(protected_data=dumped({"encrypted_content": blob})))
        surplus.add(count(with_summary) - count(blob_only))
    assert len(surplus) == 1
    assert surplus.pop() > 0


def test_reasoning_details_text_counts(count: Count) -> None:
    """A Chat Completions ``reasoning.text`` entry counts its readable text, not its signature."""
    blob = fake_encrypted_content(4_096)
    with_text = turn(reasoning(protected_data=dumped([{"type": "reasoning.text", "text": SUMMARY, "signature": blob}])))
    without_text = turn(reasoning(protected_data=dumped([{"type": "reasoning.text", "text": "", "signature": blob}])))
    assert count(with_text) > count(without_text)


# --- 3. why we count ourselves: the framework's own counter ---------------------------------


def framework_count(tokenizer: Tokenizer, message: Message) -> int:
    """What agent_framework's compaction counts for ``message`` (its serialized JSON)."""
    return tokenizer.count_tokens(_serialize_message(message))


SIGNED_FORMS: dict[str, Callable[[str], Content]] = {
    "additional_properties signature": lambda blob: reasoning(text=THINKING, additional_properties={"signature": blob}),
    "additional_properties thought_signature": lambda blob: reasoning(
        text=THINKING, additional_properties={"thought_signature": blob}
    ),
    "protected_data json thought_signature": lambda blob: reasoning(
        text=THINKING, protected_data=dumped({"thought_signature": blob})
    ),
}


@pytest.mark.parametrize("form", list(SIGNED_FORMS))
def test_signatures_inflate_the_framework_count_but_not_ours(form: str, tokenizer: Tokenizer) -> None:
    """agent-framework 1.23 still counts thinking/thought signatures as text; we do not."""
    blob = fake_encrypted_content(4_096)
    plain = turn(reasoning(text=THINKING))
    signed = turn(SIGNED_FORMS[form](blob))
    ours = MediaTokenEstimator(tokenizer)

    assert ours.count_message_tokens(signed) == ours.count_message_tokens(plain)
    inflation = framework_count(tokenizer, signed) - framework_count(tokenizer, plain)
    assert inflation >= 0.9 * tokenizer.count_tokens(blob)


def test_inline_image_inflates_the_framework_count_but_not_ours(tokenizer: Tokenizer) -> None:
    """The framework counts an inline image by its base64 length; we count the estimate."""
    image = Message("user", [Content.from_data(b"\x89PNG" + bytes(300_000), "image/png")], message_id="m1")
    ours = MediaTokenEstimator(tokenizer).count_message_tokens(image)

    assert ours == MESSAGE_OVERHEAD_TOKENS + DEFAULT_IMAGE_TOKENS
    assert framework_count(tokenizer, image) > 10 * ours


def test_image_in_a_tool_result_counts_for_us_but_not_for_the_framework(tokenizer: Tokenizer) -> None:
    """The framework drops a result's media items from its count; we charge the estimate."""

    def result(media: list[Content]) -> Message:
        return Message(
            "tool",
            [Content.from_function_result(call_id="c1", result=[Content.from_text("see image"), *media])],
            message_id="m1",
        )

    with_image = result([Content.from_data(bytes(3_000), "image/png")])
    without = result([])
    ours = MediaTokenEstimator(tokenizer)

    assert ours.count_message_tokens(with_image) - ours.count_message_tokens(without) == DEFAULT_IMAGE_TOKENS
    assert framework_count(tokenizer, with_image) == framework_count(tokenizer, without)


# --- 4. media at a fixed estimate ----------------------------------------------------------


def media_message(content: Content) -> Message:
    return Message("user", [content], message_id="m1")


@pytest.mark.parametrize("size", [3_000, 300_000])
def test_inline_image_counts_the_default_estimate_whatever_its_size(size: int, tokenizer: Tokenizer) -> None:
    """A 3KB and a 300KB inline image both count 1,024 tokens by default."""
    image = media_message(Content.from_data(bytes(size), "image/png"))
    assert MediaTokenEstimator(tokenizer).count_message_tokens(image) == MESSAGE_OVERHEAD_TOKENS + DEFAULT_IMAGE_TOKENS


@pytest.mark.parametrize("uri", ["https://example.com/a.png", "https://example.com/" + "a" * 4_000 + ".png"])
def test_image_url_counts_the_estimate_whatever_its_length(uri: str, tokenizer: Tokenizer) -> None:
    """An image URL counts the estimate, never the URL's characters."""
    image = media_message(Content.from_uri(uri, media_type="image/png"))
    assert MediaTokenEstimator(tokenizer).count_message_tokens(image) == MESSAGE_OVERHEAD_TOKENS + DEFAULT_IMAGE_TOKENS


def test_data_uri_counts_the_estimate() -> None:
    """A ``data:`` URI is inline media too."""
    uri = "data:image/png;base64," + base64.b64encode(bytes(30_000)).decode("ascii")
    assert default_count(media_message(Content.from_uri(uri))) == MESSAGE_OVERHEAD_TOKENS + DEFAULT_IMAGE_TOKENS


def test_hosted_file_counts_the_estimate() -> None:
    """A hosted file (no media type) counts the non-image estimate."""
    hosted = media_message(Content.from_hosted_file("file_abc123"))
    assert default_count(hosted) == MESSAGE_OVERHEAD_TOKENS + DEFAULT_OTHER_MEDIA_TOKENS


@pytest.mark.parametrize("size", [3_000, 300_000])
def test_media_in_a_tool_result_counts_text_plus_estimate(size: int, tokenizer: Tokenizer) -> None:
    """A rich tool result counts its text and the media estimate, never the base64 length."""
    content = Content.from_function_result(
        call_id="c1", result=[Content.from_text("see image"), Content.from_data(bytes(size), "image/png")]
    )
    expected = MESSAGE_OVERHEAD_TOKENS + tokenizer.count_tokens("see image") + DEFAULT_IMAGE_TOKENS
    assert MediaTokenEstimator(tokenizer).count_message_tokens(Message("tool", [content])) == expected


def test_media_beside_text_adds_the_estimate() -> None:
    """A user turn with text and an image counts the text plus the estimate."""
    text_only = Message("user", ["What is in this picture?"])
    with_image = Message("user", ["What is in this picture?", Content.from_data(bytes(3_000), "image/png")])
    assert default_count(with_image) - default_count(text_only) == DEFAULT_IMAGE_TOKENS


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(Content.from_data(bytes(3_000), "image/png"), 500, id="png"),
        pytest.param(Content.from_uri("https://example.com/a.jpg", media_type="image/jpeg"), 500, id="jpeg-url"),
        pytest.param(Content.from_data(bytes(3_000), "audio/wav"), 2_048, id="wav"),
        pytest.param(Content.from_data(bytes(3_000), "application/pdf"), 2_048, id="pdf"),
        pytest.param(Content.from_hosted_file("file_abc", media_type="application/pdf"), 2_048, id="hosted-pdf"),
        pytest.param(Content.from_hosted_file("file_abc", media_type="image/png"), 500, id="hosted-png"),
    ],
)
def test_image_and_other_media_estimates(content: Content, expected: int) -> None:
    """Images count ``image_tokens``; audio, documents and the rest count ``other_media_tokens``."""
    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), image_tokens=500, other_media_tokens=2_048)
    assert estimator.count_message_tokens(media_message(content)) == MESSAGE_OVERHEAD_TOKENS + expected


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(Content.from_data(bytes(3_000), "image/png"), id="png"),
        pytest.param(Content.from_data(bytes(3_000), "application/pdf"), id="pdf"),
        pytest.param(Content.from_hosted_file("file_abc"), id="hosted"),
        pytest.param(
            Content.from_function_result(call_id="c1", result=[Content.from_data(bytes(3_000), "image/png")]),
            id="in-result",
        ),
    ],
)
def test_estimate_media_callback_overrides_both_estimates(content: Content) -> None:
    """``estimate_media`` decides every media part's price."""
    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), image_tokens=500, estimate_media=lambda _: 77)
    assert estimator.count_message_tokens(media_message(content)) == MESSAGE_OVERHEAD_TOKENS + 77


def test_estimate_media_callback_sees_the_content() -> None:
    """The callback is given the media part itself."""
    seen: list[str | None] = []

    def estimate(content: Content) -> int:
        seen.append(content.media_type)
        return 10

    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), estimate_media=estimate)
    estimator.count_message_tokens(media_message(Content.from_data(bytes(10), "audio/wav")))
    assert seen == ["audio/wav"]


@pytest.mark.parametrize("value", [0, -1, 1.5, True, None, "1024"])
@pytest.mark.parametrize("name", ["image_tokens", "other_media_tokens"])
def test_estimates_must_be_positive_integers(name: str, value: object) -> None:
    """A bad estimate is refused at construction, naming the parameter."""
    kwargs: dict[str, Any] = {name: value}
    with pytest.raises(ValueError, match=name):
        MediaTokenEstimator(CharacterEstimatorTokenizer(), **kwargs)


@pytest.mark.parametrize("name", ["image_tokens", "other_media_tokens"])
def test_an_estimate_of_one_is_accepted(name: str) -> None:
    kwargs: dict[str, Any] = {name: 1}
    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), **kwargs)
    assert getattr(estimator, name) == 1


@pytest.mark.parametrize("answer", [0, -3, 2.5, None, True])
def test_estimate_media_callback_must_return_a_positive_integer(answer: object) -> None:
    """A bad callback answer raises ``ValueError`` naming ``estimate_media`` when a media part is counted."""

    def estimate(_: Content) -> Any:
        return answer

    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), estimate_media=estimate)
    with pytest.raises(ValueError, match="estimate_media"):
        estimator.count_message_tokens(media_message(Content.from_data(bytes(10), "image/png")))


def test_estimate_media_must_be_callable() -> None:
    bogus: Any = 77
    with pytest.raises(ValueError, match="estimate_media"):
        MediaTokenEstimator(CharacterEstimatorTokenizer(), estimate_media=bogus)


@pytest.mark.parametrize(
    "text", ["", "hello world", "<|endoftext|>", "naïve café 東京 🚀", "def f(x):\n    return x * 2\n", "a" * 5_000]
)
def test_count_tokens_delegates_to_the_wrapped_tokenizer(text: str, tokenizer: Tokenizer) -> None:
    """``MediaTokenEstimator.count_tokens`` is exactly the wrapped tokenizer's answer."""
    estimator = MediaTokenEstimator(tokenizer)
    assert estimator.count_tokens(text) == tokenizer.count_tokens(text)
    assert estimator.tokenizer is tokenizer


class _NoCount:
    pass


class _NotCallableCount:
    count_tokens = 5


@pytest.mark.parametrize("bogus", [_NoCount(), _NotCallableCount(), None, "o200k_base"])
def test_tokenizer_without_count_tokens_is_refused(bogus: Any) -> None:
    with pytest.raises(ValueError, match="count_tokens"):
        MediaTokenEstimator(bogus)


def test_as_estimator_keeps_an_estimator_and_wraps_a_tokenizer() -> None:
    """Strategies share the caller's estimator (and so its cache and estimates)."""
    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer(), image_tokens=500)
    assert as_estimator(estimator) is estimator
    wrapped = as_estimator(CharacterEstimatorTokenizer())
    assert (wrapped.image_tokens, wrapped.other_media_tokens) == (DEFAULT_IMAGE_TOKENS, DEFAULT_OTHER_MEDIA_TOKENS)


# --- 5. the cache ----------------------------------------------------------------------------


def two_text_message() -> Message:
    return Message("user", ["What is the weather in Paris?", "And in Lyon?"], message_id="u1")


def test_counting_a_message_again_reuses_the_cache() -> None:
    """The same message, a shallow copy and a fresh equal message are tokenized once per distinct text."""
    tokenizer = CountingTokenizer()
    estimator = MediaTokenEstimator(tokenizer)
    message = two_text_message()

    first = estimator.count_message_tokens(message)
    assert tokenizer.calls == 2
    assert estimator.count_message_tokens(message) == first
    assert estimator.count_message_tokens(copy.copy(message)) == first
    assert estimator.count_message_tokens(two_text_message()) == first
    assert estimator.count_message_tokens(Message.from_dict(message.to_dict())) == first
    assert tokenizer.calls == 2
    assert sorted(tokenizer.texts) == sorted(["What is the weather in Paris?", "And in Lyon?"])


def test_repeated_text_within_a_message_is_tokenized_once() -> None:
    tokenizer = CountingTokenizer()
    MediaTokenEstimator(tokenizer).count_message_tokens(Message("user", ["same words", "same words"]))
    assert tokenizer.calls == 1


def test_the_history_view_shares_the_estimators_cache() -> None:
    """Converting to records after counting does not tokenize again."""
    tokenizer = CountingTokenizer()
    estimator = MediaTokenEstimator(tokenizer)
    message = two_text_message()
    expected = estimator.count_message_tokens(message)
    assert via_history(estimator, message) == expected
    assert tokenizer.calls == 2


def test_media_and_blobs_never_reach_the_tokenizer() -> None:
    """Only readable text is tokenized: no base64, no URL, no ciphertext."""
    tokenizer = CountingTokenizer()
    blob = fake_encrypted_content(4_096)
    message = Message(
        "assistant",
        [
            reasoning(text=THINKING, protected_data=blob, additional_properties={"signature": blob}),
            Content.from_data(bytes(3_000), "image/png"),
            Content.from_uri("https://example.com/" + "a" * 400 + ".png", media_type="image/png"),
            ANSWER,
        ],
    )
    MediaTokenEstimator(tokenizer).count_message_tokens(message)
    assert sorted(tokenizer.texts) == sorted([THINKING, ANSWER])


def test_another_estimator_recounts() -> None:
    """Each estimator has its own cache, so another tokenizer never reuses a count."""
    first, second = CountingTokenizer(), CountingTokenizer(offline_tiktoken())
    message = two_text_message()
    MediaTokenEstimator(first).count_message_tokens(message)
    MediaTokenEstimator(second).count_message_tokens(message)
    assert (first.calls, second.calls) == (2, 2)


def test_another_estimator_over_the_same_tokenizer_recounts() -> None:
    tokenizer = CountingTokenizer()
    message = two_text_message()
    MediaTokenEstimator(tokenizer).count_message_tokens(message)
    MediaTokenEstimator(tokenizer).count_message_tokens(message)
    assert tokenizer.calls == 4


def test_cache_keys_carry_the_basis_version() -> None:
    estimator = MediaTokenEstimator(CharacterEstimatorTokenizer())
    estimator.count_message_tokens(two_text_message())
    keys = list(estimator._parts._tokens)
    assert keys
    assert {key[0] for key in keys} == {BASIS_VERSION}


def test_a_new_basis_version_recounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts cached on an older basis are never reused."""
    tokenizer = CountingTokenizer()
    estimator = MediaTokenEstimator(tokenizer)
    estimator.count_message_tokens(two_text_message())
    monkeypatch.setattr(basis, "BASIS_VERSION", BASIS_VERSION + 1)
    estimator.count_message_tokens(two_text_message())
    assert tokenizer.calls == 4


def bogus_group(index: int = 0) -> dict[str, object]:
    """A framework ``_group`` annotation with an absurd per-message token count."""
    return {
        "id": f"g{index}",
        "kind": "user",
        "index": index,
        "has_reasoning": False,
        "token_count": 999_999,
        "token_count_basis": 2,
    }


def test_framework_token_count_annotation_is_ignored(count: Count) -> None:
    """A ``_group.token_count`` stamped by the framework (or anyone) does not change our count."""
    plain = two_text_message()
    annotated = two_text_message()
    annotated.additional_properties["_group"] = bogus_group()
    assert count(annotated) == count(plain)


def conversation(*, signed: bool = False) -> list[Message]:
    """A long tool-using conversation that the anchored strategy must shorten and shed."""
    blob = fake_encrypted_content(4_096)
    messages = [Message("system", ["You are a careful research assistant."], message_id="sys")]
    messages.append(Message("user", ["Research the weather in ten cities."], message_id="u0"))
    for i in range(10):
        parts: list[Content] = []
        if signed:
            parts.append(reasoning(text="", protected_data=blob, additional_properties={"signature": blob}))
        parts.append(Content.from_function_call(f"c{i}", "search", arguments={"city": f"city {i}"}))
        messages.append(Message("assistant", parts, message_id=f"a{i}"))
        result = f"city {i}: " + "sunny with a light breeze and mild temperatures; " * 60
        messages.append(
            Message("tool", [Content.from_function_result(call_id=f"c{i}", result=result)], message_id=f"t{i}")
        )
    messages.append(Message("user", ["Now compare them."], message_id="u1"))
    return messages


def projection(messages: list[Message]) -> list[tuple[object, ...]]:
    """What a strategy decided, without the framework's own annotations."""
    out: list[tuple[object, ...]] = []
    for message in messages:
        props = {k: v for k, v in message.additional_properties.items() if k not in ("_group", "_excluded")}
        excluded = bool(message.additional_properties.get("_excluded"))
        contents = [content.to_dict(exclude_none=True) for content in message.contents]
        out.append((message.message_id, str(message.role), contents, excluded, json.dumps(props, sort_keys=True)))
    return out


def annotate_bogus(messages: list[Message]) -> None:
    for index, message in enumerate(messages):
        message.additional_properties["_group"] = bogus_group(index)


def annotate_by_framework(messages: list[Message]) -> None:
    annotate_message_groups(messages, tokenizer=CharacterEstimatorTokenizer())


@pytest.mark.parametrize("annotate", [annotate_bogus, annotate_by_framework], ids=["bogus", "framework"])
@pytest.mark.parametrize("signed", [False, True], ids=["plain", "with-blobs"])
async def test_anchored_decisions_ignore_framework_token_counts(
    annotate: Callable[[list[Message]], None], signed: bool
) -> None:
    """The strategy decides the same on messages carrying framework counts as on messages without them."""
    reference = conversation(signed=signed)
    annotated = conversation(signed=signed)
    annotate(annotated)

    first = AnchoredCompactionStrategy(max_input_tokens=3_000, tokenizer=CharacterEstimatorTokenizer())
    second = AnchoredCompactionStrategy(max_input_tokens=3_000, tokenizer=CharacterEstimatorTokenizer())
    assert await first(reference)
    assert await second(annotated)

    assert first.last_report is not None
    assert first.last_report.shed  # the scenario really makes decisions
    assert second.last_report == first.last_report
    assert projection(annotated) == projection(reference)


async def test_blobs_do_not_change_anchored_decisions() -> None:
    """A conversation whose reasoning carries blobs is counted, and compacted, like one without."""
    plain, signed = conversation(), conversation(signed=True)
    first = AnchoredCompactionStrategy(max_input_tokens=3_000, tokenizer=CharacterEstimatorTokenizer())
    second = AnchoredCompactionStrategy(max_input_tokens=3_000, tokenizer=CharacterEstimatorTokenizer())
    await first(plain)
    await second(signed)
    assert first.last_report is not None
    assert second.last_report is not None
    assert (second.last_report.tokens_before, second.last_report.shed) == (
        first.last_report.tokens_before,
        first.last_report.shed,
    )


# --- 6. tool calls and results ------------------------------------------------------------------


def call_message(name: str, arguments: str | dict[str, Any] | None) -> Message:
    return Message("assistant", [Content.from_function_call("c1", name, arguments=arguments)], message_id="m1")


def result_message(content: Content) -> Message:
    return Message("tool", [content], message_id="m1")


def test_function_call_counts_name_and_arguments(tokenizer: Tokenizer) -> None:
    """A call is priced as its name and its arguments JSON."""
    message = call_message("get_weather", {"city": "Paris", "units": "metric"})
    expected = MESSAGE_OVERHEAD_TOKENS + tokenizer.count_tokens('get_weather {"city":"Paris","units":"metric"}')
    assert MediaTokenEstimator(tokenizer).count_message_tokens(message) == expected


def test_function_call_name_counts(count: Count) -> None:
    short = call_message("f", {"city": "Paris"})
    long = call_message("get_the_current_weather_forecast_for_a_city", {"city": "Paris"})
    assert count(long) > count(short)


def test_function_call_arguments_count(count: Count) -> None:
    bare = call_message("get_weather", None)
    with_arguments = call_message("get_weather", {"city": "Paris", "units": "metric", "days": 7})
    assert count(with_arguments) > count(bare)


def test_dict_and_compact_string_arguments_count_the_same(count: Count) -> None:
    """Dict arguments count as the compact, key-sorted JSON the same string would."""
    arguments = {"units": "metric", "city": "Paris", "days": [1, 2, 3]}
    compact = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    assert count(call_message("get_weather", arguments)) == count(call_message("get_weather", compact))


def test_dict_and_spaced_string_arguments_count_close(count: Count) -> None:
    """The same JSON with the default separators differs by at most one token per separator space."""
    arguments = {"city": "Paris", "units": "metric", "days": [1, 2, 3], "detail": "hourly"}
    spaced = json.dumps(arguments)
    as_dict = count(call_message("get_weather", arguments))
    as_string = count(call_message("get_weather", spaced))
    assert as_dict <= as_string <= as_dict + spaced.count(", ") + spaced.count(": ")


def test_tool_result_counts_its_text(tokenizer: Tokenizer) -> None:
    text = "Sunny, 21°C, light breeze from the west. " * 20
    message = result_message(Content.from_function_result(call_id="c1", result=text))
    assert MediaTokenEstimator(tokenizer).count_message_tokens(message) == (
        MESSAGE_OVERHEAD_TOKENS + tokenizer.count_tokens(text)
    )


def test_longer_tool_result_counts_more(count: Count) -> None:
    short = result_message(Content.from_function_result(call_id="c1", result="ok"))
    long = result_message(Content.from_function_result(call_id="c1", result="ok " * 500))
    assert count(long) > count(short)


def test_structured_tool_result_counts_its_json(tokenizer: Tokenizer) -> None:
    """A dict result counts the JSON text the framework renders for it."""
    content = Content.from_function_result(call_id="c1", result={"city": "Paris", "temperature": 21})
    assert isinstance(content.result, str)
    assert MediaTokenEstimator(tokenizer).count_message_tokens(result_message(content)) == (
        MESSAGE_OVERHEAD_TOKENS + tokenizer.count_tokens(content.result)
    )


def test_failed_call_result_counts_its_error_text(count: Count) -> None:
    """A failed call's result (the framework's shape: error text plus exception) counts its error text."""
    error = 'Error: Requested function "get_weather" not found.'
    failed = result_message(
        Content.from_function_result(call_id="c1", result=error, exception="KeyError('get_weather')")
    )
    empty = result_message(Content.from_function_result(call_id="c1", result=""))
    error_only = result_message(Content.from_function_result(call_id="c1", result=error))
    assert count(failed) > count(empty)
    assert count(failed) >= count(error_only)


def test_exception_diagnostic_is_not_counted() -> None:
    """Only ``result`` reaches the model; the exception text is host-internal."""
    error = 'Error: Requested function "get_weather" not found.'
    diagnostic = "Traceback (most recent call last):\n" + '  File "tool.py", line 12, in run\n' * 40
    with_exception = result_message(Content.from_function_result(call_id="c1", result=error, exception=diagnostic))
    without = result_message(Content.from_function_result(call_id="c1", result=error))
    assert default_count(with_exception) == default_count(without)


# --- plain text and overhead ---------------------------------------------------------------------


def test_text_message_counts_text_plus_overhead(tokenizer: Tokenizer) -> None:
    message = Message("user", [ANSWER])
    assert MediaTokenEstimator(tokenizer).count_message_tokens(message) == (
        MESSAGE_OVERHEAD_TOKENS + tokenizer.count_tokens(ANSWER)
    )


def test_empty_message_counts_the_overhead(count: Count) -> None:
    assert count(Message("assistant", [])) == MESSAGE_OVERHEAD_TOKENS


def test_parts_add_up(count: Count) -> None:
    """A message counts the overhead once plus each part."""
    both = Message("user", ["first part", "second part"])
    first = Message("user", ["first part"])
    second = Message("user", ["second part"])
    assert count(both) == count(first) + count(second) - MESSAGE_OVERHEAD_TOKENS
