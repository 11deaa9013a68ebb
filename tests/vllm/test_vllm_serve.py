"""The Serve app with a vLLM pool (serve_config.cpu.yaml on the tiny offline model):
real Ray, real HTTP, the real openai client, vLLM on the CPU. One app for the module (a
vLLM app takes a minute to start here): the TP rollout runs last, as it replaces the pool.

The TP rollout is the only way vLLM can change TP: a shadow deployment at the new TP. The
pool runs at TP1 and may run at TP2 (vLLM's multiprocessing executor; each CPU rank gets a
core of its own, engines.vllm_engine.cpu_ranks_bound). An operator's pin starts the TP2
deployment beside the serving TP1 one; traffic switches once it runs, TP1 drains, no
request fails, and the TP2 engine's greedy text equals HF's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.paths import ROOT
from tests.factories import one_entry
from tests.live_app import in_replica, served_with_driver
from tests.shadow_load import Load, pin_and_watch, pools
from tests.tiny_model_fixture import hf_greedy, require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.local_serve import LocalServe
from wattwise.tiny_model import tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()

MODEL = "tiny-llm"
POOL = "pool-cpu"
BATCH_LIMIT = 2
PROMPT = "Return the number of items in the"


@pytest.fixture(scope="module")
def served(tiny_model: Path) -> Iterator[LocalServe]:
    def edit(config: dict[str, Any]) -> None:
        one_entry(config)
        app = config["applications"][0]
        app["autoscaling_policy"]["policy_kwargs"].update({"shadow_timeout_s": 600, "handover_s": 3})
        args = app["args"]
        args["model_name"] = MODEL
        args["batch_api"] = {"enabled": False}
        pool = args["pools"][0]
        pool["engine"] = tiny_engine_config(tiny_model, batch_limit=BATCH_LIMIT, max_num_seqs=8,
                                            distributed_executor_backend="mp")
        pool["tensor_parallel_options"] = [1, 2]
        pool["num_cpus"] = 0.5  # both deployments fit the 2 logical CPUs while they overlap

    with served_with_driver(ROOT / "serve_config.cpu.yaml", edit) as local:
        yield local


def _client(served: LocalServe) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="none", max_retries=0, timeout=120)


def _in_replica(read: Callable[[Any], Any]) -> Any:
    return in_replica(POOL, read)


def _replica_stats() -> dict[str, float]:
    return _in_replica(lambda replica: replica.engine.stats().to_metrics())


def _unfinished_in_vllm() -> int:
    """Requests vLLM itself still tracks (its output processor), not our own counters."""
    return _in_replica(lambda replica: replica.engine.unfinished_in_vllm())


def _reference(tiny_model: Path, prompt: str, max_tokens: int) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model).decode(hf_greedy(tiny_model, prompt, max_tokens))


def test_streamed_completion_matches_hf_greedy(served: LocalServe, tiny_model: Path) -> None:
    stream = _client(served).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
    text, usage, chunks = "", None, 0
    for chunk in stream:
        if chunk.choices:
            chunks += 1
            text += chunk.choices[0].text
        usage = chunk.usage or usage
    assert text == _reference(tiny_model, PROMPT, 24)
    # Not `chunks > 1`: the replica sends what the engine made in each 50 ms (stream_flush_s),
    # and the tiny model can make all 24 tokens in one of them (one CI run did).
    assert chunks >= 1 and usage.completion_tokens == 24


def test_streamed_chat_matches_hf_greedy_on_the_chat_template(served: LocalServe, tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Open the file and"}]
    rendered = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    stream = _client(served).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == _reference(tiny_model, rendered, 20)


def test_client_disconnect_frees_the_request_in_vllm(served: LocalServe) -> None:
    """A client that closes its stream mid-generation aborts its request in vLLM: the request
    never completes and vLLM tracks nothing after. The 900 tokens take ~2.5 s on an idle
    machine; a close that reaches vLLM after they end proves nothing (and reading vLLM's count
    between the first token and the close raced them too), so the test tries up to three times."""
    assert _unfinished_in_vllm() == 0  # also the driver's first call to the replica (seconds), made now
    outcomes = []
    for _ in range(3):
        completed_before = _replica_stats()["completed_requests"]
        stream = _client(served).completions.create(model=MODEL, prompt=PROMPT, max_tokens=900, temperature=0,
                                                    stream=True)
        next(iter(stream))
        stream.close()
        deadline = time.monotonic() + 60
        while _unfinished_in_vllm() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _unfinished_in_vllm() == 0, "vLLM still tracks the request a minute after its client left"
        stats = _replica_stats()
        assert stats["running_requests"] == 0 and stats["queued_requests"] == 0
        outcomes.append("aborted" if stats["completed_requests"] == completed_before else "completed first")
        if outcomes[-1] == "aborted":
            break
    assert outcomes[-1] == "aborted", f"the close never stopped the request before its end: {outcomes}"


def test_batch_limit_holds_and_stats_move_under_load(served: LocalServe) -> None:
    """Waves of 6 requests against a batch limit of 2, sampled until a sample catches the
    batch full with requests queued behind it: on a busy machine one stats call may take
    as long as a whole wave, so no single wave is sure to be caught mid-way."""
    client = _client(served)
    finished: list[str] = []

    def one(i: int) -> None:
        resp = client.completions.create(model=MODEL, prompt=f"{PROMPT} list {i}", max_tokens=200, temperature=0)
        finished.append(resp.choices[0].finish_reason)

    _replica_stats()  # the driver's first call to the replica is slow: not while sampling
    samples: list[dict[str, float]] = []
    waves = 0
    deadline = time.monotonic() + 300
    while not any(s["running_requests"] == BATCH_LIMIT and s["queued_requests"] >= 2 for s in samples):
        assert time.monotonic() < deadline, f"no sample caught a full batch with a queue in {waves} waves: {samples}"
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append(_replica_stats())
            time.sleep(0.1)
        for t in threads:
            t.join()
        waves += 1
    assert finished == ["length"] * 6 * waves
    assert all(s["running_requests"] <= BATCH_LIMIT and s["batch_limit"] == BATCH_LIMIT for s in samples)
    assert max(s["kv_blocks_used"] for s in samples) > 0
    after = _replica_stats()
    assert after["tokens_per_s"] > 0 and after["itl_ewma_s"] > 0 and after["completed_requests"] >= 6


def test_vllm_pool_moves_to_tp2_by_shadow_deployment(served: LocalServe, tiny_model: Path) -> None:
    status = pools(served)
    assert status["pool-cpu"]["serving"] and status["pool-cpu-tp2"]["replicas"].get("RUNNING", 0) == 0
    with Load(served.base_url, MODEL, max_tokens=8, threads=1) as load:
        rollout = pin_and_watch(served, load, "cpu", "pool-cpu", "pool-cpu-tp2", 2, timeout_s=540)
    print(f"\nshadow TP1->TP2 (vLLM, tiny model): {rollout.summary(load)}")
    assert load.failed == []
    assert rollout.old_running_before_switch and min(rollout.old_running_before_switch) >= 1
    assert sum(1 for t in load.done if t > rollout.retired_s) >= 1
    # The engine now serving really runs two ranks, and decodes exactly as HF does.
    assert in_replica("pool-cpu-tp2", lambda replica: replica.engine.stats().tensor_parallel) == 2
    text = _client(served).completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    assert text == _reference(tiny_model, PROMPT, 16)
    assert pools(served)["pool-cpu-tp2"]["rollout_outcomes"] == {"completed": 1}
