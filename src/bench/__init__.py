"""The offline bench: a scripted provider, generated workloads, measurements and the demo.

Run it as ``python -m maf_compaction.bench COMMAND`` (``demo``; see ``--help``).
"""
