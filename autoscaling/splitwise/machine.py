"""Splitwise's machine-level schedulers (§IV-B) as hooks of the shared ContinuousBatcher.

Prompt machines need no hook: FCFS under a per-step token budget is the batcher's own
behaviour (BatcherConfig.max_batched_tokens = 2048). Token machines batch as far as
memory allows and queue near the limit; mixed machines let a prompt preempt a young
token phase (priority grows with age) at most a few times per request.
"""

from __future__ import annotations

import math

from autoscaling.splitwise.config import MachineConfig
from batching.continuous_batcher import ContinuousBatcher, RunningBatch, Sequence
from core.roles import Phase


class KvBudgetAdmission:
    """Admit while the sequence's KV fits within `budget` of the cache; else queue."""

    def __init__(self, budget: float) -> None:
        self.budget = budget

    def admit(self, seq: Sequence, batch: RunningBatch, now_s: float) -> bool:
        if not batch.running:
            return True  # an empty replica always takes work, or a long request would wait forever
        need = math.ceil((seq.context_tokens + 1) / batch.block_size)
        return batch.kv_blocks_used + need <= self.budget * batch.kv_blocks_total


class AgingPreemption:
    """A waiting prompt (no token yet) preempts the youngest token phase that is younger
    than `age_limit_s` and under its preemption cap; token phases never preempt."""

    def __init__(self, age_limit_s: float, max_preemptions: int) -> None:
        self.age_limit_s = age_limit_s
        self.max_preemptions = max_preemptions

    def victim(self, seq: Sequence, batcher: ContinuousBatcher, now_s: float) -> int | None:
        if seq.generated > 0:
            return None
        best, best_age = None, self.age_limit_s
        for index, running in enumerate(batcher.running):
            age = now_s - running.enqueued_s
            if running.generated > 0 and running.preemptions < self.max_preemptions and age < best_age:
                best, best_age = index, age
        return best


def machine_policies(config: MachineConfig) -> tuple[KvBudgetAdmission | None, AgingPreemption]:
    """The batcher hooks of a replica by its home phase, as the simulator wires them.

    Every replica may be lent to the mixed pool, so all get aging preemption (it acts only
    when a prompt waits behind token phases); token homes queue near KV full.
    A prompt home's FCFS token budget is BatcherConfig.max_batched_tokens, set by its owner.
    """
    s = config.scheduling
    preemption = AgingPreemption(s.preempt_age_limit_s, s.max_preemptions_per_request)
    admission = KvBudgetAdmission(s.token_kv_budget) if config.phase is Phase.TOKEN else None
    return admission, preemption
