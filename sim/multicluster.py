"""Mico's multi-cluster experiment (§4.2) in virtual time: one batch of queries dispatched
across clusters up front, each cluster the shared ContinuousBatcher on the calibrated
perf model (as sim/simulator.py runs replicas), with optional back-off offloading.

Reports what Mico's Table 1 and Fig. 10 compare: throughput (queries over the time the
last cluster finishes) and cumulative KV (KV tokens held, integrated over time).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from app.offload import ClusterLoad, TransferCost, Waiting, offload_to_idle
from app.token_ledger import TokenLedger
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher, Step, StepOutput
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

BATCH_SLO = SLO(ttft_s=3600.0, tbt_s=2.0)  # offline batch: only completion time matters


@dataclass(frozen=True)
class ClusterSpec:
    batch_limit: int
    tensor_parallel: int = 8
    model: str = "llama2-70b"
    hardware: str = "h100-80gb"
    profile: str | None = None  # named perf/power profile (energy.profiles); None: the default for model and hardware


@dataclass(frozen=True)
class MultiClusterResult:
    makespan_s: float
    throughput_qps: float
    cumulative_kv_token_s: float
    tokens_per_cluster: tuple[int, ...]  # actual prompt + output tokens each cluster served
    offloaded: int

    @property
    def token_imbalance(self) -> float:
        """max / min tokens per cluster (1 = perfectly balanced)."""
        return max(self.tokens_per_cluster) / max(min(self.tokens_per_cluster), 1)


def account_step(ledger: TokenLedger, step: Step, out: StepOutput) -> None:
    """M_k follows the batcher iteration by iteration: each prefill chunk, one token per
    emitting sequence, and what a finished request's prediction left over."""
    for seq, n in step.prefill_chunks:
        ledger.progress(seq.request_id, n)
    for seq in out.emitted:
        ledger.progress(seq.request_id, 1)
    for seq in out.finished:
        ledger.finish(seq.request_id)


def _nominal_tokens_per_s(batcher: ContinuousBatcher, context_tokens: int = 512) -> float:
    """Decode rate of a full batch: the rate an idle cluster offers a moved query."""
    b = batcher.batch_limit
    step = batcher.perf.iteration(0, 0.0, b, b * context_tokens, batcher.tensor_parallel, batcher.clock_mhz)
    return b / step.time_s


class MultiClusterSim:
    def __init__(
        self,
        spec: ClusterSpec,
        n_clusters: int,
        prompt_tokens: Sequence[int],
        output_tokens: Sequence[int],
        predicted_output_tokens: Sequence[int],
        offload: TransferCost | None = None,
    ) -> None:
        perf = default_perf_model(spec.model, spec.hardware, spec.profile)
        config = BatcherConfig(tensor_parallel=spec.tensor_parallel, batch_limit=spec.batch_limit)
        self.batchers = [ContinuousBatcher(perf, config) for _ in range(n_clusters)]
        self.rate_tokens_per_s = _nominal_tokens_per_s(self.batchers[0])
        self.ledger = TokenLedger(n_clusters)
        self.requests = [
            Request(str(i), max(int(p), 1), max(int(o), 1), 0.0, BATCH_SLO, "batch",
                    target_output_tokens=max(int(o), 1))
            for i, (p, o) in enumerate(zip(prompt_tokens, output_tokens))
        ]
        self.predicted = [max(int(p), 1) for p in predicted_output_tokens]
        self.offload = offload
        self.served_tokens = [0] * n_clusters
        self.offloaded = 0
        self._heap: list[tuple[float, int]] = []
        self._steps: list[Step | None] = [None] * n_clusters

    def run(self, assignment: Sequence[int]) -> MultiClusterResult:
        for i, k in enumerate(assignment):
            request = self.requests[i]
            self.batchers[k].add(request, 0.0)
            self.ledger.add(k, request.request_id, request.prompt_tokens + self.predicted[i])
        kv_token_s = 0.0
        end_s = 0.0
        for k in range(len(self.batchers)):
            self._kick(k, 0.0)
        while self._heap:
            now, k = heapq.heappop(self._heap)
            step = self._steps[k]
            assert step is not None  # one heap entry per step in flight
            batcher = self.batchers[k]
            kv_token_s += batcher.kv_blocks_used * batcher.config.block_size * step.time_s
            self._account(k, step, batcher.finish_step(step))
            self._steps[k] = None
            end_s = max(end_s, now)
            self._kick(k, now)
        n = len(self.requests)
        return MultiClusterResult(end_s, n / end_s if end_s else 0.0, kv_token_s, tuple(self.served_tokens),
                                  self.offloaded)

    def _account(self, k: int, step: Step, out: StepOutput) -> None:
        account_step(self.ledger, step, out)
        for seq in out.finished:
            self.served_tokens[k] += seq.request.prompt_tokens + seq.generated

    def _kick(self, k: int, now: float) -> None:
        batcher = self.batchers[k]
        step = batcher.plan_step(now)
        if step is None and self.offload is not None:
            step = self._take_offload(k, now)
        if step is None:
            return
        self._steps[k] = step
        heapq.heappush(self._heap, (step.end_s, k))

    def _take_offload(self, k: int, now: float) -> Step | None:
        """Cluster k drained its queue: announce it and take what pays to move."""
        offload = self.offload
        if offload is None:
            return None
        busy = [self._load(j) for j in range(len(self.batchers)) if j != k and self.batchers[j].waiting]
        moves = offload_to_idle(self._load(k), busy, offload)
        if not moves:
            return None
        start_s = now
        for move in moves:
            request = self.batchers[move.from_cluster].by_id[move.request_id].request
            self.batchers[move.from_cluster].abort(move.request_id)
            self.ledger.move(move.request_id, k)
            self.batchers[k].add(request, now)
            start_s = max(start_s, now + offload.seconds(request.prompt_tokens))
        self.offloaded += len(moves)
        return self.batchers[k].plan_step(start_s)

    def _load(self, k: int) -> ClusterLoad:
        batcher = self.batchers[k]
        fresh = [s for s in batcher.waiting if s.generated == 0 and s.prefilled == 0]
        waiting = [Waiting(s.request_id, self.ledger.left_tokens(s.request_id), s.request.prompt_tokens) for s in fresh]
        running = self.ledger.load_tokens[k] - sum(w.cost_tokens for w in waiting)
        return ClusterLoad(k, running, waiting, self.rate_tokens_per_s)
