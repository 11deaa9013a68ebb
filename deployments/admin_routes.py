"""/admin/*: operator endpoints of the ingress, each behind an admin key (app.auth).

Reads report what the app holds (pools, plan, profiles, request outcomes, Splitwise
state); changes (clock and TP pins, drains) go through the plan store, so the replicas
apply them and only the node's privileged GPU-control actor touches clocks; TP pins go
to the controller, which rolls a shadow-TP pool over to its deployment of that TP.
Every action is logged by the key's name, never the key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import Request as HTTPRequest
from pydantic import BaseModel
from ray import serve

from app.config import AdminKey, PoolConfig
from app.openai_api import APIError, openapi_body
from deployments.admin import (
    ClockRequest,
    DrainRequest,
    TensorParallelRequest,
    deployed_policy,
    profiles_in_use,
)
from deployments.http_app import error_response, fastapi_app
from deployments.plan_store import plan_store
from energy.hardware import GPUS

logger = logging.getLogger("ray.serve")


def _audit(key: AdminKey, action: str, change: bool = True) -> None:
    """Who did what on /admin/*, by the key's name (never the key); reads (polled by
    dashboards) only at debug level."""
    logger.log(logging.INFO if change else logging.DEBUG, "wattwise admin %r: %s", key.name, action)


def _check_clock(pool: PoolConfig, clock_mhz: int) -> None:
    gpu = GPUS[pool.engine.hardware]
    if not gpu.min_clock_mhz <= clock_mhz <= gpu.max_clock_mhz:
        raise APIError(400, f"Invalid value for 'clock_mhz': {pool.engine.hardware} supports "
                       f"{gpu.min_clock_mhz}-{gpu.max_clock_mhz} MHz.", param="clock_mhz")


def _check_tensor_parallel(pool: PoolConfig, tensor_parallel: int) -> None:
    if tensor_parallel not in pool.tp_degrees:
        raise APIError(400, f"Invalid value for 'tensor_parallel': pool {pool.name!r} runs at "
                       f"{pool.tp_degrees} (its tensor_parallel_options).", param="tensor_parallel")


class AdminRoutes:
    """Mixed into the Ingress deployment (which holds config, pools, auth, metrics)."""

    @fastapi_app.get("/admin/pools")
    async def admin_pools(self, http: HTTPRequest) -> Any:
        """Per deployment: replica counts as Serve reports them (dashboards, the demo), its
        pool and TP, the deployment serving that pool and the pool's TP rollout, if any."""
        try:
            self._admin(http, "read pools")
        except APIError as err:
            return error_response(err)
        status = await asyncio.to_thread(self.pools_status)
        store = await plan_store(self.app_name).admin_view.remote()
        plan_tp = (store["plan"] or {}).get("tensor_parallel", {})
        rollouts = store.get("rollouts") or {}
        for pool in self.config.pools:
            rollout = rollouts.get(pool.deployment_name) or {}
            serving = rollout.get("serving", pool.deployment_name)
            for tp, name in pool.deployments_by_tp().items():
                if name in status:
                    status[name].update({
                        "pool": pool.deployment_name, "tensor_parallel": plan_tp.get(name, tp),
                        "serving_deployment": serving, "serving": name == serving,
                        "rollout": rollout.get("rollout"), "rollout_outcomes": rollout.get("outcomes", {})})
        return status

    @fastapi_app.get("/admin/requests")
    def admin_requests(self, http: HTTPRequest) -> Any:
        """This ingress replica's accepted / outcome / retry counts since it started: every
        accepted request must show up as exactly one outcome (fault tests, soak bench)."""
        try:
            self._admin(http, "read request counts")
        except APIError as err:
            return error_response(err)
        return dict(self.metrics.counts)

    @fastapi_app.get("/admin/splitwise")
    async def admin_splitwise(self, http: HTTPRequest) -> Any:
        """The Splitwise coordinator's roles, pending and assigned tokens, transfer counts."""
        try:
            self._admin(http, "read splitwise")
            if self.phase_split is None:
                raise APIError(404, "This app has no prompt/token split (no `splitwise:` block).", code="not_found")
        except APIError as err:
            return error_response(err)
        return await self.phase_split.coordinator.stats.remote()

    @fastapi_app.get("/admin/plan")
    async def admin_plan(self, http: HTTPRequest) -> Any:
        """The controller's last published plan, the operators' overrides, drained pools."""
        try:
            self._admin(http, "read plan")
        except APIError as err:
            return error_response(err)
        view = await plan_store(self.app_name).admin_view.remote()
        return {**view, "drained": sorted(view["overrides"].get("drained", {}))}

    @fastapi_app.get("/admin/profiles")
    async def admin_profiles(self, http: HTTPRequest) -> Any:
        """The energy profiles the autoscaling policy plans with ([] for policies without)."""
        try:
            self._admin(http, "read profiles")
            kwargs = await asyncio.to_thread(deployed_policy, self.app_name)
            return {"object": "list", "data": await asyncio.to_thread(profiles_in_use, kwargs)}
        except APIError as err:
            return error_response(err)
        except (OSError, ValueError, KeyError) as exc:
            return error_response(APIError(500, f"The policy's energy profile cannot be read ({exc}).",
                                            "server_error", code="profile_unreadable"))

    @fastapi_app.post("/admin/clocks", openapi_extra=openapi_body(ClockRequest))
    async def admin_clocks(self, http: HTTPRequest) -> Any:
        """Pin a pool's GPU clock. It goes into the plan store as an override: the pool's
        replicas apply it and forward it to their node's GPU-control actor (the only code
        that touches NVML); the ingress never sets clocks itself."""
        return await self._pin(http, ClockRequest, "clock_mhz", _check_clock)

    @fastapi_app.post("/admin/tensor_parallel", openapi_extra=openapi_body(TensorParallelRequest))
    async def admin_tensor_parallel(self, http: HTTPRequest) -> Any:
        """Pin a pool's TP over the policy's choice (null unpins). The controller applies
        it: a shadow-TP pool rolls over to its deployment of that TP (GET /admin/pools
        shows the rollout), an in-place pool's replicas re-shard."""
        return await self._pin(http, TensorParallelRequest, "tensor_parallel", _check_tensor_parallel)

    async def _pin(self, http: HTTPRequest, model: type[BaseModel], field: str,
                   check: Callable[[PoolConfig, int], None]) -> Any:
        """An operator's pin of one plan field of a pool (null unpins), checked against the
        pool and kept in the plan store over every plan until unpinned."""
        try:
            key = self._admin(http, None)
            body = await self._parse(http, model, check_model=False)
            pool = self._pool_config(body.pool)
            value = getattr(body, field)
            if value is not None:
                check(pool, value)
            version = await plan_store(self.app_name).override.remote(field, pool.deployment_name, value)
        except APIError as err:
            return error_response(err)
        _audit(key, f"{field} of {pool.deployment_name} -> {value} (plan version {version})")
        return {"pool": pool.deployment_name, field: value, "plan_version": version}

    @fastapi_app.post("/admin/drain", openapi_extra=openapi_body(DrainRequest))
    async def admin_drain(self, http: HTTPRequest) -> Any:
        """Stop (drain: true) or resume routing new requests to a pool; requests already
        on it finish. Kept in the plan store: this ingress replica applies it at once,
        the others when they next read the plan (within a second)."""
        try:
            key = self._admin(http, None)
            body = await self._parse(http, DrainRequest, check_model=False)
            name = self._pool_config(body.pool).deployment_name
            store = plan_store(self.app_name)
            version = await store.override.remote("drained", name, True if body.drain else None)
            drained = await store.overrides_of.remote("drained")
        except APIError as err:
            return error_response(err)
        self.drained = set(drained)
        _audit(key, f"{'drained' if body.drain else 'resumed'} {name} (plan version {version})")
        return {"pool": name, "drained": body.drain, "all_drained": sorted(drained), "plan_version": version}

    def _admin(self, http: HTTPRequest, reading: str | None) -> AdminKey:
        key = self.auth.admin(http.headers.get("authorization"))
        if reading:
            _audit(key, reading, change=False)
        return key

    def _pool_config(self, name: str) -> PoolConfig:
        for pool in self.config.pools:
            if name in (pool.name, pool.deployment_name):
                return pool
        raise APIError(404, f"No pool {name!r}; pools: {[p.name for p in self.config.pools]}.", param="pool",
                       code="pool_not_found")

    def _undrained(self, pool: str) -> str:
        """`pool`, or while it is drained the next pool in config order that is not (a
        larger-request pool serves smaller requests, as DynamoLLM's spill does)."""
        if pool not in self.drained:
            return pool
        order = [p.deployment_name for p in self.config.pools]
        i = order.index(pool)
        for other in order[i + 1:] + order[:i][::-1]:
            if other not in self.drained:
                return other
        raise APIError(503, "Every pool is drained by an operator; retry later.", "overloaded",
                       code="pools_drained", retry_after_s=5)

    def pools_status(self) -> dict[str, Any]:
        """Replica counts per pool as Serve reports them."""
        status = serve.status().applications[serve.get_replica_context().app_name]
        return {
            name: {"status": str(dep.status), "replicas": {str(getattr(k, "value", k)): n for k, n in dep.replica_states.items()}}
            for name, dep in status.deployments.items()
            if name in self.pools
        }
