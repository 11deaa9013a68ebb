"""The robustness bench's verdict per variant: the composite against the strongest baseline."""

from bench.robustness import VARIANTS, verdict


def _run(policy: str, energy_j: float, gpu_hours: float, **classes: float) -> dict:
    return {"policy": policy, "energy_j": energy_j, "gpu_hours": gpu_hours, "slo_attainment": classes}


def test_the_composite_is_read_against_the_cheapest_baseline_meeting_every_class() -> None:
    rows = [_run("best-static", 100.0, 10.0, SS=0.995, LL=1.0),
            _run("serve-autoscaler", 80.0, 8.0, SS=0.97, LL=1.0),  # cheaper, but misses a class
            _run("wattwise", 90.0, 6.0, SS=1.0, LL=0.999)]
    line = verdict("v", rows)
    assert "composite x best-static energy 0.90, GPU-hours 0.60" in line
    assert "serve-autoscaler SS 97.0%" in line


def test_a_variant_the_composite_cannot_run_is_reported_not_a_crash() -> None:
    rows = [_run("best-static", 100.0, 10.0, SS=1.0),
            {"variant": "v", "policy": "wattwise", "error": "the energy profile has no shape"}]
    assert verdict("v", rows) == "v: the composite cannot run; wattwise cannot run: the energy profile has no shape"


def test_the_variants_cover_other_gpus_models_and_loads() -> None:
    names = {v.name for v in VARIANTS}
    assert {"A100 (Splitwise's profile)", "B200", "BLOOM-176B (Splitwise's profile)", "Llama-3.1-8B"} <= names
    assert {v.model for v in VARIANTS} >= {"llama2-70b", "bloom-176b", "llama3.1-8b"}
