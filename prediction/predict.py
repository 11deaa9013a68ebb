"""Output-length predictors: a replaceable interface and a simple online default.

Mico (issue #8) replaces the default with a text model; every predictor exposes its
recent error so admission control can size its margin.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from core.classes import LengthClassConfig


class OutputLengthPredictor(Protocol):
    """`request_id` pairs a prediction with its observed length, for online learning."""

    def predict(self, prompt_tokens: int, max_tokens: int, text: str = "",
                request_id: str | None = None) -> int: ...

    def observe(self, prompt_tokens: int, output_tokens: int, predicted: int,
                request_id: str | None = None) -> None: ...


class BucketMedianPredictor:
    """Median of recent outputs of prompts of the same input size, capped at max_tokens.

    Cheap, online, and no worse than a constant; its window forgets old traffic."""

    def __init__(
        self, lengths: LengthClassConfig | None = None, prior_tokens: int = 200, window: int = 512
    ) -> None:
        self.lengths = lengths or LengthClassConfig()
        self.prior_tokens = prior_tokens
        self._history: dict[str, deque[int]] = {}
        self._errors: deque[float] = deque(maxlen=window)
        self._window = window

    def predict(self, prompt_tokens: int, max_tokens: int, text: str = "", request_id: str | None = None) -> int:
        hist = self._history.get(self.lengths.input_size(prompt_tokens))
        guess = int(np.median(hist)) if hist else self.prior_tokens
        return max(1, min(guess, max_tokens))

    def observe(self, prompt_tokens: int, output_tokens: int, predicted: int, request_id: str | None = None) -> None:
        size = self.lengths.input_size(prompt_tokens)
        self._history.setdefault(size, deque(maxlen=self._window)).append(output_tokens)
        self._errors.append(abs(predicted - output_tokens) / max(output_tokens, 1))

    @property
    def mean_relative_error(self) -> float:
        return float(np.mean(self._errors)) if self._errors else 0.0


class OraclePredictor:
    """Knows the true length (traces in the simulator): the upper bound for any predictor."""

    def predict(self, prompt_tokens: int, max_tokens: int, text: str = "", true_tokens: int | None = None) -> int:
        return max(1, min(true_tokens or max_tokens, max_tokens))

    def observe(self, prompt_tokens: int, output_tokens: int, predicted: int, request_id: str | None = None) -> None:
        pass
