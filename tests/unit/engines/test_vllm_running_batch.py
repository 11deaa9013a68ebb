"""A vLLM replica's running batch as the admission rules read it: throttLL'eM's rule
decides for it exactly as for the simulated replica holding the same requests."""

from __future__ import annotations

from autoscaling.throttllem.config import ThrottllemConfig
from autoscaling.throttllem.replica_policies import replica_policies
from batching.continuous_batcher import BatcherConfig
from energy.profiles import perf_model_for
from engines.admission_gate import AdmissionGate
from engines.vllm_running_batch import VllmRunningBatch
from engines.vllm_stats import VllmStatsSnapshot
from tests.unit.autoscaling.test_throttllem_admission import SPLITWISE, replica, req


def _view_like(batcher) -> VllmRunningBatch:
    snapshot = VllmStatsSnapshot(kv_blocks_total=batcher.kv_blocks_total,
                                 kv_usage=batcher.kv_blocks_used / batcher.kv_blocks_total)
    view = VllmRunningBatch(batcher.tensor_parallel, batcher.block_size, snapshot, AdmissionGate(batcher.batch_limit))
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
    view = VllmRunningBatch(1, 16, snapshot, AdmissionGate(8))
    assert view.kv_blocks_used == 0  # nothing of ours inside: vLLM's last report may be stale
    seq = view.candidate(req("r", 100, 50), 0.0)
    view.enter(seq)
    view.advance("r", 7, 0.4)
    assert [s.generated for s in view.running] == [7] and view.kv_blocks_used == 25
    assert view.running[0].first_token_s == 0.4  # throttLL'eM holds its mean TBT from there
    view.leave("r")
    assert view.running == [] and view.kv_blocks_used == 0
