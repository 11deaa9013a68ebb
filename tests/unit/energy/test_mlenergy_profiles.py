"""Named perf/power profiles fitted on the ML.ENERGY Leaderboard, against rows kept out of the fit."""

import pytest

from energy.calibration import default_perf_model
from energy.hardware import GPUS
from energy.mlenergy_calibration import Holdout, holdout, holdouts, later_checkpoint
from energy.profile import CONV_CLASS_SHAPES, PROFILE_CLOCKS_MHZ, profile_clocks_mhz
from energy.profile_builder import build_profile
from energy.profiles import MLENERGY_SOURCES, PROFILE_NAMES, default_profile, perf_model_for
from energy.tp_scaling import fit_tp_scaling


@pytest.mark.parametrize("holdout_result", holdouts(MLENERGY_SOURCES), ids=lambda h: f"{h.profile}:{h.split}")
def test_held_out_itl_and_energy_per_token_within_15pct(holdout_result: Holdout) -> None:
    """Whole configurations (every other batch size; or the later checkpoint) kept out of the fit."""
    assert len(holdout_result.predictions) >= 5
    assert holdout_result.max_error_pct("itl_ms") < 15
    assert holdout_result.max_error_pct("j_per_token") < 15
    assert holdout_result.mape_pct("power_w") < 10


def test_every_profile_is_held_out_on_alternate_batch_sizes() -> None:
    assert {(h.profile, h.split) for h in holdouts(MLENERGY_SOURCES)} >= {
        (name, "every other batch") for name in MLENERGY_SOURCES}
    h = holdout("mlenergy-llama3-70b-h100", MLENERGY_SOURCES["mlenergy-llama3-70b-h100"], later_checkpoint)
    assert {p.row.model_id for p in h.predictions} == {"meta-llama/Llama-3.3-70B-Instruct"}


def test_rows_beyond_kv_capacity_are_not_fitted() -> None:
    assert max(r.max_num_seqs for r in MLENERGY_SOURCES["mlenergy-llama3-70b-b200"].rows()) == 1536


def test_current_stack_decodes_much_faster_than_splitwise() -> None:
    """Issue 19: a decode step at batch 64 and 1k context, TP4 H100: Splitwise ~54 ms, vLLM today ~17-22 ms."""
    current = perf_model_for("mlenergy-llama3-70b-h100").decode_time_s(64, 64 * 1000, 4, 1980)
    splitwise = perf_model_for("splitwise-llama2-70b-h100").decode_time_s(64, 64 * 1000, 4, 1980)
    assert current < 0.6 * splitwise
    assert 0.015 < current < 0.03


def test_unmeasured_tps_follow_the_measured_tp_law() -> None:
    """The leaderboard ran 70B on H100 at TP4 only. At TP2 and TP8 a decode step keeps TP4's
    overhead plus the all-reduce's growth per doubling, streams 1/tp of the weights and splits
    the per-sequence work tp ways; prefill moves by Splitwise's measured ratios."""
    current, splitwise = perf_model_for("mlenergy-llama3-70b-h100"), perf_model_for("splitwise-llama2-70b-h100")
    gpu = current.gpu
    assert current.tensor_parallel_degrees == [2, 4, 8]
    for tp, doublings in ((2, -1), (8, 1)):
        fit, four = current.fits[tp], current.fits[4]
        assert fit.d0 == pytest.approx(current.overhead_ms(4) + doublings * gpu.tp_comm_ms_per_doubling
                                       + current.weight_read_ms(tp))
        assert fit.d1 == pytest.approx(four.d1 * 4 / tp)
        assert fit.d2 == pytest.approx(four.d2 * 4 / tp)  # KV reads split over the GPUs
        for coef in ("p0", "p1", "p2"):
            assert getattr(fit, coef) / getattr(four, coef) == pytest.approx(
                getattr(splitwise.fits[tp], coef) / getattr(splitwise.fits[4], coef))

    def j_per_token(tp: int) -> float:  # all of the replica's GPUs
        step = current.iteration(0, 0, 64, 64 * 600, tp, 1980)
        return step.time_s * step.power_w / 64

    steps = {tp: current.decode_time_s(64, 64 * 600, tp, 1980) for tp in (2, 4, 8)}
    assert steps[2] > steps[4] > steps[8]
    # At one batch the leaderboard's dense pairs cost about the same per token at TP2 as at
    # TP1 (0.89-1.06x): the second GPU halves the step. Past TP4 the all-reduce and the floor
    # of the extra GPUs win (its MoE TP4/TP8 pairs: 1.19-1.33x; DynamoLLM: TP8 1.24-1.67x TP4).
    assert 0.8 < j_per_token(4) / j_per_token(2) < 1.1
    assert j_per_token(8) > j_per_token(4)
    # ML.ENERGY's dense TP1/TP2 pairs: TP2 takes 0.6-0.65x TP1's step; here TP8 0.6-0.8x TP4's.
    assert 0.6 < steps[8] / steps[4] < 0.8
    assert perf_model_for("mlenergy-llama3-70b-b200").tensor_parallel_degrees == [2]  # no H100 ratios for B200


def test_tp_law_is_fitted_on_the_leaderboards_pairs() -> None:
    """The GPU's per-doubling constants are what energy.tp_scaling fits on the pairs."""
    gpu = perf_model_for("mlenergy-llama3-70b-h100").gpu
    fitted = fit_tp_scaling(gpu)
    assert fitted.comm_ms_per_doubling == pytest.approx(gpu.tp_comm_ms_per_doubling, abs=0.01)
    assert fitted.power_ratio_per_doubling == pytest.approx(gpu.tp_power_ratio_per_doubling, abs=0.001)
    assert fitted.itl_mape_pct < 3


def test_current_stack_profiles_are_the_default_where_they_cover_the_pair() -> None:
    for model in ("llama2-70b", "llama3.1-70b"):
        assert default_perf_model(model, "h100-80gb") is perf_model_for("mlenergy-llama3-70b-h100", model)
    assert default_perf_model("llama3.1-8b", "h100-80gb") is perf_model_for("mlenergy-llama3.1-8b-h100")
    assert default_perf_model("llama3.1-70b", "b200-180gb") is perf_model_for("mlenergy-llama3-70b-b200")
    assert default_profile("llama2-70b", "a100-80gb") is None and default_profile("bloom-176b", "h100-80gb") is None
    assert default_perf_model("llama2-70b", "a100-80gb").decode_power is None  # Splitwise's fit


def test_splitwise_profile_keeps_its_fit() -> None:
    """Splitwise's fit, by name, keeps its constant decode power and its latency at max clock
    (the numbers of the fitted clock and power physics, energy.clock_fit)."""
    pm = perf_model_for("splitwise-llama2-70b-h100")
    assert pm.decode_power is None
    step = pm.iteration(2048, 2048**2, 16, 16000, 8, 1980)
    # To 1e-12, not bit for bit: the fit's least squares runs on the CPU's BLAS kernels, and
    # AVX2 and AVX-512 ones differ in the last bit.
    assert (step.time_s, step.power_w) == pytest.approx((0.17642063840945096, 5050.108555826326), rel=1e-12)
    step = pm.iteration(0, 0, 64, 64000, 4, 1400)
    assert (step.time_s, step.power_w) == pytest.approx((0.05277827672119195, 1765.958978661292), rel=1e-12)


@pytest.mark.parametrize("name", list(MLENERGY_SOURCES))
def test_decode_power_rises_with_batch_and_falls_with_clock(name: str) -> None:
    pm = perf_model_for(name)
    tp, max_clock = pm.tensor_parallel_degrees[0], pm.gpu.max_clock_mhz
    power = [pm.decode_power_w(b, b * 450, tp, max_clock) for b in (1, 8, 64, 256, 1024)]
    assert power == sorted(power)
    assert power[3] > 1.05 * power[1]  # measured 8 -> 256: +9% on B200, +30% on H100
    assert pm.decode_power_w(64, 64 * 450, tp, 1200) < pm.decode_power_w(64, 64 * 450, tp, max_clock)
    busy, light = (pm.iteration(0, 0, b, b * 450, tp, max_clock).power_w for b in (256, 8))
    assert busy > light


def test_profiles_are_selectable_by_name() -> None:
    assert set(MLENERGY_SOURCES) < set(PROFILE_NAMES)
    as_llama2 = default_perf_model("llama2-70b", "h100-80gb", "mlenergy-llama3-70b-h100")
    as_llama3 = perf_model_for("mlenergy-llama3-70b-h100")
    assert (as_llama2.model.name, as_llama3.model.name) == ("llama2-70b", "llama3.1-70b")
    # The measured TP is the same; the others stream each model's own weights.
    assert as_llama2.fits[4] == as_llama3.fits[4] and as_llama2.fits[8] != as_llama3.fits[8]
    with pytest.raises(ValueError, match="known"):
        perf_model_for("no-such-profile")
    with pytest.raises(ValueError, match="b200-180gb"):
        default_perf_model("llama3.1-70b", "h100-80gb", "mlenergy-llama3-70b-b200")
    with pytest.raises(ValueError, match="sizes"):
        perf_model_for("mlenergy-llama3.1-8b-h100", "llama3.1-70b")


def test_an_energy_profile_covers_every_tp_its_perf_model_has() -> None:
    """Llama-3.1-8B runs on one GPU: its energy profile is built at TP1 (not only at the 70B
    models' TP2-TP8), so the composite can plan on it."""
    from autoscaling.wattwise import WattwiseConfig, WattwisePolicy
    from energy.profile_builder import build_profile

    perf = default_perf_model("llama3.1-8b", "h100-80gb", "mlenergy-llama3.1-8b-h100")
    assert build_profile(perf).tensor_parallel_degrees == [1]
    policy = WattwisePolicy(WattwiseConfig(pools={"pool-all": ["SS", "MM", "LL"]}, model="llama3.1-8b",
                                           hardware="h100-80gb", profile="mlenergy-llama3.1-8b-h100"))
    assert policy.profile.tensor_parallel_degrees == [1]


def test_a_profile_holds_only_clocks_its_gpu_runs() -> None:
    """An A100 tops out at 1,410 MHz: a profile point at 1,980 would be 1,410 under another
    name, and a plan would name a clock the GPU cannot set. An H100 keeps DynamoLLM's grid."""
    a100 = build_profile(default_perf_model("llama2-70b", "a100-80gb", "splitwise-llama2-70b-a100"),
                         shapes={"MM": CONV_CLASS_SHAPES["MM"]})
    assert a100.clocks_mhz[-1] == GPUS["a100-80gb"].max_clock_mhz == 1410
    assert all(c <= 1410 for c in a100.clocks_mhz)
    assert profile_clocks_mhz(GPUS["h100-80gb"]) == PROFILE_CLOCKS_MHZ
