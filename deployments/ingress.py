"""The OpenAI-compatible HTTP ingress: validate, classify, route to a pool, stream back.

Everything a client can get wrong is answered here with a 4xx in OpenAI's error
format before any replica sees the request. `Ingress` is a plain class that receives
its config, pool handles and plan source; deployments.builder makes it a Serve
deployment serving `Ingress.http_app()` (the OpenAI routes here, /admin/* and the
Batch API as routers over the shared IngressState), so tests construct it directly.
"""


import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from app.choices import choice_requests
from app.classify import Classifier, UnknownServiceClass
from app.config import AppConfig
from app.federation_wire import ADMIN_KEY_HEADER, PROGRESS_FIELD, RESUME_FIELD
from app.openai_api import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    NamedToolChoice,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    invalid_request,
    messages_text,
    openapi_body,
)
from app.openai_responses import ChatRenderer, CompletionRenderer, Renderer, usage_event
from app.pool_overflow import Attempt, overflow_attempts, serving_pools
from app.prompt_tokenizer import prompt_tokenizer, tool_parsing
from app.route import WeightedRouter
from app.sampling import sampling_of
from core.prefix_cache import block_hashes
from core.published_plan import PublishedPlan
from core.request import Request
from core.roles import ReplicaKind
from deployments import admin_routes, batch_routes
from deployments.asgi_bridge import HttpExchange, ResponseParts, StreamState, current_exchange, run_exchange
from deployments.http_app import build_http_app
from deployments.ingress_state import SERVICE_CLASS_HEADER, IngressState, json_object
from deployments.messages import ReplicaChunk, Reply, Shed, Squashed
from deployments.phase_split import PhaseSplit
from deployments.rate_ledger import RateLimitGate
from deployments.resume import ResumableStream, Resumption, StreamBroken, call_with_retries
from deployments.serve_request_ids import as_own_request
from deployments.tracing import tracer
from prediction.predictor_factory import make_predictor

logger = logging.getLogger("ray.serve")

ROUTE_COMPLETIONS = "/v1/completions"
ROUTE_CHAT = "/v1/chat/completions"
POOL_FULL = "pool_full"

# Follows the controller's plan forever, calling its argument with each new plan
# (deployments.plan_store.follow_plan for the ingress's app).
PlanFollower = Callable[[Callable[[PublishedPlan], None]], Coroutine[Any, Any, None]]


def _overloaded() -> APIError:
    return APIError(503, "All replicas of this pool are busy; retry later.", "overloaded", code=POOL_FULL,
                    retry_after_s=1)


def _replica_failed(exc: Exception) -> APIError:
    return APIError(503, f"The replica serving this request failed ({type(exc).__name__}); retry.", "server_error",
                    code="replica_failed", retry_after_s=1)


def _refusal(reply: Reply) -> APIError | None:
    """A replica's answer that it did not serve the request: squashed after waiting past
    its deadline (DynamoLLM), or shed on overload. Both are worth retrying later."""
    if isinstance(reply, Squashed):
        return APIError(503, f"The request waited {reply.waited_s:.0f} s without starting and was dropped; "
                        "retry.", "overloaded", code="request_squashed", retry_after_s=1)
    if isinstance(reply, Shed):
        return APIError(503, f"The replica is overloaded ({reply.reason}); retry later.", "overloaded",
                        code=POOL_FULL, retry_after_s=reply.retry_after_s)
    return None


def _stream_failure(exc: Exception) -> APIError:
    if isinstance(exc, BackPressureError):
        return _overloaded()
    if isinstance(exc, (RayError, StreamBroken)):
        return _replica_failed(exc)
    return APIError(500, f"The stream failed ({type(exc).__name__}).", "server_error")


def _outcome_of(err: APIError) -> str:
    return "error_retryable" if err.retry_after_s is not None else "error_final"


def _service_report(request: Any, pool: str, result: ReplicaChunk, resumption: Resumption, now_s: float,
                    first_token_s: float | None = None) -> dict[str, Any] | None:
    """How the request was served against its SLO, as the client saw it (the `wattwise`
    field of a response): from arrival at the ingress to the client's last token, resumes
    included; a resume's silence longer than the TTFT target misses the SLO."""
    usage = result.usage
    if usage is None:
        return None
    n = usage.completion_tokens
    ttft_s = usage.ttft_s if first_token_s is None else first_token_s - request.arrival_s
    e2e_s = max(now_s - request.arrival_s, ttft_s)
    mean_tbt_s = (e2e_s - ttft_s) / (n - 1) if n > 1 else 0.0
    return {
        "length_class": request.length_class,
        "service_class": request.service_class,
        "pool": pool,
        "ttft_s": ttft_s,
        "mean_tbt_s": mean_tbt_s,
        "e2e_s": e2e_s,
        "slo_ttft_s": request.slo.ttft_s,
        "slo_tbt_s": request.slo.tbt_s,
        "slo_met": (ttft_s <= request.slo.ttft_s and mean_tbt_s <= request.slo.tbt_s
                    and resumption.stall_s <= request.slo.ttft_s),
        "resumed": resumption.resumed,
        "retries": resumption.retries,
        "resume_stall_s": resumption.stall_s,
        **({"splitwise": result.splitwise.to_json()} if result.splitwise is not None else {}),
    }


RESUMED = TypeAdapter(StreamState)  # a front's RESUME_FIELD, checked as app.federation_wire.HeldStream says


def resumed_elsewhere(body: Any, federated: bool) -> StreamState | None:
    """The stream state a federation front sent in the body (app.federation_wire), if any;
    only a front holding an admin key may send one."""
    raw = (body.model_extra or {}).get(RESUME_FIELD)
    if raw is None:
        return None
    if not federated:
        raise APIError(403, f"'{RESUME_FIELD}' is for a federation front: send one of the app's admin keys in "
                       f"{ADMIN_KEY_HEADER}.", "permission_error", param=RESUME_FIELD, code="admin_key_required")
    if not body.stream:
        raise APIError(400, f"'{RESUME_FIELD}' resumes a stream: send it with stream: true.", param=RESUME_FIELD)
    try:
        return RESUMED.validate_python(raw)
    except ValidationError as exc:
        raise invalid_request(exc) from None


class Ingress:
    def __init__(self, config: AppConfig, pools: dict[str, DeploymentHandle], app_name: str,
                 batch_queue: DeploymentHandle | None = None, splitwise: DeploymentHandle | None = None,
                 follow_plan: PlanFollower | None = None, state: IngressState | None = None,
                 rate_limits: RateLimitGate | None = None) -> None:
        self.config = config
        phase_split = PhaseSplit(pools, splitwise, config.splitwise) if splitwise else None
        # What the routes share (the admin and Batch API routers depend on it, not on this class).
        self.state = state if state is not None else IngressState(config, pools, app_name, batch_queue, phase_split)
        self.phase_split = self.state.phase_split
        self.pools = pools  # every pool's deployments, shadow-TP ones included
        self.metrics = self.state.metrics
        self.prompts = prompt_tokenizer(config)
        self.classifier = Classifier(config.lengths, config.services, config.pool_of_class())
        self.predictor = make_predictor(config.predictor, config.lengths, config.prior_output_tokens)
        # In Serve, limits hold across ingress replicas (deployments.rate_ledger); here, in-process.
        self.rate_limits = rate_limits if rate_limits is not None else RateLimitGate(config, app_name)
        self.router = WeightedRouter()
        self.tool_parsing = tool_parsing(config)
        self._follow_plan = follow_plan  # None: no controller (tests apply plans themselves)
        self._follower: asyncio.Task | None = None
        self._app: FastAPI | None = None

    def http_app(self) -> FastAPI:
        """This replica's FastAPI app: the OpenAI, admin and Batch API routes over its state."""
        if self._app is None:
            self._app = build_http_app(ROUTERS, ingress=self, ingress_state=self.state)
        return self._app

    async def exchange(self, http: HttpExchange) -> AsyncIterator[ResponseParts]:
        """One HTTP request from the gateway, answered by this replica's app in batches of
        parts (deployments.asgi_bridge); a stream another replica began goes on from
        `http.resume`."""
        async for parts in run_exchange(self.http_app(), http):
            yield parts

    def model_cards(self) -> list[dict[str, Any]]:
        """This app's entries of /v1/models, as vLLM lists a model and its LoRA adapters
        (other apps' /v1 list them too: AppConfig.model_apps)."""
        config = self.config
        root = getattr(config.pools[0].engine, "model", config.model_name)
        now = int(time.time())
        permission = {"object": "model_permission", "created": now, "allow_create_engine": False,
                      "allow_sampling": True, "allow_logprobs": not config.modelled, "allow_search_indices": False,
                      "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None,
                      "is_blocking": False}
        adapters = getattr(config.pools[0].engine, "lora_adapters", [])
        return [{"id": name, "object": "model", "created": now, "owned_by": "wattwise", "root": path,
                 "parent": parent, "max_model_len": config.max_context_tokens,
                 "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", **permission}]}
                for name, path, parent in [(config.model_name, root, None),
                                           *((a.name, a.path, config.model_name) for a in adapters)]]

    def _ensure_following_plan(self) -> None:
        """Routing weights (DynamoLLM spill) and serving deployments (shadow TP changes)
        come from the controller's published plan."""
        if self._follow_plan is not None and (self._follower is None or self._follower.done()):
            self._follower = asyncio.get_running_loop().create_task(self._follow_plan(self.apply_plan))

    def apply_plan(self, plan: PublishedPlan) -> None:
        self.router.set_weights(plan.routing_weights)
        self.state.apply_plan(plan)

    # ---- the request path --------------------------------------------------------
    async def _serve(self, http: HTTPRequest, route: str, schema: type, prompt_of: Callable) -> Any:
        exchange = current_exchange()
        resume = exchange.resume if exchange is not None else None  # a stream another replica began
        arrival_s = time.time()
        self._ensure_following_plan()
        try:
            tenant = self.state.authenticate(http)
            federated = self.state.federated(http)
            body: Any = await self.state.parse(http, schema)
            if resume is None:  # a stream another cloud began (app.federation_wire)
                resume = resumed_elsewhere(body, federated)
            arrival_s = arrival_s if resume is None else resume.arrival_s
            with tracer.start_as_current_span("wattwise.classify") as span:
                tools = self._tools(body)
                request, pool = self._classify(body, prompt_of(body), tenant.name, tenant.service_class, arrival_s,
                                               tenant.slo_override, None if resume is None else resume.request_id,
                                               tools)
                if resume is None:  # a resumed stream's tokens were charged when it began
                    await self._check_rate(tenant.name, request.prompt_tokens + body.n * request.max_tokens)
                drained = self.state.drained
                pool = self.state.undrained(self.router.pick(
                    request.length_class, pool, allowed={p.deployment_name for p in self.config.pools} - drained))
                span.set_attribute("wattwise.length_class", request.length_class)
                span.set_attribute("wattwise.pool", pool)
            attempts = self._attempts(request.service_class, pool)
            renderer = self._renderer(body, request, tools)
            with self._accounted(route):
                for i, attempt in enumerate(attempts):
                    request.refuse_above_pending_tokens = attempt.refuse_above_pending_tokens
                    try:
                        response = await self._respond(body, request, attempt.pool, renderer, route,
                                                       [a.pool for a in attempts[i + 1:]], resume, federated)
                    except APIError as err:
                        if err.code == POOL_FULL and i + 1 < len(attempts):
                            continue  # overflow: to the mixed pool (Chiron), or a pool with room
                        raise
                    request.refuse_above_pending_tokens = None  # a resumed stream queues where it goes
                    return response
        except APIError as err:
            self.metrics.record(route, err.status)
            raise  # answered by the app's APIError handler (deployments.http_app)

    def _tools(self, body: Any) -> Any:
        """A chat request's tool calls, prepared by the app's vLLM tool parser (the constraint
        and the parsing of `tools` with a tool choice other than "none"); None without."""
        choice = getattr(body, "effective_tool_choice", "none")
        if choice == "none":
            return None
        if self.tool_parsing is None:
            what = f"function {choice.function.name!r}" if isinstance(choice, NamedToolChoice) else repr(choice)
            raise APIError(400, f"tool_choice {what} needs a tool call parser; this app has none (vLLM's server "
                           "needs --tool-call-parser; here it is the app's `tool_call_parser`, on vLLM pools).",
                           param="tool_choice", code="unsupported_parameter")
        try:
            return self.tool_parsing.prepare(body.model_dump(mode="json", by_alias=True, exclude_unset=True))
        except ValueError as exc:  # vLLM's own validation (pydantic's errors are ValueErrors)
            raise APIError(400, f"Invalid tools request: {exc}", param="tools") from None

    def _renderer(self, body: Any, request: Request, tools: Any) -> Renderer:
        if isinstance(body, ChatCompletionRequest):
            return ChatRenderer(body, (lambda i: tools.calls()) if tools is not None else (lambda i: None))
        return CompletionRenderer(body, request.prompt_text)

    @contextmanager
    def _accounted(self, route: str) -> Iterator[None]:
        """Count a request accepted, and its outcome if it fails or its client leaves before
        the response is sent (a sent one counts its own: completed, or its stream's end)."""
        self.metrics.accepted(route)
        try:
            yield
        except APIError as err:
            self.metrics.outcome(route, _outcome_of(err))
            raise
        except asyncio.CancelledError:
            self.metrics.outcome(route, "cancelled")
            raise

    async def _respond(self, body: Any, request: Request, pool: str, renderer: Renderer, route: str,
                       fallbacks: Sequence[str] = (), resume: StreamState | None = None,
                       federated: bool = False) -> Any:
        """Serve on `pool`, each of the `n` choices as a request of its own (app.choices); a
        failed replica's request is retried there, then on `fallbacks`. A stream goes on from
        `resume`, what its client holds; a `federated` one reports each event's tokens to the
        front door that called."""
        rid = f"{'chatcmpl' if isinstance(renderer, ChatRenderer) else 'cmpl'}-{request.request_id}"
        pools = [pool, *fallbacks]
        requests = choice_requests(request, body.n)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            exchange = current_exchange()
            start = partial(self._start_stream, own_request_id=len(requests) > 1)
            streams = [ResumableStream(start, r, pools, self.config.max_retries, self.metrics.retried,
                                       progress=None if resume is None else resume.progress(),
                                       inherited=Resumption() if resume is None else resume.resumption())
                       for r in requests]
            if exchange is not None and len(streams) == 1:  # the gateway resumes one choice's stream
                exchange.follow(streams[0], request.request_id)
            firsts = [await self._first_chunk(gen) for gen in streams]
            self.metrics.record(route, 200)
            return StreamingResponse(
                self._sse(streams, firsts, rid, body.model, renderer, request, route, include_usage,
                          resume is None or resume.events == 0, federated),
                media_type="text/event-stream",
            )
        retried: list[str] = []

        def on_retry(next_pool: str) -> None:
            retried.append(next_pool)
            self.metrics.retried(next_pool)

        results = await asyncio.gather(*(self._call(call_with_retries(
            partial(self._start_complete, r, own_request_id=len(requests) > 1), pools, self.config.max_retries,
            on_retry)) for r in requests))
        for r, result in zip(requests, results, strict=True):
            self._learn(r, result)
        self.metrics.record(route, 200)
        self.metrics.outcome(route, "completed")
        response = renderer.whole(rid, body.model, results)
        response["wattwise"] = self._report(request, pool, results[0], Resumption(retries=len(retried)))
        return response

    def _report(self, request: Any, pool: str, result: ReplicaChunk, resumption: Resumption,
                first_token_s: float | None = None) -> dict[str, Any] | None:
        """The response's `wattwise` block, also counted in the ingress's latency and SLO metrics."""
        report = _service_report(request, pool, result, resumption, time.time(), first_token_s)
        if report is not None:
            self.metrics.served(request.service_class, report["e2e_s"], report["slo_met"], resumption.resumed)
        return report

    def _attempts(self, service_class: str, pool: str) -> list[Attempt]:
        """Pools to try in order, none drained. With length pools, an interactive request
        whose pool is backed up tries the other serving pools with a replica running
        (app.pool_overflow); with Chiron's kinds, the kind's pool and then mixed."""
        drained = self.state.drained
        if self.config.pool_of_kind(ReplicaKind.MIXED) is not None:
            kinds = [p for p in self._candidates(service_class, pool) if p not in drained]
            return [Attempt(p, None) for p in kinds or [pool]]
        if self.phase_split is not None:
            return [Attempt(pool, None)]
        order = [p.deployment_name for p in self.config.pools if p.deployment_name not in drained]
        serving = serving_pools(self.router.weights, order)
        attempts = overflow_attempts(pool, service_class, serving, self.config.pool_overflow)
        if len(attempts) == 1:
            return attempts
        # An overflow target must have a replica running (one not counted yet is taken as running).
        return [a for a in attempts
                if a.refuse_above_pending_tokens is None or self.state.running_replicas_of(a.pool) != 0]

    def _candidates(self, service_class: str, pool: str) -> list[str]:
        """Pools to try in order. With Chiron's replica kinds: interactive requests go to
        the interactive pool, then mixed; batch ones to batch replicas if any run, then mixed."""
        mixed = self.config.pool_of_kind(ReplicaKind.MIXED)
        if mixed is None:
            return [pool]
        if service_class == "batch":
            batch = self.config.pool_of_kind(ReplicaKind.BATCH)
            return [batch, mixed] if batch and (self.state.running_replicas_of(batch) or 0) > 0 else [mixed]
        interactive = self.config.pool_of_kind(ReplicaKind.INTERACTIVE)
        return [interactive, mixed] if interactive else [mixed]

    async def run_batch_request(self, body: dict[str, Any], deadline_s: float) -> tuple[bool, dict[str, Any]]:
        """One line of a Batch API file, served as a batch-class completion (called by the
        BatchQueue deployment). Returns (ok, response body or error object)."""
        chat = "messages" in body
        schema: type[ChatCompletionRequest | CompletionRequest] = ChatCompletionRequest if chat else CompletionRequest
        route = ROUTE_CHAT if chat else ROUTE_COMPLETIONS
        try:
            try:
                parsed = schema.model_validate({**body, "stream": False, "stream_options": None})
            except ValidationError as exc:
                raise invalid_request(exc) from None
            self.state.check_model(parsed.model)
            tools = self._tools(parsed)
            request, pool = self._classify(parsed, _prompt_of(parsed), "batch-api", "batch", time.time(), tools=tools)
            renderer = self._renderer(parsed, request, tools)
            candidates = self._candidates("batch", pool)
            with self._accounted(route):
                for i, pool in enumerate(candidates):
                    try:
                        return True, await self._respond(parsed, request, pool, renderer, route)
                    except APIError as err:
                        if err.code != POOL_FULL or i + 1 == len(candidates):
                            raise
            raise AssertionError("unreachable: the last candidate returns or raises")
        except APIError as err:
            return False, err.body()["error"]

    async def _check_rate(self, tenant: str, tokens: int) -> None:
        wait_s = await self.rate_limits.retry_after_s(tenant, tokens)
        if wait_s is not None:
            raise APIError(429, f"Rate limit reached for tenant {tenant!r}; retry in {wait_s:.1f} s.", "requests",
                           code="rate_limit_exceeded", retry_after_s=wait_s)

    def _classify(self, body: Any, prompt: str, tenant: str, service_class: str, arrival_s: float,
                  slo_override: dict[str, float] | None = None, request_id: str | None = None, tools: Any = None):
        sampling = sampling_of(body, self.config.modelled, None if tools is None else tools.structured)
        prompt = self.prompts.render(body, prompt)
        # vLLM's server tokenizes a chat template's text without adding special tokens (it has its own)
        add_special_tokens = not isinstance(body, ChatCompletionRequest)
        ids = self.prompts.encode(prompt, add_special_tokens)
        prompt_tokens = max(len(ids), 1)
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
        request_id = request_id or uuid.uuid4().hex
        predicted = self.predictor.predict(prompt_tokens, max_tokens, prompt, request_id)
        try:
            request, pool = self.classifier.classify(
                request_id, prompt_tokens, max_tokens, predicted, service_class, arrival_s, tenant,
                slo_override=slo_override,
            )
        except UnknownServiceClass as exc:
            raise APIError(400, str(exc), param=SERVICE_CLASS_HEADER) from None
        request.prompt_text, request.sampling, request.add_special_tokens = prompt, sampling, add_special_tokens
        request.adapter = None if body.model == self.config.model_name else body.model
        if self.config.prefix_cache is not None and request.adapter is None:  # an adapter's KV is its own
            request.prefix_hashes = block_hashes(ids, self.config.prefix_cache.block_tokens)
        return request, pool

    async def _call(self, response: Awaitable[Reply]) -> ReplicaChunk:
        try:
            result = await response
        except BackPressureError:
            raise _overloaded() from None
        except (RayError, StreamBroken) as exc:
            raise _replica_failed(exc) from None
        refused = _refusal(result)
        if refused is not None:
            raise refused
        assert isinstance(result, ReplicaChunk)
        return result

    async def _first_chunk(self, gen: ResumableStream) -> ReplicaChunk:
        """Await the first chunk before answering 200, so overload still gets a 503."""
        return await self._call(gen.__anext__())

    def _start_stream(self, request: Any, pool: str, own_request_id: bool = False) -> Any:
        """`own_request_id`: one of several concurrent calls of this request (n > 1 choices)."""
        if self.phase_split is not None:
            return self.phase_split.stream(request)
        method = self.pools[self.state.deployment(pool)].options(stream=True).generate
        return as_own_request(lambda: method.remote(request)) if own_request_id else method.remote(request)

    def _start_complete(self, request: Any, pool: str, own_request_id: bool = False) -> Any:
        if self.phase_split is not None:
            return self.phase_split.complete(request)
        method = self.pools[self.state.deployment(pool)].complete
        return as_own_request(lambda: method.remote(request)) if own_request_id else method.remote(request)

    async def _sse(self, streams: list[ResumableStream], firsts: Sequence[Reply], rid: str, model: str,
                   renderer: Renderer, request: Request, route: str, include_usage: bool,
                   first_event: bool = True, federated: bool = False) -> AsyncIterator[str]:
        """Stream the choices' chunks as SSE, as they come; a replica failure past the retries
        ends the stream with an OpenAI error event (retryable: 503 + retry_after), never
        silently. A choice's first event carries its role (`first_event`: none was sent
        before a resume). A `federated` stream's events carry their tokens (app.federation_wire)."""
        finals: dict[int, ReplicaChunk] = {}
        started = set() if first_event else {0}
        try:
            async for index, chunk in _interleaved(streams, firsts):
                refused = _refusal(chunk)
                if refused is not None:
                    raise refused
                assert isinstance(chunk, ReplicaChunk)
                events = renderer.events(rid, model, index, chunk, index not in started)
                started.add(index)
                if federated:
                    for k, event in enumerate(events):
                        event[PROGRESS_FIELD] = {"tokens": chunk.num_tokens if k == len(events) - 1 else 0}
                if chunk.finish_reason:
                    finals[index] = chunk
                    self._learn(request, chunk)
                    if index == 0 and events:
                        gen = streams[0]
                        events[-1]["wattwise"] = self._report(request, gen.pool, chunk, gen.resumption(),
                                                              gen.progress.first_token_s)
                for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
            if include_usage:
                usages = [finals[i].usage for i in sorted(finals)]
                yield f"data: {json.dumps(usage_event(renderer, rid, model, [u for u in usages if u]))}\n\n"
            yield "data: [DONE]\n\n"
            self.metrics.outcome(route, "completed")
        except (asyncio.CancelledError, GeneratorExit):
            for gen in streams:
                gen.cancel()
            self.metrics.outcome(route, "cancelled")
            raise
        except Exception as exc:  # every failure becomes an error event
            for gen in streams:
                gen.cancel()
            err = exc if isinstance(exc, APIError) else _stream_failure(exc)
            self.metrics.outcome(route, _outcome_of(err))
            yield f"data: {json.dumps(err.body())}\n\n"

    def _learn(self, request: Request, result: ReplicaChunk) -> None:
        if result.usage is not None:
            self.predictor.observe(
                request.prompt_tokens, result.usage.completion_tokens, request.predicted_output_tokens or 0,
                request.request_id,
            )


async def _interleaved(streams: list[ResumableStream], firsts: Sequence[Reply]) -> AsyncIterator[tuple[int, Reply]]:
    """(choice, chunk) from every stream as each comes, each stream's first given, until
    every stream has sent its last chunk (or a refusal)."""
    pending: dict[asyncio.Future, int] = {}
    for i, first in enumerate(firsts):
        yield i, first
        if isinstance(first, ReplicaChunk) and first.finish_reason is None:
            pending[asyncio.ensure_future(streams[i].__anext__())] = i
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                i = pending.pop(future)
                chunk = future.result()
                yield i, chunk
                if isinstance(chunk, ReplicaChunk) and chunk.finish_reason is None:
                    pending[asyncio.ensure_future(streams[i].__anext__())] = i
    finally:
        for future in pending:
            future.cancel()


def _prompt_of(body: ChatCompletionRequest | CompletionRequest) -> str:
    """The prompt before a chat template renders it (the modelled engine's text)."""
    if isinstance(body, ChatCompletionRequest):
        return body.prompt_text()
    return body.prompt if isinstance(body.prompt, str) else body.prompt[0]


# ---- the OpenAI routes ---------------------------------------------------------------------
async def serving_ingress(http: HTTPRequest) -> Ingress:
    """The Ingress of the replica serving this request (a FastAPI dependency; async, so
    FastAPI calls it inline rather than in its thread pool)."""
    return http.app.state.ingress


router = APIRouter()
Serving = Annotated[Ingress, Depends(serving_ingress)]


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


# Serve statuses in which a pool serves: an autoscaling one keeps its running replicas (the
# one controller resizes pools all the time), and a pool folded to none is routed around.
SERVING_STATUSES = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING"})


def pool_ready(status: dict[str, Any]) -> bool:
    """A pool deployment serves: healthy or autoscaling, or updating with replicas running
    (a rolling restart, e.g. a new TP); not unhealthy, failed, or deploying its first."""
    if status.get("status") in SERVING_STATUSES:
        return True
    return status.get("status") == "UPDATING" and status.get("replicas", {}).get("RUNNING", 0) > 0


@router.get("/health/ready")
def ready(ingress: Serving) -> JSONResponse:
    """Unauthenticated readiness (load balancers, LocalServe): does every pool deployment
    serve (`pool_ready`)? 200 or 503, and nothing more than that per pool."""
    state = ingress.state
    status = state.pools_status()
    pools = {p.deployment_name: pool_ready(status.get(state.deployment(p.deployment_name), {}))
             for p in ingress.config.pools}
    ready = bool(pools) and all(pools.values())
    return JSONResponse({"ready": ready, "pools": pools}, status_code=200 if ready else 503)


@router.get("/v1/models")
async def models(http: HTTPRequest, ingress: Serving) -> Any:
    """vLLM's model list: this app's model and adapters, then those of its `model_apps`."""
    ingress.state.authenticate(http)
    cards = ingress.model_cards()
    for app in ingress.config.model_apps:
        try:
            cards += await serve.get_deployment_handle("Ingress", app).model_cards.remote()
        except Exception:  # not deployed (yet), or failing: its models are not served now
            logger.warning("wattwise: app %r did not list its models", app, exc_info=True)
    return {"object": "list", "data": cards}


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeCompletionRequest))
async def tokenize(http: HTTPRequest, ingress: Serving) -> Any:
    """vLLM's /tokenize: a prompt's token ids, or chat messages' as a chat completion renders them."""
    state = ingress.state
    state.authenticate(http)
    data = json_object(await state.read_body(http))
    chat = "messages" in data
    body: Any = state.validated(data, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    prompts = ingress.prompts
    text = prompts.render(body, messages_text(body.messages)) if chat else body.prompt
    ids = prompts.encode(text, body.add_special_tokens)
    return {"count": len(ids), "max_model_len": ingress.config.max_context_tokens, "tokens": ids,
            "token_strs": prompts.token_strs(ids) if body.return_token_strs else None}


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize(http: HTTPRequest, ingress: Serving) -> Any:
    state = ingress.state
    state.authenticate(http)
    body = await state.parse(http, DetokenizeRequest)
    try:
        return {"prompt": ingress.prompts.decode(body.tokens)}
    except ValueError as exc:
        raise APIError(400, f"Cannot detokenize: {exc}", param="tokens") from None


@router.post("/v1/embeddings")
async def embeddings(http: HTTPRequest, ingress: Serving) -> Any:
    """Refused: every pool here generates text; vLLM's server has no such route then either."""
    ingress.state.authenticate(http)
    raise APIError(404, f"/v1/embeddings is not served: '{ingress.config.model_name}' generates text and this app "
                   "serves no embedding model.", code="model_not_embedding")


@router.post(ROUTE_COMPLETIONS, openapi_extra=openapi_body(CompletionRequest))
async def completions(http: HTTPRequest, ingress: Serving) -> Any:
    return await ingress._serve(http, ROUTE_COMPLETIONS, CompletionRequest, _prompt_of)


@router.post(ROUTE_CHAT, openapi_extra=openapi_body(ChatCompletionRequest))
async def chat_completions(http: HTTPRequest, ingress: Serving) -> Any:
    return await ingress._serve(http, ROUTE_CHAT, ChatCompletionRequest, _prompt_of)


ROUTERS = (router, admin_routes.router, batch_routes.router)


def openapi_spec() -> dict[str, Any]:
    """The app's OpenAPI document, without an ingress behind it."""
    return build_http_app(ROUTERS).openapi()
