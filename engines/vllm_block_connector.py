"""A vLLM KV connector that stores requests' KV blocks as files and loads any it finds.

Two of our features need KV outside the engine that computed it, and vLLM 0.32 ships no
connector for either on the CPU:
- Splitwise: a prompt replica's KV must reach a token replica, possibly on another node.
  ExampleConnector writes to a shared path (a shared filesystem across nodes) and looks a
  prompt of k x block_size + 1 tokens up under another key than it stored it (always a
  miss); NixlConnector needs GPUs and RDMA/NVLink.
- Chiron: a mixed replica preempts a batch request (engines/vllm_engine.py aborts it) and
  later resumes it as a new request whose prompt is the old prompt plus the tokens made
  so far. vLLM's host offload connectors would keep that KV but are CUDA/XPU-only
  (SimpleCPUOffloadConnector calls torch.cuda.Stream.priority_range(); OffloadingConnector's
  CPU spec raises "only supported on CUDA-alike and XPU GPUs").

So this connector keeps one content-addressed store of blocks (engines/kv_block_files.py:
a file per block and TP rank, named by a hash of the token prefix up to the block's end):
- it stores every full computed block (prompt AND generated tokens) of a request that
  opts in through SamplingParams.extra_args: KEEP_KV_ON_ABORT when the request is aborted
  (preempted), EXPORT_KV when it finishes for any reason (a Splitwise prompt phase);
  vLLM keeps the blocks until the worker has written them (request_finished -> True, then
  get_finished reports the request);
- it loads, for a new request, the longest run of stored blocks its prompt starts with,
  so vLLM computes only the rest; a file gone between lookup and load is reported as a
  load error and vLLM recomputes those blocks (kv_load_failure_policy="recompute").
The replica moves files between nodes through Ray's object store (deployments/kv_handoff.py).
Files live under `shared_storage_path` (extra config), at most `max_stored_blocks` blocks
(oldest evicted). Models with one KV cache group (no hybrid/MLA layouts).
"""

from __future__ import annotations

import os
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

from engines.kv_block_files import block_axis, block_file, block_keys, evict_oldest, write_atomic

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# SamplingParams.extra_args keys a request opts in with.
KEEP_KV_ON_ABORT = "wattwise_keep_kv_on_abort"  # store its KV if aborted (Chiron preemption)
EXPORT_KV = "wattwise_export_kv"  # store its KV when it finishes (Splitwise prompt phase)
DEFAULT_MAX_STORED_BLOCKS = 4096


@dataclass
class BlockFileMetadata(KVConnectorMetadata):
    loads: list[tuple[str, int]] = field(default_factory=list)  # (block key, block id)
    stores: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # request id -> blocks


def _store_trigger(request: Request) -> str | None:
    """EXPORT_KV, KEEP_KV_ON_ABORT (if it was aborted) or None: whether to store its KV."""
    extra = (request.sampling_params.extra_args if request.sampling_params else None) or {}
    if extra.get(EXPORT_KV):
        return EXPORT_KV
    if extra.get(KEEP_KV_ON_ABORT) and request.status == RequestStatus.FINISHED_ABORTED:
        return KEEP_KV_ON_ABORT
    return None


class BlockFileKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._ranks = vllm_config.parallel_config.tensor_parallel_size
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

    def _stored_everywhere(self, key: str) -> bool:
        return all(os.path.exists(block_file(self._dir, key, rank)) for rank in range(self._ranks))

    # ---- scheduler side -----------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        # Leave the prompt's last token to compute: it yields the next token's logits.
        keys = block_keys(list(request.prompt_token_ids or ()), self._block_size, request.num_prompt_tokens - 1)
        hits = 0
        while hits < len(keys) and self._stored_everywhere(keys[hits]):
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
        meta = BlockFileMetadata(stores=self._stores)
        self._stores = {}
        scheduled = [(r.req_id, r.block_ids[0]) for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        scheduled += [  # resumed after vLLM's own preemption: its block list is all new
            (rid, blocks[0])
            for rid, blocks in zip(cached.req_ids, cached.new_block_ids)
            if blocks is not None and rid in cached.resumed_req_ids and rid in self._loads
        ]
        for rid, block_ids in scheduled:
            first, keys = self._loads.pop(rid, (0, []))
            meta.loads += [(key, block_ids[first + i]) for i, key in enumerate(keys)]
        self._loads.clear()
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        trigger = _store_trigger(request)
        if trigger is None:
            return False, None
        processed = request.num_computed_tokens - request.num_in_flight_tokens
        keys = block_keys(list(request.all_token_ids), self._block_size, min(processed, len(request.all_token_ids)))
        # An export is always written afresh: the replica may be about to remove an
        # existing copy that another request of its own was using.
        blocks = [(key, block_ids[i]) for i, key in enumerate(keys)
                  if trigger == EXPORT_KV or not self._stored_everywhere(key)]
        if not blocks:
            return False, None
        self._stores[request.request_id] = blocks
        return True, None  # vLLM frees the blocks once get_finished reports the request

    # ---- worker side --------------------------------------------------------------
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        meta = self._get_connector_metadata()
        assert isinstance(meta, BlockFileMetadata)
        if not meta.stores and not meta.loads:
            return
        rank = get_tensor_model_parallel_rank()
        caches = self._kv_caches(forward_context)
        for rid, blocks in meta.stores.items():
            for key, block in blocks:
                write_atomic(block_file(self._dir, key, rank), safetensors.torch.save(
                    {name: kv.select(axis, block).contiguous().cpu() for name, (kv, axis) in caches.items()}))
            self._stored.add(rid)
        if meta.stores:
            evict_oldest(self._dir, self._max_blocks * self._ranks)
        for key, block in meta.loads:
            try:
                tensors = safetensors.torch.load_file(block_file(self._dir, key, rank))
            except FileNotFoundError:
                self._load_errors.add(block)
                continue
            targets = {name: kv.select(axis, block) for name, (kv, axis) in caches.items()}
            if any(name not in tensors or tensors[name].shape != t.shape for name, t in targets.items()):
                self._load_errors.add(block)  # another model, TP or block size: recompute
                continue
            for name, target in targets.items():
                target.copy_(tensors[name])

    def _kv_caches(self, forward_context: ForwardContext) -> dict[str, tuple[torch.Tensor, int]]:
        """Each attention layer's paged KV and the axis that indexes its blocks."""
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        caches = {}
        for name, layer in forward_context.no_compile_layers.items():
            kv = getattr(layer, "kv_cache", None)
            if isinstance(kv, torch.Tensor) and kv.numel():  # unbound layers hold an empty tensor
                caches[name] = (kv, block_axis(tuple(kv.shape), num_blocks))
        if not caches:
            raise RuntimeError("BlockFileKVConnector found no paged KV cache in this model's layers")
        return caches

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # stores happen once, when an opted-in request finishes (start_load_kv)

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._stored = self._stored, set()
        return done or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors
