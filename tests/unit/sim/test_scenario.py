"""The operator's provisioning of static pools: the fluid model's peak count, then the fewest
replicas that meet the SLO target on the workload itself."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from core.classes import LengthClassConfig
from sim.config import SimConfig
from sim.scenario import build, layout, meets_slos, provision, shipped_app
from sim.workload import Workload, fit_context, load_trace, window


@pytest.fixture(scope="module")
def code_bursts() -> Workload:
    """The coding trace's first 5 minutes: on/off bursts of long prompts, whose TTFTs the
    fluid model (a steady rate per peak minute, sized on TBT) does not see."""
    return fit_context(window(load_trace("code"), 0, 300), 8192)


def test_a_pool_the_fluid_model_undersizes_gets_the_fewest_replicas_that_meet_the_slos(code_bursts):
    fluid = provision(code_bursts, layout("single"), SimConfig(provision_slo_target=0), LengthClassConfig())[0]
    config = SimConfig()
    met = provision(code_bursts, layout("single"), config, LengthClassConfig())[0]
    assert not meets_slos(code_bursts, fluid, config)
    assert met.replicas > fluid.replicas
    assert meets_slos(code_bursts, met, config)
    assert not meets_slos(code_bursts, replace(met, replicas=met.replicas - 1), config)


def test_every_baseline_starts_from_the_provisioned_pools_and_the_wattwise_policy_where_its_planner_puts_them(
        code_bursts):
    single, _ = build("singlepool", code_bursts, SimConfig())
    throttllem, _ = build("throttllem", code_bursts, SimConfig())
    assert single[0].replicas == throttllem[0].replicas > 1
    # The wattwise policy runs the app's pools, each started at the planner's shape for the
    # opening minute's load: on A100s, slower than the H100s the app's start suits, the long
    # pool starts at a larger TP, with more replicas.
    w = window(load_trace("conv"), 0.0, 600.0)
    h100, _ = build("wattwise", w, SimConfig())
    assert [s.name for s in h100] == [p.deployment_name for p in shipped_app().pools]
    a100_config = SimConfig(hardware="a100-80gb", profile="splitwise-llama2-70b-a100")
    a100, _ = build("wattwise", w, a100_config)
    long = {s.name: s for s in a100}["pool-long"]
    assert long.tensor_parallel > 2 and long.replicas > {s.name: s for s in h100}["pool-long"].replicas
    # Its prompts weighed as the planner weighs them: the same arrivals with prompts 2.5x the
    # longest the long band was profiled at start on more GPUs.
    longer = replace(w, prompt_tokens=np.where(w.prompt_tokens >= 1024, 7500, w.prompt_tokens))

    def long_gpus(setups) -> int:
        pool = {s.name: s for s in setups}["pool-long"]
        return pool.replicas * pool.tensor_parallel

    assert long_gpus(build("wattwise", longer, SimConfig())[0]) > long_gpus(h100)


def test_throttllem_alone_schedules_to_e2e_deadlines_as_the_paper_and_the_composite_holds_the_mean_tbt(code_bursts):
    def replica_config(name: str):
        setups, _ = build(name, code_bursts, SimConfig())
        return setups[0].batcher_policies.keywords["config"]

    assert not replica_config("throttllem").hold_mean_tbt
    assert replica_config("wattwise").hold_mean_tbt
