"""Builds the Serve application named by serve_config.yaml's import_path."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from app.config import AppConfig, PoolConfig
from deployments.ingress import Ingress
from deployments.replica import LLMReplica

TOKEN_ROUTER = "deployments.token_router:TokenBalancedRouter"


def _pool_deployment(pool: PoolConfig, stream_flush_s: float) -> Application:
    scaling = pool.autoscaling
    routing = {}
    if pool.request_router == "token_balanced":
        routing["request_router_config"] = {"request_router_class": TOKEN_ROUTER, "request_routing_stats_period_s": 1.0}
    return LLMReplica.options(
        name=pool.deployment_name,
        max_ongoing_requests=pool.max_ongoing_requests,
        max_queued_requests=pool.max_queued_requests,
        ray_actor_options={"num_cpus": pool.num_cpus},
        autoscaling_config={
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "initial_replicas": scaling.initial_replicas,
            "metrics_interval_s": scaling.metrics_interval_s,
            "look_back_period_s": scaling.look_back_period_s,
            # Our policy damps itself; Serve's delays would only add lag.
            "upscale_delay_s": 0,
            "downscale_delay_s": 0,
        },
        **routing,
    ).bind(pool.name, pool.engine.model_dump(), stream_flush_s)


def build_app(args: dict[str, Any]) -> Application:
    """`serve run serve_config.yaml` entry point: args are validated as AppConfig."""
    config = AppConfig.model_validate(args or {})
    pools = {p.deployment_name: _pool_deployment(p, config.stream_flush_s) for p in config.pools}
    ingress = Ingress.options(
        ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=config.ingress_max_ongoing_requests
    )
    return ingress.bind(config.model_dump(mode="json"), pools)
