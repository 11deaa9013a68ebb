"""The shipped (prompt, response length) pairs and their splits by conversation.

Turns of one conversation share topic and style, so a split by row would score a model
on conversations it trained on; every split here hashes `conv_id` instead.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

from core.paths import DATA
from core.token_counter import count_tokens

# The checkout's data/ or, in an installed wheel, its package data (core.paths).
PROMPTS_FILE = DATA / "prompts" / "sharegpt_pairs.jsonl"
# The same prompts (and ML.ENERGY's ShareGPT prompts) answered by the served SmolLM2 (data/prompts/README.md).
SERVED_MODEL_LENGTHS_FILE = DATA / "prompts" / "smollm2_lengths.jsonl"


@dataclass(frozen=True)
class PromptPairs:
    """Aligned lists; lengths in tokens as core.token_counter counts them (the ingress's and
    the modelled engine's count, so predictions and length classes share one unit)."""

    prompts: list[str]
    prompt_tokens: list[int]
    output_tokens: list[int]
    conv_ids: list[str]

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, keep: list[bool]) -> PromptPairs:
        pick = [i for i, k in enumerate(keep) if k]
        return PromptPairs([self.prompts[i] for i in pick], [self.prompt_tokens[i] for i in pick],
                           [self.output_tokens[i] for i in pick], [self.conv_ids[i] for i in pick])


def load_pairs(path: Path = PROMPTS_FILE) -> PromptPairs:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return PromptPairs(
        [r["prompt"] for r in rows],
        [max(int(r["prompt_tokens"]), 1) for r in rows],
        [max(int(r["response_tokens"]), 1) for r in rows],
        [str(r["conv_id"]) for r in rows],
    )


def load_served_model_pairs(path: Path = SERVED_MODEL_LENGTHS_FILE, prompts_file: Path = PROMPTS_FILE) -> PromptPairs:
    """(prompt, the served model's own response length) pairs from prediction.label_with_served_model's rows.

    A row of the shipped pairs names its prompt by index in `prompts_file`; an extra prompt
    carries its text. Prompt tokens are counted as load_pairs counts them (core.token_counter),
    so both label sources feed the predictor the same features.
    """
    shipped = load_pairs(prompts_file)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [shipped.prompts[r["index"]] if r["source"] == "sharegpt_pairs" else r["prompt"] for r in rows]
    return PromptPairs(
        texts,
        [shipped.prompt_tokens[r["index"]] if r["source"] == "sharegpt_pairs" else max(count_tokens(t), 1)
         for r, t in zip(rows, texts)],
        [max(int(r["response_tokens"]), 1) for r in rows],
        [str(r["conv_id"]) for r in rows],
    )


LABEL_SOURCES = {"sharegpt": load_pairs, "smollm2": load_served_model_pairs}


def _slots(pairs: PromptPairs) -> list[int]:
    return [zlib.crc32(c.encode()) % 1000 for c in pairs.conv_ids]


def split_by_conversation(pairs: PromptPairs, held_out_fraction: float = 0.2) -> tuple[PromptPairs, PromptPairs]:
    """(rest, held out) on a hash of the conversation id: no conversation on both sides.

    The held-out slice is the top of the hash range, so at the default fraction it is
    split_three_way's test split: prompts the default predictor neither trained nor was tuned on.
    """
    held = [s >= 1000 - held_out_fraction * 1000 for s in _slots(pairs)]
    return pairs.subset([not h for h in held]), pairs.subset(held)


@dataclass(frozen=True)
class ThreeWaySplit:
    """train fits models, validation chooses among them (all tuning), test is scored once."""

    train: PromptPairs
    validation: PromptPairs
    test: PromptPairs


def split_three_way(pairs: PromptPairs, validation_fraction: float = 0.2, test_fraction: float = 0.2) -> ThreeWaySplit:
    """Deterministic split on a hash of the conversation id: no conversation on two sides.

    Test takes the top of the hash range and validation the band below it; the bottom
    slice, on which earlier models were tuned, lies in train.
    """
    slot = _slots(pairs)
    test_from = 1000 - test_fraction * 1000
    validation_from = test_from - validation_fraction * 1000
    return ThreeWaySplit(
        pairs.subset([s < validation_from for s in slot]),
        pairs.subset([validation_from <= s < test_from for s in slot]),
        pairs.subset([s >= test_from for s in slot]),
    )
