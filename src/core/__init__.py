"""The pure core: immutable values in, values out; no framework, no I/O, no state."""
