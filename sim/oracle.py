"""An energy floor for a workload: perfect knowledge, free reconfiguration.

Per window, the oracle knows the arrival rate and mean request shape and picks the
(TP, clock, instances) whose steady state (the CapacityModel's fluid model on the
same perf profile the replicas use) carries the window within the TBT target at the
least power; idle windows cost nothing. Start-ups, queueing and bursts inside a
window are free to it, so it is the floor that policies are judged against, not a
policy one can run.

Interactive requests load the window they arrive in. A batch request may start any time
within its class's TTFT target (an hour), so the oracle paces batch work: each request
spread evenly over some span after its arrival, the same span for all, the cheapest of a
few spans up to the target. A job landing at once would otherwise make its window one that
no configuration carries (such a window costs nothing, so a floor cannot count on it); an
hour's pace for all is no floor either, as it adds a sparse tail after the traffic ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.classes import default_service_classes
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load
from sim.config import SimConfig
from sim.workload import Workload

# The spans over which the oracle tries pacing batch work: one window up to an hour.
BATCH_PACES_S = (60.0, 300.0, 900.0, 1800.0, 3600.0)


@dataclass(frozen=True)
class OracleResult:
    energy_j: float
    gpu_hours: float
    infeasible_windows: int  # windows no configuration within the cluster carries
    batch_pace_s: float  # the span each batch request's work was spread over


def window_loads(w: Workload, window_s: float, batch_span_s: float) -> list[Load]:
    """Each loaded window's arrival rate and mean request shape: interactive requests in the
    window they arrive in, each batch request spread evenly over the `batch_span_s` after
    its arrival."""
    bins = (w.arrival_s // window_s).astype(np.int64)
    spread = max(1, round(batch_span_s / window_s))
    weight = np.where(w.interactive, 1.0, 1.0 / spread)
    copies = np.where(w.interactive, 1, spread)
    starts = np.cumsum(copies) - copies
    at = np.repeat(bins, copies) + np.arange(copies.sum()) - np.repeat(starts, copies)
    weight, prompt, output = (np.repeat(a, copies) for a in (weight, w.prompt_tokens, w.output_tokens))
    requests = np.bincount(at, weights=weight)
    prompt_sum = np.bincount(at, weights=weight * prompt)
    output_sum = np.bincount(at, weights=weight * output)
    return [Load(n / window_s, p / n, o / n) for n, p, o in zip(requests, prompt_sum, output_sum, strict=True)
            if n > 0]


def oracle_energy(
    w: Workload, config: SimConfig, window_s: float = 60.0, tbt_s: float = 0.1, clock_stride: int = 8,
    batch_span_s: float = default_service_classes()["batch"].slo.ttft_s,
) -> OracleResult:
    """The floor at the cheapest batch pace whose windows some configuration carries (the
    fewest uncarried windows if none)."""
    perf = default_perf_model(config.model, config.hardware, config.profile)
    cap = CapacityModel(perf)
    clocks = perf.gpu.supported_clocks_mhz()
    clocks = sorted(set(clocks[::clock_stride]) | {perf.gpu.max_clock_mhz})
    paces = [p for p in BATCH_PACES_S if window_s <= p <= batch_span_s] if not w.interactive.all() else []
    results = [_paced(w, cap, clocks, config.cluster_gpus, window_s, tbt_s, pace)
               for pace in paces or [window_s]]
    return min(results, key=lambda r: (r.infeasible_windows, r.energy_j))


def _paced(w: Workload, cap: CapacityModel, clocks: list[int], cluster_gpus: int, window_s: float, tbt_s: float,
           batch_pace_s: float) -> OracleResult:
    perf = cap.perf
    energy = gpu_s = 0.0
    infeasible = 0
    for load in window_loads(w, window_s, batch_pace_s):
        best: tuple[float, int] | None = None
        for tp in perf.tensor_parallel_degrees:
            for clock in clocks:
                n = cap.instances_needed(tp, clock, load, tbt_s, limit=cluster_gpus // tp)
                if n is None:
                    continue
                power = n * cap.operating(tp, clock, n, load, tbt_s).power_w
                if best is None or power < best[0]:
                    best = (power, n * tp)
        if best is None:
            infeasible += 1
            continue
        energy += best[0] * window_s
        gpu_s += best[1] * window_s
    return OracleResult(energy, gpu_s / 3600.0, infeasible, batch_pace_s)
