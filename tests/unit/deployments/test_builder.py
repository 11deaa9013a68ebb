"""The app's HTTP entry as the builder wires it (the deployed app is tested in tests/ray)."""

from __future__ import annotations

from typing import Any

import yaml
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.serve.deployment import Application

from core.paths import SERVE_CONFIG
from deployments.builder import ROUTERS, build_app


def _args(**changes: Any) -> dict[str, Any]:
    return {**yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"], **changes}


def test_the_gateway_is_the_http_entry_on_the_head_node() -> None:
    entry = build_app(_args(gateway_replicas=3))._bound_deployment
    assert entry.name == "Gateway" and entry.num_replicas == 3
    assert entry.ray_actor_options["resources"] == {HEAD_NODE_RESOURCE_NAME: 0.001}
    assert entry.ray_actor_options["num_cpus"] == 0  # a head may offer no CPU to replicas


def test_without_a_gateway_the_ingress_takes_http() -> None:
    entry = build_app(_args(gateway_replicas=0))._bound_deployment
    assert entry.name == "Ingress"


def test_the_pools_route_by_kv_room_as_the_simulator_does() -> None:
    """serve_config.yaml's pools take the rank the simulator's dispatch uses (core.replica_choice)."""
    ingress = build_app(_args(gateway_replicas=0))._bound_deployment
    handles = [h for arg in ingress.init_args if isinstance(arg, dict) for h in arg.values()]
    pools = [h._bound_deployment for h in handles
             if isinstance(h, Application) and h._bound_deployment.name.startswith("pool-")]
    assert {p.name for p in pools} == {"pool-short", "pool-medium", "pool-long"}
    for pool in pools:
        assert pool._deployment_config.request_router_config.request_router_class == ROUTERS["kv_aware"]
