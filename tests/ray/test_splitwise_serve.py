"""Splitwise's phase split in Ray Serve: real Ray, real HTTP, the real openai client.

Prompts run on prompt replicas, their KV moves through Ray's object store, token
replicas decode; a dropped transfer is recomputed; a burst past the prompt pool's
threshold overflows into the mixed pool. The coordinator's counters are read over
HTTP (GET /admin/splitwise): a Serve handle in this process would leave router threads
behind that auto-start a stray Ray after the cluster stops.
"""

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.factories import one_entry
from tests.live_app import wait_for
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"
CONFIG = Path(__file__).resolve().parents[2] / "serve_config.splitwise.yaml"


def _split_config(config: dict[str, Any]) -> None:
    one_entry(config)
    args = config["applications"][0]["args"]
    args["batch_api"] = {"enabled": False}
    args["splitwise"].update({"transfer_failure_prob": 0.25, "kv_transfer_timeout_s": 0.5, "report_period_s": 0.5})
    # Two 150-token prompts in flight fill a prompt replica: a burst must overflow.
    args["splitwise"]["scheduling"]["prompt_queue_threshold_tokens"] = 250
    for pool in args["pools"]:
        pool["num_cpus"] = 0.05


@pytest.fixture(scope="module")
def served() -> Any:
    with LocalServe(CONFIG, edit=_split_config, dashboard=False) as local:
        yield local


def _coordinator_stats(served: LocalServe) -> dict[str, Any]:
    response = served.admin("GET", "/admin/splitwise")
    response.raise_for_status()
    return response.json()


def _client(served: LocalServe) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def _words(n: int) -> str:
    return " ".join(["word"] * n)


def test_phases_run_on_their_pools_and_kv_moves_or_is_recomputed(served: LocalServe) -> None:
    client = _client(served)
    # Serve may call a replica ready before the coordinator's poll has heard from it (a
    # slow first answer on a busy machine); until then its phase runs on the mixed pool.
    wait_for(lambda: {"pool-prompt", "pool-token"} <= set(_coordinator_stats(served)["deployments"].values()),
             180, "the coordinator to know a prompt and a token replica")
    first = client.completions.create(model=MODEL, prompt=_words(60), max_tokens=16)
    assert first.usage.completion_tokens == 16 and len(first.choices[0].text.split()) == 16
    split = first.model_extra["wattwise"]["splitwise"]
    deployments = _coordinator_stats(served)["deployments"]
    assert deployments[split["prompt_replica"]] == "pool-prompt"
    assert deployments[split["token_replica"]] == "pool-token"
    assert split["kv"] in ("object_store", "recomputed")

    # Streaming: the prompt replica's first token, then the token replica's stream.
    stream = client.completions.create(model=MODEL, prompt=_words(50), max_tokens=30, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(text.split()) == 30 and len(chunks) > 2
    assert chunks[-1].model_extra["wattwise"]["splitwise"]["token_replica"] in deployments

    # Enough requests that some transfers are dropped (p = 0.25): all still complete.
    def one(i: int) -> tuple[int, str]:
        r = client.completions.create(model=MODEL, prompt=_words(40 + i), max_tokens=8)
        return r.usage.completion_tokens, r.model_extra["wattwise"]["splitwise"]["kv"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(24)))
    assert all(tokens == 8 for tokens, _ in results)
    # Each response says how its token replica got the KV.
    kv_seen = Counter(kv for _, kv in results)
    assert kv_seen["object_store"] > 0, kv_seen
    assert kv_seen["recomputed"] > 0, kv_seen  # dropped transfers, recomputed on the token side

    # The ingress tells the coordinator each outcome without waiting for it (fire and forget):
    # the last ones may land just after their responses, later still on a loaded machine.
    told = 1 + 1 + sum(1 for _, kv in results if kv)  # the first request, the stream and these
    def counted() -> int:
        return sum(n for event, n in _coordinator_stats(served)["counts"].items() if event.startswith("kv_"))

    wait_for(lambda: counted() >= told, 180,
             f"the coordinator to count the {told} KV outcomes the responses report ({kv_seen})")


def test_a_burst_overflows_into_the_mixed_pool(served: LocalServe) -> None:
    client = _client(served)
    before = _coordinator_stats(served)["counts"]
    roles: list[str] = []

    def one(i: int) -> str:
        r = client.completions.create(model=MODEL, prompt=_words(150), max_tokens=40)
        assert r.usage.completion_tokens == 40
        return r.model_extra["wattwise"]["splitwise"]["prompt_role"]

    def burst_overflowed() -> bool:
        """Six clients at once; on a busy machine their prompts may reach the prompt replica
        one after another, never two in flight, so a burst is sent again until one overflows."""
        with ThreadPoolExecutor(6) as pool:
            roles.extend(pool.map(one, range(18)))
        return "mixed" in roles

    wait_for(burst_overflowed, 600, "a burst to overflow into the mixed pool", poll_s=0)
    after = _coordinator_stats(served)
    on_mixed = after["counts"].get("prompt_on_mixed", 0) - before.get("prompt_on_mixed", 0)
    assert on_mixed > 0, after  # the coordinator placed them, and counted them
    assert roles.count("prompt") > 0
