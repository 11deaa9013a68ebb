"""Which output-length predictor the ingress runs (`prediction.predictor_factory` builds it).

`hashed_text` (default) trains at start-up on the train split of the shipped ShareGPT
pairs in about a second, so it works offline and carries no pickled artefact;
`transformer` loads a fine-tuned model from a local path; `bucket_median` is the
text-free online median of earlier outputs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.classes import LengthClassConfig
from prediction.length_buckets import LengthBuckets


class PredictorConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["hashed_text", "transformer", "bucket_median"] = Field(
        default="hashed_text", description="Bucket model: hashed words + task cues, a local fine-tuned transformer, "
        "or the text-free median of earlier outputs.")
    buckets: Literal["uniform", "length_classes"] = Field(
        default="uniform",
        description="'uniform': Mico's N buckets of l_max / N; 'length_classes': DynamoLLM's S / M / L outputs.")
    n_buckets: int = Field(default=10, ge=2, description="Uniform buckets (Mico §4.1.1: 10).")
    l_max_tokens: int = Field(
        default=1100, gt=0, description="Top of the last uniform bucket: the longest training response (1,065 tokens) "
        "rounded up; longer ones go to the last bucket.")
    model_path: str | None = Field(
        default=None, description="transformer: directory of a fine-tuned sequence classifier.")
    data_path: str | None = Field(
        default=None, description="Training pairs (JSON lines); None: data/prompts/sharegpt_pairs.jsonl.")
    online_sample_rate: float = Field(
        default=0.1, ge=0, le=1, description="Share of served requests kept to keep learning (Mico §3.2).")
    online_batch: int = Field(default=16, gt=0, description="Observed lengths per online update.")
    error_window: int = Field(default=1024, gt=0, description="(predicted, actual) pairs kept for the rolling error.")
    seed: int = Field(default=0, description="Seeds training order and request sampling: same config, same model.")

    @model_validator(mode="after")
    def _path(self) -> PredictorConfig:
        if self.kind == "transformer" and not self.model_path:
            raise ValueError("predictor kind 'transformer' needs model_path")
        return self

    def length_buckets(self, lengths: LengthClassConfig) -> LengthBuckets:
        if self.buckets == "length_classes":
            return LengthBuckets.from_length_classes(lengths, self.l_max_tokens)
        return LengthBuckets.uniform(self.l_max_tokens, self.n_buckets)
