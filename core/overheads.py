"""What reconfiguring a replica costs: one table for the planners, the simulator and Serve.

Source: DynamoLLM Table V (Llama2-70B on 8xH100): a new VM ~1-2 min, distributed env
~2 min, weights ~3 min, engine setup ~18 s, installing weights and KV ~15 s; a GPU clock
change takes 50-80 ms (NVML ~50-200 ms). The default is a warm node of a running Ray
cluster with the weights cached on it, so only engine setup and installing weights and KV
remain (33 s).

A clock change stalls nothing here: DynamoLLM's stall is the inference loop itself calling
nvidia-smi; wattwise's replicas forward their clock to the node's GPU-control actor, off the
request path (throttLL'eM, §IV: "off the critical path"). What a change costs is lateness:
the GPUs run at the old clock until the next forward plus the lock's latency, and every
runtime charges that (batching.continuous_batcher, ContinuousBatcher.request_clock).

A TP change is a restart at the new TP in every runtime we run: the simulator starts
new replicas while the old ones serve, Serve rolls a shadow deployment (vLLM) or the sim
engine stalls for the same time. DynamoLLM's NVLink re-shard (§III-D, energy.reshard)
would be cheaper, but no runtime here does it, so no planner may assume it.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class OverheadTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    create_vm_s: float = Field(default=0.0, ge=0, description=(
        "Booting a new GPU VM (Table V: 1-2 min; 0 on a warm node)."))
    init_distributed_s: float = Field(default=0.0, ge=0, description=(
        "Distributed environment set-up (Table V: ~2 min)."))
    download_weights_s: float = Field(default=0.0, ge=0, description=(
        "Fetching weights (Table V: ~3 min; 0 when cached)."))
    engine_setup_s: float = Field(default=18.0, ge=0, description="Engine start (Table V: ~18 s).")
    install_weights_kv_s: float = Field(default=15.0, ge=0, description=(
        "Loading weights and allocating KV (Table V: ~15 s)."))
    reshard_s: float = Field(default=33.0, ge=0, description=(
        "A TP change: a restart at the new TP on the same warm node (engine set-up + weights/KV)."))
    clock_change_s: float = Field(default=0.1, ge=0, description=(
        "From a clock lock to the GPUs running at it (NVML 50-200 ms); the old clock runs meanwhile."))
    clock_forward_period_s: float = Field(default=0.25, gt=0, description=(
        "A replica sends its latest clock choice (per-step hook or plan) to its GPUs this often, so "
        "a GPU takes at most one change per period: a choice lands at the next send plus "
        "clock_change_s."))

    @property
    def startup_s(self) -> float:
        """A new replica, from request to serving."""
        return (
            self.create_vm_s + self.init_distributed_s + self.download_weights_s
            + self.engine_setup_s + self.install_weights_kv_s
        )

    @classmethod
    def cold_cloud(cls) -> OverheadTable:
        """Table V in full: a new 8xH100 VM (~6-8 min in total)."""
        return cls(create_vm_s=90.0, init_distributed_s=120.0, download_weights_s=180.0)


def clock_lands_s(now_s: float, forward_period_s: float, change_s: float) -> float:
    """When a clock chosen at `now_s` reaches the GPUs: the replica's first forward from then
    (forwards go out at multiples of `forward_period_s`; at once where it is 0), plus the
    lock's latency. The batcher models its lag by this rule, and a vLLM replica's clock rule
    reads it for its real GPUs' (engines.vllm_running_batch)."""
    sent_s = math.ceil(now_s / forward_period_s) * forward_period_s if forward_period_s > 0 else now_s
    return sent_s + change_s
