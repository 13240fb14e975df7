"""The async shell: framework types, conversion, effects and wiring."""
