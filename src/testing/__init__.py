"""Check a host's configuration of the core: hypothesis strategies for realistic histories, and replay checks.

Needs hypothesis: install the ``testing`` extra (``pip install '.[testing]'`` in a checkout of this project; PyPI's
maf-compaction is another project). A host runs the checks in its own property tests, on its own configuration::

    from hypothesis import given
    from maf_compaction import core
    from maf_compaction.testing import check_restored_state_replays, histories

    @given(histories(min_turns=3))
    def test_my_configuration_replays(history):
        check_restored_state_replays(
            history, step=core.composition_step, config=CONFIG, state=core.State(), measure=measure,
            rule=core.record_rule(CONFIG),
        )

The strategies draw conversations as plain values (:class:`Drawn` messages of :class:`Text`, :class:`Call`,
:class:`Result`, :class:`Reasoning` and :class:`Media`), and :func:`histories` / :func:`history_chunks` as the
core's ``History``. The package's own property tests draw from the same strategies.
"""

from __future__ import annotations

from ..core.extras import install_hint

try:
    import hypothesis as _hypothesis
except ImportError as error:  # pragma: no cover - exercised in a subprocess without hypothesis
    raise ImportError(
        f"maf_compaction.testing needs hypothesis, the testing extra: {install_hint('testing')}"
    ) from error

from .messages import MEDIA_TOKENS, Call, Content, Drawn, Media, Reasoning, Result, Text, to_history, to_part, to_record
from .replay import (
    Answerer,
    Passed,
    ReplayError,
    check_a_list_that_lost_its_insertions_agrees,
    check_later_passes_keep_earlier_decisions,
    check_restored_state_replays,
    check_two_lists_agree,
    quoting_answer,
    run_pass,
    shown,
    with_injected_context,
)
from .strategies import (
    Chunks,
    conversation_and_extension,
    conversation_chunks,
    conversations,
    estimate_tokens,
    histories,
    history_chunks,
)

del _hypothesis

__all__ = [
    "MEDIA_TOKENS",
    "Answerer",
    "Call",
    "Chunks",
    "Content",
    "Drawn",
    "Media",
    "Passed",
    "Reasoning",
    "ReplayError",
    "Result",
    "Text",
    "check_a_list_that_lost_its_insertions_agrees",
    "check_later_passes_keep_earlier_decisions",
    "check_restored_state_replays",
    "check_two_lists_agree",
    "conversation_and_extension",
    "conversation_chunks",
    "conversations",
    "estimate_tokens",
    "histories",
    "history_chunks",
    "quoting_answer",
    "run_pass",
    "shown",
    "to_history",
    "to_part",
    "to_record",
    "with_injected_context",
]
