"""Ray Serve's autoscaler and Dynamo's SLA planner in the simulator: a load step that each must
follow, at its own pace (Serve after its upscale delay, Dynamo on its adjustment interval), and
the load test Serve's target is read from."""

from __future__ import annotations

import numpy as np
import pytest

import sim.load_test as load_testing
from autoscaling.registry import make_policy
from core.classes import LengthClassConfig
from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.load_test import load_test
from sim.run import simulate
from sim.scenario import SPECS, build, layout
from sim.simulator import PoolSetup, Simulator
from sim.workload import Workload, fit_context, load_trace, superpose, synthetic

STEP_S = 240.0


@pytest.fixture(scope="module")
def step() -> Workload:
    """Conversation-sized requests at 2 req/s for 8 min, plus 10 req/s from minute 4 on."""
    rng, conv = np.random.default_rng(3), load_trace("conv")
    calm = synthetic(2.0, 480.0, rng, lengths_from=conv)
    busy = synthetic(10.0, 480.0 - STEP_S, rng, lengths_from=conv)
    busy = Workload(busy.arrival_s + STEP_S, busy.prompt_tokens, busy.output_tokens, busy.interactive)
    return fit_context(superpose(calm, busy), 8192)


def _ready(raw, name: str) -> np.ndarray:
    return np.asarray(raw.series.ready[name])


def test_serve_autoscaler_follows_the_step_only_after_its_upscale_delay(step):
    clock = default_perf_model("llama2-70b", "h100-80gb", None).gpu.max_clock_mhz
    setup = PoolSetup("pool-all", tuple(LengthClassConfig.names()), 4, clock, 1)
    policy = make_policy("serve-autoscaler", target_ongoing_requests={"pool-all": 24.0}, clock_mhz={"pool-all": clock})
    raw = Simulator(step, policy, [setup], SimConfig()).run()
    assert raw.log.done.all()
    t, ready = np.asarray(raw.series.t_s), _ready(raw, "pool-all")
    assert (ready[t < STEP_S + 30] == 1).all()  # Serve's 30 s upscale delay
    assert ready[-1] > 1
    assert set(raw.series.clock_mhz["pool-all"]) == {float(clock)}


def test_the_operators_load_test_finds_a_lower_rate_under_a_tighter_ttft(step):
    tight = LengthClassConfig()
    loose = LengthClassConfig(ttft_s={"S": 2.0, "M": 2.0, "L": 2.0})
    clock = default_perf_model("llama2-70b", "h100-80gb", None).gpu.max_clock_mhz
    at_tight = load_test(step, 4, clock, SimConfig(), tight, duration_s=120.0, steps=3)
    at_loose = load_test(step, 4, clock, SimConfig(), loose, duration_s=120.0, steps=3)
    assert 0 < at_tight.rate_per_s < at_loose.rate_per_s
    assert 1.0 <= at_tight.ongoing_requests < at_loose.ongoing_requests


def test_sla_planner_sizes_each_pool_only_on_its_adjustment_interval():
    """Short prompts with long answers (decode-bound): 1 req/s, then 20 more from minute 2 on (one
    replica carries 10 more since the refit: its TP4 decodes faster than it did)."""
    rng = np.random.default_rng(4)
    shape = dict(prompt_lognormal=(5.0, 0.3), output_lognormal=(7.0, 0.3))
    calm, busy = synthetic(1.0, 420.0, rng, **shape), synthetic(20.0, 300.0, rng, **shape)
    busy = Workload(busy.arrival_s + 120.0, busy.prompt_tokens, busy.output_tokens, busy.interactive)
    w = fit_context(superpose(calm, busy), 8192)
    setups, _ = build("sla-planner", w, SimConfig())
    assert [s.name for s in setups] == list(layout(SPECS["sla-planner"].layout))
    summary, raw = simulate("sla-planner", w)
    assert summary["completed"] == len(w)
    t = np.asarray(raw.series.t_s)
    for name in raw.pool_names:  # nothing moves before the first adjustment at 180 s
        assert (_ready(raw, name)[t < 180] == _ready(raw, name)[0]).all()
    assert sum(_ready(raw, n).max() - _ready(raw, n)[0] for n in raw.pool_names) > 0


def test_the_load_test_looks_past_a_fluid_rate_that_is_far_too_low(step, monkeypatch):
    real = load_testing.busiest_operating
    monkeypatch.setattr(load_testing, "busiest_operating", lambda *a: (0.25, real(*a)[1]))
    clock = default_perf_model("llama2-70b", "h100-80gb", None).gpu.max_clock_mhz
    found = load_test(step, 4, clock, SimConfig(), duration_s=120.0, steps=3)
    assert found.rate_per_s > 2 * 0.25
