"""The application's configuration: the `args` of serve_config.yaml, validated at start.

A bad config fails `serve run` with a message naming the field, not at first request.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.predictor_config import PredictorConfig
from autoscaling.chiron.local import LocalAutoscalerConfig
from core.classes import LengthClassConfig, ServiceClass, default_service_classes
from engines.factory import EngineConfig, context_tokens
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
    # No `kind` (or kind: sim): simulated GPUs; kind: vllm: the real engine (engines.vllm_config).
    engine: EngineConfig = SimEngineConfig()
    autoscaling: PoolAutoscaling = PoolAutoscaling()
    max_ongoing_requests: int = Field(default=512, gt=0)
    max_queued_requests: int = Field(default=1024, gt=0)
    num_cpus: float = Field(default=0.1, ge=0)
    # "token_balanced": Mico's pending-token balance across the pool's replicas
    # (deployments.token_router); "default": Serve's power-of-two-choices router.
    request_router: Literal["default", "token_balanced"] = "default"
    # Chiron: a pool of interactive, mixed or batch replicas (routing by service class
    # instead of length class); None for length-class pools.
    kind: Literal["interactive", "mixed", "batch"] | None = None
    # Chiron's Algorithm 1 in every replica of the pool: it owns the batch limit.
    local_autoscaler: LocalAutoscalerConfig | None = None

    @property
    def deployment_name(self) -> str:
        return f"pool-{self.name}"


class ApiKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str
    service_class: str = "interactive"
    # Per ingress replica; None: unlimited. Over the limit: 429 with Retry-After.
    requests_per_s: float | None = Field(default=None, gt=0)
    tokens_per_s: float | None = Field(default=None, gt=0)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def default_pools() -> list[PoolConfig]:
    """Three pools by input size, DynamoLLM's merging of the nine classes at low load."""
    return [
        PoolConfig(name="short", classes=["SS", "SM", "SL"], engine=SimEngineConfig(tensor_parallel=2)),
        PoolConfig(name="medium", classes=["MS", "MM", "ML"], engine=SimEngineConfig(tensor_parallel=4)),
        PoolConfig(name="long", classes=["LS", "LM", "LL"], engine=SimEngineConfig(tensor_parallel=8)),
    ]


class BatchApiConfig(BaseModel):
    """The OpenAI Batch API and its durable queue (SQLite on the node running it)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    db_path: str = "~/.wattwise/batches.sqlite"
    max_in_flight: int = Field(default=32, gt=0)


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
    # Rate-limit buckets hold this many seconds' worth of a tenant's rate (its burst).
    rate_limit_burst_s: float = Field(default=5.0, gt=0)
    # Concurrent HTTP requests per ingress replica; Serve's default of 5 would queue
    # streams behind each other at the proxy.
    ingress_max_ongoing_requests: int = Field(default=2048, gt=0)
    max_request_bytes: int = Field(default=1_000_000, gt=0)
    # Tokens are sent through Serve in batches at most this far apart (each yield is a
    # Ray object, so one per token would cap a replica at a few hundred tokens/s).
    stream_flush_s: float = Field(default=0.05, ge=0)
    prior_output_tokens: int = Field(default=200, gt=0)
    predictor: PredictorConfig = PredictorConfig()
    batch_api: BatchApiConfig = BatchApiConfig()

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique: {names}")
        kinds = [p.kind for p in self.pools if p.kind is not None]
        if kinds:
            if len(kinds) != len(self.pools) or len(set(kinds)) != len(kinds):
                raise ValueError("with replica kinds, every pool needs a distinct kind")
            if not {"interactive", "mixed"} <= set(kinds):
                raise ValueError("replica kinds need at least an interactive and a mixed pool")
            return self._check_services()
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
        return self._check_services()

    def _check_services(self) -> AppConfig:
        if self.default_service_class not in self.services:
            raise ValueError(f"default_service_class {self.default_service_class!r} is not in services")
        for key in self.api_keys:
            if key.service_class not in self.services:
                raise ValueError(f"api key of tenant {key.tenant!r}: unknown service class {key.service_class!r}")
        return self

    def pool_of_kind(self, kind: str) -> str | None:
        return next((p.deployment_name for p in self.pools if p.kind == kind), None)

    def pool_of_class(self) -> dict[str, str]:
        """Length class -> pool; with replica kinds every class starts at the interactive pool."""
        if self.pool_of_kind("interactive"):
            return dict.fromkeys(LengthClassConfig.names(), self.pool_of_kind("interactive"))
        return {cls: pool.deployment_name for pool in self.pools for cls in pool.classes}

    @property
    def max_context_tokens(self) -> int:
        return min(context_tokens(p.engine) for p in self.pools)
