"""The ingress side of Splitwise's phase split (§IV): prompt on one replica, tokens on another.

For each request the coordinator picks a prompt and a token replica at once; the
prompt replica runs the prompt and sends the first token plus a KV handle; the token
replica decodes the rest from that KV (or recomputes the prompt if the KV does not
arrive) and streams it. The coordinator's reservations are landed as each phase
reaches its replica and released when it ends, also when the client leaves early.
The final chunk carries a `splitwise` report: where each phase ran and how the KV came.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.splitwise_config import SplitwiseServeConfig
from core.request import Request
from deployments.phase_router import ASSIGNED_REPLICA_KEY
from deployments.resume import is_refusal

PROMPT, TOKEN = "prompt", "token"


def _no_replica() -> dict[str, Any]:
    return {"rejected": True, "reason": "no replica of a phase pool is ready", "retry_after_s": 1.0, "text": "",
            "num_tokens": 0, "finish_reason": None, "usage": None}


def _to(request: Request, placement: dict[str, Any]) -> Request:
    return dataclasses.replace(request, metadata={**request.metadata, ASSIGNED_REPLICA_KEY: placement["replica"]})


class PhaseStream:
    """The chunks of one phase-split request, with the `cancel()` of a Serve response."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]]) -> None:
        self._chunks = chunks

    def __aiter__(self) -> PhaseStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._chunks.__anext__()

    def cancel(self) -> None:
        """The client left: close the phases (releases reservations, cancels the decode)."""
        if not self._chunks.ag_running:
            asyncio.get_running_loop().create_task(self._chunks.aclose())


class PhaseSplit:
    def __init__(self, pools: dict[str, DeploymentHandle], coordinator: DeploymentHandle,
                 settings: SplitwiseServeConfig) -> None:
        self.pools = pools
        self.coordinator = coordinator
        self.settings = settings
        self._settings = settings.model_dump()

    def stream(self, request: Request) -> PhaseStream:
        return PhaseStream(self._phases(request))

    async def complete(self, request: Request) -> dict[str, Any]:
        """The whole answer as one dict, like LLMReplica.complete."""
        text: list[str] = []
        tokens = 0
        async for chunk in self._phases(request):
            if is_refusal(chunk):
                return chunk
            text.append(chunk["text"])
            tokens += chunk["num_tokens"]
            if chunk["finish_reason"] is not None:
                return {**chunk, "text": "".join(text), "num_tokens": tokens}
        raise RuntimeError(f"request {request.request_id} ended without a final chunk")

    async def _phases(self, request: Request) -> AsyncIterator[dict[str, Any]]:
        out_tokens = request.predicted_output_tokens or request.max_tokens
        pair = await self.coordinator.assign.remote(request.prompt_tokens, out_tokens)
        if pair is None:
            yield _no_replica()
            return
        prompt, token = pair[PROMPT], pair[TOKEN]
        open_phases = {PROMPT: prompt, TOKEN: token}
        report = {"prompt_replica": prompt["replica"], "prompt_role": prompt["role"],
                  "token_replica": token["replica"], "token_role": token["role"]}
        decode = None
        try:
            pre = await self.pools[prompt["deployment"]].prefill.remote(
                _to(request, prompt), self._settings, token["replica"])
            self._finish(open_phases, PROMPT)
            report["prompt_replica"] = pre.get("replica", prompt["replica"])
            first, kv = pre["chunk"], pre["kv"]
            del pre
            report["kv_bytes"] = kv.nbytes if kv is not None else 0
            if first is not None:
                if first["finish_reason"] is not None or is_refusal(first):
                    first["splitwise"] = report
                    yield first  # a one-token answer (or a refusal): no token phase
                    return
                yield first
            decode = self.pools[token["deployment"]].options(stream=True).decode.remote(
                _to(request, token), kv, self.settings.kv_transfer_timeout_s)
            del kv  # the call holds the KV ref now; once it is done nothing keeps the payload
            landed = False
            async for chunk in decode:
                if not landed:
                    self.coordinator.landed.remote(token["ticket"])
                    landed = True
                if chunk["finish_reason"] is not None:
                    report.update(token_replica=chunk.get("replica", token["replica"]), kv=chunk.get("kv"))
                    self._finish(open_phases, TOKEN, chunk.get("kv"))
                    chunk["splitwise"] = report
                yield chunk
                if chunk["finish_reason"] is not None:
                    return
        finally:
            if decode is not None and TOKEN in open_phases:
                decode.cancel()
            for phase in list(open_phases):
                self._finish(open_phases, phase)

    def _finish(self, open_phases: dict[str, dict[str, Any]], phase: str, outcome: str | None = None) -> None:
        placement = open_phases.pop(phase)
        self.coordinator.finished.remote(placement["id"], phase, placement["ticket"],
                                         f"kv_{outcome}" if outcome else None)
