"""A local Ray cluster with the app from serve_config.yaml, per test module (one at a time:
LocalServe.stop stops every Ray on the machine)."""

from collections.abc import Iterator
from typing import Any

import pytest

from app.config import hash_key
from wattwise.local_serve import LocalServe

INTERACTIVE_KEY = "sk-test-interactive"
BATCH_KEY = "sk-test-batch"
LIMITED_KEY = "sk-test-limited"


def _test_config(config: dict[str, Any]) -> None:
    """The shipped config, with test keys, full tracing and a quick-to-react policy: these
    tests exercise the HTTP surface and the replicas, so the utilisation policy (scale at 4
    requests per replica, shrink after 3 s) stands in for the one controller, which
    tests/test_wattwise_serve.py runs as shipped."""
    config["tracing_config"]["sampling_ratio"] = 1.0
    app = config["applications"][0]
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation", "target_requests_per_replica": 4,
                                                  "downscale_hold_s": 3}
    app["args"]["api_keys"] = [
        {"sha256": hash_key(INTERACTIVE_KEY), "tenant": "acme", "service_class": "interactive"},
        {"sha256": hash_key(BATCH_KEY), "tenant": "acme-batch", "service_class": "batch"},
        {"sha256": hash_key(LIMITED_KEY), "tenant": "small", "requests_per_s": 0.2},  # burst of 1 request
    ]
    for pool in app["args"]["pools"]:
        pool["autoscaling"]["max_replicas"] = 3
    # One ingress: tenant rate limits are kept per ingress replica, and the 429 test needs one bucket.
    app["args"]["ingress_replicas"] = 1


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServe]:
    with LocalServe(edit=_test_config) as local:
        yield local
