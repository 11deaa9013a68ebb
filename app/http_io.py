"""Reading a request's body and answering an APIError: what every HTTP entry of wattwise
shares (the gateway, the ingress, the federation front door)."""

from __future__ import annotations

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from app.openai_api import APIError


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())


async def read_limited_body(http: HTTPRequest, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `limit` bytes: from
    Content-Length before reading anything, else while it streams in."""
    too_large = APIError(413, f"Request body exceeds {limit} bytes.", code="request_too_large")
    declared = http.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
