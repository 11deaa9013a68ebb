"""A request's `n` choices, each served as a request of its own: on any engine, by any
replica (with prefix routing, the replica that holds the prompt), resumed on its own.

vLLM's server draws n samples from one request; here choice i is a request with id
`<id>-<i>` (choice 0 keeps the request's id) and, for a seeded request, seed + i: each
choice is a valid sample, reproducible from the seed, but not vLLM's n-sample draw.
"""

from __future__ import annotations

from dataclasses import replace

from core.request import Request


def choice_requests(request: Request, n: int) -> list[Request]:
    return [request] + [
        replace(request, request_id=f"{request.request_id}-{i}", metadata=dict(request.metadata),
                sampling=request.sampling if request.sampling.seed is None
                else replace(request.sampling, seed=request.sampling.seed + i))
        for i in range(1, n)]
