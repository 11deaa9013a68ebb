"""Splitwise's phase split in Ray Serve with vLLM replicas on the CPU (tiny offline model):
the prompt replica's engine stores the prompt's KV through vLLM's ExampleConnector, the
token replica's engine loads it (or recomputes on a miss) and streams the answer, which
must equal HF transformers' greedy continuation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.tiny_model_fixture import hf_greedy, require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.local_serve import LocalServe
from wattwise.paths import ROOT
from wattwise.tiny_model import stdlib_docstrings, tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()

MODEL = "tiny-llm"


@pytest.fixture(scope="module")
def kv_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv")


@pytest.fixture(scope="module")
def served(tiny_model: Path, kv_store: Path) -> Iterator[LocalServe]:  # noqa: F811
    def engine(role: str) -> dict[str, Any]:
        return tiny_engine_config(tiny_model, enable_prefix_caching=False,
                                  kv_transfer={"role": role, "storage_path": str(kv_store)})

    def edit(config: dict[str, Any]) -> None:
        args = config["applications"][0]["args"]
        args["model_name"] = MODEL
        args["batch_api"] = {"enabled": False}
        fixed = {"min_replicas": 1, "max_replicas": 1}
        args["pools"] = [
            {"name": "prompt", "phase": "prompt", "classes": ["SS"], "engine": engine("kv_producer"),
             "autoscaling": fixed, "num_cpus": 0.05},
            {"name": "token", "phase": "token", "classes": ["SS"], "engine": engine("kv_consumer"),
             "autoscaling": fixed, "num_cpus": 0.05},
        ]

    with LocalServe(ROOT / "serve_config.splitwise.yaml", edit=edit) as local:
        yield local


def test_split_through_serve_matches_hf_greedy(served: LocalServe, tiny_model: Path, kv_store: Path) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    prompt = stdlib_docstrings()[3][:700]
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    report = chunks[-1].model_extra["wattwise"]["splitwise"]
    assert report["prompt_role"] == "prompt" and report["token_role"] == "token"
    assert report["prompt_replica"] != report["token_replica"]
    assert report["kv"] == "connector"
    assert any(kv_store.iterdir()), "the prompt replica stored no KV"
    assert text == AutoTokenizer.from_pretrained(tiny_model).decode(hf_greedy(tiny_model, prompt, 24))
