"""Settings of one simulation run: cluster, reconfiguration overheads, epochs, prices."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.config import BatchApiConfig
from core.overheads import OverheadTable
from core.replica_choice import PrefixAffinity

ReplicaRouter = Literal["kv_aware", "prefix_aware", "pow2", "oracle"]


class SimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="llama2-70b", description=(
        "Model the simulated replicas serve (a perf model's model name)."))
    hardware: str = Field(default="h100-80gb", description=(
        "GPU the simulated cluster has (a perf model's hardware name)."))
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles.PROFILE_NAMES) the replicas and every policy "
        "are modelled on; None: the default for model and hardware (energy.profiles.default_profile)."))
    cluster_gpus: int = Field(default=96, gt=0, description=(
        "GPUs in the simulated cluster; DynamoLLM provisions 12 H100 servers (96 GPUs)."))
    overheads: OverheadTable = Field(default=OverheadTable(), description=(
        "What a TP change, a clock change and a new instance cost (the simulator charges them)."))
    control_interval_s: float = Field(default=1.0, gt=0, description="The policy's control step (s).")
    sample_interval_s: float = Field(default=10.0, gt=0, description=(
        "Interval (s) of the sampled time series (power, GPUs, load) in the results."))
    batch_limit: int = Field(default=256, gt=0, description="Most requests in one replica's running batch.")
    max_batched_tokens: int = Field(default=8192, gt=0, description=(
        "Most tokens (prefill plus decode) one engine step processes."))
    batch_in_flight: int | None = Field(default=BatchApiConfig().max_in_flight, gt=0, description=(
        "Batch requests on length pools wait in the app's global batch queue (Serve: the Batch "
        "API's durable queue, deadline first), at most this many in flight on the pools "
        "(batch_api.max_in_flight, the same default); None: each goes to its pool on arrival. "
        "Chiron's replica kinds keep their own queue, drained into replicas with room."))
    drain_limit_s: float = Field(default=3600.0, ge=0, description=(
        "After the last arrival, requests still in flight get this long (s) to finish."))
    provision_window_s: float = Field(default=60.0, gt=0, description=(
        "Window (s) the peak load used to provision static pools is measured over."))
    provision_slo_target: float = Field(default=0.99, ge=0, le=1, description=(
        "Share of its requests' SLOs a provisioned pool must meet: from the fluid model's count "
        "for the peak window up, each pool gets the fewest replicas whose own traffic meets it in "
        "a simulation at max clock (a baseline that misses SLOs is no yardstick at equal SLO: "
        "the code trace's bursts broke one TP8 replica's TTFTs 40% of the time). 0: the fluid "
        "model's count alone."))
    provision_search_window_s: float = Field(default=7200.0, gt=0, description=(
        "A static pool's replicas are searched by simulating at most this much of its traffic: "
        "the busiest such window of a longer run (a 24 h day's peak hours). A static fleet that "
        "meets the target at its peak meets it where the load is lower, and each simulation of a "
        "whole day costs minutes; the run itself still covers the whole workload."))
    price_per_gpu_hour: float | None = Field(default=None, ge=0, description=(
        "GPU cost (USD per GPU-hour) for the cost results; None: the GPU's list price."))
    squash_after_s: float | None = Field(default=None, gt=0, description=(
        "Requests that never started and waited longer than this (s) and than their TTFT target "
        "are squashed, as the Serve app answers them with 503 (DynamoLLM §IV-D); None: never."))
    grid_gco2_per_kwh: float = Field(default=400.0, ge=0, description=(
        "Grid carbon intensity (gCO2 per kWh) for the emissions results when no carbon series is given."))
    length_prediction: Literal["predictor", "oracle", "noisy"] = Field(default="predictor", description=(
        "Output-length predictions the requests carry: \"predictor\" draws them from the ingress "
        "predictor's held-out confusion (the default: what Serve does); \"oracle\" uses true lengths "
        "(ablations); \"noisy\" adds Gaussian relative noise whose p95 is length_error_p95."))
    length_error_p95: float = Field(default=0.0, ge=0, description=(
        "p95 relative error of the \"noisy\" predictions (throttLL'eM §V-D: 0.15, 0.30)."))
    length_error_seed: int = Field(default=0, description="Seed of the \"noisy\" predictions' noise.")
    replica_router: ReplicaRouter = Field(default="kv_aware", description=(
        "How a pool's request picks its replica: \"kv_aware\" the KV-room rank (core.replica_choice, the "
        "Serve pools' default router); \"prefix_aware\" that rank after the replicas holding the prompt's "
        "prefix within the load bound (`prefix_affinity`); \"pow2\" Serve's default router (the shorter queue "
        "of two at random); \"oracle\" the replica holding the most of the prompt whatever its load (every "
        "cache known: the hit rate's reference). Replicas cache prompt prefixes whenever the workload has "
        "prefix hashes (Mooncake's, the multi-turn generator's), as vLLM does."))
    prefix_affinity: PrefixAffinity = Field(default=PrefixAffinity(), description=(
        "The load bound on prefix affinity (\"prefix_aware\"): requests above the least loaded replica, "
        "and the least share of the prompt a replica must hold."))
    router_seed: int = Field(default=0, description="Seed of \"pow2\"'s random picks.")
