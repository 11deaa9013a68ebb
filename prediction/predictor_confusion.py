"""The ingress predictor's held-out confusion: its measured error, for everything that
must allow for it (the simulator's predicted lengths, throttLL'eM's projection margin)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from core.classes import LengthClassConfig
from core.disk_cache import cached_pickle
from prediction.length_buckets import LengthBuckets
from prediction.predictor_config import PredictorConfig
from prediction.trained_predictor_key import trained_predictor_key


@dataclass(frozen=True)
class PredictorError:
    """The default predictor's held-out confusion (counts[true bucket, predicted bucket])."""

    buckets: LengthBuckets
    confusion: np.ndarray

    def overrun_quantile(self, q: float) -> float:
        """Quantile of how far actual lengths exceed predictions (actual / predicted - 1,
        0 when the prediction was long enough): the margin throttLL'eM's projections need."""
        mid = np.array([self.buckets.midpoint_tokens(b) for b in range(self.buckets.n)], dtype=float)
        ratio = np.maximum(mid[:, None] / np.maximum(mid[None, :], 1.0) - 1.0, 0.0)
        weights = self.confusion.ravel().astype(float)
        if weights.sum() == 0:
            return 0.0
        order = np.argsort(ratio.ravel())
        cumulative = np.cumsum(weights[order]) / weights.sum()
        return float(ratio.ravel()[order][np.searchsorted(cumulative, q)])


@lru_cache(maxsize=1)
def default_predictor_error() -> PredictorError:
    """Kept on disk apart from the predictor: the processes that need only these counts (every
    pool replica, Serve's controller) then never import scikit-learn to read a trained model."""
    config, lengths = PredictorConfig(online_sample_rate=0.0), LengthClassConfig()
    return cached_pickle(f"predictor-error-{trained_predictor_key(config, lengths)}.pkl",
                         lambda: _measured_error(config, lengths))


def _measured_error(config: PredictorConfig, lengths: LengthClassConfig) -> PredictorError:
    from prediction.predictor_factory import make_bucket_predictor  # scikit-learn: only on a cache miss

    predictor = make_bucket_predictor(config, lengths)
    return PredictorError(predictor.buckets, predictor.errors.confusion())
