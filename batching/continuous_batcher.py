"""Iteration-level continuous batching of one replica, driven by a clock it is given.

This is the one scheduler both runtimes share: the real-time modelled engine sleeps for
each step's modelled duration, the discrete-event simulator schedules an event at
its end. Modelled on vLLM v1: a running batch bounded by a batch limit, chunked
prefill under a per-step token budget, paged KV in fixed blocks, and recompute
preemption of the newest sequence when KV runs out.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence as Ordered
from dataclasses import dataclass, field
from typing import Protocol

from batching.deadline_order import deadline_insert_index, due_key, move_late_behind, yields_to_waiting_head
from batching.step_budget import fit_chunks_to_step_time, prefill_sum_sq, tbt_bounded_step_tokens
from batching.step_speed import StepSpeed
from core.arrival_rates import ArrivalRates
from core.overheads import clock_lands_s
from core.prefix_cache import PrefixCache
from core.replica_choice import ReplicaOccupancy
from core.request import Request
from core.slo_outcomes import SloOutcomes, mean_tbt_s, slo_met
from core.stats import ReplicaStats
from energy.perf_model import PerfModel


def _fresh(seq: Sequence) -> bool:
    """A prompt not yet started here (a preempted or resumed sequence is not)."""
    return seq.generated == 0 and not seq.preempted_here


def _interactive(seq: Sequence) -> bool:
    return seq.request.service_class == "interactive"


def _ttft_due_s(seq: Sequence) -> float:
    return seq.request.ttft_due_s


def _unstarted(seq: Sequence) -> bool:
    """Never prefilled on any replica: nothing computed, generated or preempted yet."""
    return not (seq.prefilled or seq.generated or seq.preemptions)


def _fresh_due_s(seq: Sequence) -> float | None:
    """Its TTFT deadline if it is a fresh prompt; None: it keeps its place (deadline_order)."""
    return _ttft_due_s(seq) if _fresh(seq) else None


@dataclass
class Sequence:
    """A request inside the replica."""

    request: Request
    enqueued_s: float
    generated: int = 0
    prefilled: int = 0  # tokens of the current prefill target already computed
    prefill_target: int = 0  # prompt (+ tokens generated before a preemption)
    kv_blocks: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    energy_j: float = 0.0
    preemptions: int = 0
    max_tbt_s: float = 0.0
    aborted: bool = False
    preempted_here: bool = False  # waiting again on this replica after a preemption
    cached_tokens: int = 0  # of its prompt, found in the replica's prefix cache when it started
    output_target: int = field(init=False)

    def __post_init__(self) -> None:
        self.output_target = self.request.output_tokens_to_generate

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def context_tokens(self) -> int:
        return self.request.prompt_tokens + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def done(self) -> bool:
        return self.generated >= self.output_target


@dataclass
class Step:
    """One planned engine iteration: what it computes and what it costs."""

    start_s: float
    time_s: float
    power_w: float
    prefill_chunks: list[tuple[Sequence, int]] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.time_s

    @property
    def energy_j(self) -> float:
        return self.time_s * self.power_w


@dataclass
class StepOutput:
    """What a finished iteration produced."""

    end_s: float
    emitted: list[Sequence] = field(default_factory=list)  # one new token each
    finished: list[Sequence] = field(default_factory=list)


@dataclass(frozen=True)
class BatcherConfig:
    tensor_parallel: int = 8
    clock_mhz: float = 1980.0
    batch_limit: int = 256
    max_batched_tokens: int = 8192
    # Chunked prefill sized to the TBT target: each step takes at most the tokens whose
    # step fits in this long at the replica's TP (batching.step_budget), never more than
    # max_batched_tokens, and beside interactive decodes the chunks are trimmed so that the
    # step itself fits (or runs only on time those decodes banked under their mean TBT).
    # None: every step may take max_batched_tokens.
    step_time_target_s: float | None = None
    block_size: int = 16
    kv_capacity_tokens: int | None = None  # default: what the model leaves free at this TP
    ewma_alpha: float = 0.2
    # Interactive requests finished, and whether each met its SLO, over this trailing
    # window (the controller's SLO guard, autoscaling.slo_guard).
    slo_window_s: float = 60.0
    # Chiron's mixed replicas: interactive requests queue ahead of batch ones and, when
    # the batch is full, preempt the newest running batch request (recompute later).
    interactive_first: bool = False
    # Prompts prefill earliest TTFT deadline first (arrival + TTFT target), ahead of a running
    # prompt's remaining chunks when that one is due later: a short prompt then waits for the
    # step in flight, not for a long prompt's whole prefill, which its tight target cannot
    # absorb on a replica serving both. A prompt already past its deadline goes behind those
    # still on time (batching.deadline_order). False: arrival order, as vLLM's default scheduler.
    prefill_by_ttft_deadline: bool = False
    # Overload (bounded queue, shed early): refuse a new request when this many wait
    # already, or when the request it would queue behind has waited longer than
    # shed_wait_factor x the new request's TTFT target. None: no bound.
    max_waiting: int | None = None
    shed_wait_factor: float | None = None
    # A clock choice reaches the GPUs at the next forward (every clock_forward_period_s) plus
    # clock_change_s, the old clock running meanwhile (core.overheads.OverheadTable). 0, 0:
    # at once.
    clock_forward_period_s: float = 0.0
    clock_change_s: float = 0.0
    # Prefix caching, as vLLM's: a prompt whose first blocks (Request.prefix_hashes, blocks of
    # this many tokens) the replica holds prefills only the rest; computed prompts' blocks stay
    # held, least recently used evicted, up to the KV cache's size. 0: no prefix cache.
    prefix_block_tokens: int = 0


class RequestShed(Exception):
    """The replica refused a request at arrival: its queue is full or already too slow;
    the client should retry after `retry_after_s`."""

    def __init__(self, request_id: str, reason: str, retry_after_s: float) -> None:
        super().__init__(f"request {request_id} shed: {reason}")
        self.reason = reason
        self.retry_after_s = retry_after_s


class RequestOverflowed(RequestShed):
    """The replica refused a request its router may send to another pool
    (`Request.refuse_above_pending_tokens`): routing, not overload."""

    def __init__(self, request_id: str, pending_prompt_tokens: int, limit: int | None) -> None:
        super().__init__(request_id, f"{pending_prompt_tokens} prompt tokens to prefill > {limit}", 0.0)


class RunningBatch(Protocol):
    """What an admission rule reads of a replica: its running sequences and capacity.
    The batcher is one; a vLLM replica's view of what it has inside vLLM is the other
    (engines.vllm_running_batch), so one rule serves both engines."""

    @property
    def running(self) -> list[Sequence]: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def batch_limit(self) -> int: ...
    @property
    def kv_blocks_total(self) -> int: ...
    @property
    def kv_blocks_used(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def clock_mhz(self) -> float: ...


class AdmissionPolicy(Protocol):
    """Decides whether the head of the waiting queue may join the batch now (FCFS:
    a refusal holds everyone behind it). throttLL'eM's SLO checks plug in here. A rule
    must admit into an empty batch: nothing would ever finish to make room."""

    def admit(self, seq: Sequence, batch: RunningBatch, now_s: float) -> bool: ...


class PreemptionPolicy(Protocol):
    """Picks a running sequence to preempt so that `seq` (the head of the waiting queue)
    can join a full batch, or None to make it wait. Splitwise's mixed replicas plug in here."""

    def victim(self, seq: Sequence, batcher: ContinuousBatcher, now_s: float) -> int | None: ...


class ClockedBatch(RunningBatch, Protocol):
    """What a clock rule reads of a replica: its batch and queue, the perf model and step
    budget it plans prefills with, and where its clock stands (chosen, running, when a new
    choice lands, the planner's band). The batcher is one; a vLLM replica's view of its
    engine (engines.vllm_running_batch) the other, so one rule picks both engines' clocks."""

    @property
    def waiting(self) -> Ordered[Sequence]: ...
    @property
    def perf(self) -> PerfModel: ...
    @property
    def step_tokens(self) -> int: ...
    @property
    def clock_target_mhz(self) -> float: ...
    @property
    def longest_clock_lag_s(self) -> float: ...
    def prefill_queue(self, now_s: float) -> list[Sequence]: ...
    def clamp_to_band(self, clock_mhz: float) -> float: ...
    def clock_lands_s(self, now_s: float) -> float: ...


class ClockPolicy(Protocol):
    """Picks the GPU clock before each step (None: keep it). Rate limiting is its own."""

    def choose_clock_mhz(self, batcher: ClockedBatch, now_s: float) -> float | None: ...

    def lowest_clock_mhz(self, batcher: ClockedBatch) -> float:
        """The lowest clock it picks whatever the band allows (0: the band's floor); the
        replica reports it so the planner prices the clock the replica runs at."""
        ...


class ContinuousBatcher:
    """Waiting queue, running batch and KV blocks of one replica."""

    def __init__(
        self,
        perf: PerfModel,
        config: BatcherConfig = BatcherConfig(),
        admission: AdmissionPolicy | None = None,
        clock_policy: ClockPolicy | None = None,
        preemption: PreemptionPolicy | None = None,
        planned_perf: PerfModel | None = None,
    ) -> None:
        """`planned_perf`: the perf model the planner believes, when the engine's steps follow
        another (`perf`); the replica then reports how much slower or faster its steps run
        (batching.step_speed). None: the planner's model is the engine's own."""
        self.perf = perf
        self.speed = StepSpeed(planned_perf) if planned_perf is not None and planned_perf is not perf else None
        self.config = config
        self.admission = admission
        self.clock_policy = clock_policy
        self.preemption = preemption
        self.tensor_parallel = config.tensor_parallel
        self.clock_mhz = config.clock_mhz  # what the GPUs run at, which each step is costed at
        # Clocks chosen and not yet on the GPUs, (when chosen, MHz), oldest first.
        self.clock_requests: list[tuple[float, float]] = []
        # The planner's bounds on any clock a hook picks (None: the GPU's whole range).
        self.clock_band_mhz: tuple[float, float] | None = None
        self.batch_limit = config.batch_limit
        kv_tokens = config.kv_capacity_tokens or perf.kv_capacity_tokens(config.tensor_parallel)
        self.kv_blocks_total = max(kv_tokens // config.block_size, 1)
        prefix_tokens = config.prefix_block_tokens
        self.prefix_cache = PrefixCache(kv_tokens // prefix_tokens) if prefix_tokens else None
        self.prompt_tokens_started = 0  # of fresh prompts, since start
        self.prompt_tokens_cached = 0  # of those, found in the prefix cache
        self.step_busy_s = 0.0  # its steps' time, since start
        self.prefill_saved_s = 0.0  # the prefill its cache hits skipped, as the perf model costs it
        self._step_tokens_at: dict[tuple[int, float], int] = {}
        self.kv_blocks_used = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.by_id: dict[str, Sequence] = {}
        self.energy_j = 0.0
        self.idle_energy_j = 0.0  # of energy_j
        self.accounted_until_s: float | None = None
        self.busy_until_s = 0.0
        self.power_w = perf.idle_power_w(config.tensor_parallel)
        self.itl_ewma_s = 0.0
        self.ttft_ewma_s = 0.0
        self.tokens_per_s = 0.0
        self.preemptions = 0
        self.completed = 0
        self.tokens_generated = 0
        self._arrivals = ArrivalRates()
        self._outcomes = SloOutcomes(config.slo_window_s)

    # ---- requests in and out -------------------------------------------------
    def add(self, request: Request, now_s: float) -> Sequence:
        if request.request_id in self.by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self._refuse_if_overloaded(request, now_s)
        blocks_needed = self._blocks_for(request.prompt_tokens + 1)
        if blocks_needed > self.kv_blocks_total:
            raise ValueError(
                f"request {request.request_id!r} needs {blocks_needed} KV blocks; "
                f"the replica has {self.kv_blocks_total}"
            )
        seq = Sequence(request=request, enqueued_s=now_s, prefill_target=request.prompt_tokens)
        self._arrivals.add(now_s, request.length_class, request.service_class == "batch", request.prompt_tokens)
        self._enqueue(seq, now_s)
        self.by_id[request.request_id] = seq
        return seq

    def _refuse_if_overloaded(self, request: Request, now_s: float) -> None:
        """Shed at arrival, before queueing makes every waiting request late; refuse one
        the router may overflow to another pool when this replica is backed up."""
        pending = self.pending_prompt_tokens
        if request.overflows(pending):
            raise RequestOverflowed(request.request_id, pending, request.refuse_above_pending_tokens)
        cap = self.config.max_waiting
        if cap is not None and len(self.waiting) >= cap:
            raise RequestShed(request.request_id, f"{len(self.waiting)} requests already wait", 1.0)
        factor = self.config.shed_wait_factor
        if factor is not None:
            wait_s = self.queue_wait_s(request, now_s)
            limit_s = factor * request.slo.ttft_s
            if wait_s > limit_s:
                raise RequestShed(request.request_id, f"queue wait {wait_s:.1f} s > {limit_s:.1f} s",
                                  float(min(max(math.ceil(wait_s - limit_s), 1), 30)))

    def queue_wait_s(self, request: Request, now_s: float) -> float:
        """How long the oldest not-yet-started request `request` would queue behind has
        waited in this replica's queue: a lower bound on the new request's own wait. Time
        spent before reaching the replica (a router queue while the pool scaled up from 0)
        says nothing about this queue's speed."""
        behind = [s for s in self.waiting if s.generated == 0 and not (
            self.config.interactive_first and request.service_class != "batch" and self._is_batch(s))]
        return max((now_s - s.enqueued_s for s in behind), default=0.0)

    def resume(self, request: Request, prior: Sequence, now_s: float, kv_present: bool) -> Sequence:
        """Continue a sequence another replica started (Splitwise's prompt -> token hand-off).

        The tokens `prior` emitted stay emitted. With `kv_present` its KV arrived with it and
        it decodes at once; without (a failed transfer) its context is recomputed first,
        like a preempted sequence's.
        """
        if request.request_id in self.by_id:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        seq = Sequence(request=request, enqueued_s=now_s, generated=prior.generated,
                       first_token_s=prior.first_token_s, last_token_s=prior.last_token_s,
                       energy_j=prior.energy_j, preemptions=prior.preemptions, max_tbt_s=prior.max_tbt_s)
        if self._blocks_for(seq.context_tokens + 1) > self.kv_blocks_total:
            raise ValueError(f"request {request.request_id!r} does not fit the replica's KV cache")
        seq.prefill_target = seq.context_tokens
        seq.prefilled = seq.prefill_target if kv_present else 0
        self._enqueue(seq, now_s)
        self.by_id[request.request_id] = seq
        return seq

    def evict(self, request_id: str) -> Sequence:
        """Take a waiting sequence out to run elsewhere (Chiron: a preempted batch request
        goes back to the global queue); its tokens so far travel with it."""
        seq = self.by_id[request_id]
        if seq in self.running:
            raise ValueError(f"request {request_id!r} is running; only waiting ones can leave")
        self.waiting.remove(seq)
        self._free(seq)
        del self.by_id[request_id]
        return seq

    def _is_batch(self, seq: Sequence) -> bool:
        return self.config.interactive_first and seq.request.service_class == "batch"

    def _first_batch_index(self) -> int:
        return next((i for i, w in enumerate(self.waiting) if self._is_batch(w)), len(self.waiting))

    def _enqueue(self, seq: Sequence, now_s: float) -> None:
        """FCFS, except that with interactive_first interactive requests wait ahead of every
        batch request, and with prefill_by_ttft_deadline a fresh prompt waits before the first
        fresh prompt of its group that goes after it at `now_s` (deadline_order; a requeued
        sequence keeps its place)."""
        end = len(self.waiting) if self._is_batch(seq) or not self.config.interactive_first \
            else self._first_batch_index()
        if self.config.prefill_by_ttft_deadline and _fresh(seq):
            end = deadline_insert_index(map(_fresh_due_s, self.waiting), _ttft_due_s(seq), end, now_s)
        self.waiting.insert(end, seq)

    def _requeue(self, seq: Sequence) -> None:
        """A preempted sequence waits first in its group: an interactive one (or any, without
        interactive_first) at the front, a batch one just before the first batch request."""
        if self._is_batch(seq):
            self.waiting.insert(self._first_batch_index(), seq)
        else:
            self.waiting.appendleft(seq)

    def _move_late_behind(self, now_s: float) -> None:
        """With prefill_by_ttft_deadline, the prompts that turned late since the last step go
        behind the prompts of their group still on time (deadline_order.due_key)."""
        if self.config.prefill_by_ttft_deadline:  # batch work waits behind interactive anyway
            move_late_behind(self.waiting, _fresh_due_s, now_s, in_group=lambda w: not self._is_batch(w))

    def _head_due_s(self) -> float | None:
        """With prefill_by_ttft_deadline, the TTFT deadline of the first waiting prompt when it
        is a fresh one: running prompts that go after it yield their chunks to it. Else None."""
        if self.config.prefill_by_ttft_deadline and self.waiting and _fresh(self.waiting[0]):
            return _ttft_due_s(self.waiting[0])
        return None

    def prefill_queue(self, now_s: float) -> list[Sequence]:
        """The sequences still to prefill, in the order this batcher prefills them at `now_s`."""
        prefilling = [s for s in self.running if s.prefilled < s.prefill_target]
        waiting = [s for s in self.waiting if s.prefilled < s.prefill_target]
        if not self.config.prefill_by_ttft_deadline:
            return prefilling + waiting
        ahead, behind = self._around_queue(prefilling, now_s)
        return ahead + waiting + behind

    def _around_queue(self, prefilling: list[Sequence], now_s: float) -> tuple[list[Sequence], list[Sequence]]:
        """Running prompts by TTFT deadline, the late behind those on time (deadline_order.due_key):
        those that go before the waiting head (before the queue), and the rest (after it)."""
        by_deadline = sorted(prefilling, key=lambda s: due_key(_ttft_due_s(s), now_s))
        head_due_s = self._head_due_s()
        ahead = next((i for i, s in enumerate(by_deadline)
                      if yields_to_waiting_head(_ttft_due_s(s), head_due_s, now_s)),
                     len(by_deadline))
        return by_deadline[:ahead], by_deadline[ahead:]

    def _prefill_running(self, seqs: list[Sequence], chunks: list[tuple[Sequence, int]], budget: int) -> int:
        """Chunks of running prompts `seqs`, in order, while the budget and KV last (no
        preemption for them); the budget left."""
        block_size = self.config.block_size
        for seq in seqs:
            if budget <= 0:
                break
            if seq not in self.running:  # preempted meanwhile
                continue
            n = min(seq.prefill_target - seq.prefilled, budget)
            target_tokens = seq.prefilled + n + (1 if seq.prefilled + n == seq.prefill_target else 0)
            if target_tokens > seq.kv_blocks * block_size and not self._grow(seq, target_tokens):
                continue
            chunks.append((seq, n))
            budget -= n
        return budget

    def _step_limit_s(self, decodes: list[Sequence], now_s: float) -> float | None:
        """How long a step with prefill chunks may run beside `decodes`: step_time_target_s, or
        longer as far as every interactive request decoding in it keeps its mean TBT (the time
        it banked under its TBT target since its first token); None: no interactive decode
        waits on it (batch work has deadlines, not a TBT), or no target."""
        target_s = self.config.step_time_target_s
        if target_s is None:
            return None
        banked = [s.request.slo.tbt_s * s.generated - (now_s - s.first_token_s)
                  for s in decodes if _interactive(s) and s.first_token_s is not None]
        return max(target_s, min(banked)) if banked else None

    def _fit_to_step_time(self, chunks: list[tuple[Sequence, int]], decodes: int,
                          decode_context: int, limit_s: float) -> list[tuple[Sequence, int]]:
        """The chunks trimmed so that the step fits `limit_s` (batching.step_budget: the token
        budget is a fresh chunk's step alone)."""
        sizes = fit_chunks_to_step_time(
            self.perf, self.tensor_parallel, self.clock_mhz, [(s.prefilled, n) for s, n in chunks],
            decodes, decode_context, limit_s, self.config.max_batched_tokens)
        return [(s, n) for (s, _), n in zip(chunks, sizes, strict=True) if n > 0]

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its KV; False if unknown."""
        seq = self.by_id.pop(request_id, None)
        if seq is None:
            return False
        seq.aborted = True
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._free(seq)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _supported_mhz(self, clock_mhz: float) -> float:
        gpu = self.perf.gpu
        return float(min(max(clock_mhz, gpu.min_clock_mhz), gpu.max_clock_mhz))

    def set_clock(self, clock_mhz: float) -> None:
        """Run at this clock from now on (a replica not yet serving; tests)."""
        self.clock_mhz = self._supported_mhz(clock_mhz)
        self.clock_requests.clear()

    @property
    def clock_target_mhz(self) -> float:
        """The latest clock chosen: the GPUs' once it lands."""
        return self.clock_requests[-1][1] if self.clock_requests else self.clock_mhz

    def request_clock(self, clock_mhz: float, now_s: float) -> None:
        """Choose a clock; the GPUs take it as the replica's clock forwarder would
        (`BatcherConfig.clock_forward_period_s`, `clock_change_s`), not at once."""
        if self.config.clock_forward_period_s <= 0 and self.config.clock_change_s <= 0:
            self.set_clock(clock_mhz)
            return
        clock = self._supported_mhz(clock_mhz)
        if clock != self.clock_target_mhz:
            self.clock_requests.append((now_s, clock))

    def clock_lands_s(self, now_s: float) -> float:
        """When a clock chosen now reaches the GPUs: the first forward from now, plus the
        lock's latency (`land_clock`'s rule)."""
        return clock_lands_s(now_s, self.config.clock_forward_period_s, self.config.clock_change_s)

    @property
    def longest_clock_lag_s(self) -> float:
        """The longest a chosen clock waits to reach the GPUs: chosen just after a forward."""
        return self.clock_lands_s(0.0) + self.config.clock_forward_period_s

    def land_clock(self, now_s: float) -> None:
        """Put on the GPUs the last clock a forward sent early enough to have landed by now:
        forwards go out at multiples of the period, each landing `clock_change_s` later."""
        if not self.clock_requests:
            return
        period = self.config.clock_forward_period_s
        sent_by = now_s - self.config.clock_change_s
        if period > 0:
            sent_by = math.floor(sent_by / period) * period
        landed = [clock for at, clock in self.clock_requests if at <= sent_by]
        if landed:
            self.clock_requests = [(at, clock) for at, clock in self.clock_requests if at > sent_by]
            self.clock_mhz = landed[-1]

    def set_clock_band(self, low_mhz: float, high_mhz: float, now_s: float | None = None) -> None:
        """Bound the clock hook's choices (the planner's band for this pool). The clock moves
        into the band, at `now_s` as a choice the GPUs take later, or at once where None (a
        replica not yet serving); a batcher without a clock hook runs at the band's floor,
        the clock the planner chose for the load."""
        if low_mhz > high_mhz:
            raise ValueError(f"clock band [{low_mhz}, {high_mhz}] MHz is empty")
        self.clock_band_mhz = (float(low_mhz), float(high_mhz))
        clock = self.clamp_to_band(self.clock_target_mhz) if self.clock_policy is not None else low_mhz
        if now_s is None:
            self.set_clock(clock)
        else:
            self.request_clock(clock, now_s)

    def clamp_to_band(self, clock_mhz: float) -> float:
        if self.clock_band_mhz is None:
            return clock_mhz
        low, high = self.clock_band_mhz
        return min(max(clock_mhz, low), high)

    def squash_waiting(self, now_s: float, max_wait_s: float) -> list[Sequence]:
        """Drop requests that never started and waited past max(max_wait_s, their TTFT
        target) (DynamoLLM §IV-D): the client is better served retrying elsewhere."""
        squashed = [
            seq for seq in self.waiting
            if seq.generated == 0 and now_s - seq.request.arrival_s > max(max_wait_s, seq.request.slo.ttft_s)
        ]
        for seq in squashed:
            self.abort(seq.request_id)
        return squashed

    def set_tensor_parallel(self, tp: int) -> None:
        """Re-shard: new speed and KV capacity; sequences that no longer fit are preempted."""
        if tp not in self.perf.fits:
            raise ValueError(f"no performance fit for TP{tp}; have {self.perf.tensor_parallel_degrees}")
        self.tensor_parallel = tp
        kv_tokens = self.config.kv_capacity_tokens or self.perf.kv_capacity_tokens(tp)
        self.kv_blocks_total = max(kv_tokens // self.config.block_size, 1)
        while self.kv_blocks_used > self.kv_blocks_total and self.running:
            self._preempt_newest()

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def step_tokens(self) -> int:
        """Tokens one step may process now: with step_time_target_s, the most whose step fits
        that long at this TP and the clock the replica runs (batching.step_budget)."""
        target = self.config.step_time_target_s
        if target is None:
            return self.config.max_batched_tokens
        key = (self.tensor_parallel, self.clock_mhz)
        tokens = self._step_tokens_at.get(key)
        if tokens is None:
            tokens = self._step_tokens_at[key] = tbt_bounded_step_tokens(
                self.perf, self.tensor_parallel, target, self.config.max_batched_tokens, self.clock_mhz)
        return tokens

    def set_batch_limit(self, limit: int) -> None:
        """New limit applies to admissions; running sequences are never evicted for it."""
        self.batch_limit = max(int(limit), 1)

    # ---- KV ------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.block_size)

    def _free(self, seq: Sequence) -> None:
        self.kv_blocks_used -= seq.kv_blocks
        seq.kv_blocks = 0

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        need = self._blocks_for(tokens) - seq.kv_blocks
        if need <= 0:
            return True
        if self.kv_blocks_used + need > self.kv_blocks_total:
            return False
        seq.kv_blocks += need
        self.kv_blocks_used += need
        return True

    def _grow_or_preempt(self, seq: Sequence, tokens: int) -> bool:
        """Grow `seq` to `tokens`, preempting the newest sequences; False if `seq` itself went."""
        while not self._grow(seq, tokens):
            if self._preempt_newest() is seq:
                return False
        return True

    def _preempt_newest(self) -> Sequence:
        return self._preempt(len(self.running) - 1)

    def _preempt(self, index: int) -> Sequence:
        """Recompute preemption: free the KV, requeue at the front; tokens already
        generated are kept (and re-prefilled), so the client never sees them twice."""
        victim = self.running.pop(index)
        self._free(victim)
        victim.prefilled = 0
        victim.prefill_target = victim.context_tokens
        victim.preemptions += 1
        victim.preempted_here = True
        self.preemptions += 1
        self._requeue(victim)
        return victim

    def _make_room_for(self, seq: Sequence, now_s: float, refused: bool = False) -> Sequence | None:
        """Make room for an interactive request by preempting the newest batch one (or the
        sequence the preemption policy picks); the victim, or None. Asked when the batch limit
        or the KV keeps the request out, and when the admission chain `refused` it: then only
        batch work yields (interactive_first; throttLL'eM's projection refused interactive
        prompts while batch work filled the KV, and they waited 2-3 s for it to finish on the
        batch mix). A preemption policy's victims answer the limit and the KV only (Splitwise's
        token homes refuse prompts near a full KV so as not to preempt their decodes)."""
        if self.preemption is not None and not refused:
            index = self.preemption.victim(seq, self, now_s)
            return None if index is None else self._preempt(index)
        if not self.config.interactive_first or self._is_batch(seq):
            return None
        for index in range(len(self.running) - 1, -1, -1):
            if self._is_batch(self.running[index]):
                return self._preempt(index)
        return None

    # ---- time and energy -----------------------------------------------------
    def _account_idle(self, now_s: float) -> None:
        """Charge idle power for any gap since the last step ended."""
        if self.accounted_until_s is None:
            self.accounted_until_s = now_s
        if now_s > self.accounted_until_s:
            self.charge_idle((now_s - self.accounted_until_s) * self.perf.idle_power_w(self.tensor_parallel))
            self.accounted_until_s = now_s

    def charge_idle(self, joules: float) -> None:
        """Energy of GPUs with nothing to run (reported apart: no request is charged it)."""
        self.energy_j += joules
        self.idle_energy_j += joules

    # ---- one iteration -------------------------------------------------------
    def plan_step(self, now_s: float) -> Step | None:
        """Choose this iteration's work and cost it; None when there is nothing to do."""
        self._account_idle(now_s)
        self._move_late_behind(now_s)
        if self.clock_policy is not None:  # it reads the clock the last step ran at
            clock = self.clock_policy.choose_clock_mhz(self, now_s)
            if clock is not None:
                self.request_clock(self.clamp_to_band(clock), now_s)
        self.land_clock(now_s)
        budget = self.step_tokens
        chunks: list[tuple[Sequence, int]] = []
        decodes: list[Sequence] = []
        decode_context = 0
        block_size = self.config.block_size
        running = self.running
        by_deadline = self.config.prefill_by_ttft_deadline
        deferred: list[Sequence] = []  # by deadline: running prompts, prefilled around the queue by due time
        # Running sequences first, oldest first; preempt the newest when KV is short.
        i = 0
        while i < len(running):
            seq = running[i]
            prefilling = seq.prefilled < seq.prefill_target
            if prefilling and by_deadline:
                deferred.append(seq)
                i += 1
                continue
            if prefilling:
                n = min(seq.prefill_target - seq.prefilled, budget)
                target_tokens = seq.prefilled + n + (1 if seq.prefilled + n == seq.prefill_target else 0)
            else:
                n = 1
                target_tokens = seq.request.prompt_tokens + seq.generated + 1
            # Most steps fit in the blocks a sequence already holds (hot path: no call).
            if target_tokens > seq.kv_blocks * block_size and not self._grow_or_preempt(seq, target_tokens):
                break
            if n > 0:
                if prefilling:
                    chunks.append((seq, n))
                else:
                    decodes.append(seq)
                    decode_context += target_tokens - 1
                budget -= n
            i += 1
        ahead, behind = self._around_queue(deferred, now_s)
        budget = self._prefill_running(ahead, chunks, budget)
        # Admit waiting sequences in queue order while the batch limit, budget and KV allow.
        def room_for(seq: Sequence, refused: bool = False) -> bool:
            """Preempt for `seq`; a victim already in this step's work leaves it."""
            nonlocal budget, decode_context
            victim = self._make_room_for(seq, now_s, refused)
            if victim is None:
                return False
            if victim in decodes:
                decodes.remove(victim)
                decode_context -= victim.context_tokens
                budget += 1
            for i, (s, n) in enumerate(chunks):
                if s is victim:
                    del chunks[i]
                    budget += n
                    break
            return True

        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) >= self.batch_limit:
                if room_for(seq):
                    continue
                break
            if self.admission is not None and not self.admission.admit(seq, self, now_s):
                if room_for(seq, refused=True):
                    continue
                break
            if not seq.in_prefill:  # resumed with its KV: decodes in this very step
                if not self._grow(seq, seq.context_tokens + 1):
                    if room_for(seq):
                        continue
                    break
                self.waiting.popleft()
                self.running.append(seq)
                decodes.append(seq)
                decode_context += seq.context_tokens
                budget -= 1
                continue
            cached = self._cached_prefix_tokens(seq)
            n = min(seq.prefill_target - cached, budget)
            target_tokens = cached + n + (1 if cached + n == seq.prefill_target else 0)
            if not self._grow(seq, target_tokens):
                if room_for(seq):
                    continue
                break
            self.waiting.popleft()
            self.running.append(seq)
            self._start_prefill(seq, cached)
            chunks.append((seq, n))
            budget -= n
        self._prefill_running(behind, chunks, budget)  # what the prompts due earlier left
        if not chunks and not decodes:
            return None
        step_limit_s = self._step_limit_s(decodes, now_s) if chunks else None
        if step_limit_s is not None:
            chunks = self._fit_to_step_time(chunks, len(decodes), decode_context, step_limit_s)
        prefill_tokens = sum(n for _, n in chunks)
        sum_sq = prefill_sum_sq((s.prefilled, n) for s, n in chunks)
        cost = self.perf.iteration(
            prefill_tokens, sum_sq, len(decodes), decode_context, self.tensor_parallel, self.clock_mhz,
        )
        self.power_w = cost.power_w
        if self.speed is not None:
            self.speed.record(cost.time_s, prefill_tokens, sum_sq, len(decodes), decode_context,
                              self.tensor_parallel, self.clock_mhz)
        # The step's energy is charged by finish_step: stats() taken mid-step must not
        # also charge idle power for the same interval.
        self.accounted_until_s = now_s + cost.time_s
        return Step(now_s, cost.time_s, cost.power_w, chunks, decodes)

    def cached_prompt_tokens(self, request: Request) -> int:
        """Of `request`'s prompt, what its prefix cache holds now (what a router reads)."""
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.matched(request.prefix_hashes) * self.config.prefix_block_tokens

    def _cached_prefix_tokens(self, seq: Sequence) -> int:
        """What a fresh prompt about to start finds cached: its held first blocks, short of its
        last token (vLLM computes at least that one); a preempted or resumed sequence none."""
        if self.prefix_cache is None or not _unstarted(seq):
            return 0
        return min(self.cached_prompt_tokens(seq.request), seq.prefill_target - 1)

    def _start_prefill(self, seq: Sequence, cached: int) -> None:
        """A fresh prompt starts: its cached blocks count as computed and are used now."""
        if not _unstarted(seq):
            return
        seq.prefilled = seq.cached_tokens = cached
        self.prompt_tokens_started += seq.prefill_target
        self.prompt_tokens_cached += cached
        if self.prefix_cache is not None and cached:
            self.prefix_cache.use(seq.request.prefix_hashes[:cached // self.config.prefix_block_tokens])
            prompt, perf, tp, clock = seq.prefill_target, self.perf, self.tensor_parallel, self.clock_mhz
            rest = prompt - cached
            self.prefill_saved_s += perf.prefill_time_s(prompt, prefill_sum_sq([(0, prompt)]), tp, clock) - \
                perf.prefill_time_s(rest, prefill_sum_sq([(cached, rest)]), tp, clock)

    def finish_step(self, step: Step) -> StepOutput:
        """Apply a planned step at its end time; aborted sequences are skipped."""
        end = step.end_s
        self.energy_j += step.energy_j
        self.step_busy_s += step.time_s
        self.accounted_until_s = end
        out = StepOutput(end_s=end)
        total_tokens = sum(n for _, n in step.prefill_chunks) + len(step.decodes)
        per_token_j = step.energy_j / max(total_tokens, 1)
        emitted = out.emitted
        for seq, n in step.prefill_chunks:
            seq.energy_j += per_token_j * n
            if seq.aborted:
                continue
            seq.prefilled += n
            if seq.prefilled >= seq.prefill_target:
                emitted.append(seq)
                if self.prefix_cache is not None:  # its prompt's blocks are held from now
                    self.prefix_cache.use(seq.request.prefix_hashes)
        for seq in step.decodes:
            seq.energy_j += per_token_j
            if not seq.aborted:
                emitted.append(seq)
        self._emit(emitted, end, out.finished)
        if step.time_s > 0:
            rate = len(out.emitted) / step.time_s
            self.tokens_per_s += self.config.ewma_alpha * (rate - self.tokens_per_s)
        for seq in out.finished:
            self.running.remove(seq)
            self._free(seq)
            del self.by_id[seq.request_id]
            self.completed += 1
            if _interactive(seq):
                request = seq.request
                assert seq.first_token_s is not None and seq.last_token_s is not None  # it emitted its tokens
                self._outcomes.add(end, request.length_class, slo_met(
                    request.slo, seq.first_token_s - request.arrival_s,
                    mean_tbt_s(seq.first_token_s, seq.last_token_s, seq.generated)))
        self.power_w = self.perf.idle_power_w(self.tensor_parallel)
        return out

    def _emit(self, emitted: list[Sequence], now_s: float, finished: list[Sequence]) -> None:
        """One new token for each sequence, in order; updates TTFT/ITL and the EWMAs."""
        alpha = self.config.ewma_alpha
        for seq in emitted:
            last = seq.last_token_s
            if seq.first_token_s is None:
                seq.first_token_s = now_s
                # Batch work waits by design: only interactive TTFTs say the replica is late.
                if seq.request.service_class != "batch":
                    ttft = now_s - seq.request.arrival_s
                    self.ttft_ewma_s = (ttft if self.ttft_ewma_s == 0
                                        else self.ttft_ewma_s + alpha * (ttft - self.ttft_ewma_s))
            elif last is not None:
                gap = now_s - last
                if gap > seq.max_tbt_s:
                    seq.max_tbt_s = gap
                self.itl_ewma_s = gap if self.itl_ewma_s == 0 else self.itl_ewma_s + alpha * (gap - self.itl_ewma_s)
            seq.last_token_s = now_s
            seq.generated += 1
            self.tokens_generated += 1
            if seq.generated >= seq.output_target:
                finished.append(seq)

    # ---- reporting -----------------------------------------------------------
    def min_tbt_slo_s(self) -> float | None:
        """The tightest TBT target among running requests (Chiron's ITL SLO of a replica)."""
        return min((s.request.slo.tbt_s for s in self.running), default=None)

    def class_rates_per_s(self, now_s: float) -> dict[str, float]:
        """Arrivals per length class over the trailing window."""
        return self._arrivals.per_s(now_s)

    @property
    def pending_prompt_tokens(self) -> int:
        """Prompt tokens its waiting and running sequences still have to prefill."""
        return sum(s.prefill_target - s.prefilled for s in (*self.waiting, *self.running))

    def occupancy(self) -> ReplicaOccupancy:
        """What routing reads (core.replica_choice), as its stats would report it."""
        return ReplicaOccupancy.of(len(self.waiting) + len(self.running), self.kv_blocks_used, self.kv_blocks_total,
                                   self.block_size, self.pending_prompt_tokens)

    def stats(self, now_s: float) -> ReplicaStats:
        self._account_idle(now_s)
        if self.accounted_until_s is not None and self.accounted_until_s <= now_s:  # no step in flight
            self.land_clock(now_s)  # an idle replica's GPUs follow their forwarded clock too
        outcomes = self._outcomes.counts(now_s)
        late = Counter(s.request.length_class for s in (*self.waiting, *self.running)
                       if s.first_token_s is None and _interactive(s) and now_s > s.request.ttft_due_s)
        return ReplicaStats(
            queued_requests=len(self.waiting),
            running_requests=len(self.running),
            batch_limit=self.batch_limit,
            kv_blocks_used=self.kv_blocks_used,
            kv_blocks_total=self.kv_blocks_total,
            kv_block_size=self.block_size,
            pending_prompt_tokens=self.pending_prompt_tokens,
            pending_decode_tokens=sum(
                s.request.output_tokens_to_generate - s.generated for s in (*self.waiting, *self.running)
            ),
            itl_ewma_s=self.itl_ewma_s,
            ttft_ewma_s=self.ttft_ewma_s,
            tokens_per_s=self.tokens_per_s,
            clock_mhz=self.clock_mhz,
            power_w=self.power_w,
            energy_j=self.energy_j,
            idle_energy_j=self.idle_energy_j,
            tensor_parallel=self.tensor_parallel,
            preemptions=self.preemptions,
            completed_requests=self.completed,
            tokens_generated=self.tokens_generated,
            interactive_running=sum(1 for s in self.running if _interactive(s)),
            batch_waiting=sum(1 for s in self.waiting if s.request.service_class == "batch"),
            class_rates_per_s=self.class_rates_per_s(now_s),
            class_prompt_tokens_per_s=self._arrivals.prompt_tokens_per_s(now_s),
            slo_completed=outcomes.completed,
            slo_met=outcomes.met,
            slo_late=dict(late),
            batch_rate_per_s=self._arrivals.batch_per_s(now_s),
            step_time_ratio=self.speed.ratio if self.speed is not None else 1.0,
            per_step_clock=self.clock_policy is not None,
            step_clock_floor_mhz=self.clock_policy.lowest_clock_mhz(self) if self.clock_policy is not None else 0.0,
            deadline_prefill_step_s=(self.config.step_time_target_s or 0.0)
            if self.config.prefill_by_ttft_deadline else 0.0,
            prompt_tokens_started=self.prompt_tokens_started,
            prompt_tokens_cached=self.prompt_tokens_cached,
            prefix_work_ratio=self.step_busy_s / (self.step_busy_s + self.prefill_saved_s)
            if self.prefill_saved_s > 0 else 1.0,
        )
