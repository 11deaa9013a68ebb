"""A vLLM replica's batch as the batcher's rules read it (batching's RunningBatch, ClockedBatch).

vLLM schedules its own batch; what our rules need is the set of requests we let past
the admission gate, how far each has got, those still waiting at the gate, the engine's
KV capacity and the replica's clock. That is what this view keeps: a Sequence per admitted
request, advanced as its tokens stream out, and vLLM's block counts from its stat loggers.
It lets throttLL'eM's admission and clock rules (the objects the simulated replicas run)
decide for a vLLM replica.

vLLM reports each step's totals, not each request's part in it, so a prompt's prefill
progress is estimated step by step as vLLM's scheduler fills a step (`on_step`): the step's
token budget less one token per decode, given to the prompts still prefilling, oldest first.
A prompt is done when its first token streams out; until then the estimate stops a token
short. The same estimate is each request's share of a step's work (its energy).
"""

from __future__ import annotations

import math

from batching.continuous_batcher import Sequence
from batching.deadline_order import due_key
from core.request import Request
from energy.perf_model import PerfModel
from engines.admission_gate import AdmissionGate
from engines.vllm_clock import VllmClock
from engines.vllm_stats import VllmStatsSnapshot


class VllmRunningBatch:
    def __init__(self, tensor_parallel: int, block_size: int, snapshot: VllmStatsSnapshot, gate: AdmissionGate,
                 clock: VllmClock, step_tokens: int, perf: PerfModel | None = None, by_deadline: bool = False) -> None:
        """`step_tokens`: vLLM's max_num_batched_tokens; `perf`: the model the clock rule plans
        prefills with (None where the replica runs none); `by_deadline`: prompts prefill
        earliest TTFT deadline first (VllmEngineConfig.prefill_by_ttft_deadline)."""
        self.tensor_parallel = tensor_parallel
        self.block_size = block_size
        self.clock = clock
        self.step_tokens = step_tokens
        self.by_deadline = by_deadline
        self._perf = perf
        self._snapshot = snapshot
        self._gate = gate
        self._sequences: dict[str, Sequence] = {}

    @property
    def batch_limit(self) -> int:
        """The gate's limit: what Chiron's local autoscaler last set."""
        return self._gate.limit

    @property
    def running(self) -> list[Sequence]:
        """Admitted requests, oldest first."""
        return list(self._sequences.values())

    @property
    def waiting(self) -> list[Sequence]:
        """Requests waiting at the admission gate, in the order it admits them."""
        return self._gate.waiting_candidates

    @property
    def all_decoding(self) -> bool:
        """Every admitted request has its first token: vLLM's next step only decodes."""
        return all(s.prefilled >= s.prefill_target for s in self._sequences.values())

    @property
    def kv_blocks_total(self) -> int:
        return self._snapshot.kv_blocks_total

    @property
    def kv_blocks_used(self) -> int:
        return round(self._snapshot.kv_usage * self._snapshot.kv_blocks_total) if self._sequences else 0

    @property
    def perf(self) -> PerfModel:
        if self._perf is None:
            raise RuntimeError("this vLLM replica runs no clock rule: no perf model to plan prefills with")
        return self._perf

    # ---- the clock, as a clock rule reads it (engines.vllm_clock) ----------------
    @property
    def clock_mhz(self) -> float:
        return self.clock.running_mhz

    @property
    def clock_target_mhz(self) -> float:
        return self.clock.target_mhz

    @property
    def longest_clock_lag_s(self) -> float:
        return self.clock.longest_lag_s

    def clamp_to_band(self, clock_mhz: float) -> float:
        return self.clock.clamp_to_band(clock_mhz)

    def clock_lands_s(self, now_s: float) -> float:
        return self.clock.lands_s(now_s)

    # ---- requests in, through and out ------------------------------------------
    @staticmethod
    def candidate(request: Request, now_s: float, generated: int = 0) -> Sequence:
        """The Sequence a waiting request is judged as (`generated`: resumed after a
        preemption, its prompt and those tokens to prefill again)."""
        seq = Sequence(request, now_s, prefill_target=request.prompt_tokens + generated)
        seq.generated = generated
        return seq

    def enter(self, seq: Sequence) -> None:
        self._sequences[seq.request_id] = seq

    def advance(self, request_id: str, generated: int, first_token_s: float | None) -> None:
        """Its tokens so far, and when the first came out (its TBT is a mean from there)."""
        if (seq := self._sequences.get(request_id)) is not None:
            seq.generated = generated
            seq.first_token_s = first_token_s
            if first_token_s is not None:
                seq.prefilled = seq.prefill_target
            seq.kv_blocks = self._blocks(seq.prefilled + generated)

    def leave(self, request_id: str) -> bool:
        """Whether it was here."""
        return self._sequences.pop(request_id, None) is not None

    def on_step(self) -> dict[str, int]:
        """A step vLLM just reported: each admitted request's tokens in it (one per decode;
        prompts still prefilling share the rest of the step's budget, oldest first), and
        their estimated prefill progress moved on by as much."""
        work: dict[str, int] = {}
        prefilling = []
        for seq in self._sequences.values():
            if seq.prefilled < seq.prefill_target:
                prefilling.append(seq)
            else:
                work[seq.request_id] = 1
        budget = self.step_tokens - len(work)
        for seq in prefilling:
            if budget <= 0:
                break
            n = min(seq.prefill_target - 1 - seq.prefilled, budget)  # done only when its first token comes
            work[seq.request_id] = max(n, 1)
            seq.prefilled += max(n, 0)
            seq.kv_blocks = self._blocks(seq.prefilled)
            budget -= max(n, 1)
        return work

    def prefill_queue(self, now_s: float) -> list[Sequence]:
        """Prompts still to prefill, in the order vLLM prefills them: those it runs, then
        those at the gate; with `by_deadline`, earliest TTFT deadline first, the late behind."""
        queue = [s for s in (*self._sequences.values(), *self.waiting) if s.prefilled < s.prefill_target]
        if self.by_deadline:
            queue.sort(key=lambda s: due_key(s.request.ttft_due_s, now_s))
        return queue

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)
