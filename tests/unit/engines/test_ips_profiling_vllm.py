"""The vLLM iterations/s profiler's windowing (engines.ips_profiling_vllm) and M's scores by
run (ml_perf_model.group_fold_scores), on synthetic steps: no vLLM needed."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.throttllem.ips_profiling import IpsSamples
from autoscaling.throttllem.ml_perf_model import group_fold_scores
from engines.ips_profiling_vllm import window_rows
from engines.vllm_stats import VllmStep


def _run(batch: int, prefill_steps: int, decode_steps: int, step_s: float) -> list[VllmStep]:
    """`prefill_steps` steps completing prompts (the last with the batch's last prompt),
    then `decode_steps` steps of the full batch, its KV growing by one block a step."""
    steps = [VllmStep(i * step_s, batch, 1 if i < prefill_steps - 1 else 0, 10.0, 100, batch)
             for i in range(prefill_steps)]
    t0 = steps[-1].t_s
    steps += [VllmStep(t0 + (i + 1) * step_s, batch, 0, 10.0 + i, 0, batch) for i in range(decode_steps)]
    return [*steps, VllmStep(steps[-1].t_s + step_s, 0, 0, 0.0, 0, 0)]  # the batch has emptied


def test_windows_cover_decode_only_at_its_rate() -> None:
    rows = window_rows(_run(batch=8, prefill_steps=5, decode_steps=32, step_s=0.0625), tp=1, clock_mhz=3000,
                       sample_s=0.5)
    assert len(rows) == 4  # 2 s of decode in 0.5 s windows
    for tp, batch, _kv, clock, ips in rows:
        assert (tp, batch, clock) == (1, 8, 3000)
        assert ips == pytest.approx(16, rel=1e-6)  # prefill steps are not counted
    assert [r[2] for r in rows] == sorted(r[2] for r in rows)  # KV grows window to window


def test_short_run_gives_one_row_or_none() -> None:
    assert len(window_rows(_run(4, 2, 20, 0.01), 1, 0.0, sample_s=0.5)) == 1  # 0.2 s: one row over it all
    assert window_rows(_run(4, 2, 3, 0.01), 1, 0.0, sample_s=0.5) == []  # too few steps
    assert window_rows([], 1, 0.0, sample_s=0.5) == []


def test_fold_scores_hold_out_whole_runs() -> None:
    rng = np.random.default_rng(0)
    runs = np.repeat(np.arange(20), 5)
    batch = np.repeat(rng.integers(1, 64, 20), 5).astype(float)
    kv = batch * 10 + rng.uniform(0, 5, len(runs))
    samples = IpsSamples(np.ones(len(runs)), batch, kv, np.full(len(runs), 3000.0), 100 / (1 + batch / 16))
    scores = group_fold_scores(samples, runs, 0.9, folds=5)
    assert set(scores) == {"gbr", "linear"} and scores["gbr"].r2 > 0.5  # a smooth curve of batch
    # two runs: each trains alone and is tested on the other
    assert np.isfinite(group_fold_scores(samples, runs % 2, 0.1, folds=2)["gbr"].mae_ips)
