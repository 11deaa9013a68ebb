"""Which output-length predictor the ingress runs, and how it is built.

`hashed_text` (default) trains at start-up on the shipped ShareGPT pairs in ~2 s, so it
works offline and carries no pickled artefact; `transformer` loads a fine-tuned model
from a local path; `bucket_median` is the text-free online median of earlier outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.hashed_bucket_model import HashedBucketModel
from app.length_buckets import LengthBuckets
from app.length_predictor import BucketLengthPredictor
from app.predict import BucketMedianPredictor, OutputLengthPredictor
from app.prompt_data import PROMPTS_FILE, load_pairs, split_by_conversation
from app.transformer_bucket_model import TransformerBucketModel
from core.classes import LengthClassConfig


class PredictorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["hashed_text", "transformer", "bucket_median"] = "hashed_text"
    # "uniform": Mico's N buckets of l_max / N; "length_classes": DynamoLLM's S / M / L outputs.
    buckets: Literal["uniform", "length_classes"] = "uniform"
    n_buckets: int = Field(default=10, ge=2)  # Mico §4.1.1
    # Longest response of the training pairs (690 words) rounded up; longer ones go to the last bucket.
    l_max_tokens: int = Field(default=700, gt=0)
    model_path: str | None = None  # transformer: directory of a fine-tuned sequence classifier
    data_path: str | None = None  # training pairs (JSON lines); None: data/prompts/sharegpt_pairs.jsonl
    online_sample_rate: float = Field(default=0.1, ge=0, le=1)  # Mico §3.2: sample queries to keep learning
    online_batch: int = Field(default=16, gt=0)
    error_window: int = Field(default=1024, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _path(self) -> PredictorConfig:
        if self.kind == "transformer" and not self.model_path:
            raise ValueError("predictor kind 'transformer' needs model_path")
        return self

    def length_buckets(self, lengths: LengthClassConfig) -> LengthBuckets:
        if self.buckets == "length_classes":
            return LengthBuckets.from_length_classes(lengths, self.l_max_tokens)
        return LengthBuckets.uniform(self.l_max_tokens, self.n_buckets)


def make_predictor(config: PredictorConfig, lengths: LengthClassConfig, prior_tokens: int) -> OutputLengthPredictor:
    if config.kind == "bucket_median":
        return BucketMedianPredictor(lengths, prior_tokens, config.error_window)
    buckets = config.length_buckets(lengths)
    train, held_out = split_by_conversation(load_pairs(Path(config.data_path) if config.data_path else PROMPTS_FILE))
    model: TransformerBucketModel | HashedBucketModel
    if config.kind == "transformer":
        model = TransformerBucketModel(config.model_path, buckets.n)
    else:
        model = HashedBucketModel(buckets.n, seed=config.seed)
        model.fit(train.prompts, train.prompt_tokens, [buckets.label(n) for n in train.output_tokens])
    predictor = BucketLengthPredictor(
        model, buckets, config.online_sample_rate, config.online_batch, config.error_window, seed=config.seed
    )
    predictor.seed_errors(held_out)
    return predictor
