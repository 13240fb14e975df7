"""The user-turn strategy's snapshot: answers to its requests, as a versioned, JSON-safe value.

A summary is a model's answer, so the same bytes on both lists and after a restore can
only come from remembering the answer, keyed by the request's identity. The snapshot
holds the last ``remembered_requests`` summary answers (accepted, refused or failed:
each is replayed, never re-sent for the same conversation state), every media
description the host's hook gave, and the counts that allocate summary ids.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .effects import Answer
from .envelope import Count, Schema, distinct, dump, error, load, shown

USER_SNAPSHOT_KIND: Final = "user_summaries"
USER_SNAPSHOT_VERSION: Final = 1
#: The ids the user half allocates: ``user_summary_<n>`` and ``user_summary_fold_<n>``.
SUMMARY_ID_FORMAT: Final = re.compile(r"user_summary_(fold_)?(0|[1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class UserSummarySnapshot:
    """Everything the user-turn strategy remembers between passes.

    Attributes:
        answers: Summarizer answers, oldest first (at most ``remembered_requests``).
        descriptions: Media descriptions by identity, oldest first; ``text`` is ``None``
            for a description that failed, was empty or was too large.
        compactions: Summaries accepted so far (they allocate ``user_summary_<n>`` ids).
        folds: Folds accepted so far (``user_summary_fold_<n>``).
    """

    answers: tuple[Answer, ...] = ()
    descriptions: tuple[Answer, ...] = ()
    compactions: Count = 0
    folds: Count = 0

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict in the one snapshot envelope (``kind``, ``version``, then the fields)."""
        return dump(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> UserSummarySnapshot:
        """Read a snapshot written by :meth:`to_dict`, strictly (every field present, typed, consistent).

        No configuration is checked, because an answer cannot be misapplied under
        another one: it is found only by its request's identity, a digest of everything
        that determines the answer (the instructions, the numbered transcript, the item
        count; for media the message id, content and surrounding text). An answer made
        under another prompt or mode simply matches no request. ``remembered_requests``
        is a capacity, not a meaning: a restore keeps the newest that many, as
        :func:`~maf_compaction.core.user_summaries.absorb` itself would.

        Raises:
            SnapshotVersionError: It was written by a newer or unknown schema version.
            SnapshotError: It is malformed or inconsistent.
        """
        return load(cls, data)


def _check(snapshot: UserSummarySnapshot, _version: int, _head: int | None) -> UserSummarySnapshot:
    """Stored answers, checked against what :func:`~maf_compaction.core.user_summaries.absorb` writes.

    - One answer per identity: absorbing an answer replaces the one it supersedes, so a
      second would shadow the first depending on lookup order.
    - ``turns`` marks a failure's conversation state, so an answer with text has none.
    - A description is not a summary: it carries no ``summary_id`` and no ``sources``.
    - A summary's id is one the user half allocates (:data:`SUMMARY_ID_FORMAT`): any
      other would be written onto the conversation as a message id nobody chose.
    """
    for name, answers in (("answers", snapshot.answers), ("descriptions", snapshot.descriptions)):
        descriptions = name == "descriptions"
        for index, answer in enumerate(answers):
            here = f"{name}[{index}]"
            if answer.text is not None and answer.turns is not None:
                raise error(f"{here}.turns", f"an answer with text carries no turns, got {answer.turns}")
            summary_id = answer.summary_id
            if summary_id is not None and not descriptions and SUMMARY_ID_FORMAT.fullmatch(summary_id) is None:
                raise error(
                    f"{here}.summary_id",
                    f"must be 'user_summary_<n>' or 'user_summary_fold_<n>', got {shown(summary_id)}",
                )
            if descriptions and (summary_id is not None or answer.sources is not None):
                field = "summary_id" if summary_id is not None else "sources"
                raise error(f"{here}.{field}", "a media description carries no summary_id or sources")
        distinct(name, [a.identity for a in answers], what="identity")
    return snapshot


USER_SNAPSHOT_SCHEMA: Final = Schema(USER_SNAPSHOT_KIND, USER_SNAPSHOT_VERSION, UserSummarySnapshot, check=_check)
