"""Splitwise's scheduling knobs, each with the paper's default or the reason for ours."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SplitwiseConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # §IV-B: prompt throughput drops past 2048 batched prompt tokens (Fig. 6a).
    prompt_batch_tokens: int = Field(default=2048, gt=0)
    # §IV-A: above these pending tokens a pool is "full" and the CLS looks in the mixed pool,
    # then in the opposite pool. Ours: four full prompt batches; 256 sequences of 512 tokens.
    prompt_queue_threshold_tokens: int = Field(default=8192, gt=0)
    token_queue_threshold_tokens: int = Field(default=131072, gt=0)
    # A pool never lends its last replica to the mixed pool.
    min_home_replicas: int = Field(default=1, ge=0)
    # §IV-A: coarse re-purposing when a replica stays mixed "a considerable amount of time".
    repurpose_after_s: float = Field(default=300.0, gt=0)
    # §IV-B token machines: queue new sequences once KV is this close to full.
    token_kv_headroom: float = Field(default=0.05, ge=0, lt=1)
    # §IV-B mixed machines: a token phase younger than this may be preempted for a prompt
    # (its priority grows with age), and never more often than the cap.
    preempt_age_limit_s: float = Field(default=2.0, ge=0)
    max_preemptions_per_request: int = Field(default=2, ge=0)


class MachineConfig(BaseModel):
    """What a replica's own batcher needs to play its Splitwise part (§IV-B)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Literal["prompt", "token", "mixed"]
    scheduling: SplitwiseConfig = SplitwiseConfig()
