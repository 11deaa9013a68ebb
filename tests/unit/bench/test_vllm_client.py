"""The pure parts of bench/vllm_client.py: the ShareGPT file vLLM's loader reads, the
tokenizer directory it counts with, the command line and the app's figures from two
scrapes of its metrics. The bench itself (Ray, `vllm bench serve`) is run by hand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.vllm_client import (
    SHAREGPT_MAX_PROMPT,
    SHAREGPT_MAX_TOTAL,
    Case,
    bench_command,
    counter_delta,
    wattwise_figures,
    write_sharegpt_file,
    write_tokenizer_dir,
)
from core.token_counter import count_tokens


def test_sharegpt_file_keeps_what_vllms_loader_keeps_with_exact_lengths(tmp_path: Path) -> None:
    path, n = write_sharegpt_file(tmp_path / "sharegpt.json")
    entries = json.loads(path.read_text())
    assert len(entries) == n > 150
    for entry in entries[:50]:
        human, gpt = entry["conversations"]
        assert (human["from"], gpt["from"]) == ("human", "gpt")
        prompt, output = count_tokens(human["value"]), count_tokens(gpt["value"])
        assert output == len(gpt["value"].split()) >= 4  # placeholder words: one token each
        assert 4 <= prompt <= SHAREGPT_MAX_PROMPT and prompt + output <= SHAREGPT_MAX_TOTAL


def test_tokenizer_dir_counts_as_the_app_counts(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(write_tokenizer_dir(tmp_path / "tok")))
    for text in ("Hello, world!", "def f(x):\n    return x ** 2", "word " * 40, "nul\x00 byte"):
        assert len(tokenizer(text).input_ids) == count_tokens(text)
    assert tokenizer.eos_token == "<|im_end|>"


def test_command_names_the_backend_endpoint_and_dataset() -> None:
    args = argparse.Namespace(num_prompts=150, request_rate=3.0, seed=0, random_input_len=512,
                              random_output_len=128, random_range_ratio=0.9)
    chat = bench_command(Case("sharegpt", "openai-chat"), "http://h:1", Path("/t"), Path("/s.json"),
                         Path("/r/x.json"), args)
    assert chat[:3] == ["vllm", "bench", "serve"]
    assert chat[chat.index("--endpoint") + 1] == "/v1/chat/completions"
    assert chat[chat.index("--dataset-path") + 1] == "/s.json" and "--random-input-len" not in chat
    completions = bench_command(Case("random", "openai"), "http://h:1", Path("/t"), Path("/s.json"),
                                Path("/r/x.json"), args)
    assert completions[completions.index("--endpoint") + 1] == "/v1/completions"
    assert completions[completions.index("--dataset-name") + 1] == "random"


def test_figures_are_deltas_between_scrapes() -> None:
    outcome = 'ray_wattwise_request_outcomes_total{route="/v1/completions",outcome="%s"}'
    energy = 'ray_wattwise_energy_joules{pool="pool-short",replica="%s"}'
    before = {
        "ray_wattwise_request_outcomes_total": {outcome % "completed": 5.0},
        "ray_wattwise_requests_accepted_total": {'ray_wattwise_requests_accepted_total{route="/v1/completions"}': 5},
        "ray_wattwise_generation_tokens_total": {"ray_wattwise_generation_tokens_total{pool=\"s\"}": 100.0},
        "ray_wattwise_energy_joules": {energy % "a": 1000.0},
        "ray_wattwise_http_responses_total": {'ray_wattwise_http_responses_total{route="r",status="200"}': 5.0},
    }
    after = {
        "ray_wattwise_request_outcomes_total": {outcome % "completed": 14.0, outcome % "error_final": 1.0},
        "ray_wattwise_requests_accepted_total": {'ray_wattwise_requests_accepted_total{route="/v1/completions"}': 15},
        "ray_wattwise_generation_tokens_total": {"ray_wattwise_generation_tokens_total{pool=\"s\"}": 300.0},
        "ray_wattwise_energy_joules": {energy % "a": 1500.0, energy % "b": 100.0},  # b started in the window
        "ray_wattwise_http_responses_total": {'ray_wattwise_http_responses_total{route="r",status="200"}': 14.0,
                                              'ray_wattwise_http_responses_total{route="r",status="503"}': 1.0},
        "ray_wattwise_ingress_slo_requests_total": {'x{slo_met="true"}': 8.0, 'x{slo_met="false"}': 1.0},
    }
    w = wattwise_figures(before, after)
    assert w["accepted"] == 10 and w["outcomes"]["completed"] == 9 and w["outcomes"]["error_final"] == 1
    assert w["non_200"] == {"503": 1}
    assert w["slo_attainment"] == 8 / 9
    assert w["generated_tokens"] == 200 and w["fleet_energy_j"] == 600 and w["j_per_token"] == 3.0
    assert counter_delta(before, after, "ray_wattwise_missing_total") == 0
