"""The one FastAPI app of the ingress: the Ingress deployment and its route mixins
(admin, Batch API) all register their routes on it; Serve binds them to the class."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.openai_api import APIError

fastapi_app = FastAPI(title="wattwise", description="SLO-aware, energy-efficient LLM serving (OpenAI API).")


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers())
