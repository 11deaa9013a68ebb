"""A deployment the plan empties keeps its replicas until the ingress has read the plan."""

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingContext

from autoscaling.handover import EmptyingHandover
from deployments.serve_adapter import AppAutoscalingPolicy
from core.plan import ClusterPlan


def test_emptied_deployments_keep_their_last_target_for_the_handover() -> None:
    handover = EmptyingHandover(handover_s=5)
    previous = {"pool-short": 2, "pool-long": 1}
    targets = {"pool-short": 0, "pool-long": 4}
    assert handover.hold(targets, previous, 100.0) == {"pool-short": 2, "pool-long": 4}
    # Serve now holds the kept target; it stays until handover_s has passed...
    assert handover.hold(targets, {"pool-short": 2, "pool-long": 4}, 104.9)["pool-short"] == 2
    assert handover.hold(targets, {"pool-short": 2, "pool-long": 4}, 105.0)["pool-short"] == 0
    # ...and once at 0 it is not held again.
    assert handover.hold(targets, {"pool-short": 0, "pool-long": 4}, 106.0)["pool-short"] == 0


def test_shrinking_is_not_held_and_a_pool_planned_back_up_ends_the_handover() -> None:
    handover = EmptyingHandover(handover_s=5)
    assert handover.hold({"a": 1}, {"a": 3}, 0.0) == {"a": 1}  # Serve routes around draining replicas
    assert handover.hold({"a": 0}, {"a": 1}, 1.0) == {"a": 1}
    assert handover.hold({"a": 2}, {"a": 1}, 2.0) == {"a": 2}
    # Emptied again later: a fresh handover from then, not the old one's remainder.
    assert handover.hold({"a": 0}, {"a": 2}, 5.5) == {"a": 2}
    assert handover.hold({"a": 0}, {"a": 2}, 10.4) == {"a": 2}
    assert handover.hold({"a": 0}, {"a": 2}, 10.5) == {"a": 0}


def _ctx(name: str, target: int, now_s: float) -> AutoscalingContext:
    dep = DeploymentID(name=name, app_name="wattwise")
    ids = [ReplicaID(unique_id=f"{name}-{i}", deployment_id=dep) for i in range(target)]
    return AutoscalingContext(
        deployment_id=dep, deployment_name=name, app_name="wattwise", current_num_replicas=target,
        target_num_replicas=target, running_replicas=ids, total_num_requests=float(target),
        total_queued_requests=0.0, aggregated_metrics={"running_requests": dict.fromkeys(ids, 1.0)},
        raw_metrics={}, capacity_adjusted_min_replicas=0, capacity_adjusted_max_replicas=4, policy_state={},
        last_scale_up_time=None, last_scale_down_time=None, current_time=now_s, config=None,
    )


def test_the_adapter_empties_a_pool_only_after_the_handover() -> None:
    """DynamoLLM folds pool-short into pool-long: the plan's routing moves at once, the
    replicas only once the ingress has had `handover_s` to read it."""
    adapter = AppAutoscalingPolicy(policy="utilisation", handover_s=3)
    adapter.policy.observe = lambda view, now: ClusterPlan(
        replicas={"pool-short": 0, "pool-long": 2}, routing_weights={"SS": {"pool-long": 1.0}})
    replicas = {"pool-short": 1, "pool-long": 2}
    history = []
    for now_s in (10.0, 11.0, 12.0, 13.0, 14.0):
        decisions, _ = adapter({c.deployment_id: c for c in (_ctx(n, r, now_s) for n, r in replicas.items())})
        replicas = {d.name: n for d, n in decisions.items()}
        history.append(replicas["pool-short"])
    assert history == [1, 1, 1, 0, 0]
