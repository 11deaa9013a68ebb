"""A real engine's measured latencies become DynamoLLM's profile (energy.engine_fit)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autoscaling.dynamollm.policy import DynamoLLMConfig, DynamoLLMPolicy
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView
from energy.engine_fit import fit_engine_perf_model, fit_quality
from energy.hardware import GPUS, MODELS, ModelSpec
from energy.latency_points import LatencyPoint, load_latency_csv, save_latency_csv
from energy.perf_model import PerfModel, PhaseFit
from energy.profile import EnergyProfile
from wattwise.cli import main

LLAMA2_70B_CONFIG = {
    "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "intermediate_size": 28672, "vocab_size": 32000, "tie_word_embeddings": False, "torch_dtype": "float16",
    "max_position_embeddings": 4096,
}
# A small served model (SmolLM2-135M's shape).
SMALL_CONFIG = {
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
TRUE_FITS = {1: PhaseFit(4.0, 0.02, 1e-6, 6.0, 0.05, 2e-5), 2: PhaseFit(3.0, 0.011, 6e-7, 5.0, 0.03, 1e-5)}


def _model_dir(tmp_path: Path, config: dict, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def _measured(perf: PerfModel, output_tokens: int = 32) -> list[LatencyPoint]:
    """What `wattwise profile --vllm-model` would record from an engine that follows `perf`."""
    clock = perf.gpu.max_clock_mhz
    points = []
    for tp in perf.tensor_parallel_degrees:
        for context in (64, 256, 768):
            for batch in (1, 4, 16):
                ttft_s = perf.prefill_time_s(batch * context, batch * context**2, tp, clock)
                itl_s = perf.decode_time_s(batch, batch * (context + output_tokens / 2), tp, clock)
                points.append(LatencyPoint(batch, context, output_tokens, tp, ttft_s, itl_s, batch / itl_s, 0.0, 0.0))
    return points


def test_model_spec_from_a_hugging_face_config_matches_the_built_in_one(tmp_path: Path) -> None:
    spec = ModelSpec.from_hf_config(_model_dir(tmp_path, LLAMA2_70B_CONFIG, "Llama-2-70b-hf"))
    built_in = MODELS["llama2-70b"]
    assert spec.params_b == pytest.approx(68.98, abs=0.01)  # the published 69B
    assert spec.kv_bytes_per_token == built_in.kv_bytes_per_token
    assert spec.weight_bytes == pytest.approx(built_in.weight_bytes, rel=0.01)
    with pytest.raises(ValueError, match=r"config\.json"):
        ModelSpec.from_hf_config(tmp_path / "missing")


def test_fit_recovers_the_engine_that_produced_the_points() -> None:
    truth = PerfModel(GPUS["h100-80gb"], MODELS["llama2-70b"], TRUE_FITS)
    points = _measured(truth)
    fitted = fit_engine_perf_model(points, MODELS["llama2-70b"], GPUS["h100-80gb"])
    assert fitted.tensor_parallel_degrees == [1, 2]
    for q in fit_quality(fitted, points):
        assert q.points == 9 and q.prompt_mape_pct < 1 and q.token_mape_pct < 1
    # ...and predicts a shape it was not fitted on.
    assert fitted.decode_time_s(8, 8 * 500, 2, 1980) == pytest.approx(truth.decode_time_s(8, 8 * 500, 2, 1980),
                                                                      rel=0.02)
    with pytest.raises(ValueError, match=">= 3"):
        fit_engine_perf_model(points[:2], MODELS["llama2-70b"], GPUS["h100-80gb"])


def test_points_whose_prompts_span_several_engine_steps_are_left_out() -> None:
    """A batch whose prompts exceed the step budget is prefilled in chunks while its first
    requests decode: neither its mean TTFT nor its ITL is one step's time."""
    truth = PerfModel(GPUS["h100-80gb"], MODELS["llama2-70b"], {1: TRUE_FITS[1]})
    budget = 4 * 256
    chunked = [replace(p, ttft_s=p.ttft_s * 0.6, itl_s=p.itl_s * 1.5) if p.batch * p.context_tokens > budget else p
               for p in _measured(truth)]
    fitted = fit_engine_perf_model(chunked, MODELS["llama2-70b"], GPUS["h100-80gb"], step_tokens=budget)
    for tokens in (300, 3000):
        assert fitted.prefill_time_s(tokens, tokens**2, 1, 1980) == pytest.approx(
            truth.prefill_time_s(tokens, tokens**2, 1, 1980), rel=0.02)
    assert fitted.decode_time_s(16, 16 * 800, 1, 1980) == pytest.approx(truth.decode_time_s(16, 16 * 800, 1, 1980),
                                                                        rel=0.02)
    (quality,) = fit_quality(fitted, chunked, step_tokens=budget)
    assert quality.points == 6 and quality.prompt_mape_pct < 1 and quality.token_mape_pct < 1
    naive = fit_engine_perf_model(chunked, MODELS["llama2-70b"], GPUS["h100-80gb"])
    assert naive.prefill_time_s(3000, 3000**2, 1, 1980) < 0.9 * truth.prefill_time_s(3000, 3000**2, 1, 1980)
    with pytest.raises(ValueError, match="one step"):
        fit_engine_perf_model(chunked, MODELS["llama2-70b"], GPUS["h100-80gb"], step_tokens=64)


def test_prefill_can_be_fitted_on_batches_of_one_alone() -> None:
    """A batch's requests reach a running engine over more than one step, so its mean TTFT
    is not one prefill step: with prefill_batch_one only batch-1 points fit prefill."""
    truth = PerfModel(GPUS["h100-80gb"], MODELS["llama2-70b"], {1: TRUE_FITS[1]})
    staggered = [replace(p, ttft_s=p.ttft_s * 1.4) if p.batch > 1 else p for p in _measured(truth)]
    fitted = fit_engine_perf_model(staggered, MODELS["llama2-70b"], GPUS["h100-80gb"], prefill_batch_one=True)
    assert fitted.prefill_time_s(2000, 4 * 500**2, 1, 1980) == pytest.approx(
        truth.prefill_time_s(2000, 4 * 500**2, 1, 1980), rel=0.02)
    (quality,) = fit_quality(fitted, staggered, prefill_batch_one=True)
    assert quality.points == 9 and quality.prompt_mape_pct < 1 and quality.token_mape_pct < 1
    with pytest.raises(ValueError, match="batch 1"):
        fit_engine_perf_model([p for p in staggered if p.context_tokens != 64], MODELS["llama2-70b"],
                              GPUS["h100-80gb"], prefill_batch_one=True)


def test_cli_fits_latency_csvs_into_a_profile_dynamollm_plans_with(tmp_path: Path, capsys) -> None:
    model_dir = _model_dir(tmp_path, SMALL_CONFIG, "SmolLM2-135M-Instruct")
    spec = ModelSpec.from_hf_config(model_dir)
    points = _measured(PerfModel(GPUS["h100-80gb"], spec, TRUE_FITS))
    csvs = []
    for tp in (1, 2):
        save_latency_csv([p for p in points if p.tensor_parallel == tp], tmp_path / f"tp{tp}.csv")
        csvs.append(str(tmp_path / f"tp{tp}.csv"))
    assert load_latency_csv(csvs[1]) == [p for p in points if p.tensor_parallel == 2]
    out = tmp_path / "profile.json"
    assert main(["profile", "--fit-latency", ",".join(csvs), "--model-dir", str(model_dir), "--out", str(out)]) == 0
    assert "fit TP1: 9 points" in capsys.readouterr().out
    profile = EnergyProfile.load(out)
    assert profile.model == "SmolLM2-135M-Instruct" and profile.tensor_parallel_degrees == [1, 2]
    assert profile.weight_bytes == spec.weight_bytes
    # The faster fit (TP2) carries more of a class per instance than the slower one.
    assert profile.max_rate_per_s("MM", 2, 1980) > profile.max_rate_per_s("MM", 1, 1980) > 0

    # DynamoLLM plans with it for a model it has no built-in spec of.
    pools = {"pool-all": ["SS", "SM", "SL", "MS", "MM", "ML", "LS", "LM", "LL"]}
    policy = DynamoLLMPolicy(DynamoLLMConfig(pools=pools, model="SmolLM2-135M-Instruct", profile_path=str(out),
                                             warmup_s=0))
    stats = ReplicaStats(class_rates_per_s={"MM": 2.0}, tensor_parallel=2)
    view = ClusterView({"pool-all": DeploymentView("pool-all", 1, 1, 0, 8, (stats,))})
    plan = policy.observe(view, 0.0)
    assert plan.replicas["pool-all"] >= 1 and plan.tensor_parallel["pool-all"] in (1, 2)


def test_fit_latency_without_a_model_dir_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["profile", "--fit-latency", str(tmp_path / "x.csv"), "--out", str(tmp_path / "p.json")])
