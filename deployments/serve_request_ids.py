"""A handle call of its own Serve request id, for the concurrent calls of one request.

Ray Serve gives a handle call made while serving a request that request's internal id
(`ray.serve.context`'s request context). An OpenAI request with `n` > 1 is n concurrent
calls from one ingress request (app.choices): under one id Serve's router delivered one
choice and left the other unrouted (vLLM parity test, n = 2: the second choice never reached
a replica; the client waited 300 s). Each such call takes a fresh id, in a copy of the
context, so the ingress request's own id is unchanged for everything else.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from typing import TypeVar

from ray.serve import context as serve_context
from ray.serve._private.utils import generate_request_id

T = TypeVar("T")


def as_own_request(call: Callable[[], T]) -> T:
    """`call()` (a handle's `.remote(...)`: it reads the request context as it is made) under a
    fresh internal request id."""

    def run() -> T:
        current = serve_context._get_serve_request_context()
        fresh = dataclasses.replace(current, _internal_request_id=generate_request_id())
        serve_context._serve_request_context.set(fresh)  # type: ignore[arg-type]  # Ray types it as None
        return call()

    return contextvars.copy_context().run(run)
