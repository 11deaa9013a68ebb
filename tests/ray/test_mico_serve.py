"""Mico in the Serve path: the text predictor in the ingress, the token router in a pool."""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from tests.factories import one_entry
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"


def _token_routed(config: dict[str, Any]) -> None:
    """Two replicas of the short pool behind the token-balanced router; one of the others."""
    one_entry(config)
    app = config["applications"][0]
    for pool in app["args"]["pools"]:
        pool["request_router"] = "token_balanced"
        replicas = 2 if pool["name"] == "short" else 1
        pool["autoscaling"].update({"min_replicas": replicas, "max_replicas": replicas, "initial_replicas": replicas})


@pytest.fixture(scope="module")
def token_routed() -> LocalServe:
    with LocalServe(edit=_token_routed, dashboard=False) as local:
        yield local


def test_requests_through_the_token_router_all_complete(token_routed: LocalServe) -> None:
    client = openai.OpenAI(base_url=f"{token_routed.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    prompts = [" ".join(["word"] * (10 + i)) + " explain in detail" for i in range(12)]

    def one(prompt: str) -> Any:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, prompts))
    assert all(r.usage.completion_tokens == 8 for r in responses)
    assert {r.model_extra["wattwise"]["pool"] for r in responses} == {"pool-short"}
    assert token_routed.pool_replicas()["pool-short"] == 2
