"""The OpenAI Batch API routes (/v1/files, /v1/batches) of the ingress, backed by the
durable BatchQueue deployment; the queue calls back Ingress.run_batch_request for
each line, so batch work takes the same request path as online work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from ray.serve.handle import DeploymentHandle

from app.openai_api import APIError, BatchCreateRequest, openapi_body
from deployments.http_app import error_response, fastapi_app

# /v1/files reads its form itself; this is what the route takes, for /openapi.json.
FILE_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "JSONL, one request per line"},
                   "purpose": {"type": "string", "enum": ["batch"]}}}}}}}


class BatchApiRoutes:
    """Mixed into the Ingress deployment (which holds config, batch_queue, _authenticate, _parse)."""

    def _batch_api(self, http: HTTPRequest) -> DeploymentHandle:
        self._authenticate(http)
        if self.batch_queue is None:
            raise APIError(404, "The Batch API is disabled in this deployment.", code="batch_api_disabled")
        return self.batch_queue

    @fastapi_app.post("/v1/files", openapi_extra=FILE_UPLOAD_BODY)
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
            return error_response(err)

    @fastapi_app.get("/v1/files/{file_id}")
    async def get_file(self, file_id: str, http: HTTPRequest) -> Any:
        return await self._batch_lookup(http, lambda q: q.file.remote(file_id), f"No file {file_id!r}.")

    @fastapi_app.get("/v1/files/{file_id}/content")
    async def get_file_content(self, file_id: str, http: HTTPRequest) -> Any:
        content = await self._batch_lookup(http, lambda q: q.file_content.remote(file_id), f"No file {file_id!r}.")
        return content if isinstance(content, JSONResponse) else Response(content, media_type="application/jsonl")

    @fastapi_app.post("/v1/batches", openapi_extra=openapi_body(BatchCreateRequest))
    async def create_batch(self, http: HTTPRequest) -> Any:
        try:
            queue = self._batch_api(http)
            body = await self._parse(http, BatchCreateRequest, check_model=False)
            batch = await queue.create_batch.remote(body.input_file_id, body.endpoint, body.completion_window)
            if "error" in batch:
                raise APIError(400, batch["error"], param="input_file_id")
            return batch
        except APIError as err:
            return error_response(err)

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
            return error_response(err)
