"""A deployment the plan empties keeps its replicas until the ingress has read the plan."""

from ray.serve.config import AutoscalingContext

from autoscaling.handover import EmptyingHandover
from core.plan import ClusterPlan
from deployments.serve_adapter import AppAutoscalingPolicy
from tests.factories import autoscaling_context


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
    return autoscaling_context(name, target, {"running_requests": 1.0}, min_replicas=0, max_replicas=4, now_s=now_s)


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
