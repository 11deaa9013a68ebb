"""The real engine: vLLM's AsyncLLM behind the engine protocol.

vLLM schedules, batches and pages KV; this class adds what our policies need around
it: an admission gate whose limit changes at run time (Chiron) and which runs the
simulated replicas' admission chain (throttLL'eM), the same replicas' clock rule after
every step on GPUs (throttLL'eM's clock inside the plan's band, engines.vllm_clock),
stats read from vLLM's own stat loggers, per-request energy from the GPUs' energy counter
step by step (engines.step_energy), and abort on client disconnect. `vllm` is imported
only here and only when an engine is built, so the rest of the project runs without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import psutil

from autoscaling.throttllem.online_ips import OnlineIpsTable
from autoscaling.throttllem.replica_policies import learnt_ips_table, replica_policies
from batching.continuous_batcher import AdmissionPolicy, BatcherConfig, ClockPolicy, RequestOverflowed, Sequence
from batching.hook_chains import chain_admission, chain_clock
from core.arrival_rates import ArrivalRates
from core.request import Request
from core.slo_outcomes import SloOutcomes, mean_tbt_s, slo_met
from core.stats import ReplicaStats
from energy.calibration import default_perf_model
from energy.hardware import GPUS
from energy.perf_model import PerfModel
from engines.admission_gate import AdmissionGate
from engines.child_reaper import new_children, watch_children
from engines.kv_block_files import BlockFiles, block_keys
from engines.protocol import GenerationChunk, RequestUsage, TensorParallelChangeUnsupported
from engines.step_energy import StepEnergy
from engines.vllm_clock import VllmClock
from engines.vllm_config import KvTransferConfig, VllmEngineConfig
from engines.vllm_lora import LoraAdapters
from engines.vllm_placement import held_gpu_ids
from engines.vllm_prefix_events import KvEventSubscriber, PrefixBlockTracker
from engines.vllm_resume import Continuation
from engines.vllm_running_batch import VllmRunningBatch
from engines.vllm_sampling import token_logprobs
from engines.vllm_stats import VllmStatsTracker, VllmStep
from engines.vllm_step_speed import VllmStepSpeed

logger = logging.getLogger(__name__)


def set_vllm_env(config: VllmEngineConfig) -> None:
    """Environment vLLM reads at import and start; values already set by the operator win."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@contextlib.contextmanager
def cpu_ranks_bound(config: VllmEngineConfig) -> Iterator[None]:
    """While the engine starts (its processes copy the environment), bind each CPU TP
    rank's threads to cores of its own where vLLM's automatic binding would refuse; an
    operator's VLLM_CPU_OMP_THREADS_BIND wins. Restored after: other engines of this
    process may run at another TP."""
    bind = "VLLM_CPU_OMP_THREADS_BIND"
    if config.device != "cpu" or config.tensor_parallel == 1 or bind in os.environ \
            or _numa_nodes() >= config.tensor_parallel:
        yield
        return
    os.environ[bind] = cpu_threads_bind(config.tensor_parallel, sorted(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        os.environ.pop(bind, None)


def _numa_nodes() -> int:
    return max(1, len(glob.glob("/sys/devices/system/node/node[0-9]*")))


def cpu_threads_bind(tensor_parallel: int, cpus: list[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND giving each TP rank an equal, disjoint share of `cpus`.
    vLLM-cpu's automatic binding gives each rank a NUMA node of its own and refuses TP
    above the node count (one node on most machines)."""
    if len(cpus) < tensor_parallel:
        raise ValueError(f"tensor_parallel: {tensor_parallel} CPU ranks need as many cores; this replica may use "
                         f"{len(cpus)} ({cpus})")
    share = len(cpus) // tensor_parallel
    return "|".join(",".join(map(str, cpus[rank * share:(rank + 1) * share])) for rank in range(tensor_parallel))


def _on_cpu() -> bool:
    """vllm-cpu: its KV cache is sized in bytes (`cpu_kvcache_space_gib`), a GPU's by
    `gpu_memory_utilization`. Passed as an engine argument, not VLLM_CPU_KVCACHE_SPACE,
    which vLLM reads as whole GiB and which would outlive this engine in the process."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_args(config: VllmEngineConfig, kv: KvTransferConfig | None = None, kv_events: str | None = None) -> Any:
    """vLLM's engine arguments: the config's fields, then its engine_kwargs unchanged;
    `kv_events`: the ZMQ endpoint vLLM publishes its KV cache events on."""
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(config.engine_kwargs) - known)
    if unknown:
        raise ValueError(f"engine_kwargs.{unknown[0]}: not an argument of vLLM's engine (AsyncEngineArgs)")
    extra: dict[str, Any] = dict(config.engine_kwargs)
    if _on_cpu():  # vLLM's own VLLM_CPU_KVCACHE_SPACE, where an operator sets it, still wins
        extra.setdefault("kv_cache_memory_bytes", int(config.cpu_kvcache_space_gib * 2**30))
    if config.lora_adapters:
        extra["enable_lora"] = True
    if kv_events is not None:
        extra["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=kv_events)
    return AsyncEngineArgs(
        **extra,
        model=config.model, tokenizer=config.tokenizer_path, dtype=config.dtype, seed=config.seed,
        tensor_parallel_size=config.tensor_parallel, distributed_executor_backend=config.executor_backend,
        max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, enforce_eager=config.enforce_eager,
        block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching,
        gpu_memory_utilization=config.gpu_memory_utilization,
        scheduling_policy="priority" if config.prefill_by_ttft_deadline else "fcfs",
        kv_transfer_config=None if kv is None else KVTransferConfig(
            kv_connector=kv.connector, kv_role=kv.role, kv_load_failure_policy="recompute",
            kv_connector_module_path=kv.connector_module_path,
            kv_connector_extra_config={**({"shared_storage_path": kv.storage_path} if kv.storage_path else {}),
                                       **kv.extra_config},
        ),
    )


class VllmEngine:
    def __init__(self, config: VllmEngineConfig) -> None:
        set_vllm_env(config)
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        self.config = config
        self.tracker = VllmStatsTracker()
        kv = config.effective_kv_transfer
        # Our connector's files: a directory of the engine's own unless one is configured.
        self.blocks = BlockFiles(kv.storage_path, config.tensor_parallel) if kv and kv.block_files else None
        self.kv_transfer = kv.model_copy(update={"storage_path": self.blocks.directory}) if kv and self.blocks else kv
        # The prefix blocks it holds, from vLLM's KV cache events (an endpoint of its own).
        self._events_dir = tempfile.mkdtemp(prefix="wattwise-kv-events-") if config.prefix_block_tokens else None
        endpoint = None if self._events_dir is None else f"ipc://{self._events_dir}/events"
        vllm_config = engine_args(config, self.kv_transfer, endpoint).create_engine_config()
        if config.prefill_by_ttft_deadline:  # started prompts' chunks by deadline too (vLLM picked sync or async)
            asynchronous = vllm_config.scheduler_config.async_scheduling
            scheduler = "DeadlineFirstAsyncScheduler" if asynchronous else "DeadlineFirstScheduler"
            vllm_config.scheduler_config.scheduler_cls = f"engines.vllm_deadline_scheduler.{scheduler}"
        group = None
        if config.executor_backend == "ray":
            import ray

            # Workers go into the bundles Serve reserved for this replica (STRICT_PACK).
            group = vllm_config.parallel_config.placement_group = ray.util.get_current_placement_group()
        # Before vLLM's workers take the group's GPUs (held_gpu_ids asks each bundle).
        self.gpu_ids = held_gpu_ids(group) if config.device == "gpu" else []
        children_before = {p.pid for p in psutil.Process().children()}
        with cpu_ranks_bound(config):
            self.llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[self.tracker.logger_factory])
        # The engine core process outlives a replica killed without shutdown(): reap it then.
        engine_procs = new_children(children_before)
        self._reaper = watch_children(engine_procs) if engine_procs else None
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
        self.adapters = LoraAdapters(config.lora_adapters)
        self.prefix_events = None if endpoint is None else KvEventSubscriber(
            endpoint, PrefixBlockTracker(config.prefix_block_tokens))
        self._prompt_tokens_started = self._prompt_tokens_cached = 0  # vLLM's prefix cache hits
        self.gate = AdmissionGate(config.batch_limit, by_deadline=config.prefill_by_ttft_deadline)
        throttllem = config.throttllem
        # throttLL'eM's perf model, which is also the planner's for these GPUs.
        perf = None if throttllem is None else default_perf_model(throttllem.model, config.hardware, throttllem.profile)
        self.clock = VllmClock(GPUS[config.hardware])
        self.running_batch = VllmRunningBatch(
            config.tensor_parallel, vllm_config.cache_config.block_size, self.tracker.snapshot, self.gate, self.clock,
            vllm_config.scheduler_config.max_num_batched_tokens, perf, config.prefill_by_ttft_deadline)
        self.learnt_ips = self._learnt_ips()
        self.admission, self.clock_rule = self._policies(perf)
        self._last_step: VllmStep | None = None
        self._step_errors = 0
        if self.admission is not None:
            self.gate.admits = self._admits
            if config.interactive_first:
                self.gate.on_urgent_refused = lambda: self._preempt_for_waiter(queued=True)
        self.step_speed = None if perf is None or config.device != "gpu" else VllmStepSpeed(
            perf, config.tensor_parallel, self.running_batch.block_size, lambda: self.running_batch.clock_mhz)
        self.tracker.step_observers.append(self._on_step)
        modelled_idle_w = perf.idle_power_w(config.tensor_parallel) if perf and self.step_speed else None
        self.energy = StepEnergy.open(self.gpu_ids, modelled_idle_w)
        self._pending: dict[str, list[int]] = {}  # request id -> [prompt tokens left, decode tokens left]
        self._arrivals = ArrivalRates()
        self._outcomes = SloOutcomes()  # the controller's SLO guard (autoscaling.slo_guard)
        self._completed = 0
        self._preemptions = 0  # ours (Chiron); vLLM's own are in the tracker
        self._preempting: set[str] = set()  # admitted batch requests being preempted
        self._vllm_ids: dict[str, str] = {}  # request id -> id of its current vLLM request
        self._aborts: set[asyncio.Task] = set()

    def _learnt_ips(self) -> OnlineIpsTable | None:
        """throttLL'eM's M for this engine's shape, corrected from its own steps (`_on_step`)."""
        throttllem = self.config.throttllem
        if throttllem is None or not throttllem.learn_from_engine:
            return None
        batch = self.running_batch
        return learnt_ips_table(throttllem, batch.tensor_parallel, self.config.max_num_seqs, batch.kv_blocks_total)

    def _policies(self, perf: PerfModel | None) -> tuple[AdmissionPolicy | None, ClockPolicy | None]:
        """The admission and clock rules the simulated replicas of this config run
        (batching.hook_chains), deciding on this replica's running batch with M as its engine
        corrects it; the clock rule only where the replica has GPUs to clock. The projector's
        own correction is off: it times the gaps between its reads, which admission makes at
        any time here, not once a step."""
        throttllem = self.config.throttllem
        if throttllem is None or perf is None:
            return None, None
        no_correction = throttllem.tuning.model_copy(update={"correction_alpha": 0.0})
        throttllem = throttllem.model_copy(update={"tuning": no_correction})
        batch = self.running_batch
        shape = BatcherConfig(tensor_parallel=batch.tensor_parallel, batch_limit=batch.batch_limit,
                              block_size=batch.block_size, kv_capacity_tokens=batch.kv_blocks_total * batch.block_size)
        admission, clock = replica_policies(perf, shape, throttllem, self.learnt_ips)
        return chain_admission([admission]), chain_clock([clock]) if self.config.device == "gpu" else None

    def _admits(self, candidate: Sequence) -> bool:
        assert self.admission is not None
        return self.admission.admit(candidate, self.running_batch, time.time())

    def _on_step(self, step: VllmStep) -> None:
        """`_observe_step`, never raising into vLLM's output handler: an error there fails every
        request in flight and stops the engine's outputs. A failing rule is logged and skipped."""
        try:
            self._observe_step(step)
        except Exception:
            self._step_errors += 1
            if self._step_errors % 1000 == 1:  # a step runs every few ms: the first, then every 1000th
                logger.exception("wattwise: a rule run after a vLLM step failed (%d so far)", self._step_errors)

    def _observe_step(self, step: VllmStep) -> None:
        """After each engine step vLLM reports (in its output handler, so nothing here may
        wait): the batch's progress, the step's speed and energy against the planner's model
        and the GPUs' counter, a decode step's time for M, then the clock for the next steps
        and the admission rule asked again, in the order the batcher runs them before a step.
        The clock only changes a target: the replica forwards it to the GPUs
        (deployments.replica), never this step."""
        decode_only = self.running_batch.all_decoding
        work = self.running_batch.on_step()
        modelled = self.step_speed.observe(step) if self.step_speed is not None else None
        self.energy.on_step(work, None if modelled is None else modelled.energy_j)
        last, self._last_step = self._last_step, step
        if self.learnt_ips is not None and work and decode_only and step.prompt_tokens == 0 and last is not None \
                and (last.running or last.waiting) and step.t_s > last.t_s:  # a decode step right after another
            self.learnt_ips.observe(len(work), round(step.kv_blocks_used), self.running_batch.clock_mhz,
                                    step.t_s - last.t_s)
        if self.clock_rule is not None:
            clock = self.clock_rule.choose_clock_mhz(self.running_batch, step.t_s)
            if clock is not None:
                self.clock.request(self.clock.clamp_to_band(clock))
        if self.admission is not None:
            self.gate.retry()

    # ---- protocol: tokens, stats, knobs ------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _pending_prompt_tokens(self) -> int:
        """Prompt tokens its requests have yet to prefill (a request's, until its first token)."""
        return sum(p for p, _ in self._pending.values())

    def stats(self) -> ReplicaStats:
        snap = self.tracker.snapshot
        inside = self.gate.active
        # vLLM reports after each step; an aborted or finished request's last report can
        # be stale while the engine idles, so counts are bounded by what we hold inside.
        running = min(snap.running, inside)
        now = time.time()
        measured, modelled = self.energy.measured, self.energy.modelled
        outcomes = self._outcomes.counts(now)
        return ReplicaStats(
            queued_requests=self.gate.waiting + inside - running,
            running_requests=running,
            batch_limit=self.gate.limit,
            kv_blocks_used=round(snap.kv_usage * snap.kv_blocks_total) if inside else 0,
            kv_blocks_total=snap.kv_blocks_total,
            kv_block_size=self.running_batch.block_size,
            pending_prompt_tokens=self._pending_prompt_tokens(),
            pending_decode_tokens=sum(d for _, d in self._pending.values()),
            itl_ewma_s=snap.itl_ewma_s,
            # A prompt due first waits for the step in flight (vLLM's, about an inter-token gap).
            deadline_prefill_step_s=snap.itl_ewma_s if self.config.prefill_by_ttft_deadline else 0.0,
            ttft_ewma_s=snap.ttft_ewma_s,
            tokens_per_s=snap.tokens_per_s,
            clock_mhz=self.clock.requested_mhz,
            power_w=self.energy.power_w(),
            # Since start, measured (NVML) and modelled side by side, each with its idle part.
            energy_measured=measured is not None, nvml_energy_j=measured.total_j if measured else 0.0,
            nvml_idle_energy_j=measured.idle_j if measured else 0.0,
            energy_modelled=modelled is not None, energy_j=modelled.total_j if modelled else 0.0,
            idle_energy_j=modelled.idle_j if modelled else 0.0,
            tensor_parallel=self.config.tensor_parallel,
            preemptions=snap.preemptions + self._preemptions,
            completed_requests=self._completed,
            class_rates_per_s=self._arrivals.per_s(now),
            class_prompt_tokens_per_s=self._arrivals.prompt_tokens_per_s(now),
            slo_completed=outcomes.completed,
            slo_met=outcomes.met,  # no slo_late: the gate keeps no deadline per waiter; misses count as they finish
            batch_rate_per_s=self._arrivals.batch_per_s(now),
            tokens_generated=snap.generated_tokens,
            interactive_running=sum(1 for s in self.running_batch.running if s.request.service_class == "interactive"),
            step_time_ratio=self.step_speed.ratio if self.step_speed is not None else 1.0,
            per_step_clock=self.clock_rule is not None,
            prompt_tokens_started=self._prompt_tokens_started, prompt_tokens_cached=self._prompt_tokens_cached,
        )

    def prefix_blocks(self) -> list[int]:
        """The prefix blocks vLLM holds, from its KV cache events (none without prefix_cache)."""
        return [] if self.prefix_events is None else self.prefix_events.held()

    def min_tbt_slo_s(self) -> float | None:
        """The tightest TBT target among admitted requests (Chiron's ITL SLO of a replica)."""
        return min((s.request.slo.tbt_s for s in self.running_batch.running), default=None)

    def set_batch_limit(self, limit: int) -> None:
        self.gate.set_limit(min(limit, self.config.max_num_seqs))

    def set_clock(self, clock_mhz: float) -> None:
        """Clocks are locked by the node's GPU-control actor, which the replica calls for
        the GPUs it holds; the engine records the target it runs at."""
        if self.config.device != "gpu":
            logger.info("vLLM on CPU: GPU clock %.0f MHz not applicable, ignored", clock_mhz)
            return
        self.clock.request(clock_mhz)

    def set_clock_band(self, low_mhz: float, high_mhz: float) -> None:
        """The clock rule (throttLL'eM's) picks each step's clock inside the band; without
        one the replica runs at its floor."""
        if self.config.device != "gpu":
            logger.info("vLLM on CPU: GPU clock band %.0f-%.0f MHz not applicable, ignored", low_mhz, high_mhz)
            return
        self.clock.set_band(low_mhz, high_mhz, has_rule=self.clock_rule is not None)

    def clock_applied(self, clock_mhz: float | None) -> None:
        self.clock.applied_mhz = clock_mhz

    def set_tensor_parallel(self, tp: int) -> None:
        raise TensorParallelChangeUnsupported(
            f"a vLLM replica cannot change TP in place ({self.config.tensor_parallel} -> {tp}): deploy a pool "
            "with the new TP beside this one (shadow) and shift traffic, then retire this one"
        )

    # ---- protocol: generation ----------------------------------------------------
    async def generate(self, request: Request) -> AsyncGenerator[GenerationChunk, None]:
        """Stream DELTA outputs; closing the iterator (client gone) aborts in vLLM.

        On a mixed replica (interactive_first) interactive requests wait ahead of batch
        ones and, when they must wait, preempt the newest admitted batch request, which
        waits first among batch requests and then continues where it stopped."""
        urgent = self.config.interactive_first and request.service_class != "batch"
        run = Continuation(request, keep_kv_on_abort=self.config.interactive_first and not urgent)
        async with contextlib.aclosing(self._generate(run, urgent)) as chunks:  # closed with this one
            async for chunk in chunks:
                yield chunk

    async def _generate(self, run: Continuation, urgent: bool) -> AsyncGenerator[GenerationChunk, None]:
        request = run.request
        rid = request.request_id
        pending = self._pending_prompt_tokens()
        if request.overflows(pending):
            raise RequestOverflowed(rid, pending, request.refuse_above_pending_tokens)
        self._arrivals.add(time.time(), request.length_class, request.service_class == "batch",
                           request.prompt_tokens)
        self._pending[rid] = [request.prompt_tokens, request.max_tokens]
        try:
            while True:
                if urgent and self.gate.would_wait:
                    self._preempt_for_waiter()
                candidate = self.running_batch.candidate(request, time.time(), run.generated)
                async with self.gate.slot(urgent=urgent, requeue=run.preemptions > 0, candidate=candidate,
                                          due_s=request.ttft_due_s):
                    self._enter(candidate)
                    async with contextlib.aclosing(self._segment(run)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    self._leave(rid)
                    if rid not in self._preempting:
                        return
                    self._preempting.discard(rid)
                    run.preemptions += 1
                    self._preemptions += 1
        finally:
            self._pending.pop(rid, None)
            self._leave(rid)
            self.energy.take_j(rid)  # an aborted request's share: it was booked, nobody is told
            self._preempting.discard(rid)

    def _enter(self, seq: Sequence) -> None:
        """`seq` joins the running batch; into an empty one, the GPUs were idle until now."""
        if not self.running_batch.running:
            self.energy.idle()
        self.running_batch.enter(seq)

    def _leave(self, request_id: str) -> None:
        """The request leaves the running batch; once it is empty the GPUs idle from now."""
        if self.running_batch.leave(request_id) and not self.running_batch.running:
            self.energy.idle()

    def _preempt_for_waiter(self, queued: bool = False) -> None:
        """Preempt the newest admitted batch request, unless the slots already being
        freed by preemptions cover every interactive waiter (this one included, or
        `queued` among them: the gate's admission rule refused it)."""
        if self.gate.urgent_waiting + (0 if queued else 1) <= len(self._preempting):
            return
        victims = [s.request_id for s in self.running_batch.running
                   if s.request.service_class == "batch" and s.request_id not in self._preempting]
        if victims:
            self._preempting.add(victims[-1])
            if (vllm_id := self._vllm_ids.get(victims[-1])) is not None:  # else it stops before starting
                self._abort_soon(vllm_id)

    def _vllm_priority(self, request: Request) -> int:
        """vLLM's priority scheduling takes the lowest value first: the TTFT deadline in ms
        (0 for all under fcfs, where vLLM ignores it). Under KV pressure vLLM preempts the
        running request due last (a batch request's deadline is an hour out)."""
        return round(request.ttft_due_s * 1000) if self.config.prefill_by_ttft_deadline else 0

    def _abort_soon(self, vllm_id: str) -> None:
        """Abort now-ish without awaiting here: the caller queues before the slot frees."""
        task = asyncio.ensure_future(self.llm.abort(vllm_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _segment(self, run: Continuation) -> AsyncGenerator[GenerationChunk, None]:
        """One vLLM request of `run`; ends early (aborted) when the run is preempted."""
        rid, request = run.request.request_id, run.request
        if rid in self._preempting:  # preempted before it started: nothing to stop
            return
        vllm_id = run.vllm_request_id
        self._vllm_ids[rid] = vllm_id
        stream = self.llm.generate(run.prompt(), run.sampling(), request_id=vllm_id,
                                   priority=self._vllm_priority(request), lora_request=self.adapters.lora(request),
                                   tokenization_kwargs={"add_special_tokens": request.add_special_tokens})
        finished = False
        try:
            async for out in stream:
                now = time.time()
                completion = out.outputs[0]
                first_output = run.prompt_ids is None
                n = run.add(out, now)
                tokens = self._tokens(run, out, n, first_output)
                self._pending[rid] = [0, run.remaining]
                self.running_batch.advance(rid, run.generated, run.first_s)
                finished = out.finished
                if out.finished and completion.finish_reason != "abort":
                    self._leave(rid)  # out of the batch before its energy is told: no later step is its
                    self._completed += 1
                    prompt_tokens = len(run.prompt_ids or ()) or request.prompt_tokens
                    arrival = request.arrival_s
                    usage = RequestUsage(
                        prompt_tokens=prompt_tokens, completion_tokens=run.generated,
                        energy_j=self.energy.take_j(rid),
                        ttft_s=(run.first_s or now) - arrival, e2e_s=(run.last_s or now) - arrival,
                        max_tbt_s=run.max_tbt_s, preemptions=run.preemptions,
                    )
                    self._preempting.discard(rid)  # finished before its preemption took effect
                    if request.service_class != "batch":
                        self._outcomes.add(now, request.length_class, slo_met(
                            request.slo, usage.ttft_s, mean_tbt_s(usage.ttft_s, usage.e2e_s, run.generated)))
                    yield dataclasses.replace(tokens, finish_reason=completion.finish_reason, usage=usage,
                                              stop_reason=completion.stop_reason)
                    return
                if n or tokens.prompt_logprobs is not None:
                    yield tokens
                if out.finished or rid in self._preempting:
                    if rid not in self._preempting:
                        raise RuntimeError(f"vLLM aborted request {vllm_id} on its own")
                    return
        finally:
            self._vllm_ids.pop(rid, None)
            if not finished:
                await stream.aclose()
                await self.llm.abort(vllm_id)

    def _tokens(self, run: Continuation, out: Any, n: int, first_output: bool) -> GenerationChunk:
        """One DELTA output's new text, token ids and, when asked for, their logprobs (and,
        in a request's first output, its prompt's)."""
        completion = out.outputs[0]
        ids = tuple(run.generated_ids[len(run.generated_ids) - n:])
        decode = self._decode_token
        logprobs = None if completion.logprobs is None else token_logprobs(ids, completion.logprobs, decode)
        prompt = None
        if first_output and run.preemptions == 0:
            self._prompt_tokens_started += len(out.prompt_token_ids or ())
            self._prompt_tokens_cached += out.num_cached_tokens or 0
            if out.prompt_logprobs is not None:
                prompt = token_logprobs(out.prompt_token_ids, out.prompt_logprobs, decode)
        return GenerationChunk(completion.text, n, token_ids=ids, logprobs=logprobs, prompt_logprobs=prompt)

    def _decode_token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    async def prefill(self, request: Request) -> int:
        """Prompt phase only (Splitwise prompt replica) with a connector that moves the KV
        itself (ExampleConnector, NixlConnector); returns the prompt's token count."""
        run = Continuation(_first_token_only(request))
        await self._last_chunk(run)
        return len(run.prompt_ids or ())

    async def export_prompt_kv(self, request: Request, timeout_s: float) -> dict[str, bytes] | None:
        """Prompt phase with our connector: compute the prompt and return its KV blocks'
        files for a token replica (engines.kv_block_files), or None if the engine had not
        written them within `timeout_s`. The prompt is tokenised here, once, so its block
        keys are known and held from before the request (another request of this replica
        sharing the prefix may release them); the files are removed once read: they travel
        on in Ray's object store."""
        assert self.blocks is not None, "export_prompt_kv needs BlockFileKVConnector"
        ids = self.tokenizer.encode(request.prompt_text)
        keys = self.blocks.hold(self._block_keys(ids))
        try:
            await self._last_chunk(Continuation(_first_token_only(request), export_kv=True, prompt_ids=ids))
            if not await self.blocks.wait_for(keys, timeout_s):
                return None
            return self.blocks.read(keys)
        finally:
            self.blocks.release(keys)

    def import_kv(self, blocks: dict[str, bytes]) -> list[str]:
        """Store blocks exported by another replica; the next request whose prompt starts
        with their tokens loads them. Returns their keys: release_kv() them after it."""
        assert self.blocks is not None, "import_kv needs BlockFileKVConnector"
        return self.blocks.write(blocks)

    def release_kv(self, keys: list[str]) -> None:
        if self.blocks is not None:
            self.blocks.release(keys)

    def _block_keys(self, token_ids: list[int]) -> list[str]:
        return block_keys(token_ids, self.llm.vllm_config.cache_config.block_size, len(token_ids))

    async def _last_chunk(self, run: Continuation) -> GenerationChunk:
        final = None
        async for chunk in self._generate(run, urgent=False):
            final = chunk
        if final is None or final.usage is None:
            raise RuntimeError(f"{run.request.request_id} ended without a final chunk")
        return final

    def unfinished_in_vllm(self) -> int:
        """Requests vLLM itself still tracks (its output processor): 0 once all are freed."""
        return self.llm.output_processor.get_num_unfinished_requests()

    async def shutdown(self) -> None:
        self.llm.shutdown()
        if self.prefix_events is not None:
            self.prefix_events.close()
        if self._events_dir is not None:
            shutil.rmtree(self._events_dir, ignore_errors=True)
        if self._reaper is not None:
            self._reaper.terminate()
            self._reaper.wait()
        if self.blocks is not None:
            self.blocks.close()


def _first_token_only(request: Request) -> Request:
    """The prompt phase of a split request: its prompt and one token, under an id of its own."""
    return dataclasses.replace(request, max_tokens=1, request_id=f"{request.request_id}-prefill")
