"""An operator's load test of one replica, as Ray Serve's autoscaling guide asks before setting
`target_ongoing_requests` ("Always load test your workloads ... set this number based on an
end-to-end latency objective", docs.ray.io serve/advanced-guides/advanced-autoscaling): the
highest steady (Poisson) arrival rate one replica serves meeting the SLO target in every
length class, at the workload's request sizes (not its arrival pattern), and the ongoing
requests (running and queued) the replica then holds, by Little's law.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaling.serve_autoscaler import busiest_operating
from core.classes import LengthClassConfig
from energy.calibration import default_perf_model
from energy.capacity import CapacityModel
from sim.config import SimConfig
from sim.metrics import attainment_by_class
from sim.scenario import held, mean_load, pool_slo
from sim.simulator import PoolSetup
from sim.workload import Workload, synthetic


@dataclass(frozen=True)
class LoadTest:
    rate_per_s: float  # the highest steady rate meeting the target in every class (0: none does)
    ongoing_requests: float  # requests on the replica at that rate, waiting or running


def load_test(w: Workload, tp: int, clock_mhz: float, config: SimConfig = SimConfig(),
              lengths: LengthClassConfig = LengthClassConfig(), duration_s: float = 600.0, steps: int = 7,
              seed: int = 0) -> LoadTest:
    """Bisect the arrival rate between 0 and twice the fluid model's busiest rate within the
    tightest TBT target (the top doubled when every step met), each step a `duration_s` run of
    one TP `tp` replica at `clock_mhz`."""
    cap = CapacityModel(default_perf_model(config.model, config.hardware, config.profile))
    everything = tuple(LengthClassConfig.names())
    fluid_rate, _ = busiest_operating(cap, tp, clock_mhz, mean_load(w, np.ones(len(w), dtype=bool)),
                                      pool_slo(everything, lengths).tbt_s)
    setup = PoolSetup("pool-all", everything, tp, clock_mhz, 1)

    def ongoing(rate: float) -> float | None:
        """Mean requests on the replica at `rate`, None if it misses the target in a class."""
        steady = synthetic(rate, duration_s, np.random.default_rng(seed), lengths_from=w)
        log = held(steady, setup, config, lengths).log
        if not len(steady) or min(attainment_by_class(log).values()) < config.provision_slo_target:
            return None
        return rate * float(np.nanmean(log.e2e_s))

    low, high, at_low = 0.0, 2 * fluid_rate, 1.0
    for _ in range(4):  # a model whose fluid rate is low by over 2x: widen while every step met
        capped = True
        for _ in range(steps):
            mid = (low + high) / 2
            found = ongoing(mid)
            if found is None:
                high, capped = mid, False
            else:
                low, at_low = mid, found
        if not capped:
            break
        high *= 2
    return LoadTest(low, max(at_low, 1.0))
