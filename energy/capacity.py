"""What one replica configuration (TP, clock) can carry, from the shared perf model.

A fluid (steady-state) model of continuous batching: an instance receiving `rate`
requests/s of mean prompt P and output L prefills each prompt once and keeps
b = rate * L * t(b) sequences decoding, where t(b) is the decode iteration time at
batch b (Little's law). Baselines use it to size pools and pick TP or clocks, the
simulator to provision for peak, and the oracle to find the energy floor; all of
them therefore agree with the latency the simulated replicas will actually see.
"""

from __future__ import annotations

from dataclasses import dataclass

from energy.perf_model import PerfModel


@dataclass(frozen=True)
class Load:
    """Arrival rate and mean request shape of some traffic."""

    rate_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float

    @property
    def mean_context_tokens(self) -> float:
        """Context of a decoding sequence, averaged over its output."""
        return self.mean_prompt_tokens + self.mean_output_tokens / 2


@dataclass(frozen=True)
class Operating:
    """Steady state of one instance under its share of a load."""

    feasible: bool
    batch: float  # sequences decoding concurrently
    tbt_s: float  # decode iteration time at that batch
    prefill_busy: float  # share of time spent prefilling
    decode_busy: float  # share of time spent decoding
    power_w: float  # mean power of the instance's GPUs


class CapacityModel:
    """Steady-state latency and power of n instances at (TP, clock) under a load."""

    def __init__(self, perf: PerfModel, max_utilisation: float = 0.85, kv_budget: float = 1.0) -> None:
        self.perf = perf
        # Share of an instance's time prefill may fill: prompt queues blow up near 1.
        self.max_utilisation = max_utilisation
        # Share of an instance's KV the steady batch may fill. 1.0 is the physical bound; a
        # planner keeping replicas whose admission reserves each request's projected peak
        # (throttLL'eM) plans below it, or prompts wait at the door for KV to free.
        self.kv_budget = kv_budget

    def decode_iteration_s(self, tp: int, clock_mhz: float, batch: float, context_tokens: float) -> float:
        """Decode step of `batch` sequences of `context_tokens` each (fractional batches allowed)."""
        return self.perf.decode_time_s(batch, batch * context_tokens, tp, clock_mhz)

    def prefill_s(self, tp: int, clock_mhz: float, prompt_tokens: float) -> float:
        return self.perf.prefill_time_s(int(prompt_tokens), prompt_tokens**2, tp, clock_mhz)

    def max_batch(self, tp: int, clock_mhz: float, context_tokens: float, tbt_s: float) -> int:
        """Largest decode batch whose iteration fits in `tbt_s` and whose KV fits in its usable
        share (>= 1)."""
        c = self.perf.decode_coefficients(tp, clock_mhz)
        per_seq_ms = c.per_seq_ms + c.per_ctx_ms * context_tokens
        budget_ms = tbt_s * 1000.0 - c.fixed_ms
        by_time = int(budget_ms / per_seq_ms) if budget_ms > 0 else 0
        by_kv = int(self.perf.kv_capacity_tokens(tp) * self.kv_budget / max(context_tokens, 1.0))
        return max(min(by_time, by_kv), 1)

    def operating(self, tp: int, clock_mhz: float, instances: int, load: Load, tbt_s: float) -> Operating:
        """Steady state of each of `instances` replicas sharing `load` evenly."""
        perf, gpu = self.perf, self.perf.gpu
        idle_w = perf.idle_power_w(tp)
        if load.rate_per_s <= 0:
            return Operating(True, 0.0, 0.0, 0.0, 0.0, idle_w)
        if instances <= 0:
            return Operating(False, 0.0, 0.0, 0.0, 0.0, 0.0)
        rate = load.rate_per_s / instances
        ctx = load.mean_context_tokens
        prefill_busy = rate * self.prefill_s(tp, clock_mhz, load.mean_prompt_tokens)
        free = 1.0 - prefill_busy
        c = perf.decode_coefficients(tp, clock_mhz)
        tokens_per_s = rate * load.mean_output_tokens / max(free, 1e-9)
        denom = 1.0 - tokens_per_s * (c.per_seq_ms + c.per_ctx_ms * ctx) / 1000.0
        if prefill_busy > self.max_utilisation or denom <= 0:
            return Operating(False, float("inf"), float("inf"), prefill_busy, 1.0, 0.0)
        batch = tokens_per_s * c.fixed_ms / 1000.0 / denom
        # Prefill steps interleave with decode steps, stretching the gap between tokens.
        step_batch = max(batch, 1.0)
        tbt = self.decode_iteration_s(tp, clock_mhz, step_batch, ctx) / free
        # A decoding instance iterates back to back; below one sequence it idles between.
        decode_busy = min(batch, 1.0) * free
        feasible = (
            tbt <= tbt_s
            and batch * ctx <= perf.kv_capacity_tokens(tp) * self.kv_budget
            and prefill_busy <= self.max_utilisation
        )
        # Decode power at the step's batch: a measured curve (ML.ENERGY) rises with load.
        decode_w = perf.decode_power_w(step_batch, step_batch * ctx, tp, clock_mhz)
        prompt = load.mean_prompt_tokens
        prefill_w = perf.prefill_power_w(prompt, prompt**2, tp, clock_mhz)
        power = idle_w + tp * (
            prefill_busy * (prefill_w - gpu.idle_w)
            + decode_busy * (decode_w - gpu.idle_w)
        )
        return Operating(feasible, batch, tbt, prefill_busy, decode_busy, power)

    def instances_needed(self, tp: int, clock_mhz: float, load: Load, tbt_s: float, limit: int = 4096) -> int | None:
        """Fewest instances that carry `load` within `tbt_s`; None if `limit` do not."""
        if load.rate_per_s <= 0:
            return 0
        lo, hi = 1, limit
        if not self.operating(tp, clock_mhz, hi, load, tbt_s).feasible:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.operating(tp, clock_mhz, mid, load, tbt_s).feasible:
                hi = mid
            else:
                lo = mid + 1
        return lo
