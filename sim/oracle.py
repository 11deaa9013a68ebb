"""An energy floor for a workload: perfect knowledge, free reconfiguration.

Per window, the oracle knows the arrival rate and mean request shape and picks the
(TP, clock, instances) whose steady state (the CapacityModel's fluid model on the
same perf profile the replicas use) carries the window within the TBT target at the
least power; idle windows cost nothing. Start-ups, queueing and bursts inside a
window are free to it, so it is the floor that policies are judged against, not a
policy one can run (sim/held_capacity.py prices the start-ups and the bursts it leaves out).

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


def binned_loads(w: Workload, window_s: float, batch_span_s: float) -> list[Load | None]:
    """Each window's arrival rate and mean request shape, from the first window to the last
    loaded one (None where nothing arrives): interactive requests in the window they arrive
    in, each batch request spread evenly over the `batch_span_s` after its arrival."""
    bins = (w.arrival_s // window_s).astype(np.int64)
    spread = max(1, round(batch_span_s / window_s))
    columns = []
    for weight in (np.ones(len(w)), w.prompt_tokens, w.output_tokens):
        weight = np.asarray(weight, dtype=float)
        interactive = np.bincount(bins, weights=np.where(w.interactive, weight, 0.0))
        batch = np.bincount(bins, weights=np.where(w.interactive, 0.0, weight)) / spread
        paced = np.convolve(batch, np.ones(spread))
        column = np.zeros(max(len(interactive), np.flatnonzero(paced).max(initial=-1) + 1))
        column[:len(interactive)] += interactive
        column += paced[:len(column)]
        columns.append(column)
    requests, prompt_sum, output_sum = columns
    return [Load(n / window_s, p / n, o / n) if n > 0 else None
            for n, p, o in zip(requests, prompt_sum, output_sum, strict=True)]


def window_loads(w: Workload, window_s: float, batch_span_s: float) -> list[Load]:
    """The loaded windows' loads (binned_loads without the empty ones)."""
    return [load for load in binned_loads(w, window_s, batch_span_s) if load is not None]


@dataclass(frozen=True)
class Carrier:
    """One configuration that carries a window's load: its GPUs and their mean power."""

    gpus: int
    power_w: float


class CarrierSearch:
    """Every (TP, clock) configuration, at the fewest instances within the cluster that carry a
    load within the TBT target, on the perf profile the replicas use."""

    def __init__(self, config: SimConfig, tbt_s: float = 0.1, clock_stride: int = 8) -> None:
        self.cap = CapacityModel(default_perf_model(config.model, config.hardware, config.profile))
        gpu = self.cap.perf.gpu
        self.clocks = sorted(set(gpu.supported_clocks_mhz()[::clock_stride]) | {gpu.max_clock_mhz})
        self.cluster_gpus = config.cluster_gpus
        self.tbt_s = tbt_s

    def carriers(self, load: Load) -> list[Carrier]:
        out = []
        for tp in self.cap.perf.tensor_parallel_degrees:
            for clock in self.clocks:
                n = self.cap.instances_needed(tp, clock, load, self.tbt_s, limit=self.cluster_gpus // tp)
                if n is not None:
                    out.append(Carrier(n * tp, n * self.cap.operating(tp, clock, n, load, self.tbt_s).power_w))
        return out


def oracle_energy(
    w: Workload, config: SimConfig, window_s: float = 60.0, tbt_s: float = 0.1, clock_stride: int = 8,
    batch_span_s: float = default_service_classes()["batch"].slo.ttft_s,
) -> OracleResult:
    """The floor at the cheapest batch pace whose windows some configuration carries (the
    fewest uncarried windows if none)."""
    search = CarrierSearch(config, tbt_s, clock_stride)
    paces = [p for p in BATCH_PACES_S if window_s <= p <= batch_span_s] if not w.interactive.all() else []
    results = [_paced(w, search, window_s, pace) for pace in paces or [window_s]]
    return min(results, key=lambda r: (r.infeasible_windows, r.energy_j))


def _paced(w: Workload, search: CarrierSearch, window_s: float, batch_pace_s: float) -> OracleResult:
    energy = gpu_s = 0.0
    infeasible = 0
    for load in window_loads(w, window_s, batch_pace_s):
        carriers = search.carriers(load)
        if not carriers:
            infeasible += 1
            continue
        best = min(carriers, key=lambda c: c.power_w)
        energy += best.power_w * window_s
        gpu_s += best.gpus * window_s
    return OracleResult(energy, gpu_s / 3600.0, infeasible, batch_pace_s)
