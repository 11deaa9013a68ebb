"""The Serve app with a vLLM pool (serve_config.cpu.yaml on the tiny offline model):
real Ray, real HTTP, the real openai client, vLLM on the CPU. One app for the module (a
vLLM app takes a minute to start here): the TP rollout runs last, as it replaces the pool.

The TP rollout is the only way vLLM can change TP: a shadow deployment at the new TP. The
pool runs at TP1 and may run at TP2 (vLLM's multiprocessing executor; each CPU rank gets a
core of its own, engines.vllm_engine.cpu_ranks_bound). An operator's pin starts the TP2
deployment beside the serving TP1 one; traffic switches once it runs, TP1 drains, no
request fails, and the TP2 engine's greedy text equals HF's."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from core.paths import ROOT
from tests.factories import one_entry
from tests.live_app import in_replica, served_with_driver, wait_for
from tests.openai_parity import assert_same_shape, finish_reasons, post, streamed_text, vllm_server
from tests.shadow_load import Load, pin_and_watch, pools
from tests.tiny_model_fixture import build_tiny_lora, hf_greedy, require_vllm, tiny_model  # noqa: F401 (fixture)
from wattwise.local_serve import LocalServe
from wattwise.tiny_model import tiny_engine_config

pytestmark = pytest.mark.ray
require_vllm()

MODEL = "tiny-llm"
POOL = "pool-cpu"
BATCH_LIMIT = 2
PROMPT = "Return the number of items in the"


# vLLM's options both servers run with (the app's through engine_kwargs): compact JSON, so
# that the tiny model's constrained output closes its objects within a few tokens.
STRUCTURED = {"backend": "xgrammar", "disable_any_whitespace": True}
LORA = "tiny-lora"
SIM_MODEL = "sim-llm"  # served by a second app behind the same /v1 (model_apps)
TOOL_PARSER = "pythonic"  # a parser the tiny tokenizer can run (hermes needs its tokens)


@pytest.fixture(scope="module")
def lora(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lora(tiny_model, tmp_path_factory.mktemp("lora"))


def _sim_app(config: dict[str, Any]) -> dict[str, Any]:
    """The smallest app of modelled replicas: one pool, one replica, no gateway."""
    app = copy.deepcopy(config["applications"][0])
    app.update(name="sim", route_prefix="/sim")
    app["autoscaling_policy"]["policy_kwargs"] = {"policy": "utilisation"}
    pool = {"name": "sim", "classes": app["args"]["pools"][0]["classes"], "num_cpus": 0.1,
            "autoscaling": {"min_replicas": 1, "max_replicas": 1}, "engine": {}}
    app["args"] = {"model_name": SIM_MODEL, "gateway_replicas": 0, "ingress_replicas": 1,
                   "batch_api": {"enabled": False}, "pools": [pool]}
    return app


@pytest.fixture(scope="module")
def served(tiny_model: Path, lora: Path) -> Iterator[LocalServe]:
    def edit(config: dict[str, Any]) -> None:
        one_entry(config)
        config["applications"].append(_sim_app(config))
        app = config["applications"][0]
        app["autoscaling_policy"]["policy_kwargs"].update({"shadow_timeout_s": 600, "handover_s": 3})
        args = app["args"]
        args.update(model_name=MODEL, batch_api={"enabled": False}, tool_call_parser=TOOL_PARSER, model_apps=["sim"])
        pool = args["pools"][0]
        pool["engine"] = tiny_engine_config(tiny_model, batch_limit=BATCH_LIMIT, max_num_seqs=8,
                                            distributed_executor_backend="mp",
                                            engine_kwargs={"structured_outputs_config": STRUCTURED},
                                            lora_adapters=[{"name": LORA, "path": str(lora)}])
        pool["tensor_parallel_options"] = [1, 2]
        pool["num_cpus"] = 0.5  # both deployments fit the 2 logical CPUs while they overlap

    with served_with_driver(ROOT / "serve_config.cpu.yaml", edit) as local:
        yield local


@pytest.fixture(scope="module")
def vllm_url(tiny_model: Path, lora: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's own OpenAI server on the same model, adapter and options, once for the module."""
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", "--block-size", "32",
            "--seed", "0", "--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSER, "--enable-lora",
            "--lora-modules", f"{LORA}={lora}", "--structured-outputs-config", json.dumps(STRUCTURED)]
    with vllm_server(tiny_model, MODEL, args, tmp_path_factory.mktemp("vllm") / "server.log") as url:
        yield url


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


# ---- parity with vLLM's own OpenAI server (tests/openai_parity.py): the same requests to both ----
CHAT = [{"role": "user", "content": "Open the file and"}]
ANSWER = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}]
NAMED = {"type": "function", "function": {"name": "weather"}}
PARITY = [  # (route, body at temperature 0, top-level fields vLLM fills by a quirk this app does not mirror)
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 12}, set()),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "logprobs": 2, "echo": True}, set()),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 30, "stop": ["\n\n", "zz"]}, set()),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "frequency_penalty": 1.5, "presence_penalty": 0.5,
                         "repetition_penalty": 1.3, "top_k": 5, "min_p": 0.05, "logit_bias": {"266": 8}}, set()),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "model": LORA}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "logprobs": True, "top_logprobs": 2}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, "response_format": {"type": "json_object"}}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 20, "response_format": {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "tools": TOOLS, "tool_choice": "required"}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "tools": TOOLS, "tool_choice": NAMED}, set()),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10, "tools": TOOLS}, set()),  # "auto"
    # vLLM's chat echo also computes the prompt's logprobs (unasked); this app does not
    ("/v1/chat/completions", {"messages": [*CHAT, {"role": "assistant", "content": "The"}], "max_tokens": 4,
                              "echo": True}, {"prompt_logprobs"}),
]


def _close(ours: Any, theirs: Any, path: str = "") -> None:
    """Equal values, floats within 1e-3 (two engines' runs of one model)."""
    if isinstance(theirs, float) and isinstance(ours, (int, float)):
        assert abs(ours - theirs) <= 1e-3, (path, ours, theirs)
    elif isinstance(theirs, dict) and isinstance(ours, dict):
        assert set(ours) == set(theirs), (path, sorted(ours), sorted(theirs))
        for key in theirs:
            _close(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list) and isinstance(ours, list):
        assert len(ours) == len(theirs), (path, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _close(a, b, f"{path}.{i}")
    else:
        assert ours == theirs, (path, ours, theirs)


def _answer(choice: dict[str, Any]) -> dict[str, Any]:
    """What a client reads of a choice, tool-call ids aside."""
    message = choice.get("message", {})
    calls = [c["function"] for c in message.get("tool_calls") or ()]
    return {"text": choice.get("text", message.get("content")), "calls": calls, "finish": choice["finish_reason"],
            "stop_reason": choice.get("stop_reason"), "logprobs": choice.get("logprobs")}


@pytest.mark.parametrize(("route", "body", "quirks"), PARITY, ids=[
    ("chat:" if "chat" in route else "text:") + ",".join(k for k in body if k not in ("prompt", "messages",
                                                                                      "max_tokens"))
    for route, body, _ in PARITY])
def test_answers_as_vllms_own_server(served: LocalServe, vllm_url: str, route: str, body: dict[str, Any],
                                     quirks: set[str]) -> None:
    request = {"model": MODEL, "temperature": 0, **body}
    (status, ours), (vllm_status, theirs) = post(served.base_url, route, request), post(vllm_url, route, request)
    assert status == vllm_status == 200, (ours, theirs)
    assert_same_shape(ours, theirs, ignore={"id", "created", *quirks})
    for mine, vllm in zip(ours["choices"], theirs["choices"], strict=True):
        _close(_answer(mine), _answer(vllm))
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


def test_json_and_tool_calls_parse_as_json(served: LocalServe) -> None:
    """Constrained output is JSON a client can load (the schemas' enums keep the tiny model short;
    one call at most, or it would go on listing calls to its last token)."""
    (_, schema), (_, tool), (_, named) = (post(served.base_url, "/v1/chat/completions", {
        "model": MODEL, "messages": CHAT, "max_tokens": 100, "temperature": 0, **extra}) for extra in (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}},
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": TOOLS, "tool_choice": NAMED}))
    assert json.loads(schema["choices"][0]["message"]["content"])["answer"] in ("yes", "no")
    call = tool["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather" and tool["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
    assert json.loads(named["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"]


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "logprobs": 1, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "logprobs": True, "top_logprobs": 1}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "tools": TOOLS, "tool_choice": NAMED}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 30, "tools": TOOLS, "tool_choice": "required"}),
], ids=["completion-logprobs", "chat-logprobs", "named-tool", "required-tool"])
def test_streams_as_vllms_own_server(served: LocalServe, vllm_url: str, route: str, body: dict[str, Any]) -> None:
    request = {"model": MODEL, "temperature": 0, "stream": True, **body}
    (_, ours), (_, theirs) = post(served.base_url, route, request), post(vllm_url, route, request)
    chat = "chat" in route
    assert streamed_text(ours, chat) == streamed_text(theirs, chat) and finish_reasons(ours) == finish_reasons(theirs)
    merged: list[dict[str, Any]] = [{}, {}]
    for side, events in zip(merged, (ours, theirs), strict=True):
        for event in events:  # every field any event has, with its type (events differ in how text is split)
            side.update({k: v for k, v in event.items() if k not in ("id", "created")})
            side.setdefault("choices", []).extend(event.get("choices", []))
    assert_same_shape(*merged)


def test_sampled_choices_refusals_and_the_other_endpoints_as_vllm(served: LocalServe, vllm_url: str) -> None:
    """n > 1 sampled (each a valid sample, not vLLM's draw: app/choices.py), the 4xx vLLM
    answers, /tokenize, /detokenize, /v1/models and /v1/embeddings."""
    both = (served.base_url, vllm_url)
    n = [post(url, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "n": 2, "temperature": 0.8,
                                       "seed": 1})[1] for url in both]
    assert_same_shape(n[0], n[1], ignore={"id", "created"})
    assert [c["index"] for c in n[0]["choices"]] == [0, 1] and n[0]["usage"]["completion_tokens"] == 8
    for path, body, status in [
        ("/v1/completions", {"prompt": PROMPT, "n": 2, "temperature": 0}, 400),
        ("/v1/completions", {"prompt": PROMPT, "suffix": "x"}, 400),
        ("/v1/completions", {"prompt": PROMPT, "model": "nope"}, 404),
        ("/v1/embeddings", {"input": "x"}, 404),
    ]:
        assert [post(url, path, {"model": MODEL, **body})[0] for url in both] == [status, status], (path, body)
    for path, body in [("/tokenize", {"prompt": PROMPT}), ("/tokenize", {"messages": CHAT}),
                       ("/tokenize", {"prompt": PROMPT, "add_special_tokens": False, "return_token_strs": True}),
                       ("/detokenize", {"tokens": [373, 266, 497]})]:
        ours, theirs = (post(url, path, {"model": MODEL, **body}) for url in both)
        assert ours == theirs, (path, ours, theirs)
    models = [httpx.get(f"{url}/v1/models", timeout=60).json() for url in both]
    assert_same_shape(models[0]["data"][0], models[1]["data"][0], ignore={"created"})
    assert {m["id"] for m in models[0]["data"]} == {m["id"] for m in models[1]["data"]} | {SIM_MODEL}


def test_a_lora_adapter_and_another_apps_model_behind_one_v1(served: LocalServe) -> None:
    """The adapter changes the greedy text; a request naming the second app's model is served
    there (its placeholder words), through this app's /v1."""
    texts = [post(served.base_url, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 8,
                                                       "temperature": 0})[1]["choices"][0]["text"]
             for model in (MODEL, LORA)]
    assert texts[0] != texts[1]
    ask = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4}
    wait_for(lambda: post(served.base_url, "/v1/chat/completions", ask)[0] == 200, 300, "the second app to serve")
    status, sim = post(served.base_url, "/v1/chat/completions", ask)
    assert status == 200 and sim["model"] == SIM_MODEL and len(sim["choices"][0]["message"]["content"].split()) == 4
    assert post(served.base_url, "/v1/chat/completions", {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4,
                                                           "logprobs": True})[0] == 400  # modelled: refused


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
