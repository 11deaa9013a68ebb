"""The labeller end to end on the tiny offline Llama (CPU, transformers): rows per prompt and
sample, lengths that agree with their finish, and a relabelling of the same prompts. Here for
the tiny model's fixture (built where vLLM is installed); the labeller itself runs no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_model_fixture import require_vllm, tiny_model  # noqa: F401 (fixture)

require_vllm()

from prediction.label_with_served_model import main


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_prompt_gets_a_row_per_sample_and_can_be_labelled_again(tiny_model: Path, tmp_path: Path) -> None:
    first = tmp_path / "labels.jsonl"
    args = ["--model", str(tiny_model), "--device", "cpu", "--max-new-tokens", "6", "--deadline-s", "3600"]
    assert main([*args, "--out", str(first), "--limit", "5", "--samples", "2"]) == 0
    labelled = rows(first)
    assert sorted((r["sample"], r["index"]) for r in labelled) == [(s, i) for s in (0, 1) for i in range(5)]
    for r in labelled:
        assert r["source"] == "sharegpt_pairs" and 0 <= r["response_tokens"] <= 6
        assert (r["finished"] == "length") == (r["response_tokens"] == 6)
    again = tmp_path / "again.jsonl"
    assert main([*args, "--out", str(again), "--prompts-from", str(first), "--limit", "3", "--seed", "7"]) == 0
    assert {r["index"] for r in rows(again)} == {r["index"] for r in labelled[:3]}
