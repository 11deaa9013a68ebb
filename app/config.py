"""The application's configuration: the `args` of serve_config.yaml, validated at start.

A bad config fails `serve run` with a message naming the field, not at first request.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.predictor_config import PredictorConfig
from core.classes import LengthClassConfig, ServiceClass, default_service_classes
from energy.hardware import MODELS
from engines.sim_engine import SimEngineConfig


class PoolAutoscaling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    initial_replicas: int | None = Field(default=None, ge=0)
    metrics_interval_s: float = Field(default=0.5, gt=0)
    look_back_period_s: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> PoolAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class PoolConfig(BaseModel):
    """One replica deployment and the length classes it serves (DynamoLLM pools)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,30}$")
    classes: list[str] = Field(min_length=1)
    engine: SimEngineConfig = SimEngineConfig()
    autoscaling: PoolAutoscaling = PoolAutoscaling()
    max_ongoing_requests: int = Field(default=512, gt=0)
    max_queued_requests: int = Field(default=1024, gt=0)
    num_cpus: float = Field(default=0.1, ge=0)
    # "token_balanced": Mico's pending-token balance across the pool's replicas
    # (deployments.token_router); "default": Serve's power-of-two-choices router.
    request_router: Literal["default", "token_balanced"] = "default"

    @property
    def deployment_name(self) -> str:
        return f"pool-{self.name}"


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str
    service_class: str = "interactive"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def default_pools() -> list[PoolConfig]:
    """Three pools by input size, DynamoLLM's merging of the nine classes at low load."""
    return [
        PoolConfig(name="short", classes=["SS", "SM", "SL"], engine=SimEngineConfig(tensor_parallel=2)),
        PoolConfig(name="medium", classes=["MS", "MM", "ML"], engine=SimEngineConfig(tensor_parallel=4)),
        PoolConfig(name="long", classes=["LS", "LM", "LL"], engine=SimEngineConfig(tensor_parallel=8)),
    ]


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = "llama2-70b-sim"
    pools: list[PoolConfig] = Field(default_factory=default_pools)
    lengths: LengthClassConfig = LengthClassConfig()
    services: dict[str, ServiceClass] = Field(default_factory=default_service_classes)
    default_service_class: str = "interactive"
    # Empty: no auth, the service class comes from the X-Service-Class header.
    api_keys: list[ApiKey] = Field(default_factory=list)
    default_max_tokens: int = Field(default=256, gt=0)
    # Concurrent HTTP requests per ingress replica; Serve's default of 5 would queue
    # streams behind each other at the proxy.
    ingress_max_ongoing_requests: int = Field(default=2048, gt=0)
    max_request_bytes: int = Field(default=1_000_000, gt=0)
    # Tokens are sent through Serve in batches at most this far apart (each yield is a
    # Ray object, so one per token would cap a replica at a few hundred tokens/s).
    stream_flush_s: float = Field(default=0.05, ge=0)
    prior_output_tokens: int = Field(default=200, gt=0)
    predictor: PredictorConfig = PredictorConfig()

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        seen: dict[str, str] = {}
        for pool in self.pools:
            for cls in pool.classes:
                if cls not in LengthClassConfig.names():
                    raise ValueError(f"pool {pool.name!r}: unknown length class {cls!r}")
                if cls in seen:
                    raise ValueError(f"length class {cls} is in pools {seen[cls]!r} and {pool.name!r}")
                seen[cls] = pool.name
        missing = sorted(set(LengthClassConfig.names()) - set(seen))
        if missing:
            raise ValueError(f"length classes served by no pool: {missing}")
        if self.default_service_class not in self.services:
            raise ValueError(f"default_service_class {self.default_service_class!r} is not in services")
        for key in self.api_keys:
            if key.service_class not in self.services:
                raise ValueError(f"api key of tenant {key.tenant!r}: unknown service class {key.service_class!r}")
        return self

    def pool_of_class(self) -> dict[str, str]:
        return {cls: pool.deployment_name for pool in self.pools for cls in pool.classes}

    @property
    def max_context_tokens(self) -> int:
        return min(MODELS[p.engine.model].max_context_tokens for p in self.pools)
