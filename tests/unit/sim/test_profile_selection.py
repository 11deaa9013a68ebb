"""Issue 19: a named perf/power profile is selectable wherever a model and GPU are, and
leaving it unset keeps Splitwise's fit (the default) bit for bit."""

import json

import pytest

from app.config import AppConfig, PoolConfig
from autoscaling.throttllem.config import ThrottllemConfig
from energy.calibration import default_perf_model
from energy.profiles import PROFILE_NAMES
from engines.sim_engine import SimEngine, SimEngineConfig
from sim.cli import main
from sim.config import SimConfig
from sim.run import simulate
from sim.scenario import build
from sim.workload import load_trace, window

MLENERGY_70B = "mlenergy-llama3-70b-h100"  # TP4 only


def _cli_j_per_token(tmp_path, *extra: str) -> float:
    out = tmp_path / f"run{len(extra)}.json"
    argv = ["--trace", "conv", "--duration-s", "120", "--policy", "scaleshard", "--no-oracle", "--json", str(out)]
    assert main([*argv, *extra]) == 0
    return json.loads(out.read_text())[0]["j_per_token"]


def test_cli_profile_changes_energy_per_token(tmp_path) -> None:
    default = _cli_j_per_token(tmp_path)
    mlenergy = _cli_j_per_token(tmp_path, "--profile", MLENERGY_70B)
    assert mlenergy != default
    assert mlenergy < default  # a current vLLM stack decodes 1.8-3.3x faster than Splitwise's


def test_unset_profile_is_splitwise_fit_bit_for_bit() -> None:
    w = window(load_trace("conv"), 0.0, 60.0)
    unset, _ = simulate("singlepool", w, SimConfig())
    named, _ = simulate("singlepool", w, SimConfig(profile="splitwise-llama2-70b-h100"))
    assert unset["energy_j"] == named["energy_j"]
    assert unset["p99_tbt_s"] == named["p99_tbt_s"]


def test_unknown_profile_names_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--profile", "no-such-profile"])
    err = capsys.readouterr().err
    assert all(name in err for name in PROFILE_NAMES)
    w = window(load_trace("conv"), 0.0, 10.0)
    with pytest.raises(ValueError, match=r"unknown perf profile 'no-such-profile'.*mlenergy-llama3-70b-h100"):
        simulate("singlepool", w, SimConfig(profile="no-such-profile"))


def test_profile_for_another_gpu_fails() -> None:
    w = window(load_trace("conv"), 0.0, 10.0)
    with pytest.raises(ValueError, match="is for h100-80gb, not a100-80gb"):
        simulate("singlepool", w, SimConfig(hardware="a100-80gb", profile=MLENERGY_70B))


def test_policies_that_pick_tps_start_on_the_profiles_tps() -> None:
    """The composite's pools start at TP4 (the app's TP2/TP8 are not measured) and its
    planner's energy profile, its throttLL'eM layer and M are built on the same profile."""
    w = window(load_trace("conv"), 0.0, 30.0)
    setups, policy = build("wattwise", w, SimConfig(profile=MLENERGY_70B))
    assert {s.tensor_parallel for s in setups} == {4}
    assert policy.config.profile == MLENERGY_70B
    assert policy.profile.tensor_parallel_degrees == [4]


def test_fixed_tp_policy_on_a_profile_without_its_tp_fails_clearly() -> None:
    w = window(load_trace("conv"), 0.0, 10.0)
    with pytest.raises(ValueError, match=f"runs TP8, but perf profile '{MLENERGY_70B}'.* has TP4 only"):
        build("singlepool", w, SimConfig(profile=MLENERGY_70B))


def test_sim_engine_runs_the_named_profile() -> None:
    engine = SimEngine(SimEngineConfig(profile=MLENERGY_70B, tensor_parallel=4))
    assert engine.batcher.perf is default_perf_model("llama2-70b", "h100-80gb", MLENERGY_70B)
    assert SimEngine(SimEngineConfig()).batcher.perf is default_perf_model("llama2-70b", "h100-80gb")


def test_serve_config_checks_the_engines_profile() -> None:
    """Unknown names fail at config load, not in a replica; throttLL'eM's M must be trained
    on the perf model its replica runs."""
    def app(engine: SimEngineConfig) -> AppConfig:
        return AppConfig(pools=[PoolConfig(name="all", classes=[c for s in "SML" for c in (s + "S", s + "M", s + "L")],
                                           engine=engine)])

    assert app(SimEngineConfig(profile=MLENERGY_70B, tensor_parallel=4)).pools[0].engine.profile == MLENERGY_70B
    with pytest.raises(ValueError, match=r"unknown perf profile 'nope'.*splitwise-llama2-70b-h100"):
        app(SimEngineConfig(profile="nope"))
    with pytest.raises(ValueError, match=r"throttllem\.profile"):
        app(SimEngineConfig(profile=MLENERGY_70B, tensor_parallel=4, throttllem=ThrottllemConfig()))
