"""Every public exception crosses processes: it pickles and unpickles to an equal error.

Hosts pass errors between processes (``multiprocessing``, task queues); the default pickling
of an exception calls ``cls(*self.args)``, which fails for errors whose constructor takes
structured arguments. The property runs over every exception class ``maf_compaction``
exports, so a new public error without a way to build it here fails the test.
"""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maf_compaction
from maf_compaction import (
    CompactionBudgetExceeded,
    LeaseTimeoutError,
    SessionLeaseError,
    SessionPayloadError,
    SessionStoreError,
    SessionVanishedError,
    SnapshotError,
    SnapshotVersionError,
    StackConfigurationError,
    StackKindError,
    StaleLeaseError,
    TokenizerUnavailableError,
)

text = st.text(max_size=40)
ids = st.text(min_size=1, max_size=20)
counts = st.integers(min_value=0, max_value=10**9)
#: How to build each public exception from arbitrary arguments.
BUILDERS: dict[type[BaseException], st.SearchStrategy[BaseException]] = {
    CompactionBudgetExceeded: st.builds(CompactionBudgetExceeded, text, needed=counts, budget=counts),
    SnapshotError: st.builds(SnapshotError, text),
    SnapshotVersionError: st.builds(
        SnapshotVersionError,
        st.one_of(counts, text, st.none()),
        st.lists(st.integers(min_value=1, max_value=9), max_size=3).map(tuple),
        kind=st.one_of(st.none(), text),
    ),
    StackKindError: st.builds(StackKindError, text, text),
    StackConfigurationError: st.builds(
        StackConfigurationError,
        st.dictionaries(text, st.one_of(counts, text, st.booleans(), st.none()), max_size=4),
        st.dictionaries(text, st.one_of(counts, text, st.booleans(), st.none()), max_size=4),
        state_key=ids,
    ),
    SessionLeaseError: st.builds(SessionLeaseError, text),
    LeaseTimeoutError: st.builds(LeaseTimeoutError, ids, st.floats(min_value=0, max_value=1e6)),
    StaleLeaseError: st.builds(StaleLeaseError, ids, counts, counts),
    SessionPayloadError: st.builds(SessionPayloadError, ids, text),
    SessionStoreError: st.builds(SessionStoreError, ids, text),
    SessionVanishedError: st.builds(SessionVanishedError, ids, counts),
    TokenizerUnavailableError: st.builds(TokenizerUnavailableError, text),
}


def public_exceptions() -> set[type[BaseException]]:
    """Every exception class the package exports (warnings are not raised, so not here)."""
    found: set[type[BaseException]] = set()
    for name in maf_compaction.__all__:
        value = getattr(maf_compaction, name)
        if isinstance(value, type) and issubclass(value, BaseException) and not issubclass(value, Warning):
            found.add(value)
    return found


def test_every_public_exception_has_a_builder() -> None:
    assert public_exceptions() == set(BUILDERS)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(BUILDERS, key=lambda cls: cls.__name__)).flatmap(lambda cls: BUILDERS[cls]), text)
def test_a_pickled_error_unpickles_to_an_equal_error(error: BaseException, note: str) -> None:
    """An error, with a note attached, survives pickle (every protocol) as an equal error with the same message."""
    error.add_note(note)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(copy) is type(error)
        assert copy == error
        assert str(copy) == str(error)
        assert copy.__notes__ == [note]
        assert vars(copy) == vars(error)


def test_errors_compare_by_value() -> None:
    assert StaleLeaseError("s", 1, 2) == StaleLeaseError("s", 1, 2)
    assert StaleLeaseError("s", 1, 2) != StaleLeaseError("s", 1, 3)
    assert StaleLeaseError("s", 1, 2) != SessionPayloadError("s", "1")
    assert len({StaleLeaseError("s", 1, 2), StaleLeaseError("s", 1, 2)}) == 1


def _raise(kind: str) -> None:
    if kind == "stale":
        raise StaleLeaseError("session-1", 3, 4)
    raise CompactionBudgetExceeded("the protected messages do not fit", needed=900, budget=800)


@pytest.mark.parametrize("kind", ["stale", "budget"])
def test_an_error_raised_in_a_worker_process_reaches_the_parent(kind: str) -> None:
    """A process pool sends the worker's exception back pickled: the parent catches our typed error."""
    with ProcessPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_raise, kind)
        error: Any = future.exception(timeout=60)
    if kind == "stale":
        assert error == StaleLeaseError("session-1", 3, 4)
        assert (error.token, error.newest) == (3, 4)
    else:
        assert isinstance(error, CompactionBudgetExceeded)
        assert (error.needed, error.budget) == (900, 800)
