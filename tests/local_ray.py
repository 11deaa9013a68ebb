"""A Ray node of the test's own, started in-process with `ray.init(address="local")`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import ray

# Ray gives a new node a fixed 30 s to register its raylet with the GCS; on a 2-core CI
# machine busy with the other tiers a start has missed that (test_plan_store, test_vllm_placement).
START_ATTEMPTS = 3
T = TypeVar("T")


def started_despite_registration_timeouts(start: Callable[[], T], after_failure: Callable[[], None],
                                          attempts: int = START_ATTEMPTS, pause_s: float = 0.0) -> T:
    """`start()`, tried again (up to `attempts`, `pause_s` apart) when Ray's registration wait
    ran out; `after_failure()` clears what a failed try left. Any other error is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as exc:
            after_failure()
            if attempt == attempts or "timed out during startup" not in str(exc):
                raise
            time.sleep(pause_s)
    raise AssertionError("unreachable")


def init_local_ray(**kwargs: Any) -> None:
    """`ray.init` on a new local node (never one another module left behind, which would
    refuse this test's resources), started again when Ray's registration wait ran out."""
    started_despite_registration_timeouts(lambda: ray.init(address="local", **kwargs), ray.shutdown)
