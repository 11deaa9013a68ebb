"""A Ray node of the test's own, started in-process with `ray.init(address="local")`."""

from __future__ import annotations

from typing import Any

import ray

# Ray gives a new node a fixed 30 s to register its raylet with the GCS; on a 2-core CI
# machine busy with the other tiers a start has missed that (test_plan_store, test_vllm_placement).
START_ATTEMPTS = 3


def init_local_ray(**kwargs: Any) -> None:
    """`ray.init` on a new local node (never one another module left behind, which would
    refuse this test's resources), started again when Ray's registration wait ran out."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            ray.init(address="local", **kwargs)
            return
        except Exception as exc:
            ray.shutdown()
            if attempt == START_ATTEMPTS or "timed out during startup" not in str(exc):
                raise
