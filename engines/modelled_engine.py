"""The modelled engine: a GPU replica the perf model stands in for, serving in real time
(the Serve-side twin of the discrete-event simulator's replicas in `sim/`).

It runs the shared ContinuousBatcher against the wall clock: each step sleeps for the
modelled iteration time, then hands placeholder tokens to the waiting streams. Output
lengths are exactly the request's target (the trace's, else max_tokens), so load tests
reproduce a trace's token counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace

from autoscaling.splitwise.machine import machine_policies
from autoscaling.throttllem.replica_policies import replica_policies
from batching.continuous_batcher import (
    AdmissionPolicy,
    BatcherConfig,
    ClockPolicy,
    ContinuousBatcher,
    PreemptionPolicy,
    Sequence,
)
from batching.hook_chains import chain_admission, chain_clock, chain_preemption
from core.request import Request
from core.sampling import unmodelled
from core.stats import ReplicaStats
from core.token_counter import default_token_counter
from energy.calibration import default_perf_model
from engines.modelled_engine_config import ModelledEngineConfig
from engines.protocol import RESUME_OFFSET_KEY, GenerationChunk, RequestSquashed, RequestUsage

_SQUASHED = object()  # queue marker: the request was squashed before it started
# Placeholder output: each word, with its leading space, is one token of core.token_counter's
# tokenizer, so a client counting the text gets the engine's count (tests/test_token_counter.py).
_WORDS = (
    "the of and to in is that for it as with was on be by this are at from or an have not but "
    "they which one you all were we when there can more if no out so said what up its about into "
    "than them only other new some could time these two may then do first any my now such like"
).split()


def placeholder_text(request_id: str, start: int, count: int) -> str:
    seed = sum(map(ord, request_id))
    return "".join(" " + _WORDS[(seed + i) % len(_WORDS)] for i in range(start, start + count))


@dataclass(frozen=True)
class Ending:
    """Where a request's placeholder output ends: its tokens, the text the client gets and
    the stop string that ended it (None: its length did)."""

    tokens: int
    text: str
    stop: str | None = None


def placeholder_ending(request: Request) -> Ending:
    """The output as vLLM would end it: at the first stop string the text holds once past
    min_tokens, cut before it (or after it, with include_stop_str_in_output); else at its
    length. A continuation's output goes on from the tokens sent before (its offset)."""
    n, rid, sampling = request.output_tokens_to_generate, request.request_id, request.sampling
    offset = int(request.metadata.get(RESUME_OFFSET_KEY, 0))
    if not sampling.stop:
        return Ending(n, placeholder_text(rid, offset, n))
    longest = max(map(len, sampling.stop))
    text = ""
    for k in range(1, n + 1):
        word = placeholder_text(rid, offset + k - 1, 1)
        text += word
        if k <= sampling.min_tokens:
            continue
        window = max(0, len(text) - len(word) - longest + 1)  # a stop string ending in this token
        hits = [(at, stop) for stop in sampling.stop if (at := text.find(stop, window)) >= 0]
        if hits:
            at, stop = min(hits)
            return Ending(k, text[:at + len(stop) if sampling.include_stop_str_in_output else at], stop)
    return Ending(n, text)


class ModelledEngine:
    """Engine protocol over the modelled GPU, driven by asyncio sleeps."""

    def __init__(self, config: ModelledEngineConfig = ModelledEngineConfig(), clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self.gpu_ids: list[int] = []  # modelled GPUs only
        perf = default_perf_model(config.model, config.hardware, config.profile)
        self.batcher = ContinuousBatcher(
            perf,
            BatcherConfig(
                tensor_parallel=config.tensor_parallel, clock_mhz=config.clock_mhz,
                batch_limit=config.batch_limit, max_batched_tokens=config.max_batched_tokens,
                step_time_target_s=config.step_time_target_s,
                interactive_first=config.interactive_first,
                prefill_by_ttft_deadline=config.prefill_by_ttft_deadline,
                max_waiting=config.max_waiting_requests, shed_wait_factor=config.shed_wait_factor,
                clock_forward_period_s=config.overheads.clock_forward_period_s,
                clock_change_s=config.overheads.clock_change_s,
                prefix_block_tokens=config.prefix_block_tokens,
            ),
        )
        # Every paper's hooks run as ordered chains: none replaces another's.
        admissions: list[AdmissionPolicy | None] = []
        clocks: list[ClockPolicy | None] = []
        preemptions: list[PreemptionPolicy | None] = []
        if config.throttllem is not None:
            throttle_admission, clock_policy = replica_policies(perf, self.batcher.config, config.throttllem)
            admissions.append(throttle_admission)
            clocks.append(clock_policy)
        if config.splitwise is not None:
            headroom_admission, preemption = machine_policies(config.splitwise)
            admissions.append(headroom_admission)
            preemptions.append(preemption)
        self.batcher.admission = chain_admission(admissions)
        self.batcher.clock_policy = chain_clock(clocks)
        self.batcher.preemption = chain_preemption(preemptions)
        self._pending_tp: tuple[int, float] | None = None  # (TP, when its engine is up)
        self.max_context_tokens = perf.model.max_context_tokens
        self._token_counter = default_token_counter()  # loaded at start (~0.1 s), not per request
        self._queues: dict[str, asyncio.Queue] = {}
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    def count_tokens(self, text: str) -> int:
        return self._token_counter.count(text)

    def stats(self) -> ReplicaStats:
        self._take_over()
        return self.batcher.stats(self._clock())

    def prefix_blocks(self) -> list[int]:
        """The prefix blocks its cache holds, the most recently used first."""
        cache = self.batcher.prefix_cache
        return [] if cache is None else cache.held()

    def set_batch_limit(self, limit: int) -> None:
        self.batcher.set_batch_limit(limit)
        self._wakeup.set()

    def min_tbt_slo_s(self) -> float | None:
        return self.batcher.min_tbt_slo_s()

    def set_clock(self, clock_mhz: float) -> None:
        """The modelled GPUs take it as forwarded clocks land (OverheadTable)."""
        self.batcher.request_clock(clock_mhz, self._clock())

    def set_clock_band(self, low_mhz: float, high_mhz: float) -> None:
        self.batcher.set_clock_band(low_mhz, high_mhz, now_s=self._clock())

    def clock_applied(self, clock_mhz: float | None) -> None:
        """Its GPUs are modelled: the batcher lands their clocks itself."""

    def set_tensor_parallel(self, tp: int) -> None:
        """A TP change as the simulator makes it: the engine at the new TP starts beside
        this one (`overheads.reshard_s`, its GPUs idle meanwhile and charged) while this
        one serves on, then takes over its requests."""
        if tp == self.batcher.tensor_parallel and self._pending_tp is None:
            return
        self._pending_tp = (tp, self._clock() + self.config.overheads.reshard_s)
        try:
            asyncio.get_running_loop().call_later(self.config.overheads.reshard_s, self._wakeup.set)
        except RuntimeError:  # no loop yet: the first step or stats() applies it
            pass

    def _take_over(self) -> None:
        """Switch to a started new-TP engine once its start-up time has passed."""
        if self._pending_tp is None or self._clock() < self._pending_tp[1]:
            return
        tp, _ = self._pending_tp
        self._pending_tp = None
        perf = self.batcher.perf
        self.batcher.charge_idle(perf.idle_power_w(tp) * self.config.overheads.reshard_s)
        self.batcher.set_tensor_parallel(tp)

    def generate(self, request: Request) -> AsyncGenerator[GenerationChunk, None]:
        refused = unmodelled(request.sampling)
        if refused:  # the ingress answers these with a 400 (app.sampling); never served in silence
            raise ValueError(f"request {request.request_id}: the modelled engine cannot honour {refused}")
        ending = placeholder_ending(request)
        if ending.stop is not None:  # it makes the tokens up to the stop string, as vLLM would
            request = replace(request, target_output_tokens=ending.tokens)
        return self._stream(request, lambda: self.batcher.add(request, self._clock()), ending)

    def resume(self, request: Request, prior: Sequence, kv_present: bool) -> AsyncGenerator[GenerationChunk, None]:
        """Splitwise token phase: continue a sequence a prompt replica started, from its
        transferred KV (or, without it, after recomputing the prompt); streams only new tokens."""
        return self._stream(request, lambda: self.batcher.resume(request, prior, self._clock(), kv_present),
                            placeholder_ending(request))

    async def _stream(self, request: Request, enter: Callable[[], Sequence],
                      ending: Ending) -> AsyncGenerator[GenerationChunk, None]:
        """The request's own generator (no wrapper around it), so closing what generate()
        returns runs the `finally` below and aborts the request at once. A continuation of a
        request another replica started goes on with its text (`ending` from its offset)."""
        seq = enter()
        self._ensure_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request.request_id] = queue
        self._wakeup.set()
        sent = seq.generated
        offset = int(request.metadata.get(RESUME_OFFSET_KEY, 0))
        chars = len(placeholder_text(request.request_id, offset, sent))  # of the output's text, sent

        def text(count: int) -> str:
            """The next `count` tokens' text as the client sees it (cut at a stop string)."""
            nonlocal chars
            start, chars = chars, chars + len(placeholder_text(request.request_id, offset + sent, count))
            return ending.text[start:chars]

        try:
            while True:
                item = await queue.get()
                if item is _SQUASHED:
                    raise RequestSquashed(request.request_id, self._clock() - request.arrival_s)
                # Coalesce everything already produced into one chunk.
                while not queue.empty() and item is not None:
                    item = queue.get_nowait()
                n = seq.generated - sent
                if item is None or seq.done:
                    yield GenerationChunk(
                        text(n), n,
                        finish_reason="stop" if ending.stop is not None or seq.generated < request.max_tokens
                        else "length",
                        usage=self._usage(seq), stop_reason=ending.stop,
                    )
                    return
                if n:
                    yield GenerationChunk(text(n), n)
                    sent += n
        finally:
            self._queues.pop(request.request_id, None)
            if not seq.done:
                self.batcher.abort(request.request_id)

    def _usage(self, seq: Sequence) -> RequestUsage:
        arrival = seq.request.arrival_s
        return RequestUsage(
            prompt_tokens=seq.request.prompt_tokens,
            completion_tokens=seq.generated,
            energy_j=seq.energy_j,
            ttft_s=(seq.first_token_s or arrival) - arrival,
            e2e_s=(seq.last_token_s or arrival) - arrival,
            max_tbt_s=seq.max_tbt_s,
            preemptions=seq.preemptions,
        )

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            if self.config.squash_after_s is not None:
                for seq in self.batcher.squash_waiting(self._clock(), self.config.squash_after_s):
                    queue = self._queues.get(seq.request_id)
                    if queue is not None:
                        queue.put_nowait(_SQUASHED)
            self._take_over()
            step = self.batcher.plan_step(self._clock())
            if step is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await asyncio.sleep(step.time_s)
            out = self.batcher.finish_step(step)
            for seq in out.emitted:
                queue = self._queues.get(seq.request_id)
                if queue is not None:
                    queue.put_nowait(None if seq.done else seq)

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
