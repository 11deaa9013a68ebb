from autoscaling.dynamollm.prompt_work import PromptWork, in_profiled_requests, prompt_work
from core.arrival_rates import ArrivalRates
from core.stats import ReplicaStats
from energy.profile import CONV_CLASS_SHAPES


def test_a_class_is_weighed_against_the_longest_prompt_its_input_band_was_profiled_at() -> None:
    # Conversation's predicted LL requests average ~1,900 prompt tokens against LL's profiled
    # 1,111: predictions mix a band's classes, so the band's longest (LS, 2,979) is the bound.
    rates = {"LL": 1.0, "LS": 2.0, "MM": 1.0, "SS": 4.0}
    tokens = {"LL": 1900.0, "LS": 2.0 * 7200, "MM": 1.0 * 985 * 1.3, "SS": 4.0 * 100}
    work = prompt_work(CONV_CLASS_SHAPES, rates, tokens, deadband=0.25)
    assert set(work) == {"LS", "MM"}
    assert abs(work["LS"] - 7200 / 2979) < 1e-9
    assert abs(work["MM"] - 1.3) < 1e-9
    # Within the deadband, or shorter: the profile's work.
    assert prompt_work(CONV_CLASS_SHAPES, {"LS": 1.0}, {"LS": 2979 * 1.2}, deadband=0.25) == {}
    assert prompt_work(CONV_CLASS_SHAPES, {"LS": 1.0}, {"LS": 500.0}, deadband=0.0) == {}
    # No arrivals or a class the profile lacks: nothing to weigh.
    assert prompt_work(CONV_CLASS_SHAPES, {"LS": 0.0, "XX": 1.0}, {"XX": 9e9}, deadband=0.0) == {}
    assert in_profiled_requests(rates, work) == {"LL": 1.0, "LS": 7200 / 2979 * 2.0, "MM": 1.3, "SS": 4.0}


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


def test_the_work_is_read_over_the_window_so_one_reports_few_long_prompts_do_not_move_it() -> None:
    work = PromptWork(CONV_CLASS_SHAPES, deadband=0.25, window_s=120.0)
    for t in range(0, 120, 10):  # steady at the profile's prompts
        assert work.observe(float(t), {"LS": 2.0}, {"LS": 2.0 * 2979}) == {}
    # One report of a few prompts twice as long: the window's mean stays within the deadband.
    assert work.observe(120.0, {"LS": 0.2}, {"LS": 0.2 * 6000}) == {}
    # Long prompts that persist: the window's mean crosses it, then follows it.
    for t in range(130, 260, 10):
        found = work.observe(float(t), {"LS": 2.0}, {"LS": 2.0 * 7200})
    assert abs(found["LS"] - 7200 / 2979) < 1e-9  # the older reports aged out
