"""Splitwise's phase split in Ray Serve with vLLM replicas on the CPU (tiny offline model):
the prompt replica's engine writes the prompt's KV blocks (BlockFileKVConnector), the
replica puts them into Ray's object store, the token replica fetches them into its own
engine's directory and its engine loads them; a quarter of the transfers are dropped on
purpose and those requests are recomputed. Every answer must equal HF transformers'
greedy continuation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.paths import ROOT
from tests.factories import one_entry
from tests.tiny_model_fixture import hf_greedy, require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.local_serve import LocalServe
from wattwise.tiny_model import stdlib_docstrings, tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()

MODEL = "tiny-llm"
DROPPED = 0.25  # share of KV transfers the prompt replica drops (failure injection)


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[LocalServe]:
    def engine(role: str) -> dict[str, Any]:
        return tiny_engine_config(tiny_model, enable_prefix_caching=False, kv_transfer={"role": role})

    def edit(config: dict[str, Any]) -> None:
        one_entry(config)
        args = config["applications"][0]["args"]
        args["model_name"] = MODEL
        args["batch_api"] = {"enabled": False}
        args["splitwise"].update({"transfer_failure_prob": DROPPED, "kv_transfer_timeout_s": 1.0})
        fixed = {"min_replicas": 1, "max_replicas": 1}
        args["pools"] = [
            {"name": "prompt", "phase": "prompt", "classes": ["SS"], "engine": engine("kv_producer"),
             "autoscaling": fixed, "num_cpus": 0.05},
            {"name": "token", "phase": "token", "classes": ["SS"], "engine": engine("kv_consumer"),
             "autoscaling": fixed, "num_cpus": 0.05},
        ]

    with LocalServe(ROOT / "serve_config.splitwise.yaml", edit=edit, dashboard=False) as local:
        yield local


def test_kv_moves_through_the_object_store_and_a_lost_transfer_is_recomputed(served: LocalServe,
                                                                               tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    prompt = stdlib_docstrings()[3][:700]
    reference = AutoTokenizer.from_pretrained(tiny_model).decode(hf_greedy(tiny_model, prompt, 24))
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    reports: list[dict[str, Any]] = []
    # Until both ways have been seen (each request drops its KV with p = DROPPED).
    while len(reports) < 40 and not {"object_store", "recomputed"} <= {r["kv"] for r in reports}:
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == reference
        reports.append(chunks[-1].model_extra["wattwise"]["splitwise"])
    kinds = [r["kv"] for r in reports]
    print(f"\n{len(reports)} requests: {kinds.count('object_store')} KV through the object store "
          f"({reports[kinds.index('object_store')]['kv_bytes']} bytes each), {kinds.count('recomputed')} recomputed")
    assert {"object_store", "recomputed"} <= set(kinds)
    for r in reports:
        assert (r["prompt_role"], r["token_role"]) == ("prompt", "token")
        assert r["prompt_replica"] != r["token_replica"]
    moved = next(r for r in reports if r["kv"] == "object_store")
    # Every full 32-token block of the prompt, as float32 K and V of 2 layers x 2 KV heads x 64 dims.
    prompt_tokens = len(AutoTokenizer.from_pretrained(tiny_model).encode(prompt))
    assert moved["kv_bytes"] >= prompt_tokens // 32 * 32 * 2 * 2 * 2 * 64 * 4
