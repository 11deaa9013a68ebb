"""throttLL'eM's engine-size autoscaler: smallest sufficient TP, grace period against down-scaling."""

import pytest

from autoscaling.registry import make_policy
from autoscaling.throttllem.autoscaler import ThrottllemAutoscaler
from autoscaling.throttllem.config import ThrottllemScalingConfig
from core.stats import ReplicaStats
from core.view import ClusterView, DeploymentView


def view(rps: float, tp: int) -> ClusterView:
    stats = ReplicaStats(tensor_parallel=tp, class_rates_per_s={"MM": rps})
    return ClusterView({"pool": DeploymentView("pool", 1, 1, 1, 1, (stats,))})


def test_grace_period_blocks_down_scaling_but_not_up_scaling():
    policy = ThrottllemAutoscaler(ThrottllemScalingConfig(max_load_rps={2: 1.0, 4: 2.0, 8: 3.0}, spawn_s=30,
                                                          monitor_interval_s=10))
    assert policy.observe(view(2.5, 8), 0.0).tensor_parallel == {"pool": 8}  # right size: grace to 30 s
    for t in (10.0, 20.0):  # load fell, but the engine is still in its grace period
        assert policy.observe(view(0.5, 8), t).tensor_parallel == {"pool": 8}
    assert policy.observe(view(0.5, 8), 30.0).tensor_parallel == {"pool": 2}
    assert policy.observe(view(2.5, 2), 40.0).tensor_parallel == {"pool": 8}  # up at once, grace or not
    assert policy.observe(view(0.5, 8), 45.0).tensor_parallel == {"pool": 8}  # between monitor ticks


def test_registered_and_sized_from_the_capacity_model():
    policy = make_policy("throttllem")
    loads = list(policy.max_load_rps.values())
    assert list(policy.max_load_rps) == [2, 4, 8] and loads == sorted(loads) and loads[0] > 0


def test_max_loads_leave_the_kv_its_admission_reserves():
    """A TP2 engine's KV (~50k tokens) holds conv's steady batch at its TBT-bound rate only to the
    last block: judged with the KV kept free, its max load is lower; a TP whose KV is ample keeps
    its TBT-bound rate."""
    full = ThrottllemAutoscaler(ThrottllemScalingConfig(kv_budget=1.0)).max_load_rps
    kept = ThrottllemAutoscaler(ThrottllemScalingConfig(kv_budget=0.8)).max_load_rps
    assert kept[2] < 0.95 * full[2]
    assert kept[8] == full[8]


def test_picks_among_the_sizes_it_is_given_only():
    """Without TP2 among its options, a load TP2 carries gets the smallest size allowed; a size the
    max loads do not know is refused when the policy is made, not at the first decision."""
    loads = {2: 1.0, 4: 2.0, 8: 3.0}
    policy = ThrottllemAutoscaler(ThrottllemScalingConfig(max_load_rps=loads, tensor_parallel_options=[4, 8]))
    assert list(policy.max_load_rps) == [4, 8]
    assert policy.wanted_tp(0.5) == 4
    assert policy.wanted_tp(2.5) == 8
    with pytest.raises(ValueError, match="TP\\[2, 4, 8\\] only"):
        ThrottllemAutoscaler(ThrottllemScalingConfig(max_load_rps=loads, tensor_parallel_options=[16]))
