"""A vLLM KV connector that keeps the KV of preempted requests so their resumption loads it.

Chiron's mixed replicas preempt a running batch request for an arriving interactive one
(engines/vllm_engine.py aborts it in vLLM) and later resume it as a new vLLM request
whose prompt is the original prompt plus the tokens generated so far. vLLM's offload
connectors would keep that KV on the host, but both are CUDA/XPU-only in 0.32
(SimpleCPUOffloadConnector calls torch.cuda.Stream.priority_range();
OffloadingConnector's CPUOffloadingSpec.get_worker raises "CPU Offloading is currently
only supported on CUDA-alike and XPU GPUs"), and ExampleConnector stores only a new
request's prompt, under a hash of that exact prompt, which a longer continuation
prompt never matches. So this connector, on the same vLLM hooks:

- stores, when a request flagged `KEEP_KV_ON_ABORT` is aborted, every full block of
  its computed KV (prompt AND generated tokens) as one file per block, named by a hash
  of the whole token prefix up to the block's end (content-addressed: any request whose
  tokens start the same finds it); vLLM holds the blocks until the worker has written
  them (request_finished -> True, then get_finished reports the request);
- loads, for a new request, the longest run of stored blocks its prompt starts with,
  so vLLM computes only the rest; a file gone between lookup and load is reported as
  a load error and vLLM recomputes those blocks (kv_load_failure_policy="recompute").

Files live under `shared_storage_path` (extra config), at most `max_stored_blocks`
(oldest evicted). One worker per engine (tensor_parallel 1) and models with one KV
cache group (no hybrid/MLA layouts), as on the CPU backend.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# SamplingParams.extra_args key: keep this request's KV when it is aborted (preempted).
KEEP_KV_ON_ABORT = "wattwise_keep_kv_on_abort"
DEFAULT_MAX_STORED_BLOCKS = 4096


def block_keys(token_ids: list[int], block_size: int, num_tokens: int) -> list[str]:
    """Key of each full block of token_ids[:num_tokens]: a hash of the prefix up to its end."""
    digest, keys = hashlib.sha256(), []
    for end in range(block_size, num_tokens + 1, block_size):
        digest.update(array("q", token_ids[end - block_size:end]).tobytes())
        keys.append(digest.copy().hexdigest()[:40])
    return keys


@dataclass
class KeptKVMetadata(KVConnectorMetadata):
    loads: list[tuple[str, int]] = field(default_factory=list)  # (block key, block id)
    stores: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # request id -> blocks


class KeepPreemptedKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        extra = self._kv_transfer_config
        self._dir = str(extra.get_from_extra_config("shared_storage_path", "/tmp/wattwise-kv"))
        self._max_blocks = int(extra.get_from_extra_config("max_stored_blocks", DEFAULT_MAX_STORED_BLOCKS))
        os.makedirs(self._dir, exist_ok=True)
        # Scheduler side.
        # request id -> (index of its first block to load, keys of the blocks to load)
        self._hits: dict[str, tuple[int, list[str]]] = {}
        self._loads: dict[str, tuple[int, list[str]]] = {}  # allocated: load in this step
        self._stores: dict[str, list[tuple[str, int]]] = {}
        # Worker side.
        self._stored: set[str] = set()
        self._load_errors: set[int] = set()

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a lost block is recomputed

    def _path(self, key: str) -> str:
        return os.path.join(self._dir, f"{key}.safetensors")

    # ---- scheduler side -----------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        # Leave the prompt's last token to compute: it yields the next token's logits.
        keys = block_keys(list(request.prompt_token_ids or ()), self._block_size, request.num_prompt_tokens - 1)
        hits = 0
        while hits < len(keys) and os.path.exists(self._path(keys[hits])):
            hits += 1
        # Blocks already computed locally (vLLM's prefix cache) are not loaded again.
        local = -(-num_computed_tokens // self._block_size)
        self._hits[request.request_id] = (local, keys[local:hits])
        return max(hits * self._block_size - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        hit = self._hits.pop(request.request_id, None)
        if num_external_tokens > 0 and hit is not None:
            self._loads[request.request_id] = hit

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KeptKVMetadata(stores=self._stores)
        self._stores = {}
        scheduled = [(r.req_id, r.block_ids[0]) for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        scheduled += [  # resumed after vLLM's own preemption: its block list is all new
            (rid, cached.new_block_ids[i][0])
            for i, rid in enumerate(cached.req_ids) if rid in cached.resumed_req_ids and rid in self._loads
        ]
        for rid, block_ids in scheduled:
            first, keys = self._loads.pop(rid, (0, []))
            meta.loads += [(key, block_ids[first + i]) for i, key in enumerate(keys)]
        self._loads.clear()
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        extra = request.sampling_params.extra_args if request.sampling_params else None
        if request.status != RequestStatus.FINISHED_ABORTED or not (extra or {}).get(KEEP_KV_ON_ABORT):
            return False, None
        processed = request.num_computed_tokens - request.num_in_flight_tokens
        keys = block_keys(list(request.all_token_ids), self._block_size, min(processed, len(request.all_token_ids)))
        blocks = [(key, block_ids[i]) for i, key in enumerate(keys) if not os.path.exists(self._path(key))]
        if not blocks:
            return False, None
        self._stores[request.request_id] = blocks
        return True, None  # vLLM frees the blocks once get_finished reports the request

    # ---- worker side --------------------------------------------------------------
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KeptKVMetadata)
        caches = self._kv_caches(forward_context)
        for rid, blocks in meta.stores.items():
            for key, block in blocks:
                tmp = f"{self._path(key)}.{os.getpid()}.tmp"
                safetensors.torch.save_file({name: kv[block].contiguous() for name, kv in caches.items()}, tmp)
                os.replace(tmp, self._path(key))  # readers never see a partial file
            self._stored.add(rid)
        if meta.stores:
            self._evict()
        for key, block in meta.loads:
            try:
                tensors = safetensors.torch.load_file(self._path(key))
            except FileNotFoundError:
                self._load_errors.add(block)
                continue
            for name, kv in caches.items():
                kv[block].copy_(tensors[name])

    def _kv_caches(self, forward_context: ForwardContext) -> dict[str, torch.Tensor]:
        """Each attention layer's paged KV: a [blocks, heads, block_size, C] view (vLLM 0.32)."""
        caches = {}
        for name, layer in forward_context.no_compile_layers.items():
            kv = getattr(layer, "kv_cache", None)
            if isinstance(kv, torch.Tensor):
                if kv.shape[2] != self._block_size:
                    raise RuntimeError(f"{name}: KV layout {tuple(kv.shape)} is not [blocks, heads, "
                                       f"{self._block_size}, C]; this connector does not support it")
                caches[name] = kv
        return caches

    def _evict(self) -> None:
        files = sorted((e for e in os.scandir(self._dir) if e.name.endswith(".safetensors")),
                       key=lambda e: e.stat().st_mtime)
        for entry in files[:max(len(files) - self._max_blocks, 0)]:
            os.unlink(entry.path)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # stores happen once, when a kept request is aborted (start_load_kv)

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._stored = self._stored, set()
        return done or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors
