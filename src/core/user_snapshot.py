"""The user-turn strategy's snapshot: answers to its requests, as a versioned, JSON-safe value.

A summary is a model's answer, so the same bytes on both lists and after a restore can
only come from remembering the answer, keyed by the request's identity. The snapshot
holds the last ``remembered_requests`` summary answers (accepted, refused or failed:
each is replayed, never re-sent for the same conversation state), every media
description the host's hook gave, and the counts that allocate summary ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, cast

from .effects import Answer
from .errors import SnapshotError, SnapshotVersionError
from .snapshot import count_field

USER_SNAPSHOT_KIND: Final = "user_summaries"
USER_SNAPSHOT_VERSION: Final = 1
SUPPORTED_USER_SNAPSHOT_VERSIONS: Final = (1,)


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
    compactions: int = 0
    folds: int = 0

    def answer(self, identity: str) -> Answer | None:
        """The remembered summary answer for ``identity``, if any."""
        for answer in reversed(self.answers):
            if answer.identity == identity:
                return answer
        return None

    def description(self, identity: str) -> Answer | None:
        """The remembered description for ``identity``, if any."""
        for answer in reversed(self.descriptions):
            if answer.identity == identity:
                return answer
        return None

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict with an explicit kind and version."""
        return {
            "kind": USER_SNAPSHOT_KIND,
            "version": USER_SNAPSHOT_VERSION,
            "answers": [_answer_dict(a) for a in self.answers],
            "descriptions": [_answer_dict(a) for a in self.descriptions],
            "compactions": self.compactions,
            "folds": self.folds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> UserSummarySnapshot:
        """Read a snapshot written by :meth:`to_dict`; refuses newer or malformed ones."""
        if not isinstance(data, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise SnapshotError(f"a user-summary snapshot must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in SUPPORTED_USER_SNAPSHOT_VERSIONS:
            raise SnapshotVersionError(version, SUPPORTED_USER_SNAPSHOT_VERSIONS)
        if data.get("kind") != USER_SNAPSHOT_KIND:
            raise SnapshotError(f"expected a {USER_SNAPSHOT_KIND!r} snapshot, got kind {data.get('kind')!r}")
        return cls(
            answers=_answers(data, "answers"),
            descriptions=_answers(data, "descriptions"),
            compactions=count_field(data, "compactions"),
            folds=count_field(data, "folds"),
        )


def _answer_dict(answer: Answer) -> dict[str, object]:
    return {
        "identity": answer.identity,
        "text": answer.text,
        "summary_id": answer.summary_id,
        "sources": answer.sources,
        "turns": answer.turns,
    }


def _answers(data: Mapping[str, object], name: str) -> tuple[Answer, ...]:
    value = data.get(name, [])
    if not isinstance(value, (list, tuple)):
        raise SnapshotError(f"snapshot field {name!r} must be a list, got {value!r}")
    found: list[Answer] = []
    for item in cast("Sequence[object]", value):
        if not isinstance(item, Mapping):
            raise SnapshotError(f"snapshot field {name!r} must hold mappings, got {item!r}")
        entry = cast("Mapping[str, object]", item)
        identity, text, summary_id, sources, turns = (
            entry.get("identity"),
            entry.get("text"),
            entry.get("summary_id"),
            entry.get("sources"),
            entry.get("turns"),
        )
        if not isinstance(identity, str) or not identity:
            raise SnapshotError(f"snapshot field {name!r}: an entry has no identity: {item!r}")
        if text is not None and not isinstance(text, str):
            raise SnapshotError(f"snapshot field {name!r}: 'text' must be a string or null, got {text!r}")
        if summary_id is not None and not isinstance(summary_id, str):
            raise SnapshotError(f"snapshot field {name!r}: 'summary_id' must be a string or null, got {summary_id!r}")
        if sources is not None and (not isinstance(sources, int) or isinstance(sources, bool) or sources < 1):
            raise SnapshotError(f"snapshot field {name!r}: 'sources' must be a positive integer or null")
        if turns is not None and (not isinstance(turns, int) or isinstance(turns, bool) or turns < 0):
            raise SnapshotError(f"snapshot field {name!r}: 'turns' must be a non-negative integer or null")
        found.append(Answer(identity=identity, text=text, summary_id=summary_id, sources=sources, turns=turns))
    return tuple(found)
