"""The pools' default router (deployments.kv_router) in a live app: a prompt skips the
replica whose KV cache is full, though that replica has the shorter queue.

Two replicas of the long pool, TP2 (a 70B model's 40,950 KV tokens each, llama3.1's long
context): one request with a 34,000-token prompt fills one replica past the 0.8 KV budget;
three more long prompts follow, each once the one before it has its first token. Joining the
shortest queue would send the third to the full replica (one request there, two on the
other); routing by KV room sends all three to the other.
"""

import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from core.kv_budget import KV_BUDGET
from core.token_counter import count_tokens
from tests.factories import INTERACTIVE_KEY, one_entry, quick_config
from tests.live_app import wait_for
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama3.1-70b-sim"
FILLING_PROMPT_TOKENS = 34_000  # 83% of a TP2 replica's KV cache
FOLLOWING_PROMPT_TOKENS = 1_100  # long-input class: the same pool


def _two_long_replicas(config: dict[str, Any]) -> None:
    quick_config(config)
    one_entry(config)  # one router: every request below is routed by the same one
    args = config["applications"][0]["args"]
    args["model_name"] = MODEL
    for pool in args["pools"]:
        pool["engine"]["model"] = "llama3.1-70b"
        if pool["name"] == "long":
            pool["autoscaling"] = {"min_replicas": 2, "initial_replicas": 2, "max_replicas": 2}


@pytest.fixture(scope="module")
def served() -> Iterator[LocalServe]:
    with LocalServe(edit=_two_long_replicas, dashboard=False) as local:
        yield local


def _prompt(tokens: int) -> str:
    prompt = " ".join(["word"] * tokens)
    assert count_tokens(prompt) >= tokens
    return prompt


def _long_pool(served: LocalServe) -> dict[str, tuple[float, float]]:
    """Each long-pool replica's (requests running, share of KV in use), as it last exported them."""
    running = served.scrape("ray_wattwise_num_requests_running")
    kv = served.scrape("ray_wattwise_kv_cache_usage_ratio")
    out: dict[str, tuple[float, float]] = {}
    for labels, value in running.items():
        if 'pool="long"' in labels:
            replica = labels.split('replica="', 1)[1].split('"', 1)[0]
            kv_share = next((v for k, v in kv.items() if f'replica="{replica}"' in k), 0.0)
            out[replica] = (value, kv_share)
    return out


class _Stream:
    """A streamed completion read on a thread of its own: its first token marks the prompt as
    prefilled; the rest keeps it running on its replica."""

    def __init__(self, client: openai.OpenAI, prompt: str, max_tokens: int) -> None:
        self.first_token = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(client, prompt, max_tokens), daemon=True)
        self._thread.start()

    def _read(self, client: openai.OpenAI, prompt: str, max_tokens: int) -> None:
        try:
            stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True)
            for _ in stream:
                self.first_token.set()
                if self._stop.is_set():
                    break
            stream.close()
        except BaseException as exc:  # surfaced by the test through `error`
            self.error = exc
            self.first_token.set()

    def started(self, timeout_s: float) -> None:
        assert self.first_token.wait(timeout_s), "no first token"
        assert self.error is None, self.error

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_a_prompt_skips_the_replica_whose_kv_cache_is_full_for_the_shorter_queue(served: LocalServe) -> None:
    wait_for(lambda: served.pool_replicas().get("pool-long") == 2, 180, "two long-pool replicas")
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=INTERACTIVE_KEY, max_retries=0, timeout=600)
    streams = [_Stream(client, _prompt(FILLING_PROMPT_TOKENS), max_tokens=3_000)]
    try:
        streams[0].started(timeout_s=240)

        def past_budget() -> dict[str, tuple[float, float]]:
            return {r: s for r, s in _long_pool(served).items() if s[1] >= KV_BUDGET}
        wait_for(past_budget, 120, "a long-pool replica past the KV budget")
        full = past_budget()
        assert len(full) == 1, f"not one replica past the KV budget: {_long_pool(served)}"
        filled = next(iter(full))
        for _ in range(3):
            streams.append(_Stream(client, _prompt(FOLLOWING_PROMPT_TOKENS), max_tokens=2_000))
            streams[-1].started(timeout_s=240)

        def placed() -> bool:
            pool = _long_pool(served)
            return sum(running for running, _ in pool.values()) == 4
        wait_for(placed, 120, "the four requests in the metrics")
        by_replica = {r: running for r, (running, _) in _long_pool(served).items()}
        other = next(r for r in by_replica if r != filled)
        assert (by_replica[filled], by_replica[other]) == (1, 3), by_replica
    finally:
        for stream in streams:
            stream.close()
