"""The ingress over pool "handles" that call objects in this process (LLMReplica running the
simulated engine, or a stub), without Ray or Serve: each call's arguments go through
pickle, as a Ray handle's arguments and replies do."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import pickle
from collections.abc import AsyncGenerator
from typing import Any

from app.config import AppConfig
from deployments.ingress import Ingress
from deployments.ingress_state import IngressState
from deployments.replica import LLMReplica, ReplicaIdentity
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig


class _Streamed:
    """A streaming call's reply, as Ray's DeploymentResponseGenerator: `cancel` stops the
    replica's generator (Serve cancels the replica's task), whoever is awaiting it."""

    def __init__(self, gen: AsyncGenerator[Any, None]) -> None:
        self._gen = gen

    def __aiter__(self) -> _Streamed:
        return self

    async def __anext__(self) -> Any:
        return await self._gen.__anext__()

    def cancel(self) -> None:
        async def close() -> None:
            with contextlib.suppress(RuntimeError):  # running: the await being cancelled closes it
                await self._gen.aclose()
        asyncio.get_running_loop().create_task(close())


class _Method:
    def __init__(self, target: Any, name: str) -> None:
        self.target, self.name = target, name

    def remote(self, *args: Any) -> Any:
        args = pickle.loads(pickle.dumps(args))
        reply = getattr(self.target, self.name)(*args)
        return _Streamed(reply) if inspect.isasyncgen(reply) else reply


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
