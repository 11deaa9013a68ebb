"""The shipped (prompt, response length) pairs and their train / held-out split."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "data" / "prompts" / "sharegpt_pairs.jsonl"


@dataclass(frozen=True)
class PromptPairs:
    """Aligned lists; lengths in words (= tokens of the sim engine, see data/prompts/README.md)."""

    prompts: list[str]
    prompt_tokens: list[int]
    output_tokens: list[int]
    conv_ids: list[str]

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, keep: list[bool]) -> PromptPairs:
        pick = [i for i, k in enumerate(keep) if k]
        return PromptPairs(*([field[i] for i in pick] for field in
                             (self.prompts, self.prompt_tokens, self.output_tokens, self.conv_ids)))


def load_pairs(path: Path = PROMPTS_FILE) -> PromptPairs:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return PromptPairs(
        [r["prompt"] for r in rows],
        [max(int(r["prompt_words"]), 1) for r in rows],
        [max(int(r["response_words"]), 1) for r in rows],
        [str(r["conv_id"]) for r in rows],
    )


def split_by_conversation(pairs: PromptPairs, held_out_fraction: float = 0.2) -> tuple[PromptPairs, PromptPairs]:
    """Deterministic split on a hash of the conversation id: no conversation on both sides."""
    held = [zlib.crc32(c.encode()) % 1000 < held_out_fraction * 1000 for c in pairs.conv_ids]
    return pairs.subset([not h for h in held]), pairs.subset(held)
