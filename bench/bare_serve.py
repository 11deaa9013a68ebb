"""The least a Serve app can do for a completion: a FastAPI ingress, one handle call to
a deployment running the same engine, the text back (streamed or whole).

`wattwise bench ingress` (modelled engine) and `wattwise bench vllm-overhead` (vLLM's
AsyncLLM, no wattwise engine layer) deploy it beside the wattwise app (route /bare), so
one run separates what Ray Serve itself costs on this machine from what our layers add
(auth, parsing, classification, length prediction, routing, admission, resume, metrics).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psutil
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from core.request import Request
from core.slo import SLO
from engines.child_reaper import new_children, watch_children
from engines.modelled_engine import ModelledEngine
from engines.modelled_engine_config import ModelledEngineConfig

api = FastAPI()


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0.1})
class BareEngine:
    def __init__(self) -> None:
        self.engine = ModelledEngine(ModelledEngineConfig(tensor_parallel=2))

    async def generate(self, body: dict[str, Any]) -> AsyncIterator[tuple[str, int]]:
        prompt_tokens = len(str(body["prompt"]).split())
        request = Request(uuid.uuid4().hex, prompt_tokens, int(body["max_tokens"]), time.time(), SLO(ttft_s=1, tbt_s=1))
        async for chunk in self.engine.generate(request):
            yield chunk.text, chunk.num_tokens


@serve.deployment(max_ongoing_requests=512)
class BareVllm:
    """vLLM's AsyncLLM with the engine arguments a wattwise vLLM pool would use."""

    def __init__(self, engine_config: dict[str, Any]) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        from engines.factory import parse_vllm_engine_config
        from engines.vllm_engine import engine_args, set_vllm_env

        config = parse_vllm_engine_config(engine_config)
        set_vllm_env(config)
        before = {p.pid for p in psutil.Process().children()}
        self.llm = AsyncLLM.from_engine_args(engine_args(config))
        self.reaper = watch_children(new_children(before))  # the bench ends with `ray stop --force`

    async def generate(self, body: dict[str, Any]) -> AsyncIterator[tuple[str, int]]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=float(body.get("temperature", 1.0)), max_tokens=int(body["max_tokens"]),
                                output_kind=RequestOutputKind.DELTA)
        async for out in self.llm.generate(str(body["prompt"]), params, request_id=uuid.uuid4().hex):
            if out.outputs[0].token_ids:
                yield out.outputs[0].text, len(out.outputs[0].token_ids)


def _completion(text: str, model: str, completion_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "bare", "object": "text_completion", "created": 0, "model": model,
                            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": None}]}
    if completion_tokens is not None:
        body["usage"] = {"prompt_tokens": 0, "completion_tokens": completion_tokens, "total_tokens": completion_tokens}
    return body


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0.1})
@serve.ingress(api)
class BareIngress:
    def __init__(self, engine: DeploymentHandle) -> None:
        self.engine = engine.options(stream=True)

    @api.post("/v1/completions")
    async def completions(self, body: dict[str, Any]) -> Any:
        chunks = self.engine.generate.remote(body)
        assert isinstance(chunks, DeploymentResponseGenerator)  # the handle streams
        if not body.get("stream"):
            pieces = [piece async for piece in chunks]
            return _completion("".join(t for t, _ in pieces), body["model"], sum(n for _, n in pieces))

        async def sse() -> AsyncIterator[str]:
            tokens = 0
            async for text, n in chunks:
                tokens += n
                yield f"data: {json.dumps(_completion(text, body['model']))}\n\n"
            yield f"data: {json.dumps({**_completion('', body['model'], tokens), 'choices': []})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")


def build(args: dict[str, Any]) -> Application:
    """Serve's import_path target: the modelled engine, or vLLM with `args["vllm"]` (an engine
    config) on `args["num_cpus"]` CPUs; LocalServe's admin keys are unused here."""
    # mypy keeps a class decorator's input type (python/mypy#3135): the classes are Deployments.
    if "vllm" not in args:
        return BareIngress.bind(BareEngine.bind())  # type: ignore[attr-defined]
    engine = BareVllm.options(ray_actor_options={"num_cpus": args.get("num_cpus", 1)})  # type: ignore[attr-defined]
    return BareIngress.bind(engine.bind(args["vllm"]))  # type: ignore[attr-defined]
