"""Settings of one simulation run: cluster, reconfiguration overheads, epochs, prices."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.overheads import OverheadTable


class SimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "llama2-70b"
    hardware: str = "h100-80gb"
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles.PROFILE_NAMES) the replicas and every policy "
        "are modelled on; None: Splitwise's fit for model and hardware."))
    cluster_gpus: int = Field(default=96, gt=0)  # DynamoLLM provisions 12 H100 servers
    overheads: OverheadTable = OverheadTable()
    control_interval_s: float = Field(default=1.0, gt=0)
    sample_interval_s: float = Field(default=10.0, gt=0)
    batch_limit: int = Field(default=256, gt=0)
    max_batched_tokens: int = Field(default=8192, gt=0)
    # After the last arrival, requests still in flight get this long to finish.
    drain_limit_s: float = Field(default=3600.0, ge=0)
    # Windows the peak used to provision static pools is measured over.
    provision_window_s: float = Field(default=60.0, gt=0)
    price_per_gpu_hour: float | None = Field(default=None, ge=0)  # None: the GPU's list price
    # Requests that never started and waited longer than this (and than their TTFT
    # target) are squashed, as the Serve app answers them with 503 (DynamoLLM §IV-D).
    squash_after_s: float | None = Field(default=None, gt=0)
    grid_gco2_per_kwh: float = Field(default=400.0, ge=0)
    # Output-length predictions the requests carry: "predictor" draws them from the ingress
    # predictor's held-out confusion (the default: what Serve does); "oracle" uses true
    # lengths (ablations); "noisy" adds Gaussian relative noise whose p95 is length_error_p95
    # (throttLL'eM §V-D: 0.15, 0.30).
    length_prediction: Literal["predictor", "oracle", "noisy"] = "predictor"
    length_error_p95: float = Field(default=0.0, ge=0)
    length_error_seed: int = 0
