"""Splitwise in the simulator and the batcher capabilities it needs."""

import numpy as np

from autoscaling.splitwise.machine import AgingPreemption
from batching.continuous_batcher import BatcherConfig, ContinuousBatcher
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from sim.config import SimConfig
from sim.splitwise import SplitwiseSimConfig
from sim.splitwise_run import run_splitwise
from sim.workload import Workload

SLO_ = SLO(ttft_s=5, tbt_s=0.2)


def workload(n: int = 120, rate: float = 2.0, seed: int = 1) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(50, 3000, n),
                    rng.integers(1, 300, n), np.ones(n, dtype=bool))


def run(b: ContinuousBatcher, now: float) -> float:
    while (step := b.plan_step(now)) is not None:
        now = b.finish_step(step).end_s
    return now


def test_resume_with_kv_decodes_without_prefill_and_without_kv_recomputes():
    perf = default_perf_model()
    prompt = ContinuousBatcher(perf, BatcherConfig())
    req = Request("r", 1000, 10, 0.0, SLO_, target_output_tokens=10)
    first = Request("r", 1000, 1, 0.0, SLO_, target_output_tokens=1)
    prompt.add(first, 0.0)
    step = prompt.plan_step(0.0)
    prior = prompt.finish_step(step).finished[0]
    for kv_present in (True, False):
        token = ContinuousBatcher(perf, BatcherConfig())
        seq = token.resume(req, prior, 1.0, kv_present)
        step = token.plan_step(1.0)
        assert (len(step.decodes), len(step.prefill_chunks)) == ((1, 0) if kv_present else (0, 1))
        run(token, 1.0)
        assert seq.generated == 10 and seq.first_token_s == prior.first_token_s and token.kv_blocks_used == 0


def test_aging_preemption_spares_old_tokens_and_respects_the_cap():
    perf = default_perf_model()
    b = ContinuousBatcher(perf, BatcherConfig(batch_limit=2))
    policy = AgingPreemption(age_limit_s=2.0, max_preemptions=1)
    old, young = (Request(i, 100, 50, 0.0, SLO_) for i in ("old", "young"))
    b.add(old, 0.0)
    b.add(young, 5.0)
    b.finish_step(b.plan_step(5.0))
    prompt = b.add(Request("p", 100, 1, 6.0, SLO_), 6.0)
    assert policy.victim(prompt, b, 6.0) == 1  # "young" (1 s old), not "old" (6 s)
    b.running[1].preemptions = 1
    assert policy.victim(prompt, b, 6.0) is None  # capped
    assert policy.victim(b.running[0], b, 6.0) is None  # token phases never preempt


def test_every_request_completes_once_with_all_its_tokens_and_energy_adds_up():
    w = workload()
    summary, sim = run_splitwise(w, SimConfig(), prompt=1, token=1)
    log = sim.log
    assert summary["completed"] == len(w) and log.done.all()
    assert (log.output_tokens == w.output_tokens).all()
    replicas_j = sum(r.energy_j(sim.all_replicas[0].stop_s) for r in sim.all_replicas)
    assert abs(replicas_j - summary["energy_j"]) < 1e-6 * replicas_j
    assert log.energy_j.sum() < summary["energy_j"]  # idle time is the cluster's, not the requests'
    assert sim.transfers["layerwise"] + sim.transfers["serialized"] == int((w.output_tokens > 1).sum())


def test_failed_transfers_recompute_and_still_complete():
    w = workload(60)
    ok, _ = run_splitwise(w, SimConfig(), prompt=1, token=1)
    summary, sim = run_splitwise(w, SimConfig(), prompt=1, token=1,
                                 splitwise=SplitwiseSimConfig(transfer_failure_prob=0.5, transfer_timeout_s=0.5))
    assert sim.transfers["failed"] > 10
    assert summary["completed"] == len(w) and (sim.log.output_tokens == w.output_tokens).all()
    assert summary["energy_j"] > ok["energy_j"]  # recomputed prompts cost energy


def test_a_burst_within_one_report_interval_spreads_over_the_prompt_replicas():
    n = 16  # all arrive before the first control tick's report
    w = Workload(np.linspace(0.0, 0.05, n), np.full(n, 2000), np.full(n, 20), np.ones(n, dtype=bool))
    summary, sim = run_splitwise(w, SimConfig(), prompt=4, token=2)
    one_prompt_s = default_perf_model().prefill_time_s(2000, 2000**2, 8, 1980)
    # herded onto one replica the last would wait ~16 prompts; spread, ~4
    assert summary["completed"] == n and np.nanmax(sim.log.ttft_s) < 6 * one_prompt_s


def test_pools_can_run_on_different_machines():
    from autoscaling.registry import make_policy
    from core.classes import LengthClassConfig
    from sim.scenario import splitwise_pools
    from sim.splitwise import SplitwiseSimulator

    w = workload(40)
    a100 = default_perf_model("llama2-70b", "a100-80gb")
    pools = splitwise_pools(w, SimConfig(), LengthClassConfig(), 1, 1)
    policy = make_policy("splitwise", replicas={p.name: 1 for p in pools}, tensor_parallel={p.name: 8 for p in pools},
                         clock_mhz={p.name: int(p.clock_mhz) for p in pools})
    sim = SplitwiseSimulator(w, policy, pools, SimConfig(), pool_perf={"pool-token": a100})
    sim.run()
    kinds = {r.pool: r.perf.gpu.name for r in sim.all_replicas}
    assert kinds == {"pool-prompt": "h100-80gb", "pool-token": "a100-80gb"}
    assert sim.log.done.all()


def test_a_replica_that_finished_its_prompts_is_seen_free_before_the_next_report():
    # A (6000 tokens) ends on replica 0 before 0.85 s; B and C (3000) arrive before the 1 s report.
    # A stale ledger still charges replica 0 with A and queues C behind B on replica 1.
    perf = default_perf_model()
    a_s = perf.prefill_time_s(6000, 2048 * 6000, 8, 1980)
    assert a_s < 0.85
    w = Workload(np.array([0.0, 0.85, 0.9]), np.array([6000, 3000, 3000]), np.array([5, 5, 5]), np.ones(3, dtype=bool))
    _, sim = run_splitwise(w, SimConfig(), prompt=2, token=1)
    alone_s = perf.prefill_time_s(3000, 2048 * 3000, 8, 1980)
    assert sim.log.ttft_s[2] < 1.3 * alone_s


def test_splitwise_hooks_join_the_pools_own_instead_of_replacing_them():
    """A token replica that runs throttLL'eM's hooks (the composite's iteration layer) keeps
    its admission: Splitwise's KV-budget rule is chained after it, aging preemption
    likewise; a pool without hooks of its own gets Splitwise's alone."""
    from autoscaling.registry import make_policy
    from autoscaling.splitwise.machine import KvBudgetAdmission
    from autoscaling.throttllem.admission import ThrottllemAdmission
    from batching.hook_chains import AdmissionChain
    from core.classes import LengthClassConfig
    from sim.scenario import splitwise_pools, with_throttllem
    from sim.splitwise import SplitwiseSimulator

    w = workload(20)
    plain = splitwise_pools(w, SimConfig(), LengthClassConfig(), 1, 1)
    policy = make_policy("splitwise", replicas={p.name: 1 for p in plain}, tensor_parallel={p.name: 8 for p in plain},
                         clock_mhz={p.name: int(p.clock_mhz) for p in plain})
    sim = SplitwiseSimulator(w, policy, with_throttllem(plain, SimConfig()), SimConfig())
    sim.run()
    token = next(r for r in sim.all_replicas if r.pool == "pool-token").ready_batcher
    assert isinstance(token.admission, AdmissionChain)
    assert [type(m) for m in token.admission.members] == [ThrottllemAdmission, KvBudgetAdmission]
    assert sim.log.done.all()
    alone = SplitwiseSimulator(w, policy, plain, SimConfig())
    alone.run()
    token = next(r for r in alone.all_replicas if r.pool == "pool-token").ready_batcher
    assert isinstance(token.admission, KvBudgetAdmission) and isinstance(token.preemption, AgingPreemption)
