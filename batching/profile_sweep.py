"""Measure a profile by sweeping an engine (DynamoLLM §IV-A, "generating LLM profiles").

Each (class, TP, clock, load) point runs Poisson arrivals of the class's request shape
through one replica's ContinuousBatcher in virtual time and records mean power, the
p90 TTFT and the p90 of per-request mean TBT. It is the `sim` engine's measurement:
the same loop a GPU sweep would run, with the modelled GPU in place of a real one.
"""

from __future__ import annotations

import numpy as np

from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.perf_model import PerfModel
from energy.profile import EnergyProfile, ProfilePoint

_ANY_SLO = SLO(ttft_s=3600, tbt_s=60)


def measure_point(
    perf: PerfModel, shape: tuple[int, int], tp: int, clock_mhz: int, rate_per_s: float,
    duration_s: float = 120.0, seed: int = 0,
) -> tuple[float, float, float]:
    """(mean power W, p90 TTFT s, p90 mean TBT s) of one replica under Poisson load."""
    rng = np.random.default_rng(seed)
    n = max(int(rate_per_s * duration_s), 1)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    prompt, output = shape
    batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=tp, clock_mhz=clock_mhz))
    ttft, tbt = [], []
    t, i = 0.0, 0
    batcher.stats(0.0)
    while i < n or batcher.has_work():
        while i < n and arrivals[i] <= t:
            batcher.add(Request(str(i), prompt, output, float(arrivals[i]), _ANY_SLO), float(arrivals[i]))
            i += 1
        step = batcher.plan_step(t)
        if step is None:
            t = float(arrivals[i])
            continue
        out = batcher.finish_step(step)
        t = out.end_s
        for seq in out.finished:
            assert seq.first_token_s is not None and seq.last_token_s is not None  # finished: it generated
            ttft.append(seq.first_token_s - seq.request.arrival_s)
            tbt.append((seq.last_token_s - seq.first_token_s) / max(seq.generated - 1, 1))
    power = batcher.stats(t).energy_j / t
    return power, float(np.percentile(ttft, 90)), float(np.percentile(tbt, 90))


def sweep(
    perf: PerfModel, shapes: dict[str, tuple[int, int]], tps: tuple[int, ...], clocks_mhz: tuple[int, ...],
    rates_per_s: dict[str, tuple[float, ...]], duration_s: float = 120.0,
) -> EnergyProfile:
    """Measure every (class, TP, clock, rate) point and assemble the profile."""
    points = [
        ProfilePoint(cls, tp, clock, rate, *measure_point(perf, shape, tp, clock, rate, duration_s))
        for cls, shape in shapes.items()
        for tp in tps if tp in perf.fits
        for clock in clocks_mhz
        for rate in rates_per_s[cls]
    ]
    return EnergyProfile(perf.model.name, perf.gpu.name, points)
