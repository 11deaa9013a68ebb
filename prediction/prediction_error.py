"""Rolling record of a length predictor's error, for admission control to size its margin.

throttLL'eM (#6) projects KV use from predicted lengths; how far actual outputs exceed
predictions (a quantile of actual / predicted) is the margin it needs.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from prediction.length_buckets import LengthBuckets


class PredictionErrors:
    """The last `window` (predicted, actual) pairs in tokens."""

    def __init__(self, buckets: LengthBuckets, window: int = 1024) -> None:
        self.buckets = buckets
        self._pairs: deque[tuple[int, int]] = deque(maxlen=window)

    def record(self, predicted_tokens: int, actual_tokens: int) -> None:
        self._pairs.append((max(predicted_tokens, 1), max(actual_tokens, 1)))

    def __len__(self) -> int:
        return len(self._pairs)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        a = np.array(self._pairs, dtype=np.float64).reshape(-1, 2)
        return a[:, 0], a[:, 1]

    def _labels(self) -> tuple[np.ndarray, np.ndarray]:
        label = self.buckets.label
        return (np.array([label(int(p)) for p, _ in self._pairs]), np.array([label(int(a)) for _, a in self._pairs]))

    @property
    def mean_relative_error(self) -> float:
        if not self._pairs:
            return 0.0
        pred, actual = self._arrays()
        return float(np.mean(np.abs(pred - actual) / actual))

    @property
    def exact_accuracy(self) -> float:
        pred, actual = self._labels()
        return float(np.mean(pred == actual)) if len(pred) else 0.0

    @property
    def within_one_accuracy(self) -> float:
        pred, actual = self._labels()
        return float(np.mean(np.abs(pred - actual) <= 1)) if len(pred) else 0.0

    def confusion(self) -> np.ndarray:
        """counts[true bucket, predicted bucket]."""
        pred, actual = self._labels()
        counts = np.zeros((self.buckets.n, self.buckets.n), dtype=np.int64)
        np.add.at(counts, (actual, pred), 1)
        return counts

    def margin_ratio(self, quantile: float = 0.9) -> float:
        """actual / predicted at `quantile`: multiply a prediction by it to cover that share."""
        if not self._pairs:
            return 1.0
        pred, actual = self._arrays()
        return float(np.quantile(actual / pred, quantile))
