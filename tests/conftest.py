"""Hypothesis profiles: ``default`` is fast enough for CI, ``long`` hunts for bugs.

Pick one with ``HYPOTHESIS_PROFILE=long .venv/bin/pytest ...``; ``default`` when unset.
``make test-long`` runs the property tests with the long profile.
"""

from __future__ import annotations

import os
import warnings

from hypothesis import HealthCheck, settings

from redis_server import redis_client, redis_server_url, redis_url  # noqa: F401 - the real redis-server fixtures

# The package warns once, on import, that it is experimental; the tests know.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import maf_compaction  # noqa: F401

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large]

# ``default`` is derandomized: CI explores the same examples on every run, so a run fails
# only for a change, never for the luck of the draw. ``long`` draws afresh to hunt bugs.
settings.register_profile(
    "default", max_examples=40, deadline=None, suppress_health_check=_SUPPRESSED, derandomize=True
)
settings.register_profile("long", max_examples=1_000, deadline=None, suppress_health_check=_SUPPRESSED, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
