"""The clock waiting prompts need for their TTFT (throttLL'eM's clock, extended to the queue)."""

import numpy as np

from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.prompt_arrivals import PromptArrivals
from autoscaling.throttllem.prompt_deadlines import PrefillWork, burst_ready_clock_mhz, prompt_deadline_clock_mhz
from autoscaling.throttllem.replica_policies import replica_policies
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from batching.step_budget import tbt_bounded_step_tokens
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

PERF = default_perf_model("llama2-70b", "h100-80gb")
CLOCKS = np.array(sorted(float(c) for c in PERF.gpu.supported_clocks_mhz()))
TP = 2


def _batcher() -> ContinuousBatcher:
    return ContinuousBatcher(PERF, BatcherConfig(tensor_parallel=TP, clock_mhz=CLOCKS[0], step_time_target_s=0.1))


def _prompt(i: int, prompt_tokens: int, ttft_s: float, service_class: str = "interactive",
            arrival_s: float = 0.0) -> Request:
    return Request(str(i), prompt_tokens, 50, arrival_s, SLO(ttft_s=ttft_s, tbt_s=0.1), service_class=service_class,
                   predicted_output_tokens=50, target_output_tokens=50)


def _burst(batcher: ContinuousBatcher, prompts: int, tokens: int, ttft_s: float) -> None:
    for i in range(prompts):
        batcher.add(_prompt(i, tokens, ttft_s), 0.0)


def _prefill_s(prompts: int, tokens: int, clock_mhz: float) -> float:
    """The queue's prefills one after another in the batcher's steps (at its lowest clock's
    token budget), each step paying the fixed part once: as the function costs them."""
    steps = -(-prompts * tokens // _batcher().step_tokens)
    fixed_s = PERF.prefill_time_s(0, 0.0, TP, clock_mhz)
    return prompts * (PERF.prefill_time_s(tokens, tokens * tokens, TP, clock_mhz) - fixed_s) + steps * fixed_s


def test_no_interactive_prompt_waiting_needs_no_clock() -> None:
    batcher = _batcher()
    assert prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0) is None
    batcher.add(_prompt(0, 3000, 2.0, service_class="batch"), 0.0)
    assert prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0) is None


def test_a_burst_gets_the_lowest_clock_at_which_the_last_prompt_meets_its_ttft() -> None:
    tokens, ttft_s = 3000, 10.0
    prompts = next(n for n in range(1, 200) if _prefill_s(n, tokens, CLOCKS[0]) > ttft_s)
    assert _prefill_s(prompts, tokens, CLOCKS[-1]) < ttft_s  # the top clock makes it
    batcher = _batcher()
    _burst(batcher, prompts, tokens, ttft_s)
    clock = prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0)
    assert clock is not None and CLOCKS[0] < clock
    assert _prefill_s(prompts, tokens, clock) <= ttft_s
    assert _prefill_s(prompts, tokens, CLOCKS[int(np.searchsorted(CLOCKS, clock)) - 1]) > ttft_s
    # One prompt alone fits at the lowest clock; a queue no clock clears runs flat out.
    alone = _batcher()
    alone.add(_prompt(0, tokens, ttft_s), 0.0)
    assert prompt_deadline_clock_mhz(alone, CLOCKS, 0.0) == CLOCKS[0]
    assert prompt_deadline_clock_mhz(batcher, CLOCKS, ttft_s) == CLOCKS[-1]  # their TTFT is already gone


def test_throttllem_raises_the_clock_for_a_queue_its_scoreboard_does_not_hold() -> None:
    """Nothing admitted yet, so throttLL'eM's projection has no opinion; the waiting burst
    still lifts the clock above the band's floor, and only up to the band's ceiling."""
    tokens, ttft_s = 3000, 10.0
    prompts = next(n for n in range(1, 200) if _prefill_s(n, tokens, CLOCKS[0]) > ttft_s)
    batcher = _batcher()
    batcher.admission, batcher.clock_policy = replica_policies(PERF, batcher.config)
    batcher.set_clock_band(CLOCKS[0], CLOCKS[-1])
    _burst(batcher, prompts, tokens, ttft_s)
    needed = prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0, ThrottllemConfig().tuning.ttft_headroom)
    assert needed is not None and needed > CLOCKS[0]
    assert batcher.clock_policy.choose_clock_mhz(batcher, 0.0) == needed
    batcher.plan_step(0.0)
    assert batcher.clock_mhz == needed
    capped = _batcher()
    capped.admission, capped.clock_policy = replica_policies(PERF, capped.config)
    capped.set_clock_band(CLOCKS[0], CLOCKS[1])
    _burst(capped, prompts, tokens, ttft_s)
    capped.plan_step(0.0)
    assert capped.clock_mhz == CLOCKS[1] < needed


def test_a_smaller_share_of_the_ttft_needs_a_higher_clock() -> None:
    tokens, ttft_s = 3000, 10.0
    prompts = next(n for n in range(1, 200) if _prefill_s(n, tokens, CLOCKS[0]) > 0.5 * ttft_s)
    batcher = _batcher()
    _burst(batcher, prompts, tokens, ttft_s)
    whole = prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0)
    half = prompt_deadline_clock_mhz(batcher, CLOCKS, 0.0, headroom=0.5)
    assert whole is not None and half is not None and whole < half
    assert _prefill_s(prompts, tokens, half) <= 0.5 * ttft_s


def test_running_decodes_interleaved_with_the_prefills_raise_the_clock() -> None:
    """Each chunk's step also decodes the running batch: the same queue behind 64 decoding
    sequences needs a higher clock than on an idle replica."""
    tokens, ttft_s = 3000, 10.0
    prompts = next(n for n in range(1, 200) if _prefill_s(n, tokens, CLOCKS[0]) > ttft_s)
    idle, busy = _batcher(), _batcher()
    for i in range(64):
        busy.add(_prompt(1000 + i, 200, 10.0), 0.0)
    t = 0.0
    while any(s.prefilled < s.prefill_target for s in busy.running) or busy.waiting:
        step = busy.plan_step(t)
        assert step is not None
        busy.finish_step(step)
        t = step.end_s
    assert len(busy.running) == 64
    _burst(idle, prompts, tokens, ttft_s + t)
    _burst(busy, prompts, tokens, ttft_s + t)
    alone = prompt_deadline_clock_mhz(idle, CLOCKS, t)
    behind = prompt_deadline_clock_mhz(busy, CLOCKS, t)
    assert alone is not None and behind is not None and CLOCKS[0] < alone < behind


def test_a_prompt_prefilling_in_chunks_still_counts_once_nothing_waits() -> None:
    batcher = _batcher()
    top_clock_step_tokens = tbt_bounded_step_tokens(PERF, TP, 0.1, 8192)  # twice the lowest clock's
    batcher.add(_prompt(0, 6 * top_clock_step_tokens, 0.5), 0.0)
    step = batcher.plan_step(0.0)
    assert step is not None and not batcher.waiting
    batcher.finish_step(step)
    assert batcher.running[0].prefilled < batcher.running[0].prefill_target
    clock = prompt_deadline_clock_mhz(batcher, CLOCKS, step.end_s)
    assert clock is not None and clock > CLOCKS[0]


def _lagging_batcher() -> ContinuousBatcher:
    """A replica whose clock reaches its GPUs at the next forward (every 0.25 s) plus 0.1 s."""
    return ContinuousBatcher(PERF, BatcherConfig(tensor_parallel=TP, clock_mhz=CLOCKS[0], step_time_target_s=0.1,
                                                 clock_forward_period_s=0.25, clock_change_s=0.1))


def test_the_prefill_cost_follows_the_batchers_own_steps() -> None:
    """A prompt's prefill, chunked into steps that each pay the fixed part, costs what the
    batcher charges for it, on the default profile and on one whose steps cost more."""
    for perf in (PERF, default_perf_model("llama2-70b", "h100-80gb", "splitwise-llama2-70b-h100")):
        for tp, tokens, clock in ((2, 3000, CLOCKS[-1]), (4, 1000, 1005.0), (2, 900, CLOCKS[0])):
            batcher = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=tp, clock_mhz=clock,
                                                            step_time_target_s=0.1))
            batcher.add(_prompt(0, tokens, 1.0), 0.0)
            estimate_s = PrefillWork(batcher, np.array([float(tokens)]), np.array([float(tokens)])).done_s(clock)[0]
            t = 0.0
            while not batcher.running or batcher.running[0].prefilled < batcher.running[0].prefill_target:
                step = batcher.plan_step(t)
                assert step is not None
                t = batcher.finish_step(step).end_s
            assert 0.999 * t <= estimate_s <= 1.05 * t


def test_a_raise_that_lands_late_asks_for_more_clock() -> None:
    """The GPUs run the present clock until a raise lands: the same prompt needs a higher
    clock on a replica whose clock lags (4,000 tokens due in 0.35 s at TP2: 1,010 MHz at
    once, 1,085 with the lowest clock running 0.1 s first)."""
    tokens, ttft_s = 4000, 0.35
    at_once, lagging = _batcher(), _lagging_batcher()
    for batcher in (at_once, lagging):
        batcher.add(_prompt(0, tokens, ttft_s), 0.0)
    now = prompt_deadline_clock_mhz(at_once, CLOCKS, 0.0)
    late = prompt_deadline_clock_mhz(lagging, CLOCKS, 0.0)
    assert now is not None and late is not None and CLOCKS[0] < now < late
    work = PrefillWork(lagging, np.array([float(tokens)]), np.array([float(tokens)]))
    lag_s = lagging.clock_lands_s(0.0)
    assert work.finish_s(lag_s, CLOCKS[0], late)[0] <= ttft_s
    assert work.finish_s(lag_s, CLOCKS[0], CLOCKS[int(np.searchsorted(CLOCKS, late)) - 1])[0] > ttft_s


def ready_clock_mhz(batcher, clocks, bursts, headroom: float = 1.0) -> float:
    """The highest of the bursts' ready clocks, the lowest clock when there is none (as
    ThrottllemClock.ready_clock_mhz combines them)."""
    return max((burst_ready_clock_mhz(batcher, clocks, PrefillWork.of_burst(batcher, tokens), ttft_s, headroom)
                for tokens, ttft_s in bursts), default=float(clocks[0]))


def test_the_ready_clock_holds_what_a_late_raise_could_not_save() -> None:
    """With no lag any clock is ready (a raise lands at once); with one, the clock a burst
    needs is higher than one prompt's (1,400 MHz against 1,010), and each is the lowest from
    which a raise saves it. The burst adds a shorter prompt: a prefill at 800 MHz takes only
    1.7x its time at the top clock, so where the top clock saves two equal prompts at once,
    one of them alone needs no more than the lowest clock through a lag (so for 2,000-5,000
    tokens at 0.2-0.6 s TTFT)."""
    one, burst = [([4000], 0.35)], [([4000, 1000], 0.35)]
    assert ready_clock_mhz(_batcher(), CLOCKS, burst) == CLOCKS[0]
    lagging = _lagging_batcher()
    lag_s = lagging.clock_lands_s(0.0) + lagging.config.clock_forward_period_s
    single, several = ready_clock_mhz(lagging, CLOCKS, one), ready_clock_mhz(lagging, CLOCKS, burst)
    assert CLOCKS[0] < single < several < CLOCKS[-1]
    for (tokens, ttft_s), clock in ((one[0], single), (burst[0], several)):
        work = PrefillWork(lagging, np.array(tokens, dtype=float), np.array(tokens, dtype=float))
        below = CLOCKS[int(np.searchsorted(CLOCKS, clock)) - 1]
        assert work.finish_s(lag_s, clock, CLOCKS[-1])[-1] <= ttft_s < work.finish_s(lag_s, below, CLOCKS[-1])[-1]


def test_a_bursts_last_finish_in_scalars_is_the_array_ones_last() -> None:
    """The ready clock's search reads only a burst's last prompt, in scalars: the same number
    as the whole burst's array, whether the raise lands before the burst ends or after."""
    lagging = _lagging_batcher()
    work = PrefillWork(lagging, np.array([2500.0, 700.0, 4000.0]), np.array([2500.0, 700.0, 4000.0]))
    for lag_s in (0.0, 0.35, 100.0):
        for present, new in ((CLOCKS[0], CLOCKS[-1]), (CLOCKS[len(CLOCKS) // 2], CLOCKS[0])):
            assert work.last_finish_s(lag_s, present, new) == work.finish_s(lag_s, present, new)[-1]


def test_the_ready_clock_reads_each_ttft_targets_largest_burst_within_a_lag() -> None:
    """The prompts seen arriving, per TTFT target: the window of one clock lag holding the most
    prompt tokens is the burst the clock stays ready for (a single large prompt can outweigh
    several small ones close together)."""
    batcher = _lagging_batcher()
    config = ThrottllemConfig()
    _, clock = replica_policies(PERF, batcher.config, config)
    seen = [(0.00, 800, 0.35), (0.05, 900, 0.35), (0.50, 2000, 1.0), (0.60, 2500, 1.0), (1.00, 3000, 0.35),
            (2.00, 500, 0.35), (2.10, 600, 0.35), (2.20, 700, 0.35)]
    for i, (at, tokens, ttft_s) in enumerate(seen):
        batcher.add(_prompt(i, tokens, ttft_s, arrival_s=at), at)
    assert batcher.longest_clock_lag_s < 0.4  # 0.00 + 0.05 and 2.0-2.2 fall in one lag each, 1.0 alone
    clock.choose_clock_mhz(batcher, 2.3)  # syncs and observes the prompts
    clocks = clock.projector.synced_table.clocks_mhz
    headroom = config.tuning.ttft_headroom
    expected = ready_clock_mhz(batcher, clocks, [([3000], 0.35), ([2000, 2500], 1.0)], headroom)
    # Had it taken the three close prompts (1,800 tokens) for the 0.35 s target:
    closest = ready_clock_mhz(batcher, clocks, [([500, 600, 700], 0.35), ([2000, 2500], 1.0)], headroom)
    assert clock.ready_clock_mhz(batcher) == expected > closest


def test_prompts_queued_in_deadline_order_are_each_recorded_once() -> None:
    """A replica prefilling by TTFT deadline queues a later prompt due first ahead of an
    earlier one: the clock still records each prompt once, in arrival order (reading the
    queue's last one as the newest counted the one due first again at the next step)."""
    batcher = ContinuousBatcher(PERF, BatcherConfig(tensor_parallel=TP, clock_mhz=CLOCKS[0], step_time_target_s=0.1,
                                                    clock_forward_period_s=0.25, clock_change_s=0.1,
                                                    prefill_by_ttft_deadline=True))
    config = ThrottllemConfig()
    _, clock = replica_policies(PERF, batcher.config, config)
    batcher.add(_prompt(0, 2500, 1.0, arrival_s=0.00), 0.00)
    batcher.add(_prompt(1, 2500, 0.35, arrival_s=0.05), 0.05)
    assert [s.request_id for s in batcher.waiting] == ["1", "0"]  # the one due first waits first
    for now_s in (0.06, 0.07, 0.08):  # three steps with both still waiting
        clock.choose_clock_mhz(batcher, now_s)
    clocks = clock.projector.synced_table.clocks_mhz
    once = ready_clock_mhz(batcher, clocks, [([2500], 0.35), ([2500], 1.0)], config.tuning.ttft_headroom)
    twice = ready_clock_mhz(batcher, clocks, [([2500, 2500], 0.35), ([2500], 1.0)], config.tuning.ttft_headroom)
    assert clock.ready_clock_mhz(batcher) == once < twice


def test_a_burst_is_the_window_of_one_lag_holding_the_most_tokens_and_old_prompts_are_forgotten() -> None:
    arrivals = PromptArrivals()
    for at_s, tokens in ((0.0, 100), (0.1, 100), (0.5, 150), (2.0, 120), (2.05, 120), (9.0, 10)):
        arrivals.add(at_s, tokens)
    def burst(lag_s: float) -> list[int]:
        found = arrivals.largest_burst(lag_s)
        assert found is not None
        return list(found.tokens)

    assert burst(0.2) == [120, 120]  # 240 tokens, over 0.0-0.1's 200
    assert burst(0.0) == [150]  # one prompt alone: the largest
    assert burst(10.0) == [100, 100, 150, 120, 120, 10]
    assert arrivals.forget_before(2.0) and burst(10.0) == [120, 120, 10]
    assert not arrivals.forget_before(9.5) and arrivals.largest_burst(1.0) is None


def _largest_window(at_s: list[float], tokens: list[int], lag_s: float) -> list[int] | None:
    """The largest burst searched afresh over every window (what PromptArrivals keeps)."""
    if not at_s:
        return None
    held = np.concatenate(([0], np.cumsum(tokens)))
    first = np.searchsorted(np.array(at_s), np.array(at_s) - lag_s, side="left")
    totals = held[1:] - held[first]
    last = int(np.argmax(totals))
    return None if totals[last] <= 0 else tokens[first[last]:last + 1]


def test_the_kept_burst_is_the_one_a_fresh_search_finds_as_prompts_come_and_go() -> None:
    """Arrivals added in bursts, ties, prompts of no tokens, old ones forgotten and the lag
    changed now and then: the burst kept up to date matches a search over every window, and
    is the same object while it is the same prompts."""
    rng = np.random.default_rng(7)
    arrivals, at_s, tokens, now_s, lag_s = PromptArrivals(), [], [], 0.0, 0.35
    for step in range(3000):
        for _ in range(int(rng.poisson(0.8))):
            now_s += float(rng.choice([0.0, rng.exponential(0.2)]))
            t = int(rng.choice([0, 100, 100, int(rng.integers(1, 4000))]))
            arrivals.add(now_s, t)
            at_s.append(now_s)
            tokens.append(t)
        if rng.random() < 0.3:
            horizon_s = now_s - float(rng.uniform(0.5, 5.0))
            kept = [i for i, a in enumerate(at_s) if a >= horizon_s]
            at_s, tokens = [at_s[i] for i in kept], [tokens[i] for i in kept]
            assert arrivals.forget_before(horizon_s) == bool(at_s)
        if rng.random() < 0.02:
            lag_s = float(rng.choice([0.0, 0.1, 0.35, 1.0]))
        found, expected = arrivals.largest_burst(lag_s), _largest_window(at_s, tokens, lag_s)
        assert (None if found is None else list(found.tokens)) == expected, step
        if found is not None:
            assert arrivals.largest_burst(lag_s) is found


def test_a_choice_below_the_bands_floor_does_not_hold_off_the_next_lowering() -> None:
    """The search keeps finding clocks under the band's floor while one loose request runs:
    no change, so when the planner lowers the floor the clock follows at the next search,
    not `clock_lower_interval_s` after the last no-op."""
    config = ThrottllemConfig()
    batcher = _batcher()
    batcher.admission, batcher.clock_policy = replica_policies(PERF, batcher.config, config)
    floor = CLOCKS[len(CLOCKS) // 2]
    batcher.set_clock_band(floor, CLOCKS[-1])
    batcher.add(_prompt(0, 100, 60.0), 0.0)
    batcher.plan_step(0.0)

    def choose(now_s: float) -> float | None:
        clock = batcher.clock_policy.choose_clock_mhz(batcher, now_s)
        if clock is not None:
            batcher.set_clock(batcher.clamp_to_band(clock))
        return clock

    step_s = config.tuning.clock_refresh_s * 1.01
    now_s = 0.0
    while now_s < 3 * config.tuning.clock_lower_interval_s:  # searches that land on the floor: no change
        now_s += step_s
        choose(now_s)
        assert batcher.clock_mhz == floor
    batcher.set_clock_band(CLOCKS[0], CLOCKS[-1])
    lowered = choose(now_s + step_s)
    assert lowered is not None and lowered < floor
