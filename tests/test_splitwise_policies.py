"""Splitwise's pure policies: JSQ with reservations, mixed fallback, KV transfer model."""

from autoscaling.splitwise.config import SplitwiseConfig
from autoscaling.splitwise.provisioning import cheapest
from autoscaling.splitwise.scheduler import MIXED, PROMPT, TOKEN, SplitwiseScheduler
from energy.hardware import MODELS
from energy.kv_transfer import KVTransferConfig, KVTransferModel


def scheduler(prompts: int, tokens: int, **kw) -> SplitwiseScheduler:
    s = SplitwiseScheduler(SplitwiseConfig(**kw))
    for i in range(prompts):
        s.add_replica(i, PROMPT)
    for i in range(prompts, prompts + tokens):
        s.add_replica(i, TOKEN)
    return s


def test_jsq_picks_the_pair_with_least_pending_tokens():
    s = scheduler(3, 3)
    for replica, pending in {0: 500, 1: 100, 2: 300, 3: 900, 4: 1000, 5: 200}.items():
        s.ledger.report(replica, pending)
    a = s.assign(50, 20, now_s=0.0)
    assert (a.prompt.replica_id, a.token.replica_id) == (1, 5)


def test_reservations_spread_a_burst_instead_of_herding():
    s = scheduler(4, 4)
    picks = {s.assign(1000, 100, now_s=0.0).prompt.replica_id for _ in range(4)}
    assert picks == {0, 1, 2, 3}  # no report in between: only reservations tell them apart
    assert s.ledger.pending_tokens(0) == 1000


def test_landing_hands_the_reservation_to_the_next_report():
    s = scheduler(1, 1)
    a = s.assign(700, 10, now_s=0.0)
    s.ledger.land(a.prompt.ticket)
    s.ledger.report(0, 700)
    assert s.ledger.pending_tokens(0) == 700


def test_overflow_goes_mixed_then_pulls_from_the_opposite_pool_and_returns_home():
    s = scheduler(1, 3, prompt_queue_threshold_tokens=1000)
    s.ledger.report(0, 5000)  # the only prompt replica is over its threshold
    s.ledger.report(1, 10)
    a = s.assign(200, 10, now_s=0.0)
    pulled = a.prompt.replica_id
    assert s.home[pulled] is TOKEN and s.role[pulled] is MIXED
    assert s.assign(200, 10, now_s=0.0).prompt.replica_id == pulled  # the mixed pool comes next
    s.rebalance(1.0)
    assert s.role[pulled] is MIXED  # its prompts are still outstanding
    s.finished(pulled, PROMPT)
    s.finished(pulled, PROMPT)
    s.rebalance(2.0)
    assert s.role[pulled] is TOKEN


def test_a_replica_mixed_too_long_is_repurposed():
    s = scheduler(1, 2, prompt_queue_threshold_tokens=1, repurpose_after_s=60.0)
    s.ledger.report(0, 100)
    pulled = s.assign(100, 10, now_s=0.0).prompt.replica_id
    s.rebalance(61.0)
    assert s.home[pulled] is PROMPT and s.repurposed == 1


def test_a_pool_keeps_its_last_replica():
    s = scheduler(1, 1, prompt_queue_threshold_tokens=1)
    s.ledger.report(0, 100)
    assert s.assign(100, 10, now_s=0.0).prompt.replica_id == 0


def test_transfer_time_from_bytes_and_bandwidth():
    model = MODELS["llama2-70b"]
    kv = KVTransferModel(model, KVTransferConfig(link_gbps=400, layerwise_min_prompt_tokens=512))
    # 1000 tokens x 327,680 B / TP8 = 40.96 MB per link; at 50 GB/s: 0.8192 ms.
    assert kv.bytes_per_link(1000, 8) == 1000 * 2 * 80 * 8 * 128 * 2 / 8
    assert abs(kv.serialized_s(1000, 8) - 40.96e6 * 8 / 400e9) < 1e-12
    small = kv.plan(256, 8, prompt_compute_s=0.05)
    assert not small.layerwise and small.visible_s == kv.serialized_s(256, 8)
    big = kv.plan(4000, 8, prompt_compute_s=0.5)
    assert big.layerwise and abs(big.visible_s - kv.serialized_s(4000, 8) / 80) < 1e-12
    # A prompt too fast to hide the transfer leaves the unhidden part visible.
    assert kv.layerwise_s(4000, 8, prompt_compute_s=0.0) == kv.serialized_s(4000, 8)


def test_search_matches_brute_force():
    meets = lambda p, t: p * 2 + t >= 7 and t >= 2  # noqa: E731
    cost = lambda p, t: 3 * p + 2 * t  # noqa: E731
    best, trials = cheapest(meets, cost, 5, 5)
    brute = min((cost(p, t), p, t) for p in range(1, 6) for t in range(1, 6) if meets(p, t))
    assert (best.cost, best.prompt, best.token) == brute
    assert len(trials) < 25
