"""An energy floor for a workload: perfect knowledge, free reconfiguration.

Per window, the oracle knows the arrival rate and mean request shape and picks the
(TP, clock, instances) whose steady state (the CapacityModel's fluid model on the
same perf profile the replicas use) carries the window within the TBT target at the
least power; idle windows cost nothing. Start-ups, queueing and bursts inside a
window are free to it, so it is the floor that policies are judged against, not a
policy one can run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energy.calibration import default_perf_model
from energy.capacity import CapacityModel, Load
from sim.config import SimConfig
from sim.workload import Workload


@dataclass(frozen=True)
class OracleResult:
    energy_j: float
    gpu_hours: float
    infeasible_windows: int  # windows no configuration within the cluster carries


def oracle_energy(
    w: Workload, config: SimConfig, window_s: float = 60.0, tbt_s: float = 0.1, clock_stride: int = 8
) -> OracleResult:
    perf = default_perf_model(config.model, config.hardware, config.profile)
    cap = CapacityModel(perf)
    clocks = perf.gpu.supported_clocks_mhz()
    clocks = sorted(set(clocks[::clock_stride]) | {perf.gpu.max_clock_mhz})
    bins = (w.arrival_s // window_s).astype(np.int64)
    energy = gpu_s = 0.0
    infeasible = 0
    for b in np.unique(bins):
        mask = bins == b
        load = Load(mask.sum() / window_s, float(w.prompt_tokens[mask].mean()), float(w.output_tokens[mask].mean()))
        best: tuple[float, int] | None = None
        for tp in perf.tensor_parallel_degrees:
            for clock in clocks:
                n = cap.instances_needed(tp, clock, load, tbt_s, limit=config.cluster_gpus // tp)
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
    return OracleResult(energy, gpu_s / 3600.0, infeasible)
