"""A vLLM replica's steps timed against the planner's perf model (batching.step_speed).

vLLM reports each step after it ran (engines.vllm_stats.VllmStep): when its outputs reached
the frontend, the prompts it finished prefilling, the tokens it generated, the KV blocks in
use. A step's duration is the gap since the previous step while the engine stayed busy (an
idle engine's gap measures idleness, not speed); it is compared with what the model gives
for the same work: those prompt tokens, one decode per generated token over the KV held as
context, at the replica's TP and clock. Prompt tokens are counted when a prefill completes,
not chunk by chunk, so single steps are off where a long prompt is chunked; the decayed sums
over many steps are not.
"""

from __future__ import annotations

from collections.abc import Callable

from batching.step_speed import StepSpeed
from energy.perf_model import IterationCost, PerfModel
from engines.vllm_stats import VllmStep


class VllmStepSpeed:
    """Feeds StepSpeed from vLLM's per-step reports (`observe` is a step observer)."""

    def __init__(self, planned_perf: PerfModel, tensor_parallel: int, block_size: int,
                 clock_mhz: Callable[[], float]) -> None:
        self.speed = StepSpeed(planned_perf)
        self.tensor_parallel = tensor_parallel
        self.block_size = block_size
        self.clock_mhz = clock_mhz  # the clock the GPUs were set to (0: not set yet, the top one)
        self._top_mhz = planned_perf.gpu.max_clock_mhz
        self._tps = frozenset(planned_perf.tensor_parallel_degrees)  # the model's: no other TP is compared
        self._last: VllmStep | None = None

    def observe(self, step: VllmStep) -> IterationCost | None:
        """Time the step against the model where it followed a busy one; the model's cost of
        its work either way (its energy, beside the GPUs': engines.step_energy). None: the
        model has no fit for this TP (the planner plans no such shape either)."""
        last, self._last = self._last, step
        if self.tensor_parallel not in self._tps:
            return None
        modelled = self.speed.reference.iteration(
            step.prompt_tokens, float(step.prompt_tokens) ** 2, step.generated_tokens,
            round(step.kv_blocks_used * self.block_size), self.tensor_parallel, self.clock_mhz() or self._top_mhz)
        if last is not None and (last.running or last.waiting) and step.t_s > last.t_s:
            self.speed.record_times(step.t_s - last.t_s, modelled.time_s)
        return modelled

    @property
    def ratio(self) -> float:
        return self.speed.ratio
