"""The served model's own lengths as predictor data: the labeller's batching and prompt set,
and the shipped labels read back as pairs split by conversation."""

import json
import random
from pathlib import Path

from prediction.label_with_served_model import batches, load_prompts
from prediction.prompt_data import SERVED_MODEL_LENGTHS_FILE, load_pairs, load_served_model_pairs, split_three_way


def test_batches_hold_every_prompt_once_and_fit_the_kv_budget():
    rng = random.Random(3)
    lengths = [rng.randint(5, 900) for _ in range(700)]
    plan = batches(lengths, max_new_tokens=100, kv_token_budget=40_000, max_batch=64, seed=0)
    assert sorted(i for b in plan for i in b) == list(range(700))
    for batch in plan:
        assert len(batch) <= 64
        assert len(batch) == 1 or len(batch) * (max(lengths[i] for i in batch) + 100) <= 40_000
    assert plan == batches(lengths, 100, 40_000, 64, seed=0)  # a rerun with the seed labels the same batches
    assert plan != batches(lengths, 100, 40_000, 64, seed=1)  # in another order


def test_extra_prompts_add_only_those_not_shipped(tmp_path: Path):
    shipped = load_pairs()
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([
        {"id": "dup_0", "conversations": [{"from": "human", "value": shipped.prompts[0]}]},
        {"id": "new_0", "conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "A new one?"}]},
    ]))
    prompts = load_prompts(extra)
    assert len(prompts) == len(shipped) + 1
    added = prompts[-1]
    assert (added.source, added.index, added.conv_id, added.text) == ("extra", 1, "new_0", "A new one?")


def test_the_shipped_served_model_lengths_read_back_as_pairs_split_by_conversation():
    rows = [json.loads(line) for line in SERVED_MODEL_LENGTHS_FILE.read_text().splitlines()]
    pairs = load_served_model_pairs()
    shipped = load_pairs()
    assert len(pairs) == len(rows) > 2000
    for row, prompt, tokens in zip(rows, pairs.prompts, pairs.output_tokens):
        if row["source"] == "sharegpt_pairs":
            assert prompt == shipped.prompts[row["index"]]
        else:
            assert prompt == row["prompt"]
        assert 1 <= tokens <= 1100 and (tokens == 1100) == (row["finished"] == "length")
    split = split_three_way(pairs)
    sides = [set(s.conv_ids) for s in (split.train, split.validation, split.test)]
    assert not (sides[0] & sides[1]) and not (sides[0] & sides[2]) and not (sides[1] & sides[2])
    assert len(split.train) + len(split.validation) + len(split.test) == len(pairs)
