"""Builds the output-length predictor a `PredictorConfig` names: trains the default model
on the shipped pairs, or loads a fine-tuned one, and seeds its measured errors."""

from __future__ import annotations

from pathlib import Path

from core.classes import LengthClassConfig
from core.disk_cache import cached_pickle
from prediction.hashed_bucket_model import HashedBucketModel
from prediction.length_buckets import LengthBuckets
from prediction.length_predictor import BucketLengthPredictor
from prediction.predict import BucketMedianPredictor, OutputLengthPredictor
from prediction.predictor_config import PredictorConfig
from prediction.prompt_data import load_pairs, split_three_way
from prediction.trained_predictor_key import trained_predictor_key, training_data
from prediction.transformer_bucket_model import TransformerBucketModel


def make_predictor(config: PredictorConfig, lengths: LengthClassConfig, prior_tokens: int) -> OutputLengthPredictor:
    if config.kind == "bucket_median":
        return BucketMedianPredictor(lengths, prior_tokens, config.error_window)
    return make_bucket_predictor(config, lengths)


def make_bucket_predictor(config: PredictorConfig, lengths: LengthClassConfig) -> BucketLengthPredictor:
    """A model-backed predictor (kind hashed_text or transformer), its errors seeded."""
    if config.kind == "bucket_median":
        raise ValueError("predictor kind 'bucket_median' has no bucket model")
    buckets = config.length_buckets(lengths)
    data = training_data(config)
    if config.kind == "transformer":
        return _build(config, buckets, data)
    # Trained the same way in every process (fixed data, seed and code): each ingress replica
    # of a machine after the first loads it (~2 s of CPU less per replica start).
    return cached_pickle(f"predictor-{trained_predictor_key(config, lengths)}.pkl",
                         lambda: _build(config, buckets, data))


def _build(config: PredictorConfig, buckets: LengthBuckets, data: Path) -> BucketLengthPredictor:
    split = split_three_way(load_pairs(data))
    model: TransformerBucketModel | HashedBucketModel
    if config.kind == "transformer":
        assert config.model_path is not None  # PredictorConfig's validator
        model = TransformerBucketModel(config.model_path, buckets.n)
    else:
        model = HashedBucketModel(buckets.n, seed=config.seed)
        model.fit(split.train.prompts, split.train.prompt_tokens, [buckets.label(n) for n in split.train.output_tokens])
    predictor = BucketLengthPredictor(
        model, buckets, config.online_sample_rate, config.online_batch, config.error_window, seed=config.seed
    )
    predictor.seed_errors(split.validation)  # the test split stays for bench.predictor's one report
    return predictor
