"""The real engine: vLLM's AsyncLLM behind the engine protocol.

vLLM schedules, batches and pages KV; this class adds what our policies need around
it: an admission gate whose limit changes at run time (Chiron), stats read from
vLLM's own stat loggers, per-request energy from NVML, and abort on client
disconnect. `vllm` is imported only here and only when an engine is built, so the
rest of the project runs without it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from core.arrival_rates import ArrivalRates
from core.request import Request
from core.stats import ReplicaStats
from engines.admission_gate import AdmissionGate
from engines.protocol import GenerationChunk, RequestUsage
from engines.token_energy import TokenEnergyMeter
from engines.vllm_config import VllmEngineConfig
from engines.vllm_sampling import sampling_params
from engines.vllm_stats import VllmStatsTracker

logger = logging.getLogger(__name__)


def set_vllm_env(config: VllmEngineConfig) -> None:
    """Environment vLLM reads at import and start; values already set by the operator win."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{config.cpu_kvcache_space_gib:g}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def engine_args(config: VllmEngineConfig) -> Any:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    kv = config.kv_transfer
    return AsyncEngineArgs(
        model=config.model, tokenizer=config.tokenizer_path, dtype=config.dtype, seed=config.seed,
        tensor_parallel_size=config.tensor_parallel, distributed_executor_backend=config.executor_backend,
        max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, enforce_eager=config.enforce_eager,
        block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching,
        gpu_memory_utilization=config.gpu_memory_utilization,
        kv_transfer_config=None if kv is None else KVTransferConfig(
            kv_connector=kv.connector, kv_role=kv.role, kv_load_failure_policy="recompute",
            kv_connector_extra_config={"shared_storage_path": kv.storage_path},
        ),
    )


def _visible_gpus() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(i) for i in visible.split(",") if i.strip().isdigit()]


class TensorParallelChangeUnsupported(RuntimeError):
    pass


class VllmEngine:
    def __init__(self, config: VllmEngineConfig) -> None:
        set_vllm_env(config)
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        self.config = config
        self.tracker = VllmStatsTracker()
        vllm_config = engine_args(config).create_engine_config()
        if config.executor_backend == "ray":
            import ray

            # Workers go into the bundles Serve reserved for this replica (STRICT_PACK).
            vllm_config.parallel_config.placement_group = ray.util.get_current_placement_group()
        self.llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[self.tracker.logger_factory])
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
        self.gate = AdmissionGate(config.batch_limit)
        gpus = _visible_gpus() if config.device == "gpu" else []
        self.energy = TokenEnergyMeter.open(gpus, lambda: self.tracker.snapshot.processed_tokens)
        self._energy_start_j = self.energy.total_j()
        self._clock_mhz = 0.0
        self._pending: dict[str, list[int]] = {}  # request id -> [prompt tokens left, decode tokens left]
        self._admitted: dict[str, Request] = {}  # inside vLLM (past the gate)
        self._arrivals = ArrivalRates()
        self._completed = 0

    # ---- protocol: tokens, stats, knobs ------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def stats(self) -> ReplicaStats:
        snap = self.tracker.snapshot
        inside = self.gate.active
        # vLLM reports after each step; an aborted or finished request's last report can
        # be stale while the engine idles, so counts are bounded by what we hold inside.
        running = min(snap.running, inside)
        now = time.time()
        return ReplicaStats(
            queued_requests=self.gate.waiting + inside - running,
            running_requests=running,
            batch_limit=self.gate.limit,
            kv_blocks_used=round(snap.kv_usage * snap.kv_blocks_total) if inside else 0,
            kv_blocks_total=snap.kv_blocks_total,
            pending_prompt_tokens=sum(p for p, _ in self._pending.values()),
            pending_decode_tokens=sum(d for _, d in self._pending.values()),
            itl_ewma_s=snap.itl_ewma_s,
            ttft_ewma_s=snap.ttft_ewma_s,
            tokens_per_s=snap.tokens_per_s,
            clock_mhz=self._clock_mhz,
            power_w=self.energy.power_w(),
            energy_j=self.energy.total_j() - self._energy_start_j,
            tensor_parallel=self.config.tensor_parallel,
            preemptions=snap.preemptions,
            completed_requests=self._completed,
            class_rates_per_s=self._arrivals.per_s(now),
            tokens_generated=snap.generated_tokens,
            interactive_running=sum(1 for r in self._admitted.values() if r.service_class == "interactive"),
        )

    def min_tbt_slo_s(self) -> float | None:
        """The tightest TBT target among admitted requests (Chiron's ITL SLO of a replica)."""
        return min((r.slo.tbt_s for r in self._admitted.values()), default=None)

    def set_batch_limit(self, limit: int) -> None:
        self.gate.set_limit(min(limit, self.config.max_num_seqs))

    def set_clock(self, clock_mhz: float) -> None:
        """Clocks are locked by the node's GPU-control actor, which the replica calls for
        the GPUs it holds; the engine records the target it runs at."""
        if self.config.device != "gpu":
            logger.info("vLLM on CPU: GPU clock %.0f MHz not applicable, ignored", clock_mhz)
            return
        self._clock_mhz = clock_mhz

    def set_tensor_parallel(self, tp: int) -> None:
        raise TensorParallelChangeUnsupported(
            f"a vLLM replica cannot change TP in place ({self.config.tensor_parallel} -> {tp}): deploy a pool "
            "with the new TP beside this one (shadow) and shift traffic, then retire this one"
        )

    # ---- protocol: generation ----------------------------------------------------
    async def generate(self, request: Request) -> AsyncIterator[GenerationChunk]:
        """Stream DELTA outputs; closing the iterator (client gone) aborts in vLLM."""
        rid = request.request_id
        self._arrivals.add(time.time(), request.length_class)
        self._pending[rid] = [request.prompt_tokens, request.max_tokens]
        finished = False
        try:
            async with self.gate.slot():
                self._admitted[rid] = request
                mark = self.energy.mark()
                stream = self.llm.generate(request.prompt_text, sampling_params(request), request_id=rid)
                generated, first_s, last_s, max_tbt_s = 0, None, None, 0.0
                try:
                    async for out in stream:
                        now = time.time()
                        completion = out.outputs[0]
                        n = len(completion.token_ids)
                        if n:
                            if first_s is None:
                                first_s = now
                            elif last_s is not None:
                                max_tbt_s = max(max_tbt_s, now - last_s)
                            last_s = now
                            generated += n
                            self._pending[rid] = [0, request.max_tokens - generated]
                        if out.finished:
                            finished = True
                            self._completed += 1
                            prompt_tokens = len(out.prompt_token_ids or ()) or request.prompt_tokens
                            arrival = request.arrival_s
                            usage = RequestUsage(
                                prompt_tokens=prompt_tokens, completion_tokens=generated,
                                energy_j=self.energy.attribute_j(mark, prompt_tokens + generated),
                                ttft_s=(first_s or now) - arrival, e2e_s=(last_s or now) - arrival,
                                max_tbt_s=max_tbt_s, preemptions=0,
                            )
                            yield GenerationChunk(completion.text, n, completion.finish_reason, usage)
                            return
                        if n:
                            yield GenerationChunk(completion.text, n)
                finally:
                    if not finished:
                        await stream.aclose()
                        await self.llm.abort(rid)
        finally:
            self._pending.pop(rid, None)
            self._admitted.pop(rid, None)

    async def prefill(self, request: Request) -> int:
        """Prompt phase only (Splitwise prompt replica): compute the prompt's KV so the
        KV connector hands it to a token replica; returns the prompt's token count."""
        one_token = Request(**{**request.__dict__, "max_tokens": 1, "request_id": f"{request.request_id}-prefill"})
        async for chunk in self.generate(one_token):
            if chunk.usage is not None:
                return chunk.usage.prompt_tokens
        raise RuntimeError(f"prefill of {request.request_id} ended without a final chunk")

    def unfinished_in_vllm(self) -> int:
        """Requests vLLM itself still tracks (its output processor): 0 once all are freed."""
        return self.llm.output_processor.get_num_unfinished_requests()

    async def shutdown(self) -> None:
        self.llm.shutdown()
