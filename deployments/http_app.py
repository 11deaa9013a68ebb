"""The ingress's FastAPI app: its route groups (`APIRouter`s: the OpenAI routes, /admin/*,
the Batch API) over the objects they depend on, and the one exception handler that
answers every `APIError` in OpenAI's error format.

Each ingress replica builds its own app (`build_http_app`) around its own state; the
routes reach that state through FastAPI dependencies (`ingress_state`), so they are
plain functions a test can serve with any state it builds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from app.http_io import error_response
from app.openai_api import APIError

if TYPE_CHECKING:
    from deployments.ingress_state import IngressState

TITLE = "wattwise"
DESCRIPTION = "SLO-aware, energy-efficient LLM serving (OpenAI API)."


async def _api_error(_: HTTPRequest, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def ingress_state(http: HTTPRequest) -> IngressState:
    """The state of the ingress replica serving this request (a FastAPI dependency;
    async, so FastAPI calls it inline rather than in its thread pool)."""
    return http.app.state.ingress_state


def build_http_app(routers: Iterable[APIRouter], **state: Any) -> FastAPI:
    """The app serving `routers`, with each keyword in `app.state` for their dependencies."""
    app = FastAPI(title=TITLE, description=DESCRIPTION)
    app.add_exception_handler(APIError, _api_error)
    for name, value in state.items():
        setattr(app.state, name, value)
    for router in routers:
        app.include_router(router)
    return app
