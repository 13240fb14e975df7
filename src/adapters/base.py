"""What every strategy adapter exposes about its configuration."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from .counting import Tokenizer


class _Budgeted(Protocol):
    @property
    def max_input_tokens(self) -> int: ...


ConfigT = TypeVar("ConfigT", bound=_Budgeted)


class ConfiguredStrategy(Generic[ConfigT]):
    """The validated parameters, the tokenizer and the budget, read-only.

    Subclasses set ``_config`` and ``_tokenizer`` in their constructor.
    """

    _config: ConfigT
    _tokenizer: Tokenizer

    @property
    def config(self) -> ConfigT:
        """The validated parameters."""
        return self._config

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer given at construction (the framework reads it for its own logs)."""
        return self._tokenizer

    @property
    def max_input_tokens(self) -> int:
        """The input budget."""
        return self._config.max_input_tokens
