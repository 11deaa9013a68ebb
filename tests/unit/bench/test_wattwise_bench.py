"""The composite bench's verdicts on each paper alone."""

from bench.wattwise import paper_headlines, strongest_baseline


def _row(policy: str, gpu_hours: float, j_per_token: float, slo: float, batch: float | None = None,
         deadlines: float = 1.0) -> dict:
    attainment = {"overall": slo} | ({} if batch is None else {"batch": batch})
    return {"policy": policy, "gpu_hours": gpu_hours, "j_per_token": j_per_token, "slo_attainment": attainment,
            "e2e_deadline_attainment": deadlines}


def test_headlines_read_each_paper_against_its_own_reference():
    rows = [_row("llumnix", 10.0, 4.0, 0.99, batch=1.0), _row("chiron", 3.0, 3.0, 0.96, batch=1.0),
            _row("static-max-clock", 8.0, 6.0, 1.0), _row("throttllem", 4.0, 4.0, 0.5, deadlines=0.98)]
    lines = paper_headlines(rows)
    assert lines == [
        "  met    Chiron alone: GPU-hours x Llumnix: 0.3 (target 0.4)",
        "  met    Chiron alone: SLO met: 0.96 (target 0.95)",
        "  MISSED throttLL'eM alone: tokens/J x static max clock: 1.5 (target 1.7)",
        "  MISSED throttLL'eM alone: E2E deadlines met: 0.98 (target 0.99)",
    ]


def test_chiron_has_no_headline_without_batch_work():
    rows = [_row("llumnix", 10.0, 4.0, 0.99), _row("chiron", 3.0, 3.0, 0.96)]
    assert paper_headlines(rows) == []


def _run(policy: str, energy_j: float, worst: float) -> dict:
    return {"policy": policy, "energy_j": energy_j, "slo_attainment": {"overall": 1.0, "SS": 1.0, "LL": worst}}


def test_the_strongest_baseline_is_the_least_energy_meeting_every_class():
    rows = [_run("singlepool", 1.0, 1.0), _run("best-static", 5.0, 0.995), _run("serve-autoscaler", 3.0, 0.98),
            _run("sla-planner", 4.0, 0.991), _run("wattwise", 2.0, 0.99)]
    assert strongest_baseline(rows)["policy"] == "sla-planner"  # serve-autoscaler is cheaper but misses LL


def test_without_a_baseline_meeting_every_class_the_strongest_is_the_best_worst_class():
    rows = [_run("best-static", 5.0, 0.97), _run("serve-autoscaler", 3.0, 0.95), _run("wattwise", 2.0, 0.99)]
    assert strongest_baseline(rows)["policy"] == "best-static"
    assert strongest_baseline([_run("singlepool", 1.0, 1.0)]) is None
