"""Derive the shipped (prompt, response length) pairs from the ShareGPT source file.

    python -m bench.derive_prompt_pairs SOURCE.jsonl [data/prompts/sharegpt_pairs.jsonl]

SOURCE rows carry `conv_id`, `turn`, `prompt`, `response` and word counts
(data/prompts/README.md names the source). The response text is dropped to keep the file
small; its length is kept in tokens as core.token_counter counts them (the count the
ingress and the modelled engine use, so predicted lengths and length classes share one unit)
and in words, for reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.token_counter import count_tokens
from prediction.prompt_data import PROMPTS_FILE


def derive(source: Path, out: Path) -> int:
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({
                "conv_id": r["conv_id"], "turn": r["turn"], "prompt": r["prompt"],
                "prompt_tokens": count_tokens(r["prompt"]), "response_tokens": count_tokens(r["response"]),
                "prompt_words": r["prompt_words"], "response_words": r["response_words"],
            }) + "\n")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args[1]) if len(args) == 2 else PROMPTS_FILE
    print(f"{derive(Path(args[0]), out)} pairs -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
