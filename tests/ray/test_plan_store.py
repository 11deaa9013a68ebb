"""The plan store in Ray (one node; issue 18 item 1): killed, it comes back with its plan and
operator settings; killed for good, readers recreate it by name with the same state. The
pure half (re-publishing, resumed reports) is tests/unit/deployments/test_plan_recovery.py."""

from __future__ import annotations

import os
import time

import pytest
from ray.exceptions import ActorDiedError

from core.plan import ClusterPlan
from deployments.serve_adapter import ControllerMetrics


@pytest.mark.ray
def test_the_plan_store_survives_kills_with_plan_and_overrides() -> None:
    import ray

    from deployments.plan_store import PlanReply, plan_store
    from tests.local_ray import init_local_ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    init_local_ray(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        app = f"recovery-{os.getpid()}"
        store = plan_store(app)
        ray.get(store.publish.remote({"replicas": {"pool-a": 2}, "clock_mhz": {"pool-a": 1400}}, {}))
        ray.get(store.override.remote("clock_mhz", "pool-a", 1100))
        ray.get(store.override.remote("drained", "pool-b", True))
        before: PlanReply = ray.get(store.get.remote())
        ray.kill(store, no_restart=False)  # as if its node died: Ray restarts it
        after: PlanReply = ray.get(store.get.remote(), timeout=120)
        assert after == before and after.plan["clock_mhz"] == {"pool-a": 1100}
        assert after.plan["drained"] == {"pool-b": True}
        ray.kill(store, no_restart=True)  # gone for good: a reader looks it up again
        # The kill is asynchronous: a call sent meanwhile may still be answered.
        deadline = time.monotonic() + 120
        while not _dead(store):
            assert time.monotonic() < deadline, "the plan store still answers 120 s after its kill"
            time.sleep(0.5)
        again: PlanReply = ray.get(plan_store(app).get.remote(), timeout=120)
        assert again == before
        # The controller's gauges export from the first call, counters at 0 (Ray refuses inc(0)).
        metrics = ControllerMetrics(app)
        metrics.plan(ClusterPlan(replicas={"pool-a": 2}, tensor_parallel={"pool-a": 4},
                                 clock_band_mhz={"pool-a": (1100, 1980)}, routing_weights={"SS": {"pool-a": 1.0}},
                                 slo_guard={"LM": 60.0}),
                     version=1, age_s=0.0)
        metrics.record(None)
    finally:
        ray.shutdown()


def _dead(actor) -> bool:
    import ray

    try:
        ray.get(actor.get.remote(), timeout=120)
    except ActorDiedError:
        return True
    return False
