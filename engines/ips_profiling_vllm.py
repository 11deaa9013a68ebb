"""Profile a real (vLLM) replica's iterations/s for throttLL'eM's performance model M.

The modelled engine's profiler (autoscaling.throttllem.ips_profiling) asked of vLLM: per run,
`batch` requests of one prompt and output length start at once (their lengths set how
much KV the batch holds); once the last prompt is prefilled, the engine's steps, as its
stat logger reports them (engines.vllm_stats.VllmStep), are cut into `sample_s` windows,
each one row (TP, mean batch, mean KV blocks, clock, iterations/s), the rows
autoscaling.throttllem.ml_perf_model.IpsModel trains on. Rows of one run are correlated
(neighbouring windows of the same batch), so every row carries its run's id and held-out
scores should hold out whole runs.

Clock: vLLM on CPU has no clock control, so every row carries one constant clock (the
CPU's maximum frequency, or 0 where unknown) and M learns no clock axis. On a GPU the same
loop would lock each run's clock first (energy.gpu_control.GpuControl.lock_clock at a
random supported clock, as the sim profiler draws one) and record it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import numpy as np

from autoscaling.throttllem.ips_profiling import IpsSamples
from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from engines.latency_profiling import prompt_of_tokens
from engines.vllm_stats import VllmStep

_ANY_SLO = SLO(ttft_s=3600, tbt_s=60)
BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class IpsProfile:
    """The samples and, per row, the id of the run (one batch of requests) it came from."""

    samples: IpsSamples
    runs: np.ndarray


def window_rows(steps: list[VllmStep], tp: int, clock_mhz: float, sample_s: float,
                min_steps: int = 8) -> list[tuple[float, ...]]:
    """Rows (tp, mean batch, mean KV blocks, clock, iterations/s) of one run's steps.

    Decode only, as M models the decode iterations admission control projects: windows
    start at the step that finished the last prefill and end before the batch empties.
    Each window is `sample_s` long; a run too short for one window gives one row over its
    whole decode phase if it has `min_steps` steps."""
    last_prefill = max((i for i, s in enumerate(steps) if s.prompt_tokens > 0 or s.waiting > 0), default=-1)
    decode = [s for s in steps[last_prefill + 1:] if s.running > 0]
    if last_prefill < 0 or not decode:
        return []
    rows = []
    start_s = steps[last_prefill].t_s
    window: list[VllmStep] = []
    for step in decode:
        window.append(step)
        elapsed = step.t_s - start_s
        if elapsed >= sample_s:
            rows.append(_row(window, elapsed, tp, clock_mhz))
            start_s, window = step.t_s, []
    if not rows and len(decode) >= min_steps and decode[-1].t_s > steps[last_prefill].t_s:
        rows.append(_row(decode, decode[-1].t_s - steps[last_prefill].t_s, tp, clock_mhz))
    return rows


def _row(window: list[VllmStep], elapsed_s: float, tp: int, clock_mhz: float) -> tuple[float, ...]:
    return (float(tp), float(np.mean([s.running for s in window])), float(np.mean([s.kv_blocks_used for s in window])),
            clock_mhz, len(window) / elapsed_s)


async def measure_run(engine, batch: int, prompt_tokens: int, output_tokens: int) -> list[VllmStep]:
    """The steps of `batch` requests of `prompt_tokens` (unique prefixes: no prefix-cache
    hits) and up to `output_tokens` each (greedy; EOS may end one earlier), sent at once."""
    prompts = [prompt_of_tokens(engine.count_tokens, prompt_tokens, f"{uuid.uuid4().hex[:8]}: ")
               for _ in range(batch)]
    steps: list[VllmStep] = []
    engine.tracker.step_observers.append(steps.append)
    try:
        await asyncio.gather(*(_drain(engine, prompt, output_tokens) for prompt in prompts))
    finally:
        engine.tracker.step_observers.remove(steps.append)
    return steps


async def _drain(engine, prompt: str, output_tokens: int) -> None:
    request = Request(f"ips-{uuid.uuid4().hex}", engine.count_tokens(prompt), output_tokens, time.time(), _ANY_SLO,
                      prompt_text=prompt, sampling=Sampling(temperature=0.0))
    async for _ in engine.generate(request):
        pass


def cpu_max_mhz() -> float:
    """The constant clock column on CPU: the cores' maximum frequency, 0 where unknown."""
    import psutil

    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError):
        return 0.0
    return float(freq.max or freq.current) if freq else 0.0


async def measure_ips(engine, batch_sizes: tuple[int, ...] = BATCH_SIZES, repeats: int = 3,
                      sample_s: float = 0.5, seed: int = 0, progress=None) -> IpsProfile:
    """Batch sweeps at random KV fills: per (batch, repeat) one run whose requests hold a
    random share (10-100%) of the model's context, output 96-320 tokens of it."""
    rng = np.random.default_rng(seed)
    max_len = int(engine.config.max_model_len or 1024)
    tp = engine.config.tensor_parallel
    clock = engine.stats().clock_mhz or cpu_max_mhz()  # a GPU engine reports the clock it is held at
    # The first request pays the warm-up.
    await _drain(engine, prompt_of_tokens(engine.count_tokens, 32, "warm-up: "), 8)
    rows: list[tuple[float, ...]] = []
    runs: list[int] = []
    run = 0
    for batch in batch_sizes:
        for _ in range(repeats):
            context = int(rng.uniform(0.1, 1.0) * (max_len - 16))
            output = min(int(rng.integers(96, 321)), context - 16)
            prompt = max(context - output, 16)
            started = time.perf_counter()
            got = window_rows(await measure_run(engine, batch, prompt, output), tp, clock, sample_s)
            rows += got
            runs += [run] * len(got)
            if progress is not None:
                progress(f"run {run}: batch {batch} prompt {prompt} output {output}: {len(got)} rows "
                         f"in {time.perf_counter() - started:.1f} s")
            run += 1
    a = np.array(rows, dtype=np.float64).reshape(-1, 5)
    return IpsProfile(IpsSamples(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]), np.array(runs))


def profile_ips_engine(engine_config: dict, batch_sizes: tuple[int, ...] = BATCH_SIZES, repeats: int = 3,
                       sample_s: float = 0.5, seed: int = 0, progress=None) -> IpsProfile:
    """Start the vLLM engine a pool config names, profile it, shut it down."""
    from engines.factory import make_engine

    async def run() -> IpsProfile:
        engine = make_engine(engine_config)
        try:
            return await measure_ips(engine, batch_sizes, repeats, sample_s, seed, progress)
        finally:
            await engine.shutdown()

    return asyncio.run(run())
