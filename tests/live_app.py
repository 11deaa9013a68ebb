"""Helpers for tests against a live app: poll until something holds, read its metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from wattwise.local_serve import LocalServe


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def metric_sum(served: LocalServe, name: str, **labels: str) -> float:
    """Sum of a metric's series with these labels on the Ray metrics endpoint."""
    total = 0.0
    for line in httpx.get(served.metrics_url, timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
