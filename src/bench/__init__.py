"""The offline evaluation harness: a generated workload, a scripted model, a simulated provider, the grid.

Run it as ``maf-compaction bench`` or ``python -m maf_compaction.bench [COMMAND]``
(``bench``, the default, or ``speed``; see ``--help`` and ``docs/bench.md``).
"""
