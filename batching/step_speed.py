"""How fast a replica's engine steps run against the perf model its planner believes.

The planner costs pool shapes on a perf/power profile; the engine a replica really runs may
be slower or faster (another serving stack or GPU, a profile fitted elsewhere: issue 19
found Splitwise's 2023 fit 1.8-3.3x slower per step than a current vLLM stack). A planner
that trusts a 2x optimistic profile holds half the replicas it needs. Each replica
therefore times every step against what the planner's model gives for the very same step
(the prefill tokens, decodes, context, TP and clock it ran) and reports the ratio of the
two over its recent steps; the planner plans the pool as the profile's engine running that
many times slower (autoscaling.dynamollm.shape_planner: `dilated`). Comparing like for
like steps keeps load out of the ratio: a busy replica's steps are longer in both columns.
"""

from __future__ import annotations

from energy.perf_model import PerfModel


class StepSpeed:
    """Measured over modelled step time, over roughly the last 1 / (1 - decay) steps;
    0.0 until the first step is timed (unmeasured: a new replica says nothing yet)."""

    def __init__(self, reference: PerfModel, decay: float = 0.995) -> None:
        self.reference = reference
        self._tps = frozenset(reference.tensor_parallel_degrees)
        self.decay = decay
        self._measured_s = 0.0
        self._modelled_s = 0.0

    def record(self, measured_s: float, prefill_tokens: int, prefill_sum_sq: float, decodes: int,
               decode_context_tokens: int, tp: int, clock_mhz: float) -> None:
        """One step that took `measured_s`, described as PerfModel.iteration takes it. A TP
        the planner's model lacks is not compared (it plans no such shape either)."""
        if tp not in self._tps:
            return
        self.record_times(measured_s, self.reference.iteration(prefill_tokens, prefill_sum_sq, decodes,
                                                               decode_context_tokens, tp, clock_mhz).time_s)

    def record_times(self, measured_s: float, modelled_s: float) -> None:
        """One step that took `measured_s` where the planner's model gives `modelled_s`."""
        if measured_s <= 0 or modelled_s <= 0:
            return
        self._measured_s = self.decay * self._measured_s + measured_s
        self._modelled_s = self.decay * self._modelled_s + modelled_s

    @property
    def ratio(self) -> float:
        return self._measured_s / self._modelled_s if self._modelled_s > 0 else 0.0
