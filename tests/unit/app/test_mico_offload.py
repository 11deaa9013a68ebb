"""Mico §3.3 back-off: an idle cluster takes queued queries only when moving them pays."""

from app.offload import ClusterLoad, TransferCost, Waiting, offload_to_idle
from sim.multicluster import ClusterSpec, MultiClusterSim

FAST = TransferCost(rtt_s=0.05)


def _busy(n_waiting: int, cost: float = 100.0, rate: float = 100.0, running: float = 0.0) -> ClusterLoad:
    return ClusterLoad(1, running, [Waiting(f"q{i}", cost, 50) for i in range(n_waiting)], rate)


IDLE = ClusterLoad(0, 0.0, [], 100.0)


def test_idle_cluster_takes_the_tail_until_it_stops_paying() -> None:
    moves = offload_to_idle(IDLE, [_busy(10)], FAST)
    # Start delays where they wait: 0 ... 9 s; on the idle cluster 0, 1, 2 ... s plus 0.05 s.
    assert [m.request_id for m in moves] == ["q9", "q8", "q7", "q6", "q5"]
    assert all(m.from_cluster == 1 and m.to_cluster == 0 for m in moves)
    # Behind 10 s of running work every queued query starts sooner on the idle cluster.
    assert len(offload_to_idle(IDLE, [_busy(10, running=1000.0)], FAST)) == 10


def test_no_offload_when_transfer_costs_more_than_waiting() -> None:
    assert offload_to_idle(IDLE, [_busy(10)], TransferCost(rtt_s=60.0)) == []


def test_no_offload_from_a_short_queue() -> None:
    short = ClusterLoad(1, 0.0, [Waiting("only", 100.0, 50)], 100.0)
    assert offload_to_idle(IDLE, [short], FAST) == []


def test_busiest_cluster_is_relieved_first() -> None:
    light = ClusterLoad(2, 0.0, [Waiting("l0", 100.0, 50), Waiting("l1", 100.0, 50)], 100.0)
    moves = offload_to_idle(IDLE, [light, _busy(10)], FAST)
    assert moves[0].request_id == "q9"


def test_offload_recovers_a_mispredicted_split_in_the_simulator() -> None:
    """All long queries predicted short and sent to one cluster: back-off evens it out."""
    outputs = [600] * 30 + [20] * 30
    prompts = [20] * 60
    predicted = [35] * 60
    assignment = [0] * 30 + [1] * 30

    def run(offload):
        return MultiClusterSim(ClusterSpec(batch_limit=4), 2, prompts, outputs, predicted, offload).run(assignment)

    without, with_ = run(None), run(FAST)
    assert with_.offloaded > 0
    assert with_.makespan_s < 0.8 * without.makespan_s
    assert run(TransferCost(rtt_s=1e6)).offloaded == 0
