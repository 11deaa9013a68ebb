"""Run one policy over a workload and report it (wall time measured around the loop, and the
provisioning before it apart)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sim.config import SimConfig
from sim.metrics import summarise
from sim.scenario import SIMULATORS, build
from sim.simulator import RawRun, Simulator
from sim.workload import Workload


def simulate(
    policy: str, w: Workload, config: SimConfig = SimConfig(),
    on_progress: Callable[[float, float], None] | None = None, wattwise_settings: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], RawRun]:
    """`wattwise_settings`: WattwiseConfig settings over the wattwise policy's (sim.scenario.build)."""
    started = time.perf_counter()
    pools, controller = build(policy, w, config, wattwise_settings=wattwise_settings)
    built = time.perf_counter()
    raw = SIMULATORS.get(policy, Simulator)(w, controller, pools, config, on_progress=on_progress).run()
    wall_s = time.perf_counter() - built
    # setup_s: provisioning before the run (the fewest replicas meeting the SLOs, best-static's search).
    summary = {"policy": policy, **summarise(raw, config), "wall_s": wall_s, "setup_s": built - started}
    if hasattr(controller, "hysteresis"):  # Chiron counts its scaling actions
        summary["hysteresis"] = controller.hysteresis
    return summary, raw
