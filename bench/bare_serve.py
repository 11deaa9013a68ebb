"""The least a Serve app can do for a completion: a FastAPI ingress, one handle call to
a deployment running the same sim engine, the text back (streamed or whole).

`wattwise bench ingress` deploys it beside the wattwise app (route /bare) so one run
separates what Ray Serve itself costs on this machine from what our layers add
(auth, parsing, classification, length prediction, routing, resume, metrics).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from core.request import Request
from core.slo import SLO
from engines.sim_engine import SimEngine, SimEngineConfig

api = FastAPI()


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0.1})
class BareEngine:
    def __init__(self) -> None:
        self.engine = SimEngine(SimEngineConfig(tensor_parallel=2))

    async def generate(self, prompt_tokens: int, max_tokens: int) -> AsyncIterator[str]:
        request = Request(uuid.uuid4().hex, prompt_tokens, max_tokens, time.time(), SLO(ttft_s=1, tbt_s=1))
        async for chunk in self.engine.generate(request):
            yield chunk.text


def _completion(text: str, model: str) -> dict[str, Any]:
    return {"id": "bare", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}]}


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0.1})
@serve.ingress(api)
class BareIngress:
    def __init__(self, engine: DeploymentHandle) -> None:
        self.engine = engine.options(stream=True)

    @api.post("/v1/completions")
    async def completions(self, body: dict[str, Any]) -> Any:
        chunks = self.engine.generate.remote(len(str(body["prompt"]).split()), int(body["max_tokens"]))
        if not body.get("stream"):
            return _completion("".join([text async for text in chunks]), body["model"])

        async def sse() -> AsyncIterator[str]:
            async for text in chunks:
                yield f"data: {json.dumps(_completion(text, body['model']))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")


def build(args: dict[str, Any]) -> Application:
    """Serve's import_path target; LocalServe hands every app admin keys, unused here."""
    return BareIngress.bind(BareEngine.bind())
