"""The shared continuous batcher: conservation, limits, KV and preemption, energy."""

from itertools import pairwise

from batching.continuous_batcher import BatcherConfig, ContinuousBatcher, Sequence, Step
from batching.deadline_order import deadline_insert_index, late_ahead, yields_to_waiting_head
from batching.step_budget import fit_chunks_to_step_time, step_time_s
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model

SLO_ = SLO(ttft_s=1, tbt_s=0.1)


def _req(i: int, prompt: int = 100, out: int = 20) -> Request:
    return Request(f"r{i}", prompt, out, 0.0, SLO_)


def _drain(b: ContinuousBatcher, t: float = 0.0) -> tuple[float, dict[str, int], int]:
    emitted: dict[str, int] = {}
    steps = 0
    while b.has_work():
        step = b.plan_step(t)
        out = b.finish_step(step)
        for seq in out.emitted:
            emitted[seq.request_id] = emitted.get(seq.request_id, 0) + 1
        t = out.end_s
        steps += 1
    return t, emitted, steps


def test_every_token_exactly_once() -> None:
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8))
    for i in range(30):
        b.add(_req(i, 50 + 10 * i, 5 + i), 0.0)
    _, emitted, _ = _drain(b)
    assert emitted == {f"r{i}": 5 + i for i in range(30)}
    assert b.kv_blocks_used == 0 and b.completed == 30


def test_batch_limit_bounds_the_running_batch() -> None:
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8, batch_limit=4))
    for i in range(10):
        b.add(_req(i), 0.0)
    step = b.plan_step(0.0)
    assert len(step.prefill_chunks) == 4 and len(b.waiting) == 6


def test_kv_pressure_preempts_and_still_completes() -> None:
    b = ContinuousBatcher(
        default_perf_model(), BatcherConfig(tensor_parallel=8, kv_capacity_tokens=16 * 40, block_size=16)
    )
    for i in range(6):
        b.add(_req(i, prompt=60, out=60), 0.0)
    _, emitted, _ = _drain(b)
    assert b.preemptions > 0
    assert all(n == 60 for n in emitted.values()) and len(emitted) == 6


def test_chunked_prefill_respects_token_budget() -> None:
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8, max_batched_tokens=512))
    b.add(_req(0, prompt=2000, out=2), 0.0)
    first = b.plan_step(0.0)
    assert sum(n for _, n in first.prefill_chunks) == 512
    b.finish_step(first)
    _, emitted, steps = _drain(b, first.end_s)
    # 3 more chunks (512, 512, 464: the last emits the first token), then 1 decode.
    assert emitted == {"r0": 1 + 1} and steps == 4


def test_abort_frees_kv_and_drops_tokens() -> None:
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8))
    b.add(_req(0), 0.0)
    b.add(_req(1), 0.0)
    step = b.plan_step(0.0)
    assert b.abort("r0")
    out = b.finish_step(step)
    assert [s.request_id for s in out.emitted] == ["r1"]
    assert not b.abort("r0")


def test_idle_time_costs_idle_power() -> None:
    pm = default_perf_model()
    b = ContinuousBatcher(pm, BatcherConfig(tensor_parallel=4))
    b.stats(0.0)
    assert b.stats(10.0).energy_j == pm.idle_power_w(4) * 10


def test_lower_clock_is_slower_and_costs_less_power() -> None:
    def run(clock: float) -> tuple[float, float]:
        b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8, clock_mhz=clock))
        for i in range(8):
            b.add(_req(i, 200, 50), 0.0)
        t, _, _ = _drain(b)
        return t, b.energy_j / t

    slow_t, slow_w = run(1000)
    fast_t, fast_w = run(1980)
    assert slow_t > fast_t and slow_w < fast_w


def _svc(i: int, service: str, prompt: int = 100, out: int = 50) -> Request:
    return Request(f"{service}{i}", prompt, out, 0.0, SLO_, service_class=service)


def test_interactive_preempts_batch_on_mixed_replicas_without_losing_tokens() -> None:
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8, batch_limit=2, interactive_first=True))
    b.add(_svc(0, "batch"), 0.0)
    b.add(_svc(1, "batch"), 0.0)
    t = b.finish_step(b.plan_step(0.0)).end_s
    t = b.finish_step(b.plan_step(t)).end_s  # both batch requests are decoding
    b.add(_svc(0, "interactive"), t)
    step = b.plan_step(t)
    assert [s.request_id for s, _ in step.prefill_chunks] == ["interactive0"]
    assert [s.request_id for s in step.decodes] == ["batch0"]  # the victim left the step it was planned in
    assert b.preemptions == 1 and [s.request_id for s in b.waiting] == ["batch1"]
    b.finish_step(step)
    _drain(b, step.end_s)
    assert b.completed == 3  # the preempted request resumed and finished; none was lost
    assert b.by_id == {} and b.kv_blocks_used == 0


def test_a_prompt_the_admission_chain_refuses_preempts_batch_work_on_mixed_replicas() -> None:
    """throttLL'eM's admission refuses an interactive prompt while batch work holds what it
    projects (here: room for two requests); interactive before batch (Chiron) then preempts
    batch requests until it admits, in the same step. The victim, planned to emit its last
    token in that step, leaves the step's work: it resumes later, and no token is lost or
    repeated. Without interactive_first the prompt waits for the batch to drain."""
    class RoomForTwo:
        def admit(self, seq, batcher, now_s):
            return len(batcher.running) < 2

    for interactive_first in (True, False):
        config = BatcherConfig(tensor_parallel=8, interactive_first=interactive_first)
        b = ContinuousBatcher(default_perf_model(), config, RoomForTwo())
        b.add(_svc(0, "batch", out=2), 0.0)
        b.add(_svc(1, "batch", out=2), 0.0)
        first = b.finish_step(b.plan_step(0.0))  # both prefilled, one token each
        b.add(_svc(0, "interactive"), first.end_s)
        step = b.plan_step(first.end_s)
        if interactive_first:
            assert [s.request_id for s, _ in step.prefill_chunks] == ["interactive0"]
            assert [s.request_id for s in step.decodes] == ["batch0"] and b.preemptions == 1
        else:
            assert step.prefill_chunks == [] and b.preemptions == 0
        second = b.finish_step(step)
        _, emitted, _ = _drain(b, second.end_s)
        for seq in first.emitted + second.emitted:
            emitted[seq.request_id] = emitted.get(seq.request_id, 0) + 1
        assert emitted == {"batch0": 2, "batch1": 2, "interactive0": 50}
        assert b.completed == 3 and b.by_id == {} and b.kv_blocks_used == 0


def test_a_preemption_policy_answers_the_kv_and_the_limit_not_an_admission_refusal() -> None:
    """Splitwise's token homes refuse prompts near a full KV (their admission) so as not to
    preempt their decodes: their preemption policy (aging) is not asked about a refusal."""
    class Refuse:
        def admit(self, seq, batcher, now_s):
            return not batcher.running

    class AnyVictim:
        asked = 0

        def victim(self, seq, batcher, now_s):
            self.asked += 1
            return 0 if self.asked == 1 else None

    preemption = AnyVictim()
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8), Refuse(), preemption=preemption)
    b.add(_req(0), 0.0)
    t = b.finish_step(b.plan_step(0.0)).end_s
    b.add(_req(1), t)
    step = b.plan_step(t)
    assert step.prefill_chunks == [] and preemption.asked == 0 and b.preemptions == 0


def test_interactive_jumps_the_batch_queue_only_when_enabled() -> None:
    for interactive_first, expected in ((True, ["interactive0", "batch0"]), (False, ["batch0", "interactive0"])):
        b = ContinuousBatcher(default_perf_model(), BatcherConfig(interactive_first=interactive_first))
        b.add(_svc(0, "batch"), 0.0)
        b.add(_svc(0, "interactive"), 0.0)
        assert [s.request_id for s in b.waiting] == expected


def test_admission_and_clock_hooks_are_consulted() -> None:
    class OnlyOne:
        def admit(self, seq, batcher, now_s):
            return len(batcher.running) < 1

    class Slow:
        def choose_clock_mhz(self, batcher, now_s):
            return 1000.0

        def lowest_clock_mhz(self, batcher):
            return 1000.0

    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8), OnlyOne(), Slow())
    for i in range(3):
        b.add(_req(i), 0.0)
    step = b.plan_step(0.0)
    assert len(step.prefill_chunks) == 1 and b.clock_mhz == 1000.0


def test_step_time_target_chunks_a_long_prompt_so_decoders_keep_their_tbt() -> None:
    """With a step time target, a 3,000-token prompt arriving beside a decoding request is
    prefilled in chunks, each step within the target, instead of one 0.2 s stall at TP2."""
    perf = default_perf_model()

    def longest_gap_s(config: BatcherConfig) -> tuple[float, int]:
        b = ContinuousBatcher(perf, config)
        b.add(_req(0, prompt=100, out=200), 0.0)
        t = b.finish_step(b.plan_step(0.0)).end_s
        b.add(_req(1, prompt=3000, out=2), t)
        gaps, steps = [], 0
        while b.has_work():
            step = b.plan_step(t)
            out = b.finish_step(step)
            if any(s.request_id == "r0" for s in out.emitted):
                gaps.append(out.end_s - t)
            t, steps = out.end_s, steps + 1
        return max(gaps), b.step_tokens

    whole_gap_s, whole_tokens = longest_gap_s(BatcherConfig(tensor_parallel=2, clock_mhz=1980))
    chunked_gap_s, chunk_tokens = longest_gap_s(
        BatcherConfig(tensor_parallel=2, clock_mhz=1980, step_time_target_s=0.1))
    assert whole_tokens == 8192 and whole_gap_s > 0.15
    assert chunk_tokens < 3000 and chunked_gap_s <= 0.1


def test_step_budget_is_the_largest_choice_that_fits_and_follows_tp() -> None:
    from batching.step_budget import STEP_TOKEN_CHOICES, tbt_bounded_step_tokens

    perf = default_perf_model()
    top = perf.gpu.max_clock_mhz
    budgets = {tp: tbt_bounded_step_tokens(perf, tp, 0.1, 8192) for tp in perf.tensor_parallel_degrees}
    for tp, n in budgets.items():
        assert perf.iteration(n, n * n, 0, 0, tp, top).time_s <= 0.1
        bigger = STEP_TOKEN_CHOICES[STEP_TOKEN_CHOICES.index(n) + 1]
        assert bigger > 8192 or perf.iteration(bigger, bigger * bigger, 0, 0, tp, top).time_s > 0.1
    tps = sorted(budgets)
    assert all(budgets[a] <= budgets[b] for a, b in pairwise(tps))  # more GPUs, bigger chunks
    assert tbt_bounded_step_tokens(perf, tps[0], 1e-6, 8192) == STEP_TOKEN_CHOICES[0]  # prefill still progresses
    assert tbt_bounded_step_tokens(perf, tps[-1], 10.0, 2048) == 2048  # never above the ceiling

    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=tps[0], step_time_target_s=0.1))
    assert b.step_tokens == budgets[tps[0]]
    b.set_tensor_parallel(tps[-1])
    assert b.step_tokens == budgets[tps[-1]]


def test_step_budget_follows_the_clock_so_a_step_fits_the_target_at_any_clock() -> None:
    """A lower clock makes a step of the same tokens longer: the budget shrinks with it."""
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=4, step_time_target_s=0.1))
    top_tokens = b.step_tokens
    b.set_clock(perf.gpu.min_clock_mhz)
    low_tokens = b.step_tokens
    assert low_tokens < top_tokens
    assert perf.iteration(low_tokens, low_tokens**2, 0, 0, 4, perf.gpu.min_clock_mhz).time_s <= 0.1
    assert perf.iteration(top_tokens, top_tokens**2, 0, 0, 4, perf.gpu.min_clock_mhz).time_s > 0.1


def _long_prompt_beside_decodes(service_class: str) -> tuple[list[Sequence], list[tuple[Step, int, float]]]:
    """A TP4 batcher (steps of 0.1 s, prompts by TTFT deadline) four chunks into a prompt of 12
    step budgets when 16 short `service_class` requests (6 tokens out) arrive; each step of the
    prompt's chunk alone beside their decodes, with the chunk the budget alone would have taken
    and that step's time; the finished requests."""
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=4, step_time_target_s=0.1, prefill_by_ttft_deadline=True))
    budget = b.step_tokens
    b.add(Request("long", 12 * budget, 5, 0.0, SLO(ttft_s=5.0, tbt_s=0.1)), 0.0)
    t = 0.0
    for _ in range(4):
        t = b.finish_step(b.plan_step(t)).end_s
    for i in range(16):
        b.add(Request(f"d{i}", 100, 6, t, SLO_, service_class=service_class), t)
    steps, finished = [], []
    while b.has_work():
        step = b.plan_step(t)
        if [s.request_id for s, _ in step.prefill_chunks] == ["long"] and step.decodes:
            seq = step.prefill_chunks[0][0]
            untrimmed = min(budget - len(step.decodes), seq.prefill_target - seq.prefilled)  # a decode takes a token
            steps.append((step, untrimmed, step_time_s(perf, 4, b.clock_mhz, [(seq.prefilled, untrimmed)],
                                                       len(step.decodes), sum(s.context_tokens for s in step.decodes))))
        out = b.finish_step(step)
        finished += out.finished
        t = out.end_s
    return finished, steps


def test_a_chunk_deep_into_its_prompt_beside_decodes_keeps_their_mean_tbt() -> None:
    """The token budget is a fresh chunk's step alone. A later chunk's attention reads what is
    already prefilled and decodes beside it add their part (code: a 1,021-token chunk after 510
    tokens beside 3 decodes took 103 ms against 100 ms, and a 6-token answer missed its mean
    TBT): the batcher trims the chunk so that each decoding interactive request keeps its mean
    TBT, and the prompt still prefills whole."""
    finished, steps = _long_prompt_beside_decodes("interactive")
    assert any(untrimmed_s > 0.1 for _, _, untrimmed_s in steps)  # the budget alone would have run over
    assert any(step.prefill_chunks[0][1] < untrimmed for step, untrimmed, _ in steps)  # so some were trimmed
    assert len(finished) == 17
    for seq in finished:
        assert seq.last_token_s - seq.first_token_s <= seq.request.slo.tbt_s * (seq.generated - 1) + 1e-9


def test_batch_decodes_do_not_trim_a_chunk() -> None:
    """Batch work has deadlines, not a TBT: beside batch decodes a chunk takes the whole budget."""
    _, steps = _long_prompt_beside_decodes("batch")
    assert any(step.time_s > 0.1 for step, _, _ in steps)
    assert all(step.prefill_chunks[0][1] == untrimmed for step, untrimmed, _ in steps)


def test_trimming_keeps_prefill_progressing_when_decodes_alone_fill_the_step() -> None:
    perf = default_perf_model()
    sizes = fit_chunks_to_step_time(perf, 2, 1980, [(0, 300), (4000, 500)], 200, 200 * 3000, 0.01, 8192)
    assert sizes == [256, 0]  # the last chunk goes, the first keeps the floor
    assert fit_chunks_to_step_time(perf, 2, 1980, [(0, 100)], 200, 200 * 3000, 0.01, 8192) == [100]
    assert fit_chunks_to_step_time(perf, 2, 1980, [(0, 512), (0, 512)], 0, 0, 10.0, 8192) == [512, 512]


def _long_prompt_started(prefill_by_ttft_deadline: bool) -> tuple[ContinuousBatcher, float]:
    """A TP2 batcher with steps of 0.1 s one step into a 6,000-token prompt (2 s TTFT target);
    and the time that step ended."""
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(
        tensor_parallel=2, step_time_target_s=0.1, prefill_by_ttft_deadline=prefill_by_ttft_deadline))
    b.add(Request("long", 6000, 10, 0.0, SLO(ttft_s=2.0, tbt_s=0.1)), 0.0)
    return b, b.finish_step(b.plan_step(0.0)).end_s


def _short_prompt_ttft_s(prefill_by_ttft_deadline: bool) -> tuple[float, bool]:
    """TTFT of a short prompt (0.25 s target) arriving while a 6,000-token prompt (2 s target)
    prefills in chunks of 0.1 s, and whether the long prompt still met its own target."""
    b, arrival_s = _long_prompt_started(prefill_by_ttft_deadline)
    b.add(Request("short", 150, 10, arrival_s, SLO(ttft_s=0.25, tbt_s=0.1)), arrival_s)
    first_s: dict[str, float] = {}
    t = arrival_s
    while b.has_work():
        out = b.finish_step(b.plan_step(t))
        for seq in out.emitted:
            first_s.setdefault(seq.request_id, out.end_s)
        t = out.end_s
    return first_s["short"] - arrival_s, first_s["long"] <= 2.0


def test_prompts_prefill_by_ttft_deadline_so_a_short_one_does_not_wait_out_a_long_one() -> None:
    """Arrival order: the short prompt waits for the long prompt's remaining chunks and misses
    its 0.25 s. Deadline order: it takes the next step, and the long prompt still meets its 2 s."""
    arrival_ttft_s, _ = _short_prompt_ttft_s(prefill_by_ttft_deadline=False)
    deadline_ttft_s, long_met = _short_prompt_ttft_s(prefill_by_ttft_deadline=True)
    assert arrival_ttft_s > 0.25
    assert deadline_ttft_s <= 0.25 and long_met


def test_prefill_queue_is_the_order_prompts_prefill_in() -> None:
    """What the prompts' clock search walks (autoscaling.throttllem.prompt_deadlines): the
    waiting prompt due first ahead of a running prompt due later."""
    b, t = _long_prompt_started(prefill_by_ttft_deadline=True)
    b.add(Request("medium", 600, 10, t, SLO(ttft_s=0.4, tbt_s=0.1)), t)
    b.add(Request("short", 150, 10, t, SLO(ttft_s=0.25, tbt_s=0.1)), t)
    assert [s.request_id for s in b.prefill_queue(t)] == ["short", "medium", "long"]


def test_running_prompts_also_take_their_chunks_by_ttft_deadline() -> None:
    """Two prompts both started: the one due first gets the next step's budget, though it
    started second (conv: a 1,000-token prompt's last 43 tokens waited two steps behind a
    2,000-token prompt due 1.6 s later, and missed its 0.4 s)."""
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=2, step_time_target_s=0.1,
                                              prefill_by_ttft_deadline=True))
    budget = b.step_tokens
    b.add(Request("long", 6 * budget, 10, 0.0, SLO(ttft_s=2.0, tbt_s=0.1)), 0.0)
    t = b.finish_step(b.plan_step(0.0)).end_s
    b.add(Request("medium", budget + budget // 2, 10, t, SLO(ttft_s=0.4, tbt_s=0.1)), t)
    second = b.plan_step(t)  # the waiting prompt due first takes the budget
    assert [(s.request_id, n) for s, n in second.prefill_chunks] == [("medium", budget)]
    t = b.finish_step(second).end_s
    assert [s.request_id for s in b.running] == ["long", "medium"]
    assert [s.request_id for s in b.prefill_queue(t)] == ["medium", "long"]
    third = b.plan_step(t)
    assert [(s.request_id, n) for s, n in third.prefill_chunks] == [("medium", budget // 2), ("long", budget // 2)]


def test_a_started_prompt_yields_only_to_a_fresh_head_due_before_it() -> None:
    """The rule the batcher's prefill queue and vLLM's deadline scheduler share: a waiter with
    no due time (requeued, resumed) keeps its place and takes no one's chunks; ties keep order."""
    assert yields_to_waiting_head(due_s=10.0, head_due_s=1.0, now_s=0.0)
    assert not yields_to_waiting_head(due_s=1.0, head_due_s=10.0, now_s=0.0)
    assert not yields_to_waiting_head(due_s=1.0, head_due_s=1.0, now_s=0.0)
    assert not yields_to_waiting_head(due_s=10.0, head_due_s=None, now_s=0.0)


def test_a_prompt_past_its_deadline_goes_behind_every_prompt_still_on_time() -> None:
    """It has missed its TTFT whatever runs next: a started one yields to an on-time head, a
    waiting one is passed by an on-time arrival, and the late keep deadline order among them."""
    assert yields_to_waiting_head(due_s=1.0, head_due_s=10.0, now_s=2.0)
    assert not yields_to_waiting_head(due_s=10.0, head_due_s=1.0, now_s=2.0)
    assert yields_to_waiting_head(due_s=1.5, head_due_s=1.0, now_s=2.0)
    assert deadline_insert_index([1.0, None, 1.5, 12.0], 10.0, 4, now_s=2.0) == 0
    assert deadline_insert_index([1.0, None, 1.5, 12.0], 10.0, 4, now_s=0.0) == 3
    assert deadline_insert_index([5.0, 1.0, 1.5], 1.2, 3, now_s=2.0) == 2
    assert late_ahead([1.0, None, 1.5, 12.0, 0.5], now_s=2.0) == [0, 2]  # 0.5 was moved already
    assert late_ahead([1.0, 1.5], now_s=2.0) == []  # no prompt on time to go behind


def test_in_a_burst_the_misses_stay_with_prompts_already_late() -> None:
    """Prompts of one TTFT target arriving faster than one replica prefills them: in arrival
    order (deadline order alone is the same here) each is served as it is about to miss or
    after, so the misses run on; with late prompts behind the ones still on time, the prompts
    that can still make it do, and more meet their TTFT."""
    def met(prefill_by_ttft_deadline: bool) -> int:
        b = ContinuousBatcher(default_perf_model(), BatcherConfig(
            tensor_parallel=2, step_time_target_s=0.1, prefill_by_ttft_deadline=prefill_by_ttft_deadline))
        t, arrivals, done = 0.0, [(0.05 * i, f"p{i}") for i in range(40)], []
        while arrivals or b.has_work():
            while arrivals and arrivals[0][0] <= t:
                at, rid = arrivals.pop(0)
                b.add(Request(rid, 1500, 2, at, SLO(ttft_s=0.4, tbt_s=0.1)), at)
            step = b.plan_step(t)
            if step is None:
                t = arrivals[0][0]
                continue
            out = b.finish_step(step)
            t = out.end_s
            done += out.finished
        assert len(done) == 40  # the late ones are served too
        return sum(s.first_token_s - s.request.arrival_s <= 0.4 for s in done)
    assert met(prefill_by_ttft_deadline=True) > met(prefill_by_ttft_deadline=False)


def test_a_chosen_clock_reaches_the_gpus_at_the_next_forward_plus_its_latency() -> None:
    """Clocks are forwarded to the GPUs every 0.25 s and take 0.1 s to lock: a clock chosen
    at 0.3 s runs from 0.6 s, steps before it are costed at the old clock and nothing
    stalls; a choice made before that forward supersedes it, one made after waits for the
    next forward."""
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=8, clock_mhz=1980.0, clock_forward_period_s=0.25,
                                              clock_change_s=0.1))
    b.request_clock(1200.0, 0.3)
    b.request_clock(1000.0, 0.4)
    b.request_clock(1500.0, 0.55)
    assert b.clock_lands_s(0.3) == 0.6 and b.clock_lands_s(0.55) == 0.85
    b.add(_req(0, out=200), 0.0)
    first = b.plan_step(0.59)
    assert first is not None and first.start_s == 0.59 and b.clock_mhz == 1980.0 and b.clock_target_mhz == 1500.0
    b.finish_step(first)
    b.land_clock(0.6)
    assert b.clock_mhz == 1000.0
    slower = b.plan_step(0.6)
    assert slower is not None and slower.start_s == 0.6 and slower.time_s > first.time_s
    b.finish_step(slower)
    b.land_clock(0.85)
    assert b.clock_mhz == 1500.0 and not b.clock_requests


def test_a_band_moved_while_serving_is_taken_as_a_chosen_clock() -> None:
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(tensor_parallel=8, clock_mhz=1980.0, clock_forward_period_s=0.25,
                                              clock_change_s=0.1))
    b.set_clock_band(1000.0, 1200.0, now_s=1.05)
    assert b.clock_mhz == 1980.0 and b.clock_target_mhz == 1000.0
    b.land_clock(1.6)
    assert b.clock_mhz == 1000.0
    b.set_clock_band(1500.0, 1500.0)  # not yet serving: at once
    assert b.clock_mhz == 1500.0 and not b.clock_requests


def test_an_idle_replica_reports_the_clock_its_gpus_took() -> None:
    """Between steps the stats read the clock the GPUs run at, landed or not; while a step
    runs it keeps the clock it is costed at. The raise asked at 0.7 s is forwarded at 0.75 s
    and lands at 0.85 s, inside a 5,000-token prefill at 1,000 MHz (0.23 s)."""
    b = ContinuousBatcher(default_perf_model(), BatcherConfig(tensor_parallel=8, clock_mhz=1980.0,
                                                              clock_forward_period_s=0.25, clock_change_s=0.1))
    b.set_clock_band(1000.0, 1000.0, now_s=0.3)
    assert b.stats(0.55).clock_mhz == 1980.0
    assert b.stats(0.6).clock_mhz == 1000.0
    b.set_clock_band(1500.0, 1500.0, now_s=0.7)
    b.add(_req(0, prompt=5000, out=5), 0.7)
    step = b.plan_step(0.7)
    assert step is not None and step.end_s > 0.85
    assert b.stats(0.85).clock_mhz == 1000.0  # the step in flight runs at the old clock
    b.finish_step(step)
    assert b.stats(step.end_s).clock_mhz == 1500.0
