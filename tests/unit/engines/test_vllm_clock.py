"""throttLL'eM's clock rule on a vLLM replica: the rule the simulated replicas run picks the same
clock from a vLLM replica's view of its batch as from the batcher holding the same requests,
raising it for a burst of prompts and lowering it once only loose decodes are left; the replica's
clock state (band, choice, read-back, lag)."""

from __future__ import annotations

import asyncio

from autoscaling.throttllem.replica_policies import replica_policies
from batching.continuous_batcher import BatcherConfig, ClockPolicy, ContinuousBatcher
from core.overheads import OverheadTable
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from engines.admission_gate import AdmissionGate
from engines.vllm_clock import VllmClock
from engines.vllm_running_batch import VllmRunningBatch
from engines.vllm_stats import VllmStatsSnapshot

PERF = default_perf_model("llama2-70b", "h100-80gb")
CLOCKS = sorted(float(c) for c in PERF.gpu.supported_clocks_mhz())
LOW, TOP = CLOCKS[0], CLOCKS[-1]
TP = 2
LAG = OverheadTable()  # the lag a vLLM replica's clock has: forwards every 0.25 s, locks in 0.1 s
RUNNING_FIRST_TOKEN_S = 0.5


def _request(rid: str, prompt: int, output: int, slo: SLO, arrival_s: float) -> Request:
    return Request(rid, prompt, output, arrival_s, slo, predicted_output_tokens=output, target_output_tokens=output)


def _batcher(running: list[Request], generated: int, waiting: list[Request], now_s: float,
             clock_mhz: float) -> tuple[ContinuousBatcher, ClockPolicy]:
    """A simulated replica holding `running` (decoding, `generated` tokens each) and `waiting`."""
    config = BatcherConfig(tensor_parallel=TP, clock_forward_period_s=LAG.clock_forward_period_s,
                           clock_change_s=LAG.clock_change_s)
    admission, clock = replica_policies(PERF, config)
    batcher = ContinuousBatcher(PERF, config, admission, clock)
    for r in running:
        seq = batcher.add(r, 0.0)
        batcher.waiting.remove(seq)
        seq.prefilled, seq.generated, seq.first_token_s = seq.prefill_target, generated, RUNNING_FIRST_TOKEN_S
        batcher._grow(seq, r.prompt_tokens + generated + 1)
        batcher.running.append(seq)
    for r in waiting:
        batcher.add(r, now_s)
    batcher.set_clock_band(LOW, TOP)
    batcher.set_clock(clock_mhz)
    return batcher, clock


async def _vllm_view(batcher: ContinuousBatcher, waiting: list[Request], now_s: float,
                     clock_mhz: float) -> tuple[VllmRunningBatch, ClockPolicy, list[asyncio.Task]]:
    """A vLLM replica's view holding the same requests: the running ones admitted and streaming,
    the waiting ones held at its gate (its rule refuses them, as throttLL'eM's admission may)."""
    snapshot = VllmStatsSnapshot(kv_blocks_total=batcher.kv_blocks_total,
                                 kv_usage=batcher.kv_blocks_used / batcher.kv_blocks_total)
    gate = AdmissionGate(batcher.batch_limit, admits=lambda _candidate: False)
    clock = VllmClock(PERF.gpu, LAG)
    view = VllmRunningBatch(TP, batcher.block_size, snapshot, gate, clock, batcher.step_tokens, PERF)
    for seq in batcher.running:
        view.enter(view.candidate(seq.request, 0.0))
        view.advance(seq.request_id, seq.generated, seq.first_token_s)

    async def wait_at_gate(r: Request) -> None:
        async with gate.slot(candidate=view.candidate(r, now_s), due_s=r.ttft_due_s):
            pass

    tasks = [asyncio.ensure_future(wait_at_gate(r)) for r in waiting]
    for _ in range(3):
        await asyncio.sleep(0)
    assert [s.request_id for s in view.waiting] == [r.request_id for r in waiting]
    clock.set_band(LOW, TOP, has_rule=True)
    clock.request(clock_mhz)
    clock.applied_mhz = clock_mhz
    _admission, rule = replica_policies(PERF, BatcherConfig(tensor_parallel=TP, batch_limit=batcher.batch_limit,
                                                            kv_capacity_tokens=batcher.kv_blocks_total * 16))
    return view, rule, tasks


def _both_choose(running: list[Request], generated: int, waiting: list[Request], now_s: float,
                 clock_mhz: float) -> tuple[float | None, float | None]:
    batcher, on_batcher = _batcher(running, generated, waiting, now_s, clock_mhz)

    async def run() -> float | None:
        view, on_view, tasks = await _vllm_view(batcher, waiting, now_s, clock_mhz)
        try:
            return on_view.choose_clock_mhz(view, now_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return on_batcher.choose_clock_mhz(batcher, now_s), asyncio.run(run())


LOOSE = SLO(ttft_s=60.0, tbt_s=1.0)
DECODING = [_request(f"d{i}", 500, 200, LOOSE, 0.0) for i in range(8)]


def test_a_burst_of_prompts_raises_the_clock_alike_on_both_engines() -> None:
    burst = [_request(f"p{i}", 3000, 100, SLO(ttft_s=2.0, tbt_s=0.1), 1.0) for i in range(6)]
    on_batcher, on_vllm = _both_choose(DECODING, 20, burst, now_s=1.0, clock_mhz=LOW)
    assert on_batcher is not None and on_batcher > LOW
    assert on_vllm == on_batcher


def test_loose_decodes_alone_lower_the_clock_alike_on_both_engines() -> None:
    on_batcher, on_vllm = _both_choose(DECODING, 20, [], now_s=1.0, clock_mhz=TOP)
    assert on_batcher is not None and on_batcher < TOP
    assert on_vllm == on_batcher


def test_the_clock_moves_into_the_band_and_reports_what_the_gpus_run_at() -> None:
    clock = VllmClock(PERF.gpu)
    assert clock.requested_mhz == 0 and clock.target_mhz == TOP == clock.running_mhz  # unlocked: default
    clock.set_band(1200, 1600, has_rule=True)  # a rule searches inside it: its choice moves into it
    assert clock.requested_mhz == 1600
    clock.set_band(1000, 1400, has_rule=False)  # no rule: the floor
    assert clock.requested_mhz == 1000 and clock.running_mhz == 1000
    clock.applied_mhz = 1980.0  # read back: reset after an NVML error
    assert clock.running_mhz == 1980.0 and clock.target_mhz == 1000
    assert clock.clamp_to_band(800) == 1000 and clock.clamp_to_band(1500) == 1400
    # A choice made now goes out at the next forward (0.25 s) and locks 0.1 s later.
    assert clock.lands_s(1.01) == 1.25 + 0.1 and clock.longest_lag_s == 0.1 + 0.25
