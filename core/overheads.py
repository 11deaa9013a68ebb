"""What reconfiguring a replica costs: one table for the planners, the simulator and Serve.

Source: DynamoLLM Table V (Llama2-70B on 8xH100): a new VM ~1-2 min, distributed env
~2 min, weights ~3 min, engine setup ~18 s, installing weights and KV ~15 s; a GPU clock
change stalls the GPU 50-80 ms (NVML ~50-200 ms). The default is a warm node of a
running Ray cluster with the weights cached on it, so only engine setup and installing
weights and KV remain (33 s).

A TP change is a restart at the new TP in every runtime we run: the simulator starts
new replicas while the old ones serve, Serve rolls a shadow deployment (vLLM) or the sim
engine stalls for the same time. DynamoLLM's NVLink re-shard (§III-D, energy.reshard)
would be cheaper, but no runtime here does it, so no planner may assume it.
"""

from __future__ import annotations

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
    clock_change_s: float = Field(default=0.1, ge=0, description="Stall of a GPU clock change (50-200 ms).")

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
