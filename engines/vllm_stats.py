"""What a vLLM replica reports, read from vLLM's own stat-logger callbacks.

vLLM calls `record(scheduler_stats, iteration_stats)` after every engine step; we keep
the latest scheduler counts (running, waiting, KV usage) and EWMAs of TTFT, ITL and
tokens/s from the iteration stats. vLLM marks these classes as unstable across
releases: this module is the only place that reads them (checked against 0.32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EWMA_ALPHA = 0.2


def _ewma(old: float, sample: float) -> float:
    return sample if old == 0 else old + EWMA_ALPHA * (sample - old)


@dataclass
class VllmStatsSnapshot:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_blocks_total: int = 1
    ttft_ewma_s: float = 0.0
    itl_ewma_s: float = 0.0
    tokens_per_s: float = 0.0
    iterations_per_s: float = 0.0
    preemptions: int = 0
    generated_tokens: int = 0
    processed_tokens: int = 0  # prompt + generated: the share key for energy
    # Where prompt tokens' KV came from: computed here, or loaded by the KV connector
    # (prompt/token split: a token replica that loaded its prompt's KV computes ~nothing).
    prompt_tokens_computed: int = 0
    prompt_tokens_kv_transfer: int = 0


@dataclass(frozen=True)
class VllmStep:
    """One engine step as the frontend saw it (a profiler's sample: engines.ips_profiling_vllm)."""

    t_s: float  # when the frontend received the step's outputs (time.time())
    running: int
    waiting: int
    kv_blocks_used: float
    prompt_tokens: int  # prompts whose prefill completed in this step (their lengths)
    generated_tokens: int


class VllmStatsTracker:
    """Accumulates vLLM's per-step callbacks; `logger_factory` plugs into AsyncLLM.
    `step_observers` are called with every step that carries both stats (profiling)."""

    def __init__(self) -> None:
        self.snapshot = VllmStatsSnapshot()
        self._last_iteration_s: float | None = None
        self.step_observers: list[Callable[[VllmStep], None]] = []

    def logger_factory(self, vllm_config: Any, engine_index: int = 0):
        from vllm.v1.metrics.loggers import StatLoggerBase

        tracker = self

        class _Logger(StatLoggerBase):
            def __init__(self) -> None:
                tracker.snapshot.kv_blocks_total = max(int(vllm_config.cache_config.num_gpu_blocks or 1), 1)

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
                tracker.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self) -> None:
                tracker.snapshot.kv_blocks_total = max(int(vllm_config.cache_config.num_gpu_blocks or 1), 1)

        return _Logger()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        snap = self.snapshot
        if scheduler_stats is not None:
            snap.running = scheduler_stats.num_running_reqs
            snap.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            snap.kv_usage = scheduler_stats.kv_cache_usage
        if iteration_stats is None:
            return
        for ttft in iteration_stats.time_to_first_tokens_iter:
            snap.ttft_ewma_s = _ewma(snap.ttft_ewma_s, ttft)
        for itl in iteration_stats.inter_token_latencies_iter:
            snap.itl_ewma_s = _ewma(snap.itl_ewma_s, itl)
        snap.preemptions += iteration_stats.num_preempted_reqs
        generated = iteration_stats.num_generation_tokens
        snap.generated_tokens += generated
        snap.processed_tokens += generated + iteration_stats.num_prompt_tokens
        snap.prompt_tokens_computed += iteration_stats.prompt_token_stats.computed
        snap.prompt_tokens_kv_transfer += iteration_stats.prompt_token_stats.external_kv_transfer
        now = iteration_stats.iteration_timestamp
        if self._last_iteration_s is not None and now > self._last_iteration_s:
            gap_s = now - self._last_iteration_s
            snap.tokens_per_s = _ewma(snap.tokens_per_s, generated / gap_s)
            snap.iterations_per_s = _ewma(snap.iterations_per_s, 1 / gap_s)
        # An idle engine runs no steps: the next gap would measure idleness, not speed.
        idle = scheduler_stats is not None and snap.running == 0 and snap.waiting == 0
        self._last_iteration_s = None if idle else now
        if self.step_observers and scheduler_stats is not None:
            step = VllmStep(now, snap.running, snap.waiting, snap.kv_usage * snap.kv_blocks_total,
                            iteration_stats.num_prompt_tokens, generated)
            for observe in self.step_observers:
                observe(step)
