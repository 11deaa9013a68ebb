"""The ingress side of Splitwise's phase split (§IV): prompt on one replica, tokens on another.

For each request the coordinator picks a prompt and a token replica at once; the
prompt replica runs the prompt and sends the first token plus a KV handle; the token
replica decodes the rest from that KV (or recomputes the prompt if the KV does not
arrive) and streams it. The coordinator's reservations are landed as each phase
reaches its replica and released when it ends, also when the client leaves early.
The final chunk carries a `splitwise` report: where each phase ran and how the KV came.
A prompt phase that does not answer within `prompt_phase_timeout_s`, or whose replica
dies, is given up: the token replica runs the whole request (the KV is `recomputed`) and
the coordinator assigns that prompt replica nothing more until it answers a poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

from app.splitwise_config import SplitwiseServeConfig
from core.request import Request
from deployments.kv_handoff import OBJECT_STORE, KvHandle, await_ref
from deployments.messages import Prefilled, ReplicaChunk, Reply, Shed, SplitwiseReport
from deployments.phase_router import ASSIGNED_REPLICA_KEY
from deployments.response_stream import ResponseStream

PROMPT, TOKEN = "prompt", "token"


def _no_replica() -> Shed:
    return Shed("no replica of a phase pool is ready", 1.0)


def _to(request: Request, placement: dict[str, Any]) -> Request:
    return dataclasses.replace(request, metadata={**request.metadata, ASSIGNED_REPLICA_KEY: placement["replica"]})


class PhaseSplit:
    def __init__(self, pools: dict[str, DeploymentHandle], coordinator: DeploymentHandle,
                 settings: SplitwiseServeConfig) -> None:
        self.pools = pools
        self.coordinator = coordinator
        self.settings = settings
        self._settings = settings.model_dump()

    def stream(self, request: Request) -> ResponseStream[Reply]:
        """The request's chunks; cancelling closes the phases (releases reservations, cancels
        the decode)."""
        return ResponseStream(self._phases(request))

    async def complete(self, request: Request) -> Reply:
        """The whole answer as one reply, like LLMReplica.complete."""
        text: list[str] = []
        tokens = 0
        async for chunk in self._phases(request):
            if not isinstance(chunk, ReplicaChunk):
                return chunk
            text.append(chunk.text)
            tokens += chunk.num_tokens
            if chunk.finish_reason is not None:
                return dataclasses.replace(chunk, text="".join(text), num_tokens=tokens)
        raise RuntimeError(f"request {request.request_id} ended without a final chunk")

    async def _phases(self, request: Request) -> AsyncGenerator[Reply, None]:
        out_tokens = request.predicted_output_tokens or request.max_tokens
        pair = await self.coordinator.assign.remote(request.prompt_tokens, out_tokens)
        if pair is None:
            yield _no_replica()
            return
        prompt, token = pair[PROMPT], pair[TOKEN]
        open_phases = {PROMPT: prompt, TOKEN: token}
        decode = None
        try:
            pre = await self._prefill(request, prompt, token)
            self._finish(open_phases, PROMPT)
            first, kv = pre.first, pre.kv
            report = SplitwiseReport(prompt_replica=pre.replica, prompt_role=prompt["role"],
                                     token_replica=token["replica"], token_role=token["role"],
                                     kv_bytes=kv.nbytes if kv is not None else 0)
            del pre
            if first is not None:
                if not isinstance(first, ReplicaChunk):
                    yield first  # a refusal: no token phase
                    return
                if first.finish_reason is not None:
                    yield dataclasses.replace(first, splitwise=report)  # a one-token answer: no token phase
                    return
                yield first
            decode = self.pools[token["deployment"]].options(stream=True).decode.remote(
                _to(request, token), kv, self.settings.kv_transfer_timeout_s)
            assert isinstance(decode, DeploymentResponseGenerator)  # the handle streams
            del kv  # the call holds the KV ref now; once it is done nothing keeps the payload
            landed = False
            async for chunk in decode:
                if not landed:
                    self.coordinator.landed.remote(token["ticket"])
                    landed = True
                if isinstance(chunk, ReplicaChunk) and chunk.finish_reason is not None:
                    self._finish(open_phases, TOKEN, chunk.kv)
                    chunk = dataclasses.replace(chunk, splitwise=dataclasses.replace(
                        report, token_replica=chunk.replica or token["replica"], kv=chunk.kv))
                    yield chunk
                    return
                yield chunk
        finally:
            if decode is not None and TOKEN in open_phases:
                decode.cancel()
            for phase in list(open_phases):
                self._finish(open_phases, phase)

    async def _prefill(self, request: Request, prompt: dict[str, Any], token: dict[str, Any]) -> Prefilled:
        """The prompt phase's answer; if its replica died or did not answer in time (Serve's
        router waits for a replica of the pool without bound), no first token and no KV:
        the token replica runs the prompt too."""
        call = self.pools[prompt["deployment"]].prefill.remote(_to(request, prompt), self._settings, token["replica"])
        assert isinstance(call, DeploymentResponse)  # a unary call
        try:
            return await asyncio.wait_for(await_ref(call), self.settings.prompt_phase_timeout_s)
        except (TimeoutError, RayActorError):
            call.cancel()
            self.coordinator.unreachable.remote(prompt["id"])
            return Prefilled(None, KvHandle(prompt["replica"], OBJECT_STORE), prompt["replica"])

    def _finish(self, open_phases: dict[str, dict[str, Any]], phase: str, outcome: str | None = None) -> None:
        placement = open_phases.pop(phase)
        self.coordinator.finished.remote(placement["id"], phase, placement["ticket"],
                                         f"kv_{outcome}" if outcome else None)
