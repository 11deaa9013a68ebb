"""/admin/*: operator endpoints of the ingress, each behind an admin key (app.auth).

Reads report what the app holds (pools, plan, profiles, request outcomes, Splitwise
state); changes (clock and TP pins, drains) go through the plan store, so the replicas
apply them and only the node's privileged GPU-control actor touches clocks; TP pins go
to the controller, which rolls a shadow-TP pool over to its deployment of that TP.
Every action is logged by the key's name, never the key. The routes are an `APIRouter`
over the ingress's state (deployments.ingress_state); errors are raised as APIError and
answered by the app's one handler (deployments.http_app).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest

from app.cloud_load import CloudLoad, cloud_load
from app.config import AdminKey, PoolConfig
from app.openai_api import APIError, openapi_body
from deployments.admin import (
    ClockRequest,
    DrainRequest,
    TensorParallelRequest,
    deployed_policy,
    profiles_in_use,
)
from deployments.http_app import ingress_state
from deployments.ingress_state import IngressState
from deployments.plan_store import plan_store
from energy.hardware import GPUS

logger = logging.getLogger("ray.serve")
router = APIRouter()
State = Annotated[IngressState, Depends(ingress_state)]


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


def _admin(state: IngressState, http: HTTPRequest, reading: str | None) -> AdminKey:
    key = state.admin(http)
    if reading:
        _audit(key, reading, change=False)
    return key


@router.get("/admin/pools")
async def admin_pools(http: HTTPRequest, state: State) -> Any:
    """Per deployment: replica counts as Serve reports them (dashboards, the demo), its
    pool and TP, the deployment serving that pool and the pool's TP rollout, if any."""
    _admin(state, http, "read pools")
    status = await asyncio.to_thread(state.pools_status)
    store = await plan_store(state.app_name).admin_view.remote()
    plan_tp = (store["plan"] or {}).get("tensor_parallel", {})
    rollouts = store.get("rollouts") or {}
    for pool in state.config.pools:
        rollout = rollouts.get(pool.deployment_name) or {}
        serving = rollout.get("serving", pool.deployment_name)
        for tp, name in pool.deployments_by_tp().items():
            if name in status:
                status[name].update({
                    "pool": pool.deployment_name, "tensor_parallel": plan_tp.get(name, tp),
                    "serving_deployment": serving, "serving": name == serving,
                    "rollout": rollout.get("rollout"), "rollout_outcomes": rollout.get("outcomes", {})})
    return status


@router.get("/admin/requests")
def admin_requests(http: HTTPRequest, state: State) -> Any:
    """This ingress replica's accepted / outcome / retry counts since it started: every
    accepted request must show up as exactly one outcome (fault tests, soak bench)."""
    _admin(state, http, "read request counts")
    return dict(state.metrics.counts)


@router.get("/admin/load", response_model=CloudLoad)
async def admin_load(http: HTTPRequest, state: State) -> CloudLoad:
    """What a federation front balances this app by: its replicas' outstanding tokens and
    rate as the controller last summed them (`at_s`; null before its first view), and the
    GPUs its pools may scale to."""
    _admin(state, http, "read load")
    view = await plan_store(state.app_name).last_load.remote()
    return cloud_load(view, state.config.capacity_gpus)


@router.get("/admin/splitwise")
async def admin_splitwise(http: HTTPRequest, state: State) -> Any:
    """The Splitwise coordinator's roles, pending and assigned tokens, transfer counts."""
    _admin(state, http, "read splitwise")
    if state.phase_split is None:
        raise APIError(404, "This app has no prompt/token split (no `splitwise:` block).", code="not_found")
    return await state.phase_split.coordinator.stats.remote()


@router.get("/admin/plan")
async def admin_plan(http: HTTPRequest, state: State) -> Any:
    """The controller's last published plan, the operators' overrides, drained pools."""
    _admin(state, http, "read plan")
    view = await plan_store(state.app_name).admin_view.remote()
    return {**view, "drained": sorted(view["overrides"].get("drained", {}))}


@router.get("/admin/profiles")
async def admin_profiles(http: HTTPRequest, state: State) -> Any:
    """The energy profiles the autoscaling policy plans with ([] for policies without)."""
    _admin(state, http, "read profiles")
    try:
        kwargs = await asyncio.to_thread(deployed_policy, state.app_name)
        return {"object": "list", "data": await asyncio.to_thread(profiles_in_use, kwargs)}
    except (OSError, ValueError, KeyError) as exc:
        raise APIError(500, f"The policy's energy profile cannot be read ({exc}).", "server_error",
                       code="profile_unreadable") from None


@router.post("/admin/clocks", openapi_extra=openapi_body(ClockRequest))
async def admin_clocks(http: HTTPRequest, state: State) -> Any:
    """Pin a pool's GPU clock. It goes into the plan store as an override: the pool's
    replicas apply it and forward it to their node's GPU-control actor (the only code
    that touches NVML); the ingress never sets clocks itself."""
    return await _pin(state, http, ClockRequest, "clock_mhz", _check_clock)


@router.post("/admin/tensor_parallel", openapi_extra=openapi_body(TensorParallelRequest))
async def admin_tensor_parallel(http: HTTPRequest, state: State) -> Any:
    """Pin a pool's TP over the policy's choice (null unpins). The controller applies
    it: a shadow-TP pool rolls over to its deployment of that TP (GET /admin/pools
    shows the rollout), an in-place pool's replicas re-shard."""
    return await _pin(state, http, TensorParallelRequest, "tensor_parallel", _check_tensor_parallel)


async def _pin(state: IngressState, http: HTTPRequest, model: type[ClockRequest | TensorParallelRequest],
               field: str, check: Callable[[PoolConfig, int], None]) -> Any:
    """An operator's pin of one plan field of a pool (null unpins), checked against the
    pool and kept in the plan store over every plan until unpinned."""
    key = _admin(state, http, None)
    body = await state.parse(http, model, check_model=False)
    pool = state.pool_config(body.pool)
    value = getattr(body, field)
    if value is not None:
        check(pool, value)
    version = await plan_store(state.app_name).override.remote(field, pool.deployment_name, value)
    _audit(key, f"{field} of {pool.deployment_name} -> {value} (plan version {version})")
    return {"pool": pool.deployment_name, field: value, "plan_version": version}


@router.post("/admin/drain", openapi_extra=openapi_body(DrainRequest))
async def admin_drain(http: HTTPRequest, state: State) -> Any:
    """Stop (drain: true) or resume routing new requests to a pool; requests already
    on it finish. Kept in the plan store: this ingress replica applies it at once,
    the others when they next read the plan (within a second)."""
    key = _admin(state, http, None)
    body = await state.parse(http, DrainRequest, check_model=False)
    name = state.pool_config(body.pool).deployment_name
    store = plan_store(state.app_name)
    version = await store.override.remote("drained", name, True if body.drain else None)
    drained = await store.overrides_of.remote("drained")
    state.drained = set(drained)
    _audit(key, f"{'drained' if body.drain else 'resumed'} {name} (plan version {version})")
    return {"pool": name, "drained": body.drain, "all_drained": sorted(drained), "plan_version": version}
