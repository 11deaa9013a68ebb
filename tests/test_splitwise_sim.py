"""Splitwise in the simulator and the batcher capabilities it needs."""

import numpy as np

from autoscaling.splitwise.machine import AgingPreemption
from core.request import Request
from core.slo import SLO
from energy.calibration import default_perf_model
from engines.batching import BatcherConfig, ContinuousBatcher
from sim.config import SimConfig
from sim.splitwise import SplitwiseSimConfig
from sim.splitwise_plan import plan_splitwise, run_splitwise
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


def test_provisioning_meets_the_slo_no_larger_than_brute_force():
    w = workload(80, rate=4.0)
    config = SimConfig()
    best, trials = plan_splitwise(w, config, slo_attainment=0.9, max_prompt=3, max_token=3)
    assert best is not None and best.meets_slo
    summary, _ = run_splitwise(w, config, best.prompt, best.token)
    assert summary["slo_attainment"]["overall"] >= 0.9
    brute = [(p, t) for p in range(1, 4) for t in range(1, 4)
             if run_splitwise(w, config, p, t)[0]["slo_attainment"]["overall"] >= 0.9]
    assert best.prompt + best.token == min(p + t for p, t in brute)
