"""The output lengths the simulated ingress predicts: the real predictor's, with its error.

A trace has no prompt text, so the simulator cannot run the ingress's text model on
it. It runs what that model does instead: each request's true length falls in a
bucket, and the predicted bucket is drawn from the predictor's confusion on its
held-out conversations (`PredictionErrors.confusion`), so classes are misjudged as
often, and as far, as they are at the ingress. True lengths ("oracle") and Gaussian
noise of a given p95 ("noisy", throttLL'eM §V-D) stay available for ablations.
"""

from __future__ import annotations

import numpy as np

from prediction.predictor_confusion import PredictorError


def predicted_by_predictor(output_tokens: np.ndarray, error: PredictorError, seed: int) -> np.ndarray:
    """Per request, a predicted bucket drawn from the confusion row of its true bucket; the
    prediction is that bucket's midpoint (what the ingress's predictor answers)."""
    rng = np.random.default_rng(seed)
    buckets = error.buckets
    n = buckets.n
    rows = error.confusion.astype(float)
    empty = rows.sum(axis=1) == 0
    rows[empty] = np.eye(n)[empty]  # no held-out sample of that bucket: assume it is right
    cdf = np.cumsum(rows / rows.sum(axis=1, keepdims=True), axis=1)
    true = np.array([buckets.label(int(t)) for t in output_tokens], dtype=np.int64)
    draws = rng.random(len(output_tokens))
    predicted = np.minimum((cdf[true] < draws[:, None]).sum(axis=1), n - 1)
    midpoints = np.array([max(buckets.midpoint_tokens(b), 1) for b in range(n)], dtype=np.int64)
    return midpoints[predicted]


def predicted_with_noise(output_tokens: np.ndarray, p95_error: float, seed: int) -> np.ndarray:
    """True lengths with Gaussian relative noise of the given p95 error (sigma = p95 / 1.96)."""
    if p95_error <= 0:
        return output_tokens
    noise = np.random.default_rng(seed).normal(0.0, p95_error / 1.96, len(output_tokens))
    return np.maximum(np.rint(output_tokens * (1.0 + noise)), 1).astype(np.int64)
