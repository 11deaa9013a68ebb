"""The discrete-event simulator: a virtual clock, simulated replicas, one policy.

Events sit in a heap of (time, seq, kind, replica); arrivals are read in order from
the workload's arrays instead of being pushed. Every control tick the simulator
builds the same ClusterView Ray Serve's adapter builds (stats of the running
replicas per deployment, requests queued outside them), asks the policy for a
ClusterPlan and applies it with the overheads a real cluster pays.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from app.classify import Classifier
from app.pool_overflow import PoolOverflowConfig, overflow_attempts, serving_pools
from app.route import WeightedRouter
from autoscaling.chiron.batch_queue import OutputLengthStats, QueuedBatchRequest
from autoscaling.chiron.local import LocalAutoscalerConfig, LocalBatchAutoscaler
from autoscaling.chiron.queue_summary import summarise_queue
from batching.continuous_batcher import AdmissionPolicy, BatcherConfig, ClockPolicy, RequestOverflowed, Sequence
from core.classes import LengthClassConfig, ServiceClass, default_service_classes
from core.plan import ClusterPlan
from core.policy import ControlPolicy
from core.replica_choice import PrefixAffinity, rank_replicas
from core.request import Request
from core.roles import BATCH_QUEUE_DEPLOYMENT, Phase, ReplicaKind
from core.view import ClusterView, DeploymentView
from energy.calibration import default_perf_model
from energy.perf_model import PerfModel
from prediction.predictor_confusion import default_predictor_error
from sim.config import SimConfig
from sim.length_prediction import predicted_by_predictor, predicted_with_noise
from sim.records import CLASS_INDEX, RequestLog, Series
from sim.replica import SimReplica, State
from sim.workload import Workload


class Event(IntEnum):
    """What a heap entry does when its time comes."""

    STEP_END = 0  # a replica's batch step finished
    READY = 1  # a starting replica finished loading
    CONTROL = 3  # the policy's control tick
    SAMPLE = 4  # record the time series
    CALL = 5  # call a function of the time (e.g. a KV transfer landing)


# Builds a new replica's admission and clock policies (e.g. throttLL'eM's) for its batcher.
BatcherPolicies = Callable[[PerfModel, BatcherConfig], tuple[AdmissionPolicy | None, ClockPolicy | None]]


def predicted_lengths(output_tokens: np.ndarray, config: SimConfig) -> np.ndarray:
    """The output lengths the classifier sees, per `SimConfig.length_prediction`."""
    if config.length_prediction == "oracle":
        return output_tokens
    if config.length_prediction == "noisy":
        return predicted_with_noise(output_tokens, config.length_error_p95, config.length_error_seed)
    return predicted_by_predictor(output_tokens, default_predictor_error(), config.length_error_seed)


@dataclass(frozen=True)
class PoolSetup:
    """A deployment the run starts with: the length classes it serves and its first plan."""

    name: str
    classes: tuple[str, ...]
    tensor_parallel: int
    clock_mhz: float
    replicas: int
    # Like the Serve app's pools (PoolAutoscaling.min_replicas): a pool keeps one warm replica.
    min_replicas: int = 1
    max_replicas: int = 1024
    batcher_policies: BatcherPolicies | None = None
    # Chiron: interactive, mixed or batch pools route by service class instead of length
    # class; batch requests wait in one global queue for spare capacity.
    # Splitwise: prompt or token pools, routed by phase (sim/splitwise.py).
    kind: ReplicaKind | Phase | None = None
    # Chiron's local autoscaler sets each replica's batch limit (Algorithm 1).
    local_autoscaler: LocalAutoscalerConfig | None = None
    # Per-step token budget of its replicas (Splitwise's prompt pool: 2048); None: SimConfig's.
    max_batched_tokens: int | None = None
    # Chunked prefill sized to the TBT target (batching.step_budget); None: a fixed budget.
    step_time_target_s: float | None = None
    # Chiron's mixed-replica rule on a length pool: interactive requests queue ahead of
    # batch ones and preempt them ("mixed" pools always do).
    interactive_first: bool = False
    # Prompts prefill earliest TTFT deadline first (BatcherConfig.prefill_by_ttft_deadline).
    prefill_by_ttft_deadline: bool = False
    # Its interactive requests try the other serving pools while its replicas are backed up
    # (app.pool_overflow, as the Serve ingress does); None: they queue here.
    overflow: PoolOverflowConfig | None = None


class Pool:
    """A deployment's runtime state: its target shape, replicas and outside queue."""

    def __init__(self, index: int, setup: PoolSetup) -> None:
        self.index = index
        self.name = setup.name
        self.setup = setup
        self.tp = setup.tensor_parallel
        self.clock_mhz = setup.clock_mhz
        self.clock_band_mhz: tuple[float, float] | None = None
        self.target = setup.replicas
        self.batch_limit: int | None = None
        self.replicas: list[SimReplica] = []
        self.outside: deque[Request] = deque()

    def live(self, tp_matches: bool) -> list[SimReplica]:
        """Starting or ready replicas whose TP does (not) match the pool's target TP."""
        return [
            r for r in self.replicas
            if r.state in (State.STARTING, State.READY) and (r.tp == self.tp) == tp_matches
        ]


@dataclass
class RawRun:
    log: RequestLog
    series: Series
    replicas: list[SimReplica]
    pool_names: list[str]
    end_s: float
    # Length class -> seconds the plan had the SLO guard on for it (ClusterPlan.slo_guard).
    slo_guard_s: dict[str, float] = field(default_factory=dict)


class Simulator:
    def __init__(
        self,
        workload: Workload,
        policy: ControlPolicy,
        pools: list[PoolSetup],
        config: SimConfig = SimConfig(),
        lengths: LengthClassConfig = LengthClassConfig(),
        services: dict[str, ServiceClass] | None = None,
        on_progress: Callable[[float, float], None] | None = None,
        perf: PerfModel | None = None,
    ) -> None:
        """`perf` models the replicas' steps (e.g. one fitted on a real engine's profile,
        energy.engine_fit); None: the config's named profile."""
        self.workload = workload
        self.policy = policy
        self.config = config
        # What every planner believes (the config's profile); replicas time their steps
        # against it when they run another (batching.step_speed).
        self.planned_perf = default_perf_model(config.model, config.hardware, config.profile)
        self.perf = perf or self.planned_perf
        self.pools = {p.name: Pool(i, p) for i, p in enumerate(pools)}
        pool_of_class = {cls: p.name for p in pools for cls in p.classes}
        self.classifier = Classifier(lengths, services or default_service_classes(), pool_of_class)
        self.router = WeightedRouter()
        self.kinds = {p.kind: self.pools[p.name] for p in pools if p.kind}
        self.batch_queue: deque[Request] = deque()
        # Length pools: batch requests wait in the app's global queue (request, pool named by
        # the classifier), at most `config.batch_in_flight` of them out on the pools.
        self.batch_backlog: deque[tuple[Request, str]] = deque()
        self.batch_out: set[str] = set()
        # How many may be out at once: the config's, until a plan raises it (Chiron's deadlines).
        self.batch_in_flight = config.batch_in_flight
        self.preempted: dict[str, Sequence] = {}  # batch requests back in the queue, with their tokens
        self.output_lengths = OutputLengthStats()
        self.on_progress = on_progress
        self.log = RequestLog(len(workload))
        self.predicted = predicted_lengths(workload.output_tokens, config)
        self.series = Series(config.sample_interval_s)
        for name in self.pools:
            for table in (self.series.ready, self.series.starting, self.series.tp, self.series.clock_mhz,
                          self.series.queued):
                table[name] = []
        self.all_replicas: list[SimReplica] = []
        self.gpus_in_use = 0
        self.stopped_energy_j = 0.0
        self.unfinished = len(workload)
        self.slo_guard_s: dict[str, float] = {}
        # The last field is the event's replica, or for CALL a function of the time.
        self._heap: list[tuple[float, int, Event, SimReplica | Callable[[float], None] | None]] = []
        self._seq = 0
        self._router_rng = np.random.default_rng(config.router_seed)

    # ---- events ----------------------------------------------------------------
    def _push(self, t: float, kind: Event, replica: SimReplica | Callable[[float], None] | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, replica))

    def run(self) -> RawRun:
        w = self.workload
        for pool in self.pools.values():
            for _ in range(pool.target):
                self._start_replica(pool, 0.0, delay_s=0.0)
        self._push(0.0, Event.SAMPLE)
        self._push(self.config.control_interval_s, Event.CONTROL)
        arrivals = w.arrival_s.tolist()
        n = len(arrivals)
        horizon = (arrivals[-1] if n else 0.0) + self.config.drain_limit_s
        i = 0
        now = 0.0
        heap = self._heap
        while True:
            if i < n and (not heap or arrivals[i] <= heap[0][0]):
                now = arrivals[i]
                self._arrive(i, now)
                i += 1
                continue
            if (self.unfinished == 0 and i >= n) or not heap:
                break
            now, _, kind, replica = heapq.heappop(heap)
            if now > horizon:
                break
            if kind == Event.STEP_END:
                assert isinstance(replica, SimReplica)
                self._step_end(replica, now)
            elif kind == Event.READY:
                assert isinstance(replica, SimReplica)
                self._ready(replica, now)
            elif kind == Event.CALL:
                assert callable(replica)
                replica(now)
            elif kind == Event.CONTROL:
                self._control(now)
                self._push(now + self.config.control_interval_s, Event.CONTROL)
            else:
                self._sample(now)
                if self.on_progress is not None:
                    self.on_progress(now, arrivals[-1] if n else 0.0)
                self._push(now + self.config.sample_interval_s, Event.SAMPLE)
        end = max(now, w.duration_s)
        self._sample(end)
        for r in self.all_replicas:
            if r.state is not State.STOPPED:
                r.stop(end)
        return RawRun(self.log, self.series, self.all_replicas, list(self.pools), end, self.slo_guard_s)

    # ---- requests --------------------------------------------------------------
    def _arrive(self, i: int, now: float) -> None:
        w = self.workload
        out = int(w.output_tokens[i])
        request, pool_name = self.classifier.classify(
            request_id=str(i), prompt_tokens=int(w.prompt_tokens[i]), max_tokens=out,
            predicted_output_tokens=int(self.predicted[i]),
            service_class="interactive" if w.interactive[i] else "batch",
            arrival_s=now, target_output_tokens=out,
        )
        if w.prefix is not None:
            request.prefix_hashes = w.prefix[i]
        log = self.log
        log.prompt_tokens[i] = request.prompt_tokens
        log.slo_ttft_s[i] = request.slo.ttft_s
        log.slo_tbt_s[i] = request.slo.tbt_s
        log.length_class[i] = CLASS_INDEX[request.length_class]
        log.interactive[i] = w.interactive[i]
        if self.kinds:
            self._arrive_by_kind(i, request, now)
            return
        if request.service_class == "batch" and self.config.batch_in_flight is not None:
            self.batch_backlog.append((request, pool_name))
            self._release_batch(now)
            return
        self._route(request, pool_name, now)

    def _route(self, request: Request, pool_name: str, now: float) -> None:
        chosen = self.router.pick(request.length_class, pool_name)
        serving = serving_pools(self.router.weights, self.pools)
        for attempt in overflow_attempts(chosen, request.service_class, serving, self.pools[chosen].setup.overflow):
            pool = self.pools[attempt.pool]
            request.refuse_above_pending_tokens = attempt.refuse_above_pending_tokens
            if self._dispatch(pool, request, now):
                request.refuse_above_pending_tokens = None
                self.log.pool[int(request.request_id)] = pool.index
                return

    def _release_batch(self, now: float) -> None:
        """Send queued batch requests (deadline order: they share a target, so arrival order)
        to their pools while fewer than `batch_in_flight` are out."""
        limit = self.batch_in_flight
        while self.batch_backlog and limit is not None and len(self.batch_out) < limit:
            request, pool_name = self.batch_backlog.popleft()
            self.batch_out.add(request.request_id)
            self._route(request, pool_name, now)

    def _batch_returned(self, request_id: str, now: float) -> None:
        """A queued batch request is out no more (finished or refused): the next may go."""
        if request_id in self.batch_out:
            self.batch_out.discard(request_id)
            self._release_batch(now)

    def _arrive_by_kind(self, i: int, request: Request, now: float) -> None:
        """Chiron: interactive to its own pool while it has room, else to mixed; batch to
        the global queue, which drains into batch (then mixed) replicas with room."""
        if request.service_class == "batch":
            self.log.pool[i] = self.kinds[ReplicaKind.BATCH].index
            self.batch_queue.append(request)
            self._drain_batch_queue(now)
            return
        pool = self.kinds[ReplicaKind.INTERACTIVE]
        if not self._has_room(pool) and ReplicaKind.MIXED in self.kinds:
            pool = self.kinds[ReplicaKind.MIXED]
        self.log.pool[i] = pool.index
        self._dispatch(pool, request, now)

    @staticmethod
    def _has_room(pool: Pool) -> bool:
        return any(r.state is State.READY and r.load < r.ready_batcher.batch_limit for r in pool.replicas)

    def _requeue_preempted_batch(self, r: SimReplica) -> None:
        """Chiron: batch requests an interactive one preempted on a mixed replica go back
        to the global queue (first in it), to run wherever capacity frees up."""
        for seq in [s for s in r.ready_batcher.waiting if s.request.service_class == "batch" and s.preempted_here]:
            self.preempted[seq.request_id] = r.ready_batcher.evict(seq.request_id)
            self.batch_queue.appendleft(seq.request)

    def _drain_batch_queue(self, now: float) -> None:
        for kind in (ReplicaKind.BATCH, ReplicaKind.MIXED):
            pool = self.kinds.get(kind)
            while pool is not None and self.batch_queue and self._has_room(pool):
                self._dispatch(pool, self.batch_queue.popleft(), now)

    def _dispatch(self, pool: Pool, request: Request, now: float) -> bool:
        """The pool's ready replica ranked first for the request (core.replica_choice, as
        Serve's router ranks them); else wait outside. False: refused for overflow
        (`Request.refuse_above_pending_tokens`), nothing changed."""
        ready = [r for r in pool.replicas if r.state is State.READY]
        if not ready:
            if request.refuse_above_pending_tokens is not None:
                return False
            pool.outside.append(request)
            return True
        best = ready[self._rank(ready, request)[0]]
        prior = self.preempted.pop(request.request_id, None)
        try:
            if prior is None:
                best.ready_batcher.add(request, now)
            else:  # resumes from its tokens: their KV is recomputed, none is emitted twice
                best.ready_batcher.resume(request, prior, now, kv_present=False)
        except RequestOverflowed:
            return False
        except ValueError:  # larger than the replica's whole KV cache
            self._reject(int(request.request_id), now)
            return True
        self._kick(best, now)
        return True

    def _rank(self, ready: list[SimReplica], request: Request) -> list[int]:
        """The pool's ready replicas best first for `request`, by the config's router."""
        router = self.config.replica_router
        if router == "pow2":  # Serve's default: of two at random, the shorter queue
            two = self._router_rng.choice(len(ready), size=min(2, len(ready)), replace=False).tolist()
            two.sort(key=lambda i: ready[i].load)
            return two + [i for i in range(len(ready)) if i not in two]
        affinity = {"prefix_aware": self.config.prefix_affinity, "oracle": PrefixAffinity.unbounded()}.get(router)
        occupancy = [r.ready_batcher.occupancy() for r in ready]
        if affinity is not None:
            occupancy = [replace(o, cached_prompt_tokens=r.ready_batcher.cached_prompt_tokens(request))
                         for o, r in zip(occupancy, ready, strict=True)]
        return rank_replicas(occupancy, request.prompt_tokens, affinity=affinity)

    def _kick(self, r: SimReplica, now: float) -> None:
        """Start the replica's next step if it is free to."""
        if r.step is not None or r.state not in (State.READY, State.DRAINING):
            return
        step = r.ready_batcher.plan_step(now)
        if step is None:
            if r.state is State.DRAINING:
                self._stop(r, now)
            return
        r.step = step
        self._push(step.end_s, Event.STEP_END, r)

    def _step_end(self, r: SimReplica, now: float) -> None:
        assert r.step is not None  # a STEP_END event follows the step _kick started
        out = r.ready_batcher.finish_step(r.step)
        r.step = None
        for seq in out.finished:
            self._complete(r, seq, now)
        if self.pools[r.pool].setup.kind is ReplicaKind.MIXED:
            self._requeue_preempted_batch(r)
        if self.batch_queue and out.finished:
            self._drain_batch_queue(now)
        self._kick(r, now)

    def _complete(self, r: SimReplica, seq: Sequence, now: float) -> None:
        """A sequence finished on replica `r`: record the request as done."""
        self.log.finish(int(seq.request.request_id), seq)
        if seq.request.service_class == "batch":
            self.output_lengths.observe(seq.generated)
            self._batch_returned(seq.request_id, now)
        self.unfinished -= 1

    # ---- replicas --------------------------------------------------------------
    def _start_replica(self, pool: Pool, now: float, delay_s: float) -> bool:
        if self.gpus_in_use + pool.tp > self.config.cluster_gpus:
            return False
        r = SimReplica(len(self.all_replicas), pool.name, pool.tp, now, now + delay_s, self.perf,
                       self.planned_perf)
        self.gpus_in_use += pool.tp
        self.all_replicas.append(r)
        pool.replicas.append(r)
        if delay_s <= 0:
            self._ready(r, now)
        else:
            self._push(now + delay_s, Event.READY, r)
        return True

    def _ready(self, r: SimReplica, now: float) -> None:
        if r.state is not State.STARTING:
            return  # cancelled while starting
        pool = self.pools[r.pool]
        cfg = self.config
        local = pool.setup.local_autoscaler
        autoscaler = LocalBatchAutoscaler(local) if local is not None else None
        if autoscaler is not None:
            r.local_autoscaler = autoscaler
        batcher = r.become_ready(BatcherConfig(
            tensor_parallel=r.tp, clock_mhz=pool.clock_mhz,
            batch_limit=autoscaler.limit if autoscaler is not None else pool.batch_limit or cfg.batch_limit,
            max_batched_tokens=pool.setup.max_batched_tokens or cfg.max_batched_tokens,
            step_time_target_s=pool.setup.step_time_target_s,
            interactive_first=pool.setup.kind is ReplicaKind.MIXED or pool.setup.interactive_first,
            prefill_by_ttft_deadline=pool.setup.prefill_by_ttft_deadline,
            clock_forward_period_s=cfg.overheads.clock_forward_period_s, clock_change_s=cfg.overheads.clock_change_s,
            prefix_block_tokens=self.workload.prefix_block_tokens,
        ))
        if pool.setup.batcher_policies is not None:
            batcher.admission, batcher.clock_policy = pool.setup.batcher_policies(self.perf, batcher.config)
        if pool.clock_band_mhz is not None:
            batcher.set_clock_band(*pool.clock_band_mhz)
        while pool.outside:
            self._dispatch(pool, pool.outside.popleft(), now)
        if self.batch_queue:
            self._drain_batch_queue(now)

    def _drain(self, r: SimReplica, now: float) -> None:
        if r.state is State.STARTING:
            self._stop(r, now)
            return
        r.state = State.DRAINING
        if r.idle:
            self._stop(r, now)

    def _stop(self, r: SimReplica, now: float) -> None:
        r.stop(now)
        self.gpus_in_use -= r.tp
        self.stopped_energy_j += r.energy_j(now)
        self.pools[r.pool].replicas.remove(r)

    # ---- control ---------------------------------------------------------------
    def view(self, now: float) -> ClusterView:
        deployments = {}
        for pool in self.pools.values():
            ready = [r for r in pool.replicas if r.state is State.READY]
            starting = sum(1 for r in pool.replicas if r.state is State.STARTING)
            deployments[pool.name] = DeploymentView(
                name=pool.name, current_replicas=len(ready), target_replicas=len(ready) + starting,
                min_replicas=pool.setup.min_replicas, max_replicas=pool.setup.max_replicas,
                replica_stats=tuple(r.ready_batcher.stats(now) for r in ready),
                queued_outside=float(len(pool.outside)),
            )
        if self.kinds or self.batch_in_flight is not None:  # the global queue: Chiron's, or the Batch API's
            waiting = [*self.batch_queue, *(request for request, _ in self.batch_backlog)]
            queue = [QueuedBatchRequest(q.arrival_s, q.ttft_due_s) for q in waiting]
            deployments[BATCH_QUEUE_DEPLOYMENT] = DeploymentView(
                BATCH_QUEUE_DEPLOYMENT, 1, 1, 1, 1, extra_metrics=summarise_queue(queue, self.output_lengths))
        return ClusterView(deployments)

    def _local_autoscale(self, now: float) -> None:
        """Chiron's Algorithm 1 in every replica that runs it, on its own counters."""
        for pool in self.pools.values():
            for r in pool.replicas:
                if r.local_autoscaler is None or r.batcher is None:
                    continue
                s = r.batcher.stats(now)
                slo = r.batcher.min_tbt_slo_s()
                if slo is not None:
                    r.batcher.set_batch_limit(r.local_autoscaler.update(
                        s.itl_ewma_s, slo, s.tokens_per_s, s.running_requests, s.tokens_generated))

    def _control(self, now: float) -> None:
        self._local_autoscale(now)
        if self.batch_queue:
            self._drain_batch_queue(now)
        plan = self.policy.observe(self.view(now), now)
        for cls in plan.slo_guard:  # the plan holds until the next tick
            self.slo_guard_s[cls] = self.slo_guard_s.get(cls, 0.0) + self.config.control_interval_s
        self._apply(plan, now)
        if self.config.squash_after_s is not None:
            self._squash(now, self.config.squash_after_s)

    def _squash(self, now: float, max_wait_s: float) -> None:
        for pool in self.pools.values():
            for r in pool.replicas:
                if r.batcher is not None:
                    for seq in r.batcher.squash_waiting(now, max_wait_s):
                        self._reject(int(seq.request_id), now)
            waited = [q for q in pool.outside if now - q.arrival_s > max(max_wait_s, q.slo.ttft_s)]
            for q in waited:
                pool.outside.remove(q)
                self._reject(int(q.request_id), now)

    def _reject(self, i: int, now: float) -> None:
        self.log.rejected[i] = True
        self.unfinished -= 1
        self._batch_returned(str(i), now)

    def _apply(self, plan: ClusterPlan, now: float) -> None:
        if plan.routing_weights:
            self.router.set_weights(plan.routing_weights)
        if BATCH_QUEUE_DEPLOYMENT in plan.batch_in_flight and self.batch_in_flight is not None:
            self.batch_in_flight = plan.queue_in_flight(self.config.batch_in_flight or 0)
            self._release_batch(now)
        for pool in self.pools.values():
            name = pool.name
            if name in plan.tensor_parallel:
                tp = plan.tensor_parallel[name]
                if tp not in self.perf.fits:
                    raise ValueError(f"plan asks TP{tp} for {name}; the model has {self.perf.tensor_parallel_degrees}")
                pool.tp = tp
            if name in plan.batch_limit:
                pool.batch_limit = plan.batch_limit[name]
                for r in pool.replicas:
                    if r.batcher is not None:
                        r.batcher.set_batch_limit(pool.batch_limit)
            if name in plan.clock_mhz:
                self._set_clock(pool, float(plan.clock_mhz[name]), now)
            band = plan.clock_band_mhz.get(name)
            if band is not None and name not in plan.clock_mhz and band != pool.clock_band_mhz:
                pool.clock_band_mhz = band
                for r in pool.replicas:
                    if r.batcher is not None:
                        r.batcher.set_clock_band(*pool.clock_band_mhz, now_s=now)
            pool.target = min(max(plan.replicas.get(name, pool.target), 0), pool.setup.max_replicas)
            self._reconcile(pool, now)

    def _set_clock(self, pool: Pool, clock_mhz: float, now: float) -> None:
        """A plan clock is a pin: the band collapses on it (as in Serve's replicas)."""
        pool.clock_mhz = clock_mhz
        pool.clock_band_mhz = (clock_mhz, clock_mhz)
        for r in pool.replicas:
            if r.batcher is None or r.batcher.clock_band_mhz == pool.clock_band_mhz:
                continue
            r.batcher.set_clock_band(clock_mhz, clock_mhz, now_s=now)

    def _reconcile(self, pool: Pool, now: float) -> None:
        """Move the pool toward `target` replicas at its TP, replacing other-TP ones."""
        current = pool.live(tp_matches=True)
        old = pool.live(tp_matches=False)
        for r in old:
            if r.state is State.STARTING:
                self._drain(r, now)
        old = [r for r in old if r.state is State.READY]
        excess = len(current) - pool.target
        if excess > 0:
            # Cancel the latest starts first, then drain the least-loaded ready replicas.
            order = sorted(current, key=lambda r: (r.state is State.READY, r.load, -r.replica_id))
            for r in order[:excess]:
                self._drain(r, now)
        delay = self.config.overheads.reshard_s if old else self.config.overheads.startup_s
        missing = pool.target - len(current)
        while missing > 0:
            if self._start_replica(pool, now, delay):
                missing -= 1
                continue
            if not old:
                break  # the cluster is full: retried next tick
            # Free GPUs by retiring an old-TP replica; if it must drain first, retry later.
            victim = min(old, key=lambda r: r.load)
            old.remove(victim)
            self._drain(victim, now)
            if victim.state is not State.STOPPED:
                break
        # Old-TP replicas keep serving, every one of them, until all the new ones are ready
        # (as Serve's shadow rollout keeps the old deployment at its count): counted in
        # replicas, one TP2 replica left beside a starting TP4 one is half the capacity.
        ready_new = sum(1 for r in pool.replicas if r.state is State.READY and r.tp == pool.tp)
        if ready_new >= pool.target:
            for r in old:
                self._drain(r, now)

    # ---- sampling --------------------------------------------------------------
    def _sample(self, now: float) -> None:
        s = self.series
        s.t_s.append(now)
        live_energy = sum(r.energy_j(now) for p in self.pools.values() for r in p.replicas)
        s.energy_j.append(self.stopped_energy_j + live_energy)
        s.gpus.append(self.gpus_in_use)
        for pool in self.pools.values():
            ready = [r for r in pool.replicas if r.state is State.READY]
            s.ready[pool.name].append(len(ready))
            s.starting[pool.name].append(sum(1 for r in pool.replicas if r.state is State.STARTING))
            s.tp[pool.name].append(pool.tp)
            s.clock_mhz[pool.name].append(
                sum(r.ready_batcher.clock_mhz for r in ready) / len(ready) if ready else float(pool.clock_mhz)
            )
            s.queued[pool.name].append(
                len(pool.outside) + sum(len(r.batcher.waiting) for r in pool.replicas if r.batcher is not None)
            )
