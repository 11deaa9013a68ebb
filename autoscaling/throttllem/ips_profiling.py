"""Profile a replica's iterations/s for throttLL'eM's performance model (throttLL'eM paper §IV-C1).

A request generator sweeps batch sizes through one replica's ContinuousBatcher in
virtual time: for each batch size it spawns that many requests whose lengths fill a
random share of the KV cache by their last iteration, at a clock drawn at random per
measurement (held for the whole measurement). Once every prompt is prefilled, a monitor
logs (TP, batch, KV blocks, clock, iterations/s) every `sample_s`: M models the decode
iterations admission control projects, so the prefill warm-up is not a sample. On a GPU the
same loop drives the real engine; here the modelled GPU stands in, so the learned model is
judged against the modelled engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.perf_model import PerfModel

_ANY_SLO = SLO(ttft_s=3600, tbt_s=60)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)


_FIELDS = ("tp", "batch", "kv_blocks", "clock_mhz", "ips")


@dataclass(frozen=True)
class IpsSamples:
    """One row per monitor sample; the feature order is the model's."""

    tp: np.ndarray
    batch: np.ndarray
    kv_blocks: np.ndarray
    clock_mhz: np.ndarray
    ips: np.ndarray

    def __len__(self) -> int:
        return len(self.ips)

    def features(self) -> np.ndarray:
        return np.column_stack([self.tp, self.batch, self.kv_blocks, self.clock_mhz]).astype(np.float64)

    def subset(self, rows: np.ndarray) -> IpsSamples:
        """The rows a boolean mask or index array picks (a train or test split)."""
        return IpsSamples(*(getattr(self, f)[rows] for f in _FIELDS))

    @staticmethod
    def concat(parts: list[IpsSamples]) -> IpsSamples:
        return IpsSamples(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


def measure(
    perf: PerfModel, tp: int, clock_mhz: float, batch: int, kv_fill: float, output_tokens: int,
    sample_s: float = 1.0,
) -> list[tuple[float, float, float, float, float]]:
    """Rows (tp, mean batch, mean KV blocks, clock, iterations/s) of one measurement."""
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=tp, clock_mhz=clock_mhz))
    max_ctx = perf.model.max_context_tokens
    ctx = int(min(kv_fill * batcher.kv_blocks_total * batcher.config.block_size / batch, max_ctx))
    output = max(min(output_tokens, ctx // 2), 2)
    prompt = max(ctx - output - batcher.config.block_size, 1)
    for i in range(batch):
        batcher.add(Request(str(i), prompt, output, 0.0, _ANY_SLO), 0.0)
    rows: list[tuple[float, float, float, float, float]] = []
    t = 0.0
    while batcher.waiting or any(s.in_prefill for s in batcher.running):  # warm-up: not sampled
        warm_up = batcher.plan_step(t)
        assert warm_up is not None  # prompts are waiting
        t = batcher.finish_step(warm_up).end_s
    window_start = t
    iters = 0
    batch_s = kv_s = 0.0  # time integrals over the window
    while batcher.has_work():
        step = batcher.plan_step(t)
        assert step is not None  # has_work()
        running, kv = len(batcher.running), batcher.kv_blocks_used
        batcher.finish_step(step)
        t = step.end_s
        iters += 1
        batch_s += running * step.time_s
        kv_s += kv * step.time_s
        elapsed = t - window_start
        if elapsed >= sample_s:
            rows.append((tp, batch_s / elapsed, kv_s / elapsed, clock_mhz, iters / elapsed))
            window_start, iters, batch_s, kv_s = t, 0, 0.0, 0.0
    return rows


def profile_ips(
    perf: PerfModel, repeats: int = 3, batch_sizes: tuple[int, ...] = BATCH_SIZES, sample_s: float = 1.0,
    seed: int = 0,
) -> IpsSamples:
    """Batch sweeps at random clocks and KV fills for every TP the model has a fit for."""
    rng = np.random.default_rng(seed)
    clocks = perf.gpu.supported_clocks_mhz()
    rows = []
    for tp in perf.tensor_parallel_degrees:
        for batch in batch_sizes:
            for _ in range(repeats):
                clock = float(clocks[rng.integers(len(clocks))])
                rows += measure(perf, tp, clock, batch, float(rng.uniform(0.05, 1.0)),
                                int(rng.integers(64, 512)), sample_s)
    a = np.array(rows, dtype=np.float64)
    return IpsSamples(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])
