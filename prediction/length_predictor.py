"""Mico's response-length predictor (§3.2): a bucket classifier behind OutputLengthPredictor.

The bucket model is pluggable (hashed linear model by default, a fine-tuned DistilBERT
from a local path instead); this class turns its bucket probabilities into a token
count, samples served requests to keep learning, and keeps the rolling error.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Protocol

import numpy as np

from prediction.length_buckets import LengthBuckets
from prediction.prediction_error import PredictionErrors
from prediction.prompt_data import PromptPairs


class BucketModel(Protocol):
    def predict_proba(self, texts: list[str], prompt_tokens: list[int]) -> np.ndarray: ...

    def partial_fit(self, texts: list[str], prompt_tokens: list[int], labels: list[int]) -> None: ...


def median_bucket(proba: np.ndarray) -> np.ndarray:
    """The median of each predicted distribution: misses land in neighbouring buckets
    (Mico §4.2.2), and the median minimises the expected distance in buckets."""
    return (np.cumsum(proba, axis=1) >= 0.5).argmax(axis=1)


class BucketLengthPredictor:
    def __init__(
        self,
        model: BucketModel,
        buckets: LengthBuckets,
        sample_rate: float = 0.1,
        update_batch: int = 16,
        error_window: int = 1024,
        max_pending: int = 4096,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.buckets = buckets
        self.errors = PredictionErrors(buckets, error_window)
        self.sample_rate = sample_rate
        self.update_batch = update_batch
        self.max_pending = max_pending
        self.updates = 0
        self._rng = random.Random(seed)
        # request id -> (text, prompt tokens) of sampled requests awaiting their length.
        self._pending: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._batch: list[tuple[str, int, int]] = []

    def predict_buckets(self, texts: list[str], prompt_tokens: list[int]) -> np.ndarray:
        return median_bucket(self.model.predict_proba(texts, prompt_tokens))

    def predict(self, prompt_tokens: int, max_tokens: int, text: str = "", request_id: str | None = None) -> int:
        """Midpoint of the predicted bucket, capped at max_tokens; may sample the request."""
        bucket = int(self.predict_buckets([text], [prompt_tokens])[0])
        if request_id is not None and self._rng.random() < self.sample_rate:
            self._pending[request_id] = (text, prompt_tokens)
            if len(self._pending) > self.max_pending:  # never observed (client went away)
                self._pending.popitem(last=False)
        return max(1, min(self.buckets.midpoint_tokens(bucket), max_tokens))

    def observe(self, prompt_tokens: int, output_tokens: int, predicted: int, request_id: str | None = None) -> None:
        """Record the error; a sampled request joins the next online update."""
        self.errors.record(predicted, output_tokens)
        sampled = self._pending.pop(request_id, None) if request_id is not None else None
        if sampled is None:
            return
        self._batch.append((sampled[0], sampled[1], self.buckets.label(output_tokens)))
        if len(self._batch) >= self.update_batch:
            texts, prompts, labels = (list(col) for col in zip(*self._batch))
            self.model.partial_fit(texts, prompts, labels)
            self._batch.clear()
            self.updates += 1

    def seed_errors(self, held_out: PromptPairs) -> None:
        """Start the rolling error from a held-out evaluation, so the margin is known before traffic."""
        predicted = self.predict_buckets(held_out.prompts, held_out.prompt_tokens)
        for bucket, actual in zip(predicted, held_out.output_tokens):
            self.errors.record(self.buckets.midpoint_tokens(int(bucket)), actual)

    @property
    def mean_relative_error(self) -> float:
        return self.errors.mean_relative_error
