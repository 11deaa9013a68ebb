"""A vLLM pool changes TP the only way vLLM can: a shadow deployment at the new TP.

Real Ray, HTTP and openai client; vLLM on this CPU with the tiny offline model. The pool
runs at TP1 and may run at TP2 (vLLM's multiprocessing executor; each CPU rank gets a
core of its own, engines.vllm_engine.cpu_ranks_bound). An operator's pin starts the TP2
deployment beside the serving TP1 one; traffic switches once it runs, TP1 drains, no
request fails, and the TP2 engine's greedy text equals HF's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.paths import ROOT
from tests.live_app import in_replica, served_with_driver
from tests.shadow_load import Load, pin_and_watch, pools
from tests.tiny_model_fixture import hf_greedy, require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.local_serve import LocalServe
from wattwise.tiny_model import tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()

MODEL = "tiny-llm"
PROMPT = "Return the number of items in the"


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[LocalServe]:
    def edit(config: dict[str, Any]) -> None:
        app = config["applications"][0]
        app["autoscaling_policy"]["policy_kwargs"].update({"shadow_timeout_s": 300, "handover_s": 3})
        args = app["args"]
        args["model_name"] = MODEL
        args["batch_api"] = {"enabled": False}
        pool = args["pools"][0]
        pool["engine"] = tiny_engine_config(tiny_model, batch_limit=4, max_num_seqs=8,
                                            distributed_executor_backend="mp")
        pool["tensor_parallel_options"] = [1, 2]
        pool["num_cpus"] = 0.5  # both deployments fit the 2 logical CPUs while they overlap

    with served_with_driver(ROOT / "serve_config.cpu.yaml", edit) as local:
        yield local


def test_vllm_pool_moves_to_tp2_by_shadow_deployment(served: LocalServe, tiny_model: Path) -> None:
    status = pools(served)
    assert status["pool-cpu"]["serving"] and status["pool-cpu-tp2"]["replicas"].get("RUNNING", 0) == 0
    with Load(served.base_url, MODEL, max_tokens=8, threads=1) as load:
        rollout = pin_and_watch(served, load, "cpu", "pool-cpu", "pool-cpu-tp2", 2, timeout_s=240)
    print(f"\nshadow TP1->TP2 (vLLM, tiny model): {rollout.summary(load)}")
    assert load.failed == []
    assert rollout.old_running_before_switch and min(rollout.old_running_before_switch) >= 1
    assert sum(1 for t in load.done if t > rollout.retired_s) >= 1
    # The engine now serving really runs two ranks, and decodes exactly as HF does.
    assert in_replica("pool-cpu-tp2", lambda replica: replica.engine.stats().tensor_parallel) == 2
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    from transformers import AutoTokenizer

    assert text == AutoTokenizer.from_pretrained(tiny_model).decode(hf_greedy(tiny_model, PROMPT, 16))
    assert pools(served)["pool-cpu-tp2"]["rollout_outcomes"] == {"completed": 1}
