"""throttLL'eM's admission checks on crafted batches, and the minimum-clock binary search."""

import itertools

import numpy as np

from autoscaling.throttllem.config import ThrottllemConfig, ThrottllemTuning
from autoscaling.throttllem.replica_policies import replica_policies
from autoscaling.throttllem.scoreboard import Projection
from autoscaling.throttllem.slo_checks import DeadlineLines, check, lowest_passing_clock
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.profiles import perf_model_for

LOOSE = SLO(ttft_s=3600, tbt_s=10)
SPLITWISE = "splitwise-llama2-70b-h100"


def replica(running: list[Request], generated: int = 5, hold_mean_tbt: bool = True, urgent_prompt_steps: float = 2.0,
            kv_budget: float = 0.8, **config):
    # The crafted margins are sized on Splitwise's fit: its KV reads cost ~7x the current
    # stack's, so one long prompt slows a batch by more than the margins' 0.1%.
    perf = perf_model_for(SPLITWISE)
    bc = BatcherConfig(tensor_parallel=8, **config)
    admission, clock = replica_policies(perf, bc, ThrottllemConfig(
        profile=SPLITWISE, hold_mean_tbt=hold_mean_tbt, kv_budget=kv_budget,
        tuning=ThrottllemTuning(urgent_prompt_steps=urgent_prompt_steps)))
    b = ContinuousBatcher(perf, bc, admission, clock)
    for r in running:  # already scheduled and decoding
        seq = b.add(r, 0.0)
        b.waiting.remove(seq)
        seq.prefilled, seq.generated = seq.prefill_target, generated
        b._grow(seq, r.prompt_tokens + generated + 1)
        b.running.append(seq)
    return b, admission, clock


def req(i: str, prompt: int, out: int, slo: SLO = LOOSE, arrival_s: float = 0.0) -> Request:
    return Request(i, prompt, out, arrival_s, slo, predicted_output_tokens=out, target_output_tokens=out)


def finish_s(admission, b, now_s):
    """Projected finish of every scoreboard entry at max clock."""
    p = admission.projector
    proj = p.project()
    iter_s = p.table.iteration_s(len(p.table.clocks_mhz) - 1, p.lookup(proj))
    return now_s + np.cumsum(iter_s)[proj.remaining - 1], iter_s


def test_kv_check_queues_what_would_overflow_the_cache():
    b, admission, _ = replica([req("a", 2000, 400)], kv_capacity_tokens=4000)
    big = b.add(req("b", 1500, 600), 1.0)
    assert not admission.admit(big, b, 1.0)
    assert admission.projector.scoreboard.ids == ["a"]  # rolled back
    small = req("c", 100, 50)
    b2, admission2, _ = replica([req("a", 2000, 400)], kv_capacity_tokens=4000)
    assert admission2.admit(b2.add(small, 1.0), b2, 1.0)


def test_a_prompt_refused_for_kv_runs_the_batch_ahead_of_it_at_max_clock_until_admitted():
    """The refused prompt waits for running requests to finish and free their KV; no
    prefill-time search sees that wait, so the replica runs flat out until it is admitted,
    then the clock search takes over again. A refused batch request changes nothing."""
    b, admission, clock = replica([req("a", 2000, 400)], kv_capacity_tokens=4000)
    clocks = b.perf.gpu.supported_clocks_mhz()
    b.set_clock_band(min(clocks), max(clocks))
    b.set_clock(min(clocks))
    b.add(req("b", 1500, 600, SLO(ttft_s=30.0, tbt_s=10)), 1.0)  # its prefill alone fits at any clock
    assert b.plan_step(1.0) is not None
    assert [s.request_id for s in b.waiting] == ["b"] and admission.projector.refused_prompt_id == "b"
    assert clock.choose_clock_mhz(b, 1.1) == max(clocks)
    b.abort("a")  # "a" is gone: its KV is free
    assert b.plan_step(2.0) is not None and not b.waiting
    assert admission.projector.refused_prompt_id is None
    assert clock.choose_clock_mhz(b, 2.1) != max(clocks)

    batch_job, batch_admission, batch_clock = replica([req("a", 2000, 400)], kv_capacity_tokens=4000)
    batch_job.set_clock_band(min(clocks), max(clocks))
    batch_job.set_clock(min(clocks))
    batch_job.add(Request("j", 1500, 600, 1.0, LOOSE, service_class="batch", predicted_output_tokens=600,
                          target_output_tokens=600), 1.0)
    batch_job.plan_step(1.0)
    assert batch_admission.projector.refused_prompt_id is None
    assert batch_clock.choose_clock_mhz(batch_job, 1.1) != max(clocks)


def test_interactive_requests_holding_most_of_the_kv_run_the_batch_at_max_clock_before_a_refusal():
    """Requests hold their KV as long as their steps take: once interactive requests hold
    over `kv_budget` of the cache the replica runs flat out, so blocks free before
    prompts are turned away. Below it (or with the share at 1), the clock search's low clock
    on the same batch; and batch requests' blocks do not count (an interactive prompt
    preempts them)."""
    def chosen_clock(share: float, service_class: str = "interactive") -> float | None:
        a = Request("a", 2000, 400, 0.0, LOOSE, service_class=service_class, predicted_output_tokens=400,
                    target_output_tokens=400)
        b, _, clock = replica([a], kv_capacity_tokens=4000, kv_budget=share)
        clocks = b.perf.gpu.supported_clocks_mhz()
        b.set_clock_band(min(clocks), max(clocks))
        b.set_clock(min(clocks) + 100)
        assert 0.4 < b.kv_blocks_used / b.kv_blocks_total < 0.8
        return clock.choose_clock_mhz(b, 1.0)

    top = max(perf_model_for(SPLITWISE).gpu.supported_clocks_mhz())
    searched = chosen_clock(0.8)
    assert searched is not None and searched < top
    assert chosen_clock(0.4) == top
    assert chosen_clock(1.0) == searched
    assert chosen_clock(0.4, service_class="batch") != top


def test_tbt_check_queues_when_the_mean_gap_would_exceed_the_target():
    b, admission, _ = replica([req("a", 3000, 200)])
    admission.projector.sync(b, 1.0)
    _, alone = finish_s(admission, b, 1.0)
    board = admission.projector.scoreboard
    board.insert_virtual("probe", admission.projector.now_iter, 6000, 200, 1e9, 0.0)
    _, both = finish_s(admission, b, 1.0)
    board.rollback()
    assert both.mean() > alone.mean()
    # A TBT target (after headroom) between the two means: "a" alone passes, with "b" it fails.
    target = (alone.mean() + both.mean()) / 2 / admission.projector.config.tuning.slo_headroom
    tight = SLO(ttft_s=3600, tbt_s=target)
    b, admission, _ = replica([req("a", 3000, 200, tight)])
    assert not admission.admit(b.add(req("b", 6000, 200, tight), 1.0), b, 1.0)
    assert admission.refused == 1


def test_e2e_check_protects_running_requests_and_admits_lost_ones_that_harm_no_one():
    b, admission, _ = replica([req("a", 500, 300)])
    admission.projector.sync(b, 1.0)
    alone, _ = finish_s(admission, b, 1.0)
    # "a" meets it only alone
    headroom = admission.projector.config.tuning.slo_headroom  # the projection stretches what is left by 1 / headroom
    deadline = SLO(ttft_s=3600, tbt_s=10, e2e_s=(1.0 + (float(alone[0]) - 1.0) / headroom) * 1.001)
    b, admission, _ = replica([req("a", 500, 300, deadline)])
    assert not admission.admit(b.add(req("b", 7000, 300), 1.0), b, 1.0)
    # A request already past its own deadline that slows no one down is scheduled, marked lost.
    b, admission, clock = replica([req("a", 500, 300)])
    late = SLO(ttft_s=0.1, tbt_s=10, e2e_s=0.5)
    assert admission.admit(b.add(req("c", 100, 20, late, arrival_s=0.0), 5.0), b, 5.0)
    assert admission.admitted_lost == 1 and admission.projector.scoreboard.lost.tolist() == [False, True]
    assert clock.target_clock_mhz(5.0) == b.perf.gpu.max_clock_mhz  # max clock while it runs


def test_a_prompt_that_cannot_wait_is_checked_against_the_running_requests_whole_targets():
    """Refused now, a prompt due within `urgent_prompt_steps` iterations misses its TTFT: it
    is admitted if the running requests keep their whole targets, though not the share of
    them the projection keeps for later arrivals; a prompt that can wait still waits."""
    b, admission, _ = replica([req("a", 500, 300)])
    p = admission.projector
    p.sync(b, 1.0)
    alone_s = float(finish_s(admission, b, 1.0)[0][0]) - 1.0  # "a"'s projected time left at max clock
    p.scoreboard.insert_virtual("probe", p.now_iter, 7000, 300, 1e9, 0.0)
    with_prompt_s = float(finish_s(admission, b, 1.0)[0][0]) - 1.0  # ... with the prompt in
    headroom = p.config.tuning.slo_headroom
    # "a"'s deadline: on time alone in the share, late in it with the prompt, on time whole.
    deadline_s = 1.0 + (alone_s + with_prompt_s) / 2 / headroom
    assert 1.0 + with_prompt_s < deadline_s

    def admits(prompt_ttft_s: float, urgent_prompt_steps: float = 2.0) -> tuple[bool, int]:
        a = req("a", 500, 300, SLO(ttft_s=3600, tbt_s=10, e2e_s=deadline_s))
        b, admission, _ = replica([a], urgent_prompt_steps=urgent_prompt_steps)
        prompt = req("b", 7000, 300, SLO(ttft_s=prompt_ttft_s, tbt_s=10), arrival_s=1.0)
        return admission.admit(b.add(prompt, 1.0), b, 1.0), admission.admitted_urgent

    assert admits(3600.0) == (False, 0)  # it can wait
    assert admits(0.001) == (True, 1)  # due before the next iteration ends
    assert admits(0.001, urgent_prompt_steps=0) == (False, 0)  # the share always


def test_binary_search_returns_the_minimum_passing_clock():
    batch = [req(str(i), 800, 300) for i in range(60)]
    b, admission, _ = replica(batch)
    p = admission.projector
    p.sync(b, 1.0)
    at = p.lookup(p.project())
    slowest, fastest = (p.table.iteration_s(i, at).mean() for i in (0, len(p.table.clocks_mhz) - 1))
    tbt = SLO(ttft_s=3600, tbt_s=(slowest + fastest) / 2 / p.config.tuning.slo_headroom)  # needs a middle clock
    b, admission, clock = replica([req(str(i), 800, 300, tbt) for i in range(60)])
    p = admission.projector
    p.sync(b, 1.0)
    proj = p.project()
    at = p.lookup(proj)
    board = p.scoreboard
    h = p.config.tuning.slo_headroom
    lines = p.deadline_lines(proj)
    passing = [check(p.table, i, at, proj, lines, 1.0, p.tbt_s, h).passes(board.lost)
               for i in range(len(p.table.clocks_mhz))]
    found = lowest_passing_clock(p.table, at, proj, lines, board.lost, 1.0, p.tbt_s, h)
    assert passing[found] and 0 < found < len(passing) - 1
    assert passing.index(True) == found
    assert clock.target_clock_mhz(1.0) == p.table.clocks_mhz[found]


def test_the_search_by_clock_levels_finds_the_clock_a_scan_of_every_clock_finds() -> None:
    """M's table repeats over runs of clocks (its trees split on few clock thresholds): every
    clock of a level reads the same times everywhere on the grid, and the next level's differ.
    The search tries level starts only, each check placed by the margins before it, and finds
    the lowest passing clock a scan of every clock finds, from any hint, for TBT targets that
    need the bottom, middle or top clocks."""
    b, admission, _ = replica([req(str(i), 800, 300) for i in range(60)])
    p = admission.projector
    p.sync(b, 1.0)
    table = p.table
    levels, n_clocks = table.clock_levels, len(table.clocks_mhz)
    by_clock = table.iter_s.reshape(n_clocks, -1)
    assert levels[0] == 0 and 1 < len(levels) <= n_clocks
    for start, end in zip(levels, [*levels[1:], n_clocks]):
        assert (by_clock[start:end] == by_clock[start]).all()
    assert all((by_clock[a] != by_clock[z]).any() for a, z in itertools.pairwise(levels))
    at = p.lookup(p.project())
    slowest, fastest = (table.iteration_s(i, at).mean() for i in (0, n_clocks - 1))
    found_clocks = set()
    for share in np.linspace(-0.2, 1.2, 15):
        tbt = SLO(ttft_s=3600, tbt_s=(fastest + share * (slowest - fastest)) / p.config.tuning.slo_headroom)
        b, admission, _ = replica([req(str(i), 800, 300, tbt) for i in range(60)])
        p = admission.projector
        p.sync(b, 1.0)
        proj, h = p.project(), p.config.tuning.slo_headroom
        at, lines, lost = p.lookup(proj), p.deadline_lines(proj), p.scoreboard.lost
        passing = [check(p.table, i, at, proj, lines, 1.0, p.tbt_s, h).passes(lost) for i in range(n_clocks)]
        scanned = passing.index(True) if any(passing) else n_clocks - 1
        for hint in (None, 0, 1, 17, 40, 41, n_clocks - 2, n_clocks - 1):
            assert lowest_passing_clock(p.table, at, proj, lines, lost, 1.0, p.tbt_s, h, hint) == scanned
        found_clocks.add(scanned)
    assert min(found_clocks) == 0 and max(found_clocks) == n_clocks - 1 and len(found_clocks) > 3


def test_a_per_token_deadline_must_hold_at_every_token_not_only_at_the_projected_end() -> None:
    # Ten slow iterations (1 s) while the batch is full, then fast ones (0.1 s) once it drains.
    elapsed = np.cumsum([1.0] * 10 + [0.1] * 90)

    def late(remaining, deadline_s, per_token_s):
        lines = DeadlineLines.build(np.array(remaining), np.array(deadline_s), np.array(per_token_s))
        return lines.late(elapsed, now_s=0.0).tolist()

    # Both deadlines are met at the projected end (token 100 ends at 19 s); growing 0.5 s per
    # token, the first would be 4.5 s late had the request ended at token 10 (10 s, due at
    # 25 - 0.5 * 90 = -20 s); an explicit E2E deadline (0 per token) binds at the end only.
    assert late([100, 100], [25.0, 25.0], [0.5, 0.0]) == [True, False]
    # 0.5 s per token from 60 s at token 100: due at 10.5 s at token 1, 15 s at token 10: met.
    assert late([100], [60.0], [0.5]) == [False]
    # The end itself still binds, with or without a per-token line; and a shorter entry is
    # read at its own end (token 10, 10 s: due at 12 s, met; at 9.5 s, late).
    assert late([100, 100], [18.0, 18.0], [0.0, 0.01]) == [True, True]
    assert late([10, 10, 100], [12.0, 9.5, 60.0], [0.5, 0.5, 0.5]) == [False, True, False]


class _ThreeClocks:
    """M at three clocks for a batch that drains after 10 iterations (the search reads only
    clocks_mhz and iteration_s)."""

    clocks_mhz = np.array([800.0, 1400.0, 1980.0])
    clock_levels = np.arange(3)

    def iteration_s(self, clock_index: int, at: object) -> np.ndarray:
        full, drained = [(1.0, 0.1), (0.8, 0.08), (0.6, 0.06)][clock_index]
        return np.array([full] * 10 + [drained] * 90)


def test_the_clock_search_keeps_requests_that_end_early_on_time() -> None:
    """A request projected to end at token 100 meets that end at every clock (19 s at the
    lowest), but, should it end at token 10 (most end sooner than projected: lengths are
    stretched by the predictor's error), only from the middle clock on: its deadline grows
    0.5 s per token from 9 s at token 10. The search picks the middle clock, the ends alone the
    lowest; and it agrees with the full verdict at every clock."""
    table = _ThreeClocks()
    projection = Projection(np.ones(100, dtype=np.int64), np.ones(100, dtype=np.int64), np.array([100]))
    deadline, none_lost = np.array([9.0 + 0.5 * 90]), np.zeros(1, dtype=bool)
    ends = DeadlineLines.at_ends(projection.remaining, deadline)
    every_token = DeadlineLines.build(projection.remaining, deadline, np.array([0.5]))
    assert lowest_passing_clock(table, None, projection, ends, none_lost, 0.0, np.inf) == 0
    assert lowest_passing_clock(table, None, projection, every_token, none_lost, 0.0, np.inf) == 1
    verdicts = [check(table, i, None, projection, every_token, 0.0, np.inf).passes(none_lost) for i in range(3)]
    assert verdicts == [False, True, True]


def test_the_searchs_margin_is_late_exactly_where_the_full_verdict_is() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, horizon = int(rng.integers(1, 30)), int(rng.integers(1, 400))
        remaining = rng.integers(1, horizon + 1, n)
        remaining[0] = horizon
        lines = DeadlineLines.build(remaining, rng.uniform(0, 20, n), rng.choice([0.0, 0.02, 0.05], n))
        elapsed = np.cumsum(rng.uniform(0.01, 0.06, horizon))
        ignore = rng.random(n) < 0.2
        late = bool((lines.late(elapsed, 0.5) & ~ignore).any())
        assert (lines.margin_s(elapsed, 0.5, ignore) >= 0) == late
        if not ignore.any():
            assert (lines.margin_s(elapsed, 0.5, None) >= 0) == late


def decoding_since(first_token_s: float | None, out: int, now_s: float, hold_mean_tbt: bool = True):
    """One request (TTFT target 30 s, TBT 0.1 s) five tokens in, its first out at `first_token_s`,
    synced at `now_s` on a replica free to pick any clock."""
    b, _, clock = replica([req("a", 500, out, SLO(ttft_s=30.0, tbt_s=0.1))], hold_mean_tbt=hold_mean_tbt)
    clocks = b.perf.gpu.supported_clocks_mhz()
    b.set_clock_band(min(clocks), max(clocks))
    b.running[0].first_token_s = first_token_s
    clock.projector.sync(b, now_s)
    return b, clock


def test_a_request_that_fell_behind_its_tbt_target_gets_the_clock_that_brings_its_mean_back() -> None:
    """The SLO's TBT is a mean over the tokens after the first, so a request that waited after
    its first token (a Splitwise hand-off, a long prefill beside it) must run the rest faster
    than the target. Its E2E deadline cannot see that: a first token well within its TTFT
    target left slack there that the mean TBT does not have."""
    def searched_clock(first_token_s: float | None, now_s: float, hold_mean_tbt: bool = True) -> float:
        _, clock = decoding_since(first_token_s, 40, now_s, hold_mean_tbt)
        return clock.target_clock_mhz(now_s)

    on_pace = searched_clock(first_token_s=0.2, now_s=0.2 + 4 * 0.1)  # 5 tokens out, 35 to go
    behind = searched_clock(first_token_s=0.2, now_s=0.2 + 4 * 0.1 + 1.5)  # the same, 1.5 s later
    e2e_only = searched_clock(first_token_s=None, now_s=0.2 + 4 * 0.1 + 1.5)
    assert behind > on_pace and behind > e2e_only
    # The paper's scheduling (throttLL'eM alone): E2E deadlines only.
    assert searched_clock(first_token_s=0.2, now_s=0.2 + 4 * 0.1 + 1.5, hold_mean_tbt=False) == e2e_only


def test_a_mean_tbt_no_clock_brings_back_is_given_up_not_the_request() -> None:
    """Two tokens left after a 5 s wait: no clock makes the mean TBT again, so the request keeps
    its E2E deadline instead of being marked lost, which would hold the replica at max clock."""
    b, clock = decoding_since(first_token_s=0.2, out=7, now_s=5.2)
    p = clock.projector
    assert not p.scoreboard.lost.any()
    assert p.scoreboard.deadline_s[0] == p.e2e_deadline_s(b.running[0], p.projected_tokens(b.running[0]))
    assert clock.target_clock_mhz(5.2) < b.perf.gpu.max_clock_mhz


def test_each_sync_reads_a_request_again_once_its_first_token_is_out_or_it_outlives_its_prediction() -> None:
    """The projector keeps a running request's scoreboard fields between syncs; they must
    still move when the request's first token comes out (the mean-TBT line) and when it
    outlives its predicted length (re-projected to max_tokens)."""
    r = Request("a", 500, 400, 0.0, SLO(ttft_s=30.0, tbt_s=0.1), predicted_output_tokens=20, target_output_tokens=400)
    b, _, clock = replica([r], generated=0)
    p, seq = clock.projector, b.running[0]
    seq.first_token_s = None
    p.sync(b, 1.0)
    e2e_line = p.scoreboard.deadline_s[0]
    projected = int(p.scoreboard.output_tokens[0])
    assert projected < r.max_tokens
    seq.first_token_s, seq.generated = 1.0, 1
    p.sync(b, 1.1)
    assert p.scoreboard.deadline_s[0] == 1.0 + 0.1 * (projected - 1) < e2e_line
    seq.generated = projected
    p.sync(b, 5.0)
    assert p.scoreboard.output_tokens[0] == r.max_tokens
    assert p.scoreboard.deadline_s[0] == p.deadline_s(seq, r.max_tokens)
