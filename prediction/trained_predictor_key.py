"""What a trained bucket predictor is a function of, as a cache key: its config, buckets,
training data, training code and scikit-learn's version. Computed without importing any of
that code, so a process that needs only a cached result of training (the predictor's
measured error, in every pool replica and Serve's controller) does not pay scikit-learn's
import (~2 s of CPU) at its start."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from core.classes import LengthClassConfig
from core.disk_cache import fingerprint
from prediction.predictor_config import PredictorConfig
from prediction.prompt_data import PROMPTS_FILE

# The modules that build a trained predictor besides its config and data, by file.
_TRAINING_CODE = tuple(Path(__file__).parent / f"{name}.py" for name in (
    "hashed_bucket_model", "prompt_features", "prompt_cues", "prompt_data", "length_buckets", "length_predictor",
    "prediction_error"))


def training_data(config: PredictorConfig) -> Path:
    return Path(config.data_path) if config.data_path else PROMPTS_FILE


def trained_predictor_key(config: PredictorConfig, lengths: LengthClassConfig) -> str:
    key = fingerprint((config, config.length_buckets(lengths)), files=(*_TRAINING_CODE, training_data(config)))
    return f"{config.kind}-sklearn{version('scikit-learn')}-{key}"
