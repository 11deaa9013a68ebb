"""Ray Serve's autoscaler and Dynamo's SLA planner in the simulator: a load step that each must
follow, at its own pace (Serve after its upscale delay, Dynamo on its adjustment interval)."""

from __future__ import annotations

import numpy as np
import pytest

from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.run import simulate
from sim.scenario import build, layout
from sim.workload import Workload, fit_context, load_trace, superpose, synthetic

STEP_S = 300.0


@pytest.fixture(scope="module")
def step() -> Workload:
    """Conversation-sized requests at 2 req/s for 10 min, plus 25 req/s from minute 5 on."""
    rng, conv = np.random.default_rng(3), load_trace("conv")
    calm = synthetic(2.0, 600.0, rng, lengths_from=conv)
    busy = synthetic(25.0, 600.0 - STEP_S, rng, lengths_from=conv)
    busy = Workload(busy.arrival_s + STEP_S, busy.prompt_tokens, busy.output_tokens, busy.interactive)
    return fit_context(superpose(calm, busy), 8192)


def _ready(raw, name: str) -> np.ndarray:
    return np.asarray(raw.series.ready[name])


def test_serve_autoscaler_follows_the_step_only_after_its_upscale_delay(step):
    summary, raw = simulate("serve-autoscaler", step)
    assert summary["completed"] == len(step)
    (name,) = raw.pool_names
    t, ready = np.asarray(raw.series.t_s), _ready(raw, name)
    assert (ready[t < STEP_S + 30] == ready[0]).all()  # Serve's 30 s upscale delay
    assert ready[-1] > ready[0]
    assert set(raw.series.clock_mhz[name]) == {float(default_perf_model("llama2-70b", "h100-80gb", None)
                                                     .gpu.max_clock_mhz)}


def test_sla_planner_sizes_each_pool_only_on_its_adjustment_interval():
    """Short prompts with long answers (the short pool, decode-bound): 1 req/s, then 10 from 2 min on."""
    rng = np.random.default_rng(4)
    shape = dict(prompt_lognormal=(5.0, 0.3), output_lognormal=(7.0, 0.3))
    calm, busy = synthetic(1.0, 420.0, rng, **shape), synthetic(10.0, 300.0, rng, **shape)
    busy = Workload(busy.arrival_s + 120.0, busy.prompt_tokens, busy.output_tokens, busy.interactive)
    w = fit_context(superpose(calm, busy), 8192)
    setups, _ = build("sla-planner", w, SimConfig())
    assert [s.name for s in setups] == list(layout("by_input"))
    summary, raw = simulate("sla-planner", w)
    assert summary["completed"] == len(w)
    t = np.asarray(raw.series.t_s)
    for name in raw.pool_names:  # nothing moves before the first adjustment at 180 s
        assert (_ready(raw, name)[t < 180] == _ready(raw, name)[0]).all()
    assert _ready(raw, "pool-short").max() > _ready(raw, "pool-short")[0]
