"""Splitwise's scheduling knobs, each with the paper's default or the reason for ours."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from core.roles import Phase


class SplitwiseConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_batch_tokens: int = Field(default=2048, gt=0, description=(
        "Most prompt tokens batched into one prefill (tokens); §IV-B: prompt throughput drops past "
        "2048 batched prompt tokens (Fig. 6a)."))
    prompt_queue_threshold_tokens: int = Field(default=8192, gt=0, description=(
        "Pending prompt tokens above which the prompt pool is \"full\" and the cluster scheduler looks "
        "in the mixed pool, then in the token pool (§IV-A). Ours: four full prompt batches."))
    token_queue_threshold_tokens: int = Field(default=131072, gt=0, description=(
        "Pending tokens above which the token pool is \"full\" and the cluster scheduler looks in the "
        "mixed pool, then in the prompt pool (§IV-A). Ours: 256 sequences of 512 tokens."))
    min_home_replicas: int = Field(default=1, ge=0, description=(
        "Replicas a pool always keeps: it lends its last ones to the mixed pool only while the other phase "
        "has no replica at all (its pool lost, or not yet started)."))
    repurpose_after_s: float = Field(default=300.0, gt=0, description=(
        "A replica that stays mixed this long (s) is re-purposed for good (§IV-A: coarse re-purposing "
        "after \"a considerable amount of time\")."))
    token_kv_budget: float = Field(default=0.95, gt=0, le=1, description=(
        "Share of a token machine's KV its sequences may fill; new ones queue beyond it (§IV-B: "
        "5% kept free). Splitwise's own, not the one controller's KV budget (core.kv_budget)."))
    preempt_age_limit_s: float = Field(default=2.0, ge=0, description=(
        "Mixed machines: a token phase younger than this (s) may be preempted for a prompt; its "
        "priority grows with age (§IV-B)."))
    max_preemptions_per_request: int = Field(default=2, ge=0, description=(
        "Mixed machines: a request's token phase is preempted at most this often (§IV-B)."))


class MachineConfig(BaseModel):
    """What a replica's own batcher needs to play its Splitwise part (§IV-B)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phase: Phase = Field(description=(
        "The replica's phase pool: prompt (prefill), token (decode) or mixed (both; §IV-A)."))
    scheduling: SplitwiseConfig = Field(default=SplitwiseConfig(), description=(
        "Splitwise's scheduling knobs the replica's batcher uses."))
