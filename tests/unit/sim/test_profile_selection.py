"""Issue 19: a named perf/power profile is selectable wherever a model and GPU are, and
leaving it unset runs the current-stack profile for the pair, bit for bit (Splitwise's fit
where none covers it)."""

import json

import pytest

from app.config import AppConfig, PoolConfig
from autoscaling.throttllem.config import ThrottllemConfig
from energy.calibration import default_perf_model
from energy.profiles import PROFILE_NAMES
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig
from sim.cli import main
from sim.config import SimConfig
from sim.run import simulate
from sim.scenario import build
from sim.workload import load_trace, window

MLENERGY_70B = "mlenergy-llama3-70b-h100"  # the default for 70B on H100
SPLITWISE_70B = "splitwise-llama2-70b-h100"
B200 = SimConfig(model="llama3.1-70b", hardware="b200-180gb")  # its profile has TP2 only


def _cli_j_per_token(tmp_path, *extra: str) -> float:
    out = tmp_path / f"run{len(extra)}.json"
    argv = ["--trace", "conv", "--duration-s", "120", "--policy", "scaleshard", "--no-oracle", "--json", str(out)]
    assert main([*argv, *extra]) == 0
    return json.loads(out.read_text())[0]["j_per_token"]


def test_cli_profile_changes_energy_per_token(tmp_path) -> None:
    default = _cli_j_per_token(tmp_path)
    splitwise = _cli_j_per_token(tmp_path, "--profile", SPLITWISE_70B)
    assert default < splitwise  # a current vLLM stack decodes 1.5-4x faster than Splitwise's


def test_unset_profile_is_the_pairs_default_bit_for_bit() -> None:
    w = window(load_trace("conv"), 0.0, 60.0)
    a100 = SimConfig(hardware="a100-80gb")
    for unset, named in ((SimConfig(), SimConfig(profile=MLENERGY_70B)),
                         (a100, a100.model_copy(update={"profile": "splitwise-llama2-70b-a100"}))):
        unset_run, _ = simulate("singlepool", w, unset)
        named_run, _ = simulate("singlepool", w, named)
        assert unset_run["energy_j"] == named_run["energy_j"]
        assert unset_run["p99_tbt_s"] == named_run["p99_tbt_s"]


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
    """On B200 the composite's pools start at TP2 (the app's TP4/TP8 are not measured there)
    and its planner's energy profile, its throttLL'eM layer and M are built on the same profile."""
    w = window(load_trace("conv"), 0.0, 30.0)
    setups, policy = build("wattwise", w, B200)
    assert {s.tensor_parallel for s in setups} == {2}
    assert policy.profile.tensor_parallel_degrees == [2]


def test_fixed_tp_policy_on_a_profile_without_its_tp_fails_clearly() -> None:
    w = window(load_trace("conv"), 0.0, 10.0)
    with pytest.raises(ValueError, match=r"runs TP8, but perf profile 'mlenergy-llama3-70b-b200'.* has TP2 only"):
        build("singlepool", w, B200)


def test_modelled_engine_runs_the_named_profile() -> None:
    engine = ModelledEngine(ModelledEngineConfig(profile=SPLITWISE_70B, tensor_parallel=4))
    assert engine.batcher.perf is default_perf_model("llama2-70b", "h100-80gb", SPLITWISE_70B)
    default = ModelledEngine(ModelledEngineConfig())
    assert default.batcher.perf is default_perf_model("llama2-70b", "h100-80gb", MLENERGY_70B)


def test_serve_config_checks_the_engines_profile() -> None:
    """Unknown names fail at config load, not in a replica; throttLL'eM's M must be trained
    on the perf model its replica runs."""
    def app(engine: ModelledEngineConfig) -> AppConfig:
        return AppConfig(pools=[PoolConfig(name="all", classes=[c for s in "SML" for c in (s + "S", s + "M", s + "L")],
                                           engine=engine)])

    assert app(ModelledEngineConfig(profile=MLENERGY_70B, tensor_parallel=4)).pools[0].engine.profile == MLENERGY_70B
    with pytest.raises(ValueError, match=r"unknown perf profile 'nope'.*splitwise-llama2-70b-h100"):
        app(ModelledEngineConfig(profile="nope"))
    with pytest.raises(ValueError, match=r"throttllem\.profile"):
        app(ModelledEngineConfig(profile=MLENERGY_70B, tensor_parallel=4, throttllem=ThrottllemConfig()))
