"""Builds the Serve application named by serve_config.yaml's import_path."""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application

from app.config import AppConfig, PoolConfig
from deployments.batch_queue import BatchQueue
from deployments.ingress import Ingress
from deployments.replica import LLMReplica
from deployments.splitwise_coordinator import SplitwiseCoordinator

TOKEN_ROUTER = "deployments.token_router:TokenBalancedRouter"
PHASE_ROUTER = "deployments.phase_router:AssignedReplicaRouter"


def _pool_deployment(pool: PoolConfig, stream_flush_s: float) -> Application:
    scaling = pool.autoscaling
    routing = {}
    if pool.request_router == "token_balanced":
        routing["request_router_config"] = {"request_router_class": TOKEN_ROUTER, "request_routing_stats_period_s": 1.0}
    if pool.phase is not None:  # Splitwise: each phase goes to the replica the coordinator chose
        routing["request_router_config"] = {"request_router_class": PHASE_ROUTER, "request_routing_stats_period_s": 1.0}
    # GPUs, or a TP placement group, as the pool's engine needs
    from engines.vllm_placement import replica_resources

    return LLMReplica.options(
        name=pool.deployment_name,
        max_ongoing_requests=pool.max_ongoing_requests,
        max_queued_requests=pool.max_queued_requests,
        **replica_resources(pool.engine, pool.num_cpus),
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
    ).bind(pool.name, _engine_config(pool), stream_flush_s,
           pool.local_autoscaler.model_dump() if pool.local_autoscaler else None)


def _engine_config(pool: PoolConfig) -> dict[str, Any]:
    """A mixed pool's replicas put interactive requests first (Chiron)."""
    engine = pool.engine.model_dump()
    if pool.kind == "mixed" and "interactive_first" in engine:
        engine["interactive_first"] = True
    return engine


def _batch_queue(config: AppConfig) -> Application:
    """One replica owns the SQLite queue; autoscaled 1..1 so its metrics reach the policy."""
    return BatchQueue.options(
        ray_actor_options={"num_cpus": 0.05},
        autoscaling_config={"min_replicas": 1, "max_replicas": 1, "metrics_interval_s": 0.5,
                            "look_back_period_s": 2.0},
    ).bind(os.path.expanduser(config.batch_api.db_path), "Ingress", config.batch_api.max_in_flight)


def build_app(args: dict[str, Any]) -> Application:
    """`serve run serve_config.yaml` entry point: args are validated as AppConfig."""
    config = AppConfig.model_validate(args or {})
    pools = {p.deployment_name: _pool_deployment(p, config.stream_flush_s) for p in config.pools}
    ingress = Ingress.options(
        ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=config.ingress_max_ongoing_requests
    )
    batch_queue = _batch_queue(config) if config.batch_api.enabled else None
    splitwise = SplitwiseCoordinator.bind(
        {p.deployment_name: p.phase for p in config.pools}, config.splitwise.model_dump()
    ) if config.phase_split else None
    return ingress.bind(config.model_dump(mode="json"), pools, batch_queue, splitwise)
