"""A vLLM replica's running batch as the admission rules read it: throttLL'eM's rule
decides for it exactly as for the simulated replica holding the same requests; its
step-by-step estimate of each prompt's prefill (each request's share of a step's work)."""

from __future__ import annotations

from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.replica_policies import replica_policies
from batching.continuous_batcher import BatcherConfig
from core.request import Request
from core.slo import SLO
from energy.hardware import GPUS
from energy.profiles import perf_model_for
from engines.admission_gate import AdmissionGate
from engines.vllm_clock import VllmClock
from engines.vllm_running_batch import VllmRunningBatch
from engines.vllm_stats import VllmStatsSnapshot
from tests.unit.autoscaling.test_throttllem_admission import SPLITWISE, replica, req


def _view_like(batcher) -> VllmRunningBatch:
    snapshot = VllmStatsSnapshot(kv_blocks_total=batcher.kv_blocks_total,
                                 kv_usage=batcher.kv_blocks_used / batcher.kv_blocks_total)
    view = VllmRunningBatch(batcher.tensor_parallel, batcher.block_size, snapshot, AdmissionGate(batcher.batch_limit),
                            VllmClock(batcher.perf.gpu), batcher.step_tokens)
    for seq in batcher.running:
        view.enter(view.candidate(seq.request, 0.0, seq.generated))
    return view


def test_throttllem_admission_gives_a_vllm_replica_the_batchers_verdicts() -> None:
    verdicts = []
    for candidate, capacity in ((req("big", 1500, 600), 4000), (req("small", 100, 50), 4000),
                                (req("fits", 1500, 600), 40000)):
        batcher, admission, _ = replica([req("a", 2000, 400)], kv_capacity_tokens=capacity)
        on_batcher = admission.admit(batcher.add(candidate, 1.0), batcher, 1.0)
        view = _view_like(batcher)
        shape = BatcherConfig(tensor_parallel=8, kv_capacity_tokens=capacity)
        fresh, _ = replica_policies(perf_model_for(SPLITWISE), shape, ThrottllemConfig(profile=SPLITWISE))
        on_view = fresh.admit(view.candidate(candidate, 1.0), view, 1.0)
        assert on_view == on_batcher, candidate.request_id
        verdicts.append(on_view)
    assert verdicts == [False, True, True]  # KV overflow refused; a small one, or in a bigger cache, admitted


def test_the_view_follows_requests_in_and_out() -> None:
    snapshot = VllmStatsSnapshot(kv_blocks_total=100, kv_usage=0.25)
    view = VllmRunningBatch(1, 16, snapshot, AdmissionGate(8), VllmClock(GPUS["h100-80gb"]), step_tokens=2048)
    assert view.kv_blocks_used == 0  # nothing of ours inside: vLLM's last report may be stale
    seq = view.candidate(req("r", 100, 50), 0.0)
    view.enter(seq)
    view.advance("r", 7, 0.4)
    assert [s.generated for s in view.running] == [7] and view.kv_blocks_used == 25
    assert view.running[0].first_token_s == 0.4  # throttLL'eM holds its mean TBT from there
    view.leave("r")
    assert view.running == [] and view.kv_blocks_used == 0


def test_the_view_estimates_prefill_progress_step_by_step_as_vllm_fills_a_step() -> None:
    snapshot = VllmStatsSnapshot(kv_blocks_total=1000, kv_usage=0.1)
    view = VllmRunningBatch(1, 16, snapshot, AdmissionGate(8), VllmClock(GPUS["h100-80gb"]), step_tokens=100)
    slo = SLO(ttft_s=10.0, tbt_s=1.0)
    for rid, prompt in (("decoding", 40), ("long", 150), ("short", 30)):
        view.enter(view.candidate(Request(rid, prompt, 10, 0.0, slo), 0.0))
    view.advance("decoding", 3, 0.2)
    # One token for the decode; the 99 left go to the oldest prompt first.
    assert view.on_step() == {"decoding": 1, "long": 99}
    assert [s.request_id for s in view.prefill_queue(0.3)] == ["long", "short"]
    assert view.on_step() == {"decoding": 1, "long": 50, "short": 29}
    # A prompt is done only with its first output: until then its estimate stays a token short.
    assert view.on_step() == {"decoding": 1, "long": 1, "short": 1}
    view.advance("long", 1, 0.4)
    view.advance("short", 1, 0.4)
    assert view.on_step() == {"decoding": 1, "long": 1, "short": 1} and view.prefill_queue(0.5) == []
    assert view.running[1].kv_blocks == 10  # 151 tokens of context in blocks of 16
