"""The federation's dispatcher (Mico §3.3 online): placement by predicted tokens per unit of
capacity, the two back-offs, failures, and the same object driving the simulator."""

import pytest

from app.cloud_dispatch import BackOffSettings, CloudDispatcher
from app.cloud_load import CloudLoad
from app.offload import TransferCost
from sim.multicluster import ClusterSpec, MultiClusterSim


def _load(outstanding: float = 0.0, capacity: int = 8) -> CloudLoad:
    return CloudLoad(outstanding, 0.0, 0, capacity, capacity, 0.0)


def test_least_outstanding_tokens_per_unit_of_capacity_wins() -> None:
    d = CloudDispatcher(2, capacities=[1.0, 3.0])
    d.dispatch(0, "a", 100, 10)
    d.dispatch(1, "b", 250, 10)
    # (100 + 50) / 1 > (250 + 50) / 3: the larger cloud, though it holds more.
    assert d.choose(50, now_s=0.0) == 1
    d.progress("a", 100)  # cloud 0 computed everything it held
    assert d.choose(50, now_s=0.0) == 0
    assert d.choose(50, now_s=0.0, exclude={0}) == 1


def test_a_clouds_report_gives_its_capacity_and_work_this_front_did_not_send() -> None:
    d = CloudDispatcher(2)
    d.report(0, _load(capacity=8), now_s=0.0)
    d.report(1, _load(capacity=2), now_s=0.0)
    assert (d.capacity(0), d.capacity(1)) == (8.0, 2.0)
    d.dispatch(0, "mine", 300, 10)
    d.report(0, _load(outstanding=1300, capacity=8), now_s=1.0)  # 1000 tokens from other clients
    assert d.load_tokens(0, now_s=1.0) == 1300
    assert d.choose(10, now_s=1.0) == 1  # 1310 / 8 > 10 / 2
    stale = 1.0 + BackOffSettings().report_ttl_s + 1
    assert d.load_tokens(0, now_s=stale) == 300  # a stale report no longer counts


def test_a_failed_cloud_rests_for_its_retry_after_or_a_doubling_back_off() -> None:
    d = CloudDispatcher(2)
    d.failed(0, now_s=10.0, retry_after_s=5.0)
    assert d.choose(1, now_s=12.0) == 1 and d.choose(1, now_s=15.0) in (0, 1)
    assert d.choose(1, now_s=12.0, exclude={1}) is None
    d.failed(1, now_s=12.0)  # no Retry-After: 1 s, then 2 s for the next failure in a row
    assert d.retry_after_s(now_s=12.0) == pytest.approx(1.0)
    d.failed(1, now_s=13.0)
    assert not d.available(1, now_s=14.5) and d.available(1, now_s=15.0)
    d.succeeded(1)
    d.failed(1, now_s=20.0)
    assert d.available(1, now_s=21.0)  # the doubling restarted


def test_a_cloud_that_falls_behind_counts_with_less_capacity() -> None:
    d = CloudDispatcher(2)
    for k in (0, 1):
        d.dispatch(k, f"r{k}", 1000, 10)
    d.tick(0.0)
    for t in range(1, 6):
        d.progress("r0", 100)  # 100 tokens a second for its one running request
        d.progress("r1", 25)  # a quarter of that
        d.tick(float(t))
    fast, slow = d.status(0, 5.0), d.status(1, 5.0)
    assert fast.speed == 1.0
    assert 0.1 < slow.speed < 0.5
    # Equal loads, equal capacities: the slow cloud gets nothing until its load is a share of the other's.
    d.finish("r0")
    d.finish("r1")
    assert d.choose(100, now_s=5.0) == 0


def test_an_idle_cloud_takes_requests_that_wait_elsewhere() -> None:
    d = CloudDispatcher(2, transfer=TransferCost(rtt_s=0.01))
    d.dispatch(1, "busy", 2000, 10)
    for i in range(6):
        d.dispatch(1, f"q{i}", 500, 20)
    d.dispatch(0, "done", 100, 10)
    d.tick(0.0)
    d.progress("busy", 100)
    d.progress("done", 100)
    d.started("busy")
    d.tick(1.0)
    d.finish("done")
    moves = d.offloads(now_s=1.0)
    assert moves and all(m.from_cluster == 1 and m.to_cluster == 0 for m in moves)
    assert "busy" not in {m.request_id for m in moves}  # started: it stays
    assert [m.request_id for m in moves] == [f"q{i}" for i in range(5, 5 - len(moves), -1)]  # the tail first
    placed = d.status(1, 1.0).dispatched_tokens
    d.move(moves[0].request_id, 0)
    assert d.cloud_of(moves[0].request_id) == 0
    assert d.status(1, 1.0).dispatched_tokens == placed - 500 and d.status(0, 1.0).dispatched_tokens == 600
    assert d.offloads(now_s=1.0, idle=[1]) == []  # a busy cloud takes nothing


def test_carbon_weight_prefers_the_cleaner_cloud_by_a_bounded_factor() -> None:
    intensity = {0: 400.0, 1: 100.0}
    plain = CloudDispatcher(2)
    weighted = CloudDispatcher(2, settings=BackOffSettings(carbon_weight=0.5))
    for d in (plain, weighted):
        d.dispatch(1, "x", 1000, 10)
        d.dispatch(0, "y", 300, 10)
    assert plain.choose(10, 0.0, intensity_g_per_kwh=intensity) == 0  # weight 0: load alone
    # 4x dirtier: cloud 0 counts (1 + 0.5 * 3) = 2.5x as loaded; 310 * 2.5 < 1010 still wins
    assert weighted.choose(10, 0.0, intensity_g_per_kwh=intensity) == 0
    weighted.dispatch(0, "z", 200, 10)
    assert plain.choose(10, 0.0, intensity_g_per_kwh=intensity) == 0
    assert weighted.choose(10, 0.0, intensity_g_per_kwh=intensity) == 1  # 510 * 2.5 > 1010


def test_bad_capacities_are_refused() -> None:
    with pytest.raises(ValueError):
        CloudDispatcher(2, capacities=[1.0])
    with pytest.raises(ValueError):
        CloudDispatcher(2, capacities=[1.0, 0.0])


# ---- the same object in the simulator's multi-cluster runs ----------------------------------------
SKEWED_OUTPUTS = [600 if i % 4 == 0 else 40 for i in range(240)]


PREDICTED = [550 if o > 100 else 55 for o in SKEWED_OUTPUTS]  # buckets right, midpoints off


def _online(specs: ClusterSpec | list[ClusterSpec], n_clusters: int, gap_s: float,
            back_off: BackOffSettings = BackOffSettings()):
    n = len(SKEWED_OUTPUTS)
    return MultiClusterSim(specs, n_clusters, [100] * n, SKEWED_OUTPUTS, PREDICTED,
                           arrival_s=[i * gap_s for i in range(n)], back_off=back_off).run()


@pytest.mark.parametrize("n_clusters", [2, 3])
def test_a_burst_of_a_skewed_mix_is_balanced_in_predicted_tokens(n_clusters: int) -> None:
    """All sent at once (as the Ray tier's federation test sends them): the clouds' predicted
    tokens within 10% of each other. Under a steady trickle it is outstanding work that is
    balanced, and what each cloud was given follows how fast it drains."""
    result = _online(ClusterSpec(batch_limit=8), n_clusters, gap_s=0.0)
    placed = result.predicted_tokens_per_cluster
    assert max(placed) / min(placed) < 1.10
    assert sum(placed) == sum(PREDICTED) + 100 * len(PREDICTED)
    assert sum(result.tokens_per_cluster) == sum(SKEWED_OUTPUTS) + 100 * len(SKEWED_OUTPUTS)


def test_a_slow_cluster_is_backed_off() -> None:
    """A cluster at 0.3x the speed its capacity predicts: its load drains slowly, so it gets
    less, and its measured progress backs it off further."""
    slow = [ClusterSpec(batch_limit=8), ClusterSpec(batch_limit=8, speed=0.3)]
    backed = _online(slow, 2, gap_s=0.25).predicted_tokens_per_cluster
    ledger_only = _online(slow, 2, gap_s=0.25, back_off=BackOffSettings(below=0.0)).predicted_tokens_per_cluster
    assert backed[1] / sum(backed) < ledger_only[1] / sum(ledger_only) < 0.4
