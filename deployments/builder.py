"""Builds the Serve application named by serve_config.yaml's import_path.

The gateway, the ingress and the pool replicas are plain classes that receive their
dependencies (deployments.gateway.Gateway, deployments.ingress.Ingress,
deployments.replica.LLMReplica); here they become Serve deployments: the subclasses below
build those dependencies inside the replica (the engine from the pool's config, the
replica context, the plan follower, the ingress handle) and add Serve's hooks, and
`serve.deployment` is applied to them. The gateway is the app's HTTP entry, or with
`gateway_replicas: 0` the ingress itself (`serve.ingress`).
"""

from __future__ import annotations

import functools
import os
from functools import partial
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from app.config import AppConfig, PoolConfig
from autoscaling.chiron.local import LocalAutoscalerConfig
from autoscaling.shadow_rollout import SHADOW_KEY, ShadowPool
from core.roles import BATCH_QUEUE_DEPLOYMENT
from deployments.batch_queue import BatchQueue
from deployments.gateway import Gateway, ModelRoutes, OtherApp, StartExchange
from deployments.ingress import Ingress
from deployments.kv_router import STATS_PERIOD_S
from deployments.metrics import GatewayMetrics
from deployments.plan_store import follow_plan
from deployments.rate_ledger import RateLimitGate, rate_ledger
from deployments.replica import LLMReplica, ReplicaIdentity
from deployments.splitwise_coordinator import SplitwiseCoordinator
from engines.factory import make_engine

ROUTERS = {"kv_aware": "deployments.kv_router:KvAwareRouter",
           "prefix_aware": "deployments.kv_router:PrefixAwareRouter",
           "token_balanced": "deployments.token_router:TokenBalancedRouter"}
PHASE_ROUTER = "deployments.phase_router:AssignedReplicaRouter"


class _ServedReplica(LLMReplica):
    """A pool replica in Serve: its engine built from the pool's config in this process."""

    def __init__(self, pool: str, engine_config: dict[str, Any], stream_flush_s: float = 0.05,
                 local_autoscaler: dict[str, Any] | None = None) -> None:
        context = serve.get_replica_context()
        super().__init__(
            pool, make_engine(engine_config),
            ReplicaIdentity(context.app_name, context.deployment, context.replica_id.unique_id),
            stream_flush_s, LocalAutoscalerConfig(**local_autoscaler) if local_autoscaler else None,
            follow_plan=partial(follow_plan, context.app_name),
        )

    async def __del__(self) -> None:
        if hasattr(self, "engine"):  # a replica whose engine failed to build has none to stop
            await self.shutdown()


class _ServedIngress(Ingress):
    """The ingress in Serve: its app config validated, the plan followed, rate limits held
    app-wide by the ledger; the gateway calls its `exchange` with each HTTP request."""

    def __init__(self, config: dict[str, Any], pools: dict[str, DeploymentHandle],
                 batch_queue: DeploymentHandle | None = None, splitwise: DeploymentHandle | None = None) -> None:
        app_name = serve.get_replica_context().app_name
        app_config = AppConfig.model_validate(config)
        rate_limits = RateLimitGate(app_config, app_name, ledger_of=partial(rate_ledger, app_name))
        super().__init__(app_config, pools, app_name, batch_queue, splitwise,
                         follow_plan=partial(follow_plan, app_name), rate_limits=rate_limits)


class _HttpIngress(_ServedIngress):
    """The ingress as the app's HTTP entry, when the app runs no gateway."""

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this in the replica after __init__: this replica's own app."""
        return self.http_app()


def _starter(ingress: DeploymentHandle) -> StartExchange:
    streaming = ingress.options(stream=True)
    return lambda http: streaming.exchange.remote(http)


def _other_app(app: str) -> OtherApp:
    """Another app's ingress (AppConfig.model_apps), found by name when first used: the
    apps of one config deploy side by side, so it may not exist when this one starts."""
    ingress = functools.cache(lambda: serve.get_deployment_handle("Ingress", app))

    async def models() -> list[str]:
        return [card["id"] for card in await ingress().model_cards.remote()]

    return OtherApp(lambda http: _starter(ingress())(http), models)


class _ServedGateway(Gateway):
    """The gateway in Serve: each request goes to an ingress replica Serve's router picks,
    of this app or of the app serving the request's model."""

    def __init__(self, ingress: DeploymentHandle, max_body_bytes: int, failover_s: float,
                 models: list[str] | None = None, model_apps: list[str] | None = None) -> None:
        routes = ModelRoutes(_starter(ingress), models or [], {app: _other_app(app) for app in model_apps or []})
        super().__init__(routes, max_body_bytes, failover_s, GatewayMetrics())


# A Batch API upload's form: the file plus its fields and boundaries.
_MULTIPART_OVERHEAD_BYTES = 1 << 20

ReplicaDeployment = serve.deployment(name="LLMReplica")(_ServedReplica)
IngressDeployment = serve.deployment(name="Ingress")(_ServedIngress)
HttpIngressDeployment = serve.deployment(name="Ingress")(serve.ingress()(_HttpIngress))
GatewayDeployment = serve.deployment(name="Gateway")(_ServedGateway)


def _pool_deployments(pool: PoolConfig, config: AppConfig) -> dict[str, Application]:
    """The pool's deployments: one, or for a shadow-TP pool one per TP option, the
    engine's own TP as `pool-<name>` and the others starting at 0 replicas."""
    by_tp = pool.deployments_by_tp()
    if len(by_tp) == 1:
        return {pool.deployment_name: _pool_deployment(pool, config)}
    return {name: _pool_deployment(pool, config, tp, ShadowPool(
        pool.deployment_name, by_tp, pool.autoscaling.min_replicas, pool.autoscaling.max_replicas))
            for tp, name in by_tp.items()}


def _pool_deployment(pool: PoolConfig, config: AppConfig, tp: int | None = None,
                     shadow: ShadowPool | None = None) -> Application:
    """One deployment of the pool, its engine at TP `tp` (the engine's own if None)."""
    tp = pool.engine.tensor_parallel if tp is None else tp
    scaling = pool.autoscaling
    routing: dict[str, Any] = {}
    # Splitwise: each phase goes to the replica the coordinator chose; "default": Serve's own.
    router = PHASE_ROUTER if pool.phase is not None else ROUTERS.get(pool.request_router)
    if router is not None:
        routing["request_router_config"] = {"request_router_class": router,
                                            "request_routing_stats_period_s": STATS_PERIOD_S}
        if pool.request_router == "prefix_aware" and config.prefix_cache is not None:
            routing["request_router_config"]["request_router_kwargs"] = {
                "block_tokens": config.prefix_cache.block_tokens, **config.prefix_cache.affinity.model_dump()}
    bounds: dict[str, Any] = {"min_replicas": scaling.min_replicas, "initial_replicas": scaling.initial_replicas}
    if shadow is not None:
        # Any of the pool's deployments may be emptied by a rollout; the pool's own bounds
        # travel to the controller (ShadowPool.entry), which keeps the pool within them.
        primary = shadow.deployments[tp] == shadow.name
        initial = scaling.min_replicas if scaling.initial_replicas is None else scaling.initial_replicas
        bounds = {"min_replicas": 0, "initial_replicas": initial if primary else 0,
                  "policy": {"policy_kwargs": {SHADOW_KEY: shadow.entry(tp)}}}
    prefix = {"prefix_block_tokens": config.prefix_cache.block_tokens} if config.prefix_cache is not None else {}
    engine = pool.engine.model_copy(update={"tensor_parallel": tp, **prefix})
    # GPUs, or a TP placement group, as the pool's engine needs
    from engines.vllm_placement import replica_resources

    return ReplicaDeployment.options(
        name=pool.deployment_name if shadow is None else shadow.deployments[tp],
        max_ongoing_requests=pool.max_ongoing_requests,
        max_queued_requests=pool.max_queued_requests,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        **replica_resources(engine, pool.num_cpus),
        autoscaling_config={
            **bounds,
            "max_replicas": scaling.max_replicas,
            "metrics_interval_s": scaling.metrics_interval_s,
            "look_back_period_s": scaling.look_back_period_s,
            # Our policy damps itself; Serve's delays would only add lag.
            "upscale_delay_s": 0,
            "downscale_delay_s": 0,
        },
        **routing,
    ).bind(pool.name, _engine_config(pool, engine), config.stream_flush_s,
           pool.local_autoscaler.model_dump() if pool.local_autoscaler else None)


def _engine_config(pool: PoolConfig, engine: Any) -> dict[str, Any]:
    """A mixed pool's replicas put interactive requests first (Chiron)."""
    config = engine.model_dump()
    if pool.kind == "mixed" and "interactive_first" in config:
        config["interactive_first"] = True
    return config


def _batch_queue(config: AppConfig) -> Application:
    """One replica owns the SQLite queue; autoscaled 1..1 so its metrics reach the policy."""
    # mypy keeps a class decorator's input type (python/mypy#3135): BatchQueue is a Deployment.
    return BatchQueue.options(  # type: ignore[attr-defined]
        name=BATCH_QUEUE_DEPLOYMENT,  # the name the policies read its request groups under
        ray_actor_options={"num_cpus": 0.05},
        autoscaling_config={"min_replicas": 1, "max_replicas": 1, "metrics_interval_s": 0.5,
                            "look_back_period_s": 2.0},
    ).bind(os.path.expanduser(config.batch_api.db_path), "Ingress", config.batch_api.max_in_flight,
           deferral=config.batch_api.deferral.model_dump())


def build_app(args: dict[str, Any]) -> Application:
    """`serve run serve_config.yaml` entry point: args are validated as AppConfig."""
    config = AppConfig.model_validate(args or {}).resolved()
    pools = {name: app for p in config.pools for name, app in _pool_deployments(p, config).items()}
    if len(pools) != sum(len(p.deployments_by_tp()) for p in config.pools):
        names = [name for p in config.pools for name in p.deployments_by_tp().values()]
        raise ValueError(f"pools[].tensor_parallel_options: deployment names collide ({names}); rename a pool whose "
                         "name ends in -tp<N>")
    spread: dict[str, Any] = {} if config.ingress_max_replicas_per_node is None else {
        "max_replicas_per_node": config.ingress_max_replicas_per_node}
    ingress = (IngressDeployment if config.gateway_replicas else HttpIngressDeployment).options(
        ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=config.ingress_max_ongoing_requests,
        num_replicas=config.ingress_replicas, **spread,
    )
    batch_queue = _batch_queue(config) if config.batch_api.enabled else None
    # mypy keeps a class decorator's input type (python/mypy#3135): this is a Deployment.
    splitwise = SplitwiseCoordinator.bind(  # type: ignore[attr-defined]
        {p.deployment_name: p.phase for p in config.pools}, config.splitwise.model_dump()
    ) if config.phase_split else None
    served = ingress.bind(config.model_dump(mode="json"), pools, batch_queue, splitwise)
    if not config.gateway_replicas:
        return served
    # On the head node, whose loss ends the cluster anyway; no CPU asked, as the head may offer none.
    gateway = GatewayDeployment.options(
        ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE_NAME: 0.001}},
        max_ongoing_requests=config.ingress_max_ongoing_requests * config.ingress_replicas,
        num_replicas=config.gateway_replicas,
    )
    return gateway.bind(served, config.max_file_bytes + _MULTIPART_OVERHEAD_BYTES, config.gateway_failover_s,
                        config.served_models(), config.model_apps)
