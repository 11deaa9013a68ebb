"""Builders shared by the tests: Serve's AutoscalingContext for the adapter's pure tests,
and the test edit of serve_config.yaml (keys, tracing, a quick-to-react policy) that the
Ray tier's apps start from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingContext

from app.config import hash_key

APP = "wattwise"
INTERACTIVE_KEY = "sk-test-interactive"
BATCH_KEY = "sk-test-batch"
LIMITED_KEY = "sk-test-limited"


def autoscaling_context(name: str = "pool-a", replicas: int = 1,
                        metrics: Mapping[str, float | Sequence[float]] | None = None, *,
                        total_requests: float | None = None, min_replicas: int = 1, max_replicas: int = 5,
                        now_s: float = 100.0, config: Any = None) -> AutoscalingContext:
    """What Serve hands a custom autoscaling policy for one deployment of `replicas` running
    replicas (`{name}-0`, `{name}-1`, ...). `metrics` maps a replica metric to one value for
    every replica or to a list with one value per replica; `total_requests` defaults to the
    replicas' running_requests (nothing queued outside them)."""
    dep = DeploymentID(name=name, app_name=APP)
    ids = [ReplicaID(unique_id=f"{name}-{i}", deployment_id=dep) for i in range(replicas)]
    aggregated: dict[str, dict[ReplicaID, float]] = {}
    for metric, value in (metrics or {}).items():
        values = [float(v) for v in value] if isinstance(value, Sequence) else [float(value)] * replicas
        aggregated[metric] = dict(zip(ids, values, strict=True))
    if total_requests is None:
        total_requests = sum(aggregated.get("running_requests", {}).values())
    return AutoscalingContext(
        deployment_id=dep, deployment_name=name, app_name=APP, current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=ids, total_num_requests=float(total_requests),
        total_queued_requests=0.0, aggregated_metrics=aggregated, raw_metrics={},
        capacity_adjusted_min_replicas=min_replicas, capacity_adjusted_max_replicas=max_replicas, policy_state={},
        last_scale_up_time=None, last_scale_down_time=None, current_time=now_s, config=config,
    )


def by_deployment(*contexts: AutoscalingContext) -> dict[DeploymentID, AutoscalingContext]:
    """The mapping a Serve application-level policy is called with."""
    return {c.deployment_id: c for c in contexts}


def quick_config(config: dict[str, Any]) -> None:
    """The shipped config, with test keys, full tracing and a quick-to-react policy: the Ray
    tests exercise the HTTP surface and the replicas, so the utilisation policy (scale at 4
    requests per replica, shrink after 3 s) stands in for the one controller, which
    tests/ray/test_wattwise_serve.py runs as shipped."""
    config["tracing_config"]["sampling_ratio"] = 1.0
    app = config["applications"][0]
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation", "target_requests_per_replica": 4,
                                                  "downscale_hold_s": 3}
    app["args"]["api_keys"] = [
        {"sha256": hash_key(INTERACTIVE_KEY), "tenant": "acme", "service_class": "interactive"},
        {"sha256": hash_key(BATCH_KEY), "tenant": "acme-batch", "service_class": "batch"},
        {"sha256": hash_key(LIMITED_KEY), "tenant": "small", "requests_per_s": 0.2},  # burst of 1 request
    ]
    for pool in app["args"]["pools"]:
        pool["autoscaling"]["max_replicas"] = 3
    # One gateway process less per app on a 2-core CI machine running several apps at once;
    # its failover is tested under a gateway of its own (unit) and across nodes (test_node_loss).
    app["args"]["gateway_replicas"] = 1
    # The utilisation policy would empty an idle pool, and a test's next request wait for a replica.
    keep_every_pool(config)


def one_entry(config: dict[str, Any]) -> None:
    """One ingress and one gateway replica, for a test of what lies behind the entry (a pool's
    policy, router or phases), which two of each only make slower to start: each is a process
    of ~6-15 s of CPU on a 2-core CI machine starting several apps. Failover between entries
    is tested where it is the point (test_node_loss, test_faults, the gateway's unit tests)."""
    args = config["applications"][0]["args"]
    args["ingress_replicas"] = 1
    args["gateway_replicas"] = 1


def keep_every_pool(config: dict[str, Any]) -> None:
    """Every pool keeps a replica: the shipped short and medium pools have min_replicas 0 so
    that the one controller may fold them at low load, which a test of other behaviour
    (admin calls on pool-short, replica counts) must not meet half-way through."""
    for pool in config["applications"][0]["args"]["pools"]:
        pool["autoscaling"]["min_replicas"] = max(pool["autoscaling"].get("min_replicas", 1), 1)
        # ... and starts at it: the shipped long pool starts at two, which the utilisation
        # policy may shrink at any moment, so a count read by a test would race it.
        pool["autoscaling"]["initial_replicas"] = pool["autoscaling"]["min_replicas"]
