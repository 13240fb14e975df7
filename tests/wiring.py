"""Test wiring: a record strategy or composition with its recall middleware sharing its state, as every real wiring
has it (a pass without one is refused). Tests that drive passes themselves, with the model's record calls scripted
into the history, build their strategies through :func:`recalled`."""

from maf_compaction.bench.speed import with_recall as recalled

__all__ = ["recalled"]
