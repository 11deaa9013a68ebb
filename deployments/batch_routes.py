"""The OpenAI Batch API routes (/v1/files, /v1/batches) of the ingress, backed by the
durable BatchQueue deployment; the queue calls back Ingress.run_batch_request for
each line, so batch work takes the same request path as online work. The routes are
an `APIRouter` over the ingress's state (deployments.ingress_state)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import Response
from ray.serve.handle import DeploymentHandle

from app.openai_api import APIError, BatchCreateRequest, openapi_body
from deployments.http_app import ingress_state
from deployments.ingress_state import IngressState

router = APIRouter()
State = Annotated[IngressState, Depends(ingress_state)]

# /v1/files reads its form itself; this is what the route takes, for /openapi.json.
FILE_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "JSONL, one request per line"},
                   "purpose": {"type": "string", "enum": ["batch"]}}}}}}}



def _batch_api(state: IngressState, http: HTTPRequest) -> DeploymentHandle:
    state.authenticate(http)
    if state.batch_queue is None:
        raise APIError(404, "The Batch API is disabled in this deployment.", code="batch_api_disabled")
    return state.batch_queue


@router.post("/v1/files", openapi_extra=FILE_UPLOAD_BODY)
async def upload_file(http: HTTPRequest, state: State) -> Any:
    queue = _batch_api(state, http)
    form = await http.form()
    upload, purpose = form.get("file"), form.get("purpose")
    if upload is None or isinstance(upload, str) or purpose != "batch":
        raise APIError(400, "Send multipart form fields 'file' and purpose='batch'.", param="file")
    content = await upload.read()
    if len(content) > state.config.max_file_bytes:
        raise APIError(413, "The file is too large.", code="file_too_large")
    return await queue.add_file.remote(content, upload.filename or "input.jsonl", purpose)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, http: HTTPRequest, state: State) -> Any:
    return await _batch_lookup(state, http, lambda q: q.file.remote(file_id), f"No file {file_id!r}.")


@router.get("/v1/files/{file_id}/content")
async def get_file_content(file_id: str, http: HTTPRequest, state: State) -> Any:
    content = await _batch_lookup(state, http, lambda q: q.file_content.remote(file_id), f"No file {file_id!r}.")
    return Response(content, media_type="application/jsonl")


@router.post("/v1/batches", openapi_extra=openapi_body(BatchCreateRequest))
async def create_batch(http: HTTPRequest, state: State) -> Any:
    queue = _batch_api(state, http)
    body = await state.parse(http, BatchCreateRequest, check_model=False)
    batch = await queue.create_batch.remote(body.input_file_id, body.endpoint, body.completion_window)
    if "error" in batch:
        raise APIError(400, batch["error"], param="input_file_id")
    return batch


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, http: HTTPRequest, state: State) -> Any:
    return await _batch_lookup(state, http, lambda q: q.batch.remote(batch_id), f"No batch {batch_id!r}.")


async def _batch_lookup(state: IngressState, http: HTTPRequest, call: Callable[[DeploymentHandle], Awaitable[Any]],
                        missing: str) -> Any:
    result = await call(_batch_api(state, http))
    if result is None:
        raise APIError(404, missing, code="not_found")
    return result
