"""Settings of one simulation run: cluster, reconfiguration overheads, epochs, prices."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OverheadTable(BaseModel):
    """Time to bring up a replica (DynamoLLM Table V, Llama2-70B), by component.

    The default is a warm node of a running Ray cluster with weights cached on it, so
    only engine setup (~18 s) and installing weights and KV (~15 s) remain; a cold
    cloud start adds the VM (~1-2 min), distributed env (~2 min) and weights (~3 min).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    create_vm_s: float = Field(default=0.0, ge=0)
    init_distributed_s: float = Field(default=0.0, ge=0)
    download_weights_s: float = Field(default=0.0, ge=0)
    engine_setup_s: float = Field(default=18.0, ge=0)
    install_weights_kv_s: float = Field(default=15.0, ge=0)
    # Re-sharding restarts the engine and reloads weights from host (DynamoLLM §III-D: 1-2 min
    # unoptimised); default: restart on the same warm node, like a start-up.
    reshard_s: float = Field(default=33.0, ge=0)
    # Locking a GPU clock stalls the replica (DynamoLLM: 50-80 ms; NVML ~50-200 ms).
    clock_change_s: float = Field(default=0.1, ge=0)

    @property
    def startup_s(self) -> float:
        return (
            self.create_vm_s + self.init_distributed_s + self.download_weights_s
            + self.engine_setup_s + self.install_weights_kv_s
        )

    @classmethod
    def cold_cloud(cls) -> OverheadTable:
        """Table V in full: a new 8xH100 VM (~6-8 min in total)."""
        return cls(create_vm_s=90.0, init_distributed_s=120.0, download_weights_s=180.0)


class SimConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "llama2-70b"
    hardware: str = "h100-80gb"
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
    # Output-length predictions the requests carry: the true length plus Gaussian noise
    # whose p95 relative error is this (throttLL'eM §V-D: 0.15, 0.30); 0 is an oracle.
    length_error_p95: float = Field(default=0.0, ge=0)
    length_error_seed: int = 0
