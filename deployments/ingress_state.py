"""What the ingress's HTTP routes share: the app's config, its pools, who may call, what
operators drained and which deployment serves each pool now.

One `IngressState` per ingress replica, built by the Ingress and handed to the route
groups (deployments.admin_routes, deployments.batch_routes, the OpenAI routes of
deployments.ingress) through FastAPI's dependency injection: the routes depend on this
object, not on each other or on the Ingress class.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ValidationError
from ray.serve.handle import DeploymentHandle

from app.auth import Authenticator, Tenant
from app.config import AdminKey, AppConfig, PoolConfig
from app.federation_wire import ADMIN_KEY_HEADER
from app.http_io import read_limited_body
from app.openai_api import APIError, invalid_request
from core.published_plan import PublishedPlan
from deployments.admin import app_details
from deployments.metrics import IngressMetrics
from deployments.phase_split import PhaseSplit

SERVICE_CLASS_HEADER = "x-service-class"
Body = TypeVar("Body", bound=BaseModel)


def serve_pool_status(app_name: str, pools: set[str]) -> dict[str, Any]:
    """Status (Serve's DeploymentStatus value, e.g. "HEALTHY") and replica counts by state per
    pool deployment as Serve reports them (deployments.admin.app_details)."""
    deployments = app_details(app_name).get("deployments", {})
    return {
        name: {"status": _value(dep["status"]),
               "replicas": dict(Counter(_value(r["state"]) for r in dep.get("replicas", [])))}
        for name, dep in deployments.items()
        if name in pools
    }


def _value(enum_or_str: Any) -> str:
    """Serve's details carry its status enums as members or, once serialised, as strings."""
    return str(getattr(enum_or_str, "value", enum_or_str))


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body's JSON object, or a 400."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, too deep, huge integers
        raise APIError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "Request body must be a JSON object.", code="invalid_json")
    return data


class IngressState:
    def __init__(self, config: AppConfig, pools: dict[str, DeploymentHandle], app_name: str,
                 batch_queue: DeploymentHandle | None = None, phase_split: PhaseSplit | None = None,
                 pool_status: Callable[[str, set[str]], dict[str, Any]] = serve_pool_status) -> None:
        self.config = config
        self.pools = pools  # every pool's deployments, shadow-TP ones included
        self.app_name = app_name
        self.batch_queue = batch_queue
        # Splitwise: both phases of a request placed by the coordinator (deployments.phase_split).
        self.phase_split = phase_split
        self.auth = Authenticator(config.api_keys, config.admin_keys, config.default_service_class)
        self.metrics = IngressMetrics()
        # Pool -> the deployment serving it while its TP changes by shadow deployments
        # (from the plan; a pool absent here is served by its own deployment).
        self.serving: dict[str, str] = {}
        self.drained: set[str] = set()  # pools taking no new requests (POST /admin/drain, from the plan)
        # Deployment -> replicas running, as the controller counted them for its last plan.
        self.running_replicas: dict[str, int] = {}
        self._pool_status = pool_status

    def apply_plan(self, plan: PublishedPlan) -> None:
        """Serving deployments (shadow TP changes), drained pools and running replicas from
        the controller's plan."""
        self.serving = {pool: dep for pool, dep in plan.serving.items() if dep in self.pools}
        self.drained = {pool for pool, on in plan.drained.items() if on and pool in self.pools}
        self.running_replicas = dict(plan.running_replicas)

    def running_replicas_of(self, pool: str) -> int | None:
        """The replicas of the deployment serving `pool` running at the last plan; None
        before the controller counted them."""
        return self.running_replicas.get(self.deployment(pool))

    def deployment(self, pool: str) -> str:
        """The deployment taking `pool`'s requests now (its own unless a shadow took over)."""
        return self.serving.get(pool, pool)

    def pools_status(self) -> dict[str, Any]:
        """Replica counts per pool deployment as Serve reports them (blocking: call in a thread
        from async code)."""
        return self._pool_status(self.app_name, set(self.pools))

    # ---- who is calling -----------------------------------------------------------
    def authenticate(self, http: HTTPRequest) -> Tenant:
        return self.auth.tenant(http.headers.get("authorization"), http.headers.get(SERVICE_CLASS_HEADER))

    def admin(self, http: HTTPRequest) -> AdminKey:
        return self.auth.admin(http.headers.get("authorization"))

    def federated(self, http: HTTPRequest) -> bool:
        """Whether a federation front door calls, with one of this app's admin keys in its own
        header (app.federation_wire); a wrong key there is refused like one on /admin/*."""
        key = http.headers.get(ADMIN_KEY_HEADER)
        if key is None:
            return False
        self.auth.admin(f"Bearer {key}")
        return True

    # ---- request bodies -------------------------------------------------------------
    async def read_body(self, http: HTTPRequest) -> bytes:
        return await read_limited_body(http, self.config.max_request_bytes)

    async def parse(self, http: HTTPRequest, schema: type[Body], check_model: bool = True) -> Body:
        return self.validated(json_object(await self.read_body(http)), schema, check_model)

    def validated(self, data: dict[str, Any], schema: type[Body], check_model: bool = True) -> Body:
        """`data` as `schema`, or a 400 naming the bad field (a 404 for a model not served)."""
        try:
            body = schema.model_validate(data)
        except ValidationError as exc:
            raise invalid_request(exc) from None
        if check_model:
            self.check_model(getattr(body, "model", None))
        return body

    def check_model(self, model: str | None) -> None:
        """A 404 unless the app serves `model` (its own, or one of its LoRA adapters)."""
        served = self.config.served_models()
        if model not in served:
            raise APIError(404, f"The model '{model}' does not exist. Available: {served}.", param="model",
                           code="model_not_found")

    # ---- pools ------------------------------------------------------------------------
    def pool_config(self, name: str) -> PoolConfig:
        for pool in self.config.pools:
            if name in (pool.name, pool.deployment_name):
                return pool
        raise APIError(404, f"No pool {name!r}; pools: {[p.name for p in self.config.pools]}.", param="pool",
                       code="pool_not_found")

    def undrained(self, pool: str) -> str:
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
