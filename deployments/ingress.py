"""The OpenAI-compatible HTTP ingress: validate, classify, route to a pool, stream back.

Everything a client can get wrong is answered here with a 4xx in OpenAI's error
format before any replica sees the request.
"""


import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from app.classify import Classifier, UnknownServiceClass
from app.config import AppConfig, hash_key
from app.openai_api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_body,
    completion_body,
    usage_dict,
)
from app.predictor_config import make_predictor
from app.prompt_tokenizer import prompt_tokenizer
from app.sampling import sampling_of
from app.rate_limit import TenantLimiter
from app.route import WeightedRouter
from deployments.metrics import IngressMetrics
from deployments.plan_store import follow_plan
from deployments.tracing import tracer

fastapi_app = FastAPI(title="wattwise", description="SLO-aware, energy-efficient LLM serving (OpenAI API).")

ROUTE_COMPLETIONS = "/v1/completions"
ROUTE_CHAT = "/v1/chat/completions"
SERVICE_CLASS_HEADER = "x-service-class"


POOL_FULL = "pool_full"


def _overloaded() -> APIError:
    return APIError(503, "All replicas of this pool are busy; retry later.", "overloaded", code=POOL_FULL,
                    retry_after_s=1)


def _replica_failed(exc: Exception) -> APIError:
    return APIError(503, f"The replica serving this request failed ({type(exc).__name__}); retry.", "server_error",
                    code="replica_failed", retry_after_s=1)


def _service_report(request: Any, pool: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """How the request was served against its SLO: the `wattwise` field of a response."""
    usage = result.get("usage")
    if not usage:
        return None
    n = usage["completion_tokens"]
    mean_tbt_s = (usage["e2e_s"] - usage["ttft_s"]) / (n - 1) if n > 1 else 0.0
    return {
        "length_class": request.length_class,
        "service_class": request.service_class,
        "pool": pool,
        "ttft_s": usage["ttft_s"],
        "mean_tbt_s": mean_tbt_s,
        "e2e_s": usage["e2e_s"],
        "slo_ttft_s": request.slo.ttft_s,
        "slo_tbt_s": request.slo.tbt_s,
        "slo_met": usage["ttft_s"] <= request.slo.ttft_s and mean_tbt_s <= request.slo.tbt_s,
    }


def _public_usage(result: dict[str, Any]) -> dict[str, Any] | None:
    usage = result.get("usage")
    if not usage:
        return None
    return usage_dict(usage["prompt_tokens"], usage["completion_tokens"], usage["energy_j"])


@serve.deployment
@serve.ingress(fastapi_app)
class Ingress:
    def __init__(self, config: dict[str, Any], pools: dict[str, DeploymentHandle],
                 batch_queue: DeploymentHandle | None = None) -> None:
        self.config = AppConfig.model_validate(config)
        self.prompts = prompt_tokenizer(self.config)
        self.pools = pools
        self.batch_queue = batch_queue
        self._replica_counts: tuple[float, dict[str, int]] = (0.0, {})
        self.classifier = Classifier(self.config.lengths, self.config.services, self.config.pool_of_class())
        self.predictor = make_predictor(self.config.predictor, self.config.lengths, self.config.prior_output_tokens)
        self.keys = {k.sha256: k for k in self.config.api_keys}
        self.limiter = TenantLimiter({k.tenant: (k.requests_per_s, k.tokens_per_s) for k in self.config.api_keys},
                                     self.config.rate_limit_burst_s)
        self.metrics = IngressMetrics()
        self.router = WeightedRouter()
        self.app_name = serve.get_replica_context().app_name
        self._follower: asyncio.Task | None = None

    def _ensure_following_plan(self) -> None:
        """Routing weights come from the controller's published plan (DynamoLLM spill)."""
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(
                follow_plan(self.app_name, lambda plan: self.router.set_weights(plan.routing_weights)))

    # ---- routes ----------------------------------------------------------------
    @fastapi_app.get("/health")
    def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @fastapi_app.get("/v1/models")
    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "wattwise"}],
        }

    @fastapi_app.get("/admin/pools")
    def pools_status(self) -> dict[str, Any]:
        """Replica counts per pool as Serve reports them (for dashboards and the demo)."""
        status = serve.status().applications[serve.get_replica_context().app_name]
        return {
            name: {"status": str(dep.status), "replicas": {str(getattr(k, "value", k)): n for k, n in dep.replica_states.items()}}
            for name, dep in status.deployments.items()
            if name in self.pools
        }

    @fastapi_app.post(ROUTE_COMPLETIONS)
    async def completions(self, http: HTTPRequest) -> Any:
        return await self._serve(http, ROUTE_COMPLETIONS, CompletionRequest, lambda b: b.prompt, completion_body)

    @fastapi_app.post(ROUTE_CHAT)
    async def chat_completions(self, http: HTTPRequest) -> Any:
        return await self._serve(http, ROUTE_CHAT, ChatCompletionRequest, lambda b: b.prompt_text(), chat_body)

    # ---- the request path --------------------------------------------------------
    async def _serve(self, http: HTTPRequest, route: str, schema: type, prompt_of: Callable, render: Callable) -> Any:
        arrival_s = time.time()
        self._ensure_following_plan()
        try:
            tenant, service_class = self._authenticate(http)
            body = await self._parse(http, schema)
            with tracer.start_as_current_span("wattwise.classify") as span:
                request, pool = self._classify(body, prompt_of(body), tenant, service_class, arrival_s)
                self._check_rate(tenant, request.prompt_tokens + request.max_tokens)
                pool = self.router.pick(request.length_class, pool, allowed=set(self.pools))
                span.set_attribute("wattwise.length_class", request.length_class)
                span.set_attribute("wattwise.pool", pool)
            candidates = await self._candidates(request.service_class, pool)
            for i, pool in enumerate(candidates):
                try:
                    response = await self._respond(body, request, pool, render, route)
                except APIError as err:
                    if err.code == POOL_FULL and i + 1 < len(candidates):
                        continue  # Chiron: overflow from a kind's own pool to the mixed pool
                    raise
                return response
        except APIError as err:
            self.metrics.record(route, err.status)
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    async def _respond(self, body: Any, request: Any, pool: str, render: Callable, route: str) -> Any:
        handle = self.pools[pool]
        rid = f"cmpl-{request.request_id}"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            gen = handle.options(stream=True).generate.remote(request)
            first = await self._first_chunk(gen)
            self.metrics.record(route, 200)
            return StreamingResponse(
                self._sse(gen, first, rid, body.model, render, request, pool, include_usage),
                media_type="text/event-stream",
            )
        result = await self._call(handle.complete.remote(request))
        self._learn(request, result)
        self.metrics.record(route, 200)
        response = render(rid, body.model, result["text"], result["finish_reason"], _public_usage(result), False)
        response["wattwise"] = _service_report(request, pool, result)
        return response

    async def _candidates(self, service_class: str, pool: str) -> list[str]:
        """Pools to try in order. With Chiron's replica kinds: interactive requests go to
        the interactive pool, then mixed; batch ones to batch replicas if any run, then mixed."""
        mixed = self.config.pool_of_kind("mixed")
        if mixed is None:
            return [pool]
        if service_class == "batch":
            batch = self.config.pool_of_kind("batch")
            running = await self._running_replicas()
            return [batch, mixed] if batch and running.get(batch, 0) > 0 else [mixed]
        return [self.config.pool_of_kind("interactive"), mixed]

    async def _running_replicas(self, max_age_s: float = 2.0) -> dict[str, int]:
        at, counts = self._replica_counts
        if time.monotonic() - at > max_age_s:
            status = await asyncio.to_thread(self.pools_status)
            counts = {name: info["replicas"].get("RUNNING", 0) for name, info in status.items()}
            self._replica_counts = (time.monotonic(), counts)
        return counts

    async def run_batch_request(self, body: dict[str, Any], deadline_s: float) -> tuple[bool, dict[str, Any]]:
        """One line of a Batch API file, served as a batch-class completion (called by the
        BatchQueue deployment). Returns (ok, response body or error object)."""
        chat = "messages" in body
        schema, prompt_of, render = (
            (ChatCompletionRequest, lambda b: b.prompt_text(), chat_body) if chat
            else (CompletionRequest, lambda b: b.prompt, completion_body))
        route = ROUTE_CHAT if chat else ROUTE_COMPLETIONS
        try:
            try:
                parsed = schema.model_validate({**body, "stream": False})
            except ValidationError as exc:
                raise APIError(400, f"Invalid request: {exc.errors()[0]['msg']}") from None
            if parsed.model != self.config.model_name:
                raise APIError(404, f"The model '{parsed.model}' does not exist.", code="model_not_found")
            request, pool = self._classify(parsed, prompt_of(parsed), "batch-api", "batch", time.time())
            candidates = await self._candidates("batch", pool)
            for i, pool in enumerate(candidates):
                try:
                    return True, await self._respond(parsed, request, pool, render, route)
                except APIError as err:
                    if err.code != POOL_FULL or i + 1 == len(candidates):
                        raise
            raise AssertionError("unreachable: the last candidate returns or raises")
        except APIError as err:
            return False, err.body()["error"]

    # ---- the Batch API (files and batches, backed by the BatchQueue deployment) ---------
    def _batch_api(self, http: HTTPRequest) -> DeploymentHandle:
        self._authenticate(http)
        if self.batch_queue is None:
            raise APIError(404, "The Batch API is disabled in this deployment.", code="batch_api_disabled")
        return self.batch_queue

    @fastapi_app.post("/v1/files")
    async def upload_file(self, http: HTTPRequest) -> Any:
        try:
            queue = self._batch_api(http)
            form = await http.form()
            upload, purpose = form.get("file"), form.get("purpose")
            if upload is None or not hasattr(upload, "read") or purpose != "batch":
                raise APIError(400, "Send multipart form fields 'file' and purpose='batch'.", param="file")
            content = await upload.read()
            if len(content) > self.config.max_request_bytes * 100:
                raise APIError(413, "The file is too large.", code="file_too_large")
            return await queue.add_file.remote(content, upload.filename or "input.jsonl", purpose)
        except APIError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @fastapi_app.get("/v1/files/{file_id}")
    async def get_file(self, file_id: str, http: HTTPRequest) -> Any:
        return await self._batch_lookup(http, lambda q: q.file.remote(file_id), f"No file {file_id!r}.")

    @fastapi_app.get("/v1/files/{file_id}/content")
    async def get_file_content(self, file_id: str, http: HTTPRequest) -> Any:
        content = await self._batch_lookup(http, lambda q: q.file_content.remote(file_id), f"No file {file_id!r}.")
        return content if isinstance(content, JSONResponse) else Response(content, media_type="application/jsonl")

    @fastapi_app.post("/v1/batches")
    async def create_batch(self, http: HTTPRequest) -> Any:
        try:
            queue = self._batch_api(http)
            data = json.loads(await http.body() or b"{}")
            missing = [k for k in ("input_file_id", "endpoint", "completion_window") if k not in data]
            if missing:
                raise APIError(400, f"Missing fields: {missing}.", param=missing[0])
            if data["endpoint"] not in (ROUTE_COMPLETIONS, ROUTE_CHAT):
                raise APIError(400, f"endpoint must be {ROUTE_COMPLETIONS} or {ROUTE_CHAT}.", param="endpoint")
            batch = await queue.create_batch.remote(data["input_file_id"], data["endpoint"], data["completion_window"])
            if "error" in batch:
                raise APIError(400, batch["error"], param="input_file_id")
            return batch
        except json.JSONDecodeError as exc:
            return JSONResponse(APIError(400, f"Request body is not valid JSON: {exc}").body(), status_code=400)
        except APIError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    @fastapi_app.get("/v1/batches/{batch_id}")
    async def get_batch(self, batch_id: str, http: HTTPRequest) -> Any:
        return await self._batch_lookup(http, lambda q: q.batch.remote(batch_id), f"No batch {batch_id!r}.")

    async def _batch_lookup(self, http: HTTPRequest, call: Callable, missing: str) -> Any:
        try:
            result = await call(self._batch_api(http))
            if result is None:
                raise APIError(404, missing, code="not_found")
            return result
        except APIError as err:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers())

    def _check_rate(self, tenant: str, tokens: int) -> None:
        wait_s = self.limiter.retry_after_s(tenant, tokens, time.monotonic())
        if wait_s is not None:
            raise APIError(429, f"Rate limit reached for tenant {tenant!r}; retry in {wait_s:.1f} s.", "requests",
                           code="rate_limit_exceeded", retry_after_s=wait_s)

    def _authenticate(self, http: HTTPRequest) -> tuple[str, str]:
        requested = http.headers.get(SERVICE_CLASS_HEADER)
        if not self.keys:
            return "default", requested or self.config.default_service_class
        auth = http.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        key = self.keys.get(hash_key(token)) if token else None
        if key is None:
            raise APIError(401, "Incorrect or missing API key.", "invalid_request_error", code="invalid_api_key")
        return key.tenant, key.service_class

    async def _parse(self, http: HTTPRequest, schema: type) -> Any:
        declared = http.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.config.max_request_bytes:
            raise APIError(413, f"Request body exceeds {self.config.max_request_bytes} bytes.", code="request_too_large")
        raw = await http.body()
        if len(raw) > self.config.max_request_bytes:
            raise APIError(413, f"Request body exceeds {self.config.max_request_bytes} bytes.", code="request_too_large")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(400, "Request body must be a JSON object.", code="invalid_json")
        try:
            body = schema.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise APIError(400, f"Invalid value for '{param}': {first['msg']}", param=param) from None
        if body.model != self.config.model_name:
            raise APIError(
                404, f"The model '{body.model}' does not exist. Available: '{self.config.model_name}'.",
                param="model", code="model_not_found",
            )
        return body

    def _classify(self, body: Any, prompt: str, tenant: str, service_class: str, arrival_s: float):
        sampling = sampling_of(body)
        prompt = self.prompts.render(body, prompt)
        prompt_tokens = self.prompts.count(prompt)
        context = self.config.max_context_tokens
        requested = getattr(body, "requested_max_tokens", body.max_tokens)
        if prompt_tokens >= context:
            raise APIError(
                400, f"This model's maximum context length is {context} tokens; the prompt has {prompt_tokens}.",
                param="prompt", code="context_length_exceeded",
            )
        max_tokens = requested or min(self.config.default_max_tokens, context - prompt_tokens)
        if prompt_tokens + max_tokens > context:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; you requested {prompt_tokens} in the "
                f"prompt and {max_tokens} for the completion.",
                param="max_tokens", code="context_length_exceeded",
            )
        request_id = uuid.uuid4().hex
        predicted = self.predictor.predict(prompt_tokens, max_tokens, prompt, request_id)
        try:
            request, pool = self.classifier.classify(
                request_id, prompt_tokens, max_tokens, predicted, service_class, arrival_s, tenant
            )
        except UnknownServiceClass as exc:
            raise APIError(400, str(exc), param=SERVICE_CLASS_HEADER) from None
        request.prompt_text, request.sampling = prompt, sampling
        return request, pool

    async def _call(self, response: Any) -> dict[str, Any]:
        try:
            result = await response
        except BackPressureError:
            raise _overloaded() from None
        except RayError as exc:
            raise _replica_failed(exc) from None
        if result.get("squashed"):
            raise APIError(503, f"The request waited {result['waited_s']:.0f} s without starting and was dropped; "
                           "retry.", "overloaded", code="request_squashed", retry_after_s=1)
        return result

    async def _first_chunk(self, gen: Any) -> dict[str, Any]:
        """Await the first chunk before answering 200, so overload still gets a 503."""
        return await self._call(gen.__anext__())

    async def _sse(self, gen, first, rid, model, render, request, pool, include_usage) -> AsyncIterator[str]:
        chunk = first
        try:
            while True:
                body = render(rid, model, chunk["text"], chunk["finish_reason"], None, True)
                if chunk["finish_reason"]:
                    body["wattwise"] = _service_report(request, pool, chunk)
                yield f"data: {json.dumps(body)}\n\n"
                if chunk["finish_reason"]:
                    self._learn(request, chunk)
                    if include_usage:
                        final = render(rid, model, "", None, _public_usage(chunk), True)
                        final["choices"] = []
                        yield f"data: {json.dumps(final)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                chunk = await gen.__anext__()
        except (asyncio.CancelledError, GeneratorExit):
            gen.cancel()
            raise
        except StopAsyncIteration:
            yield f"data: {json.dumps(APIError(500, 'The replica ended the stream early.', 'server_error').body())}\n\n"
        except RayError as exc:
            yield f"data: {json.dumps(_replica_failed(exc).body())}\n\n"

    def _learn(self, request: Any, result: dict[str, Any]) -> None:
        if result.get("usage"):
            self.predictor.observe(
                request.prompt_tokens, result["usage"]["completion_tokens"], request.predicted_output_tokens or 0,
                request.request_id,
            )
