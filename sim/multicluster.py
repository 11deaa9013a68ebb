"""Mico's multi-cluster experiment (§4.2) in virtual time: queries placed across clusters,
each cluster the shared ContinuousBatcher on the calibrated perf model (as
sim/simulator.py runs replicas).

Placement, the clusters' outstanding tokens and the back-offs are the CloudDispatcher's,
the object the federation front door places requests with (app.cloud_dispatch): queries
arrive at their times and the dispatcher picks each one's cluster, or a fixed
`assignment` (round-robin, Mico's batch dispatch) places them and the dispatcher only
keeps the books and offloads. Each step's progress goes to it, as the front door feeds it
streamed tokens, and it ticks every second of virtual time.

Reports what Mico's Table 1 and Fig. 10 compare: throughput (queries over the time the
last cluster finishes) and cumulative KV (KV tokens held, integrated over time), and the
predicted tokens each cluster was given.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from app.cloud_dispatch import BackOffSettings, CloudDispatcher
from app.offload import TransferCost
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher, Step, StepOutput
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

BATCH_SLO = SLO(ttft_s=3600.0, tbt_s=2.0)  # offline batch: only completion time matters
TICK_S = 1.0  # the dispatcher's tick, as the front door's


@dataclass(frozen=True)
class ClusterSpec:
    batch_limit: int
    tensor_parallel: int = 8
    model: str = "llama2-70b"
    hardware: str = "h100-80gb"
    profile: str | None = None  # named perf/power profile (energy.profiles); None: the default for model and hardware
    speed: float = 1.0  # < 1: the cluster runs its steps this much slower than the perf model (a slow cloud)


@dataclass(frozen=True)
class MultiClusterResult:
    makespan_s: float
    throughput_qps: float
    cumulative_kv_token_s: float
    tokens_per_cluster: tuple[int, ...]  # actual prompt + output tokens each cluster served
    offloaded: int
    predicted_tokens_per_cluster: tuple[float, ...] = ()  # prompt + predicted output placed on each cluster

    @property
    def token_imbalance(self) -> float:
        """max / min tokens per cluster (1 = perfectly balanced)."""
        return max(self.tokens_per_cluster) / max(min(self.tokens_per_cluster), 1)


class Books(Protocol):
    """Whatever keeps outstanding tokens: a TokenLedger, or the CloudDispatcher."""

    def progress(self, request_id: str, tokens: float) -> None: ...

    def finish(self, request_id: str) -> None: ...


def account_step(books: Books, step: Step, out: StepOutput) -> None:
    """M_k follows the batcher iteration by iteration: each prefill chunk, one token per
    emitting sequence, and what a finished request's prediction left over."""
    for seq, n in step.prefill_chunks:
        books.progress(seq.request_id, n)
    for seq in out.emitted:
        books.progress(seq.request_id, 1)
    for seq in out.finished:
        books.finish(seq.request_id)


def _nominal_tokens_per_s(batcher: ContinuousBatcher, context_tokens: int = 512) -> float:
    """Decode rate of a full batch."""
    b = batcher.batch_limit
    step = batcher.perf.iteration(0, 0.0, b, b * context_tokens, batcher.tensor_parallel, batcher.clock_mhz)
    return b / step.time_s


class _Event(IntEnum):
    STEP_END = 0
    ARRIVAL = 1
    TICK = 2


class MultiClusterSim:
    def __init__(
        self,
        spec: ClusterSpec | Sequence[ClusterSpec],
        n_clusters: int,
        prompt_tokens: Sequence[int],
        output_tokens: Sequence[int],
        predicted_output_tokens: Sequence[int],
        offload: TransferCost | None = None,
        arrival_s: Sequence[float] | None = None,
        back_off: BackOffSettings = BackOffSettings(),
    ) -> None:
        """`spec`: one for every cluster, or one each; `offload`: the back-off's transfer
        cost (None: no offloading); `arrival_s`: each query's arrival (None: all at 0)."""
        specs = [spec] * n_clusters if isinstance(spec, ClusterSpec) else list(spec)
        if len(specs) != n_clusters:
            raise ValueError(f"{len(specs)} cluster specs for {n_clusters} clusters")
        self.batchers = [ContinuousBatcher(default_perf_model(s.model, s.hardware, s.profile),
                                           BatcherConfig(tensor_parallel=s.tensor_parallel, batch_limit=s.batch_limit))
                         for s in specs]
        self.speeds = [s.speed for s in specs]
        self.requests = [
            Request(str(i), max(int(p), 1), max(int(o), 1), 0.0, BATCH_SLO, "batch",
                    target_output_tokens=max(int(o), 1))
            for i, (p, o) in enumerate(zip(prompt_tokens, output_tokens))
        ]
        self.predicted = [max(int(p), 1) for p in predicted_output_tokens]
        self.arrival_s = [float(t) for t in arrival_s] if arrival_s is not None else [0.0] * len(self.requests)
        self.offload = offload is not None
        self.dispatcher = CloudDispatcher(n_clusters, [float(_nominal_tokens_per_s(b)) for b in self.batchers]
                                          if len({s for s in specs}) > 1 else None, back_off,
                                          offload or TransferCost())
        self.served_tokens = [0] * n_clusters
        self.offloaded = 0
        self._heap: list[tuple[float, int, _Event, int]] = []
        self._seq = 0
        self._steps: list[Step | None] = [None] * n_clusters
        self._unfinished = len(self.requests)

    def _push(self, t: float, kind: _Event, index: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, index))

    def run(self, assignment: Sequence[int] | None = None) -> MultiClusterResult:
        """Each query at its arrival to `assignment[i]`, or (None) to the dispatcher's choice."""
        self._assignment = assignment
        for i, t in enumerate(self.arrival_s):
            self._push(t, _Event.ARRIVAL, i)
        self._push(0.0, _Event.TICK, 0)
        kv_token_s = 0.0
        end_s = 0.0
        while self._heap and self._unfinished:
            now, _, kind, index = heapq.heappop(self._heap)
            if kind is _Event.ARRIVAL:
                self._arrive(index, now)
            elif kind is _Event.TICK:
                self.dispatcher.tick(now)
                self._push(now + TICK_S, _Event.TICK, 0)
            else:
                step = self._steps[index]
                assert step is not None  # one heap entry per step in flight
                batcher = self.batchers[index]
                kv_token_s += batcher.kv_blocks_used * batcher.config.block_size * step.time_s
                self._account(index, step, batcher.finish_step(step))
                self._steps[index] = None
                end_s = max(end_s, now)
                self._kick(index, now)
        n = len(self.requests)
        placed = tuple(self.dispatcher.status(k, end_s).dispatched_tokens for k in range(len(self.batchers)))
        return MultiClusterResult(end_s, n / end_s if end_s else 0.0, kv_token_s, tuple(self.served_tokens),
                                  self.offloaded, placed)

    def _arrive(self, i: int, now: float) -> None:
        request = self.requests[i]
        cost = request.prompt_tokens + self.predicted[i]
        k = self._assignment[i] if self._assignment is not None else self.dispatcher.choose(cost, now)
        assert k is not None  # simulated clusters never fail
        self.dispatcher.dispatch(k, request.request_id, cost, request.prompt_tokens)
        self.batchers[k].add(request, now)
        self._kick(k, now)

    def _account(self, k: int, step: Step, out: StepOutput) -> None:
        account_step(self.dispatcher, step, out)
        for seq in out.finished:
            self.served_tokens[k] += seq.request.prompt_tokens + seq.generated
        self._unfinished -= len(out.finished)

    def _kick(self, k: int, now: float) -> None:
        if self._steps[k] is not None:
            return
        batcher = self.batchers[k]
        step = batcher.plan_step(now)
        if step is None and self.offload:
            step = self._take_offload(k, now)
        if step is None:
            return
        if self.speeds[k] != 1.0:  # a slow cluster: the same step, taking longer
            step.time_s /= self.speeds[k]
        self._steps[k] = step
        self._push(step.end_s, _Event.STEP_END, k)

    def _take_offload(self, k: int, now: float) -> Step | None:
        """Cluster k drained its queue: it takes what the dispatcher finds worth moving."""
        moves = self.dispatcher.offloads(now, idle=[k])
        if not moves:
            return None
        start_s = now
        for move in moves:
            request = self.batchers[move.from_cluster].by_id[move.request_id].request
            self.batchers[move.from_cluster].abort(move.request_id)
            self.dispatcher.move(move.request_id, k)
            self.batchers[k].add(request, now)
            start_s = max(start_s, now + self.dispatcher.transfer.seconds(request.prompt_tokens))
        self.offloaded += len(moves)
        return self.batchers[k].plan_step(start_s)
