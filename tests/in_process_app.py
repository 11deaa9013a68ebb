"""The ingress over pool "handles" that call objects in this process (LLMReplica running the
simulated engine, or a stub), without Ray or Serve: each call's arguments go through
pickle, as a Ray handle's arguments and replies do."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

from app.config import AppConfig
from deployments.ingress import Ingress
from deployments.ingress_state import IngressState
from deployments.replica import LLMReplica, ReplicaIdentity
from deployments.response_stream import ResponseStream
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig


class _Method:
    def __init__(self, target: Any, name: str) -> None:
        self.target, self.name = target, name

    def remote(self, *args: Any) -> Any:
        args = pickle.loads(pickle.dumps(args))
        reply = getattr(self.target, self.name)(*args)
        return ResponseStream(reply) if inspect.isasyncgen(reply) else reply  # cancel() as Serve's


class Handle:
    """A DeploymentHandle's call surface over one object in this process."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def options(self, **_: Any) -> Handle:
        return self

    def __getattr__(self, name: str) -> _Method:
        return _Method(self.target, name)


def healthy(app_name: str, pools: set[str]) -> dict[str, Any]:
    return {p: {"status": "HEALTHY", "replicas": {"RUNNING": 1}} for p in pools}


def sim_ingress(config: AppConfig) -> Ingress:
    """The app's ingress over one simulated replica per pool."""
    replicas = {p.deployment_name: LLMReplica(p.name, ModelledEngine(ModelledEngineConfig()),
                                              ReplicaIdentity("app", p.deployment_name, "r0"))
                for p in config.pools}
    pools: dict[str, Any] = {name: Handle(r) for name, r in replicas.items()}
    return Ingress(config, pools, "app", state=IngressState(config, pools, "app", pool_status=healthy))
