from dataclasses import replace

import numpy as np

from autoscaling.dynamollm.prompt_work import TUNED_PROMPT_TOKENS, PromptWork, in_profiled_requests, prompt_work
from core.arrival_rates import ArrivalRates
from core.classes import LengthClassConfig
from core.stats import ReplicaStats
from sim.config import SimConfig
from sim.scenario import length_classes
from sim.simulator import predicted_lengths
from sim.workload import fit_context, load_trace


def test_the_reference_is_the_conversation_traces_mean_prompt_per_predicted_class() -> None:
    """What the planner's headrooms were tuned on: the classes as the simulator's predictor
    assigns them, not the true ones (predictions mix a band's classes: predicted LL averages
    1,770 prompt tokens against the true LL's 1,111)."""
    w = fit_context(load_trace("conv"), 8192)
    predicted = replace(w, output_tokens=predicted_lengths(w.output_tokens, SimConfig()))
    classes = length_classes(predicted, LengthClassConfig())
    derived = {str(c): int(w.prompt_tokens[classes == c].mean()) for c in np.unique(classes)}
    assert derived == TUNED_PROMPT_TOKENS


def test_a_class_is_weighed_by_its_mean_prompt_over_its_reference_beyond_the_deadband() -> None:
    rates = {"LL": 1.0, "LS": 2.0, "MM": 1.0, "SS": 4.0}
    tokens = {"LL": 1770 * 1.2, "LS": 2.0 * 7200, "MM": 1.0 * 581 * 1.5, "SS": 4.0 * 100}
    work = prompt_work(TUNED_PROMPT_TOKENS, rates, tokens, deadband=0.35)
    assert set(work) == {"LS", "MM"}  # LL within the deadband, SS shorter
    assert abs(work["LS"] - 7200 / 2530) < 1e-9
    assert abs(work["MM"] - 1.5) < 1e-9
    # Shorter prompts save prefill, not decode: never below the profile's work.
    assert prompt_work(TUNED_PROMPT_TOKENS, {"LS": 1.0}, {"LS": 500.0}, deadband=0.0) == {}
    # No arrivals or a class without a reference: nothing to weigh.
    assert prompt_work(TUNED_PROMPT_TOKENS, {"LS": 0.0, "XX": 1.0}, {"XX": 9e9}, deadband=0.0) == {}
    assert in_profiled_requests(rates, work) == {"LL": 1.0, "LS": 7200 / 2530 * 2.0, "MM": 1.5, "SS": 4.0}


def test_the_work_is_read_over_the_window_so_one_reports_few_long_prompts_do_not_move_it() -> None:
    work = PromptWork(TUNED_PROMPT_TOKENS, deadband=0.35, window_s=120.0)
    for t in range(0, 120, 10):  # steady at the reference
        assert work.observe(float(t), {"LS": 2.0}, {"LS": 2.0 * 2530}) == {}
    # One report of a few prompts three times as long: the window's mean stays within the deadband.
    assert work.observe(120.0, {"LS": 0.2}, {"LS": 0.2 * 7500}) == {}
    # Long prompts that persist: the window's mean crosses it, then follows it.
    for t in range(130, 260, 10):
        found = work.observe(float(t), {"LS": 2.0}, {"LS": 2.0 * 7200})
    assert abs(found["LS"] - 7200 / 2530) < 1e-9  # the older reports aged out


def test_replicas_report_each_classs_prompt_tokens_over_the_rate_window_through_serves_flat_metrics() -> None:
    arrivals = ArrivalRates(window_s=30.0)
    arrivals.add(0.0, "LS", prompt_tokens=6000)
    arrivals.add(10.0, "LS", prompt_tokens=3000)
    arrivals.add(20.0, "SS", batch=True, prompt_tokens=150)
    assert arrivals.prompt_tokens_per_s(25.0) == {"LS": 300.0, "SS": 5.0}
    assert arrivals.prompt_tokens_per_s(35.0) == {"LS": 100.0, "SS": 5.0}  # the first aged out
    stats = ReplicaStats(class_rates_per_s=arrivals.per_s(35.0),
                         class_prompt_tokens_per_s=arrivals.prompt_tokens_per_s(35.0))
    assert ReplicaStats.from_metrics(stats.to_metrics()).class_prompt_tokens_per_s == {"LS": 100.0, "SS": 5.0}
