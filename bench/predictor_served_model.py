"""Do the served model's own hidden states (SmolLM2-135M-Instruct) predict output length better?

    python -m bench.predictor_served_model            # sweep poolings and heads on the VALIDATION split
    python -m bench.predictor_served_model --test     # score the one configuration chosen on validation, on TEST

Needs `torch`, `transformers` and the model directory `wattwise prepare-model smollm2` writes
(an fp32 Llama checkpoint with tokenizer and chat template). Issue 19 item 2 lists "the
served model's own hidden states" as an option; this measures it exactly as
bench.predictor_encoder measured all-MiniLM-L6-v2 (same splits, heads, baselines, scores).

Features: the prompt's first `max_length` tokens inside the model's chat template (with its
default system prompt and the assistant header, as the served model reads it), run through
the base model (no LM head) in fp32 on the CPU. The constant system-prompt prefix runs once
and its KV cache is reused, so only the user tokens and the header are computed per prompt.
Three poolings come out of the one pass and are chosen between on validation: the mean of the
last layer over the prompt's own tokens, the last token's last layer (the state that emits
the first answer token), the mean of the middle layer. Each is standardised with the train
split's mean and spread (LLM hidden states have a few huge dimensions) and scaled to unit
norm on average, so the heads' regularisation means what it meant for MiniLM's embedding.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

from bench.predictor_embeddings import Config, EmbeddingBench, arguments, cached, finish, grid
from prediction.prompt_data import LABEL_SOURCES, PromptPairs, split_three_way
from wattwise.prepare_model import DEFAULT_DIR

POOLINGS = ("last-mean", "last-token", "middle-mean")


class ServedModelEncoder:
    """SmolLM2's pooled hidden states of chat-formatted prompts; CPU, fp32, one torch thread per core."""

    name = "smollm2-135m"

    def __init__(self, model_dir: Path = DEFAULT_DIR, max_length: int = 128) -> None:
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise ImportError("the served-model features need `pip install torch transformers`") from exc
        if not (Path(model_dir) / "config.json").exists():
            raise FileNotFoundError(f"{model_dir}: run `wattwise prepare-model smollm2` first")
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        # AutoModel: the base LlamaModel, without the LM head nobody reads here.
        self.model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32).eval()
        self.max_length = max_length
        self.middle = self.model.config.num_hidden_layers // 2
        marker = "\x00USER\x00"
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                                  add_generation_prompt=True)
        head, tail = str(text).split(marker)
        self.prefix_ids = self._ids(head)
        self.suffix_ids = self._ids(tail)
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([self.prefix_ids]), use_cache=True)
        self.prefix_cache = out.past_key_values

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, text: str) -> list[int]:
        """The user message's first max_length tokens, then the template's tail (end of turn, assistant header)."""
        return self._ids(text[:4000])[:self.max_length] + self.suffix_ids

    def encode(self, texts: list[str], batch_size: int = 16) -> dict[str, np.ndarray]:
        """One pooled vector per text and pooling (POOLINGS), rows in the input order."""
        torch = self._torch
        ids = [self.prompt_ids(t) for t in texts]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # batches pad little
        n_prefix = len(self.prefix_ids)
        out: dict[str, list[np.ndarray]] = {p: [] for p in POOLINGS}
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chunk = [ids[i] for i in order[start:start + batch_size]]
                width = max(len(c) for c in chunk)
                tokens = torch.full((len(chunk), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, c in enumerate(chunk):  # right padding: a real token never attends to a pad
                    tokens[row, :len(c)] = torch.tensor(c)
                    mask[row, :len(c)] = 1
                cache = copy.deepcopy(self.prefix_cache)
                cache.batch_repeat_interleave(len(chunk))
                result = self.model(input_ids=tokens, past_key_values=cache, use_cache=True, output_hidden_states=True,
                                    attention_mask=torch.cat([torch.ones((len(chunk), n_prefix), dtype=torch.long),
                                                              mask], dim=1),
                                    position_ids=torch.arange(n_prefix, n_prefix + width).expand(len(chunk), -1))
                weights = mask.unsqueeze(-1).to(torch.float32)
                last = result.last_hidden_state
                ends = mask.sum(1) - 1
                out["last-mean"].append(((last * weights).sum(1) / weights.sum(1)).numpy())
                out["last-token"].append(last[torch.arange(len(chunk)), ends].numpy())
                middle = result.hidden_states[self.middle]
                out["middle-mean"].append(((middle * weights).sum(1) / weights.sum(1)).numpy())
        positions = np.asarray(order, dtype=np.int64)
        pooled = {}
        for name, parts in out.items():
            rows = np.concatenate(parts)
            ordered = np.empty_like(rows)
            ordered[positions] = rows
            pooled[name] = ordered.astype(np.float64)
        return pooled


def standardise(train: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """z-score with the train split's statistics, then divide by sqrt(d): rows have unit norm on average,
    as MiniLM's normalised embeddings do, and no single huge hidden dimension dominates."""
    mean = train.mean(0)
    spread = train.std(0) + 1e-6
    scale = np.sqrt(train.shape[1])
    return (train - mean) / spread / scale, (other - mean) / spread / scale


def embeddings(encoder: ServedModelEncoder, pairs: PromptPairs) -> dict[str, np.ndarray]:
    """All poolings of every prompt, cached on disk (the sweep refits heads, never the model)."""
    key = f"{encoder.name}-{encoder.max_length}"
    return cached(key, pairs, lambda: encoder.encode(pairs.prompts))


# The configuration the validation sweep chose (highest exact + within-one on 10 buckets), filled in after it ran.
# Run 2026-11-24 at max_length 128: 0.321 / 0.712 vs the default's 0.270 / 0.655 (docs/mico.md). Batch-only (no
# online learning); the best SGD head, last-token alpha 1e-3 on the embedding alone, scored 0.316 / 0.704.
CHOSEN = Config("logistic", "embedding", 0.3, 1.0, "last-token")
GRID: list[Config] = [c for pooling in POOLINGS for c in grid(pooling)]


def main(argv: list[str] | None = None) -> int:
    p = arguments("python -m bench.predictor_served_model", __doc__)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    p.add_argument("--max-length", type=int, default=128, help="prompt tokens the model reads (the rest is cut)")
    args = p.parse_args(argv)
    split = split_three_way(LABEL_SOURCES[args.labels]())
    start = time.perf_counter()
    encoder = ServedModelEncoder(args.model_dir, args.max_length)
    load_s = time.perf_counter() - start
    other = split.test if args.test else split.validation
    start = time.perf_counter()
    raw_train = embeddings(encoder, split.train)
    embed_s = time.perf_counter() - start
    raw_other = embeddings(encoder, other)
    side = "TEST" if args.test else "validation"
    print(f"train {len(split.train)}, {side} {len(other)} (scored); {encoder.name} hidden states, fp32, "
          f"max_length {args.max_length} + {len(encoder.prefix_ids)} + {len(encoder.suffix_ids)} template tokens; "
          f"model load {load_s:.2f} s; train embeddings {embed_s:.1f} s (cached in ~/.cache/wattwise after the "
          "first run)")
    emb_train: dict[str, np.ndarray] = {}
    emb_other: dict[str, np.ndarray] = {}
    for pooling in POOLINGS:
        emb_train[pooling], emb_other[pooling] = standardise(raw_train[pooling], raw_other[pooling])
    bench = EmbeddingBench(split.train, other, emb_train, emb_other)
    return finish(bench, args, CHOSEN, GRID, encoder.encode, encoder._torch.get_num_threads())


if __name__ == "__main__":
    raise SystemExit(main())
