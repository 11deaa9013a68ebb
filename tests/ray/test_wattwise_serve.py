"""The one controller end to end in Ray Serve, with the shipped serve_config.yaml:
interactive chat across length pools, a Batch API job through the same pools, the
plan's clock bands reaching the replicas and their per-step clocks moving inside them."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.live_app import wait_for
from wattwise.local_serve import LocalServe

pytestmark = pytest.mark.ray
MODEL = "llama2-70b-sim"
TOP_CLOCK_MHZ = 1980.0


def _clocks(served: LocalServe) -> dict[str, float]:
    """The lowest clock any replica of each pool reports (gauge, modelled GPUs)."""
    lowest: dict[str, float] = {}
    for labels, value in served.scrape("ray_wattwise_gpu_clock_mhz").items():
        pool = labels.split('pool="', 1)[1].split('"', 1)[0]
        lowest[pool] = min(value, lowest.get(pool, value))
    return lowest


def _chat(client: openai.OpenAI, words: int, tokens: int) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": " ".join(["word"] * words)}], max_tokens=tokens)


def _batch_file(n: int) -> bytes:
    lines = [{"custom_id": f"job-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"summarise report {i}", "max_tokens": 40}} for i in range(n)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def test_composite_serves_chat_and_batch_jobs_and_moves_clocks_inside_the_planned_bands() -> None:
    with LocalServe(dashboard=False) as served:
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="x", max_retries=0, timeout=120)
        pools = {"pool-short", "pool-medium", "pool-long"}

        def banded() -> bool:  # a pool is planned once its replicas have reported (or folded)
            plan = served.admin("GET", "/admin/plan").json()["plan"]
            folded = {p for p, n in plan.get("replicas", {}).items() if n == 0}
            return bool(plan) and set(plan.get("clock_band_mhz", {})) | folded == pools

        wait_for(banded, 180, "a plan with clock bands for every pool")
        plan = served.admin("GET", "/admin/plan").json()["plan"]
        assert plan["clock_mhz"] == {}  # the per-step clock is throttLL'eM's, inside the band
        assert all(low <= high == TOP_CLOCK_MHZ for low, high in plan["clock_band_mhz"].values())

        batch_file = client.files.create(file=("jobs.jsonl", _batch_file(12)), purpose="batch")
        batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/completions",
                                      completion_window="24h")
        # The Batch API queue's request groups reach the one controller: its Chiron layer
        # (Algorithm 2 on the deadlines) plans how many batch requests may be out at once.
        wait_for(lambda: "batch-queue" in served.admin("GET", "/admin/plan").json()["plan"].get("batch_in_flight", {}),
                 120, "the plan's batch_in_flight for the Batch API queue")
        shapes = [(20, 60), (600, 40), (2000, 30)] * 8  # short, medium and long prompts
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda s: _chat(client, *s), shapes))
        order = ["pool-short", "pool-medium", "pool-long"]
        for answer, (words, _) in zip(answers, shapes):  # its own pool, or a longer one it folded into
            own = order[[20, 600, 2000].index(words)]
            assert order.index(answer.model_extra["wattwise"]["pool"]) >= order.index(own)
        assert {a.model_extra["wattwise"]["pool"] for a, (w, _) in zip(answers, shapes) if w == 2000} == {"pool-long"}
        assert all(a.choices[0].finish_reason == "length" and a.usage.completion_tokens == t
                   for a, (_, t) in zip(answers, shapes))

        # Under load each replica's throttLL'eM clock leaves the top for the band below it.
        def lowered() -> bool:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda s: _chat(client, *s), [(20, 80)] * 4))
            clocks = _clocks(served)
            return any(clock < TOP_CLOCK_MHZ for clock in clocks.values())

        wait_for(lowered, 180, "a replica's clock below the top (throttLL'eM inside the band)")

        deadline = time.monotonic() + 300
        while (batch := client.batches.retrieve(batch.id)).status != "completed":
            assert time.monotonic() < deadline, f"batch not completed: {batch}"
            time.sleep(1)
        out = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        assert sorted(o["custom_id"] for o in out) == sorted(f"job-{i}" for i in range(12))
        assert all(o["error"] is None for o in out)
        assert httpx.get(f"{served.base_url}/health/ready", timeout=10).status_code == 200
