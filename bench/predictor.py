"""Output-length predictor (Mico §3.2): held-out accuracy vs baselines, and latency.

    python -m bench.predictor

Trains the default hashed-text model on the shipped ShareGPT pairs (split by
conversation), scores the held-out split in buckets of both schemes (Mico's 10 of
70 words, DynamoLLM's S / M / L), against baselines scored in the same run: the
training set's majority bucket, and the median output of training prompts of the same
input size (what BucketMedianPredictor converges to). Lengths are words (= sim tokens).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.length_buckets import LengthBuckets
from app.predictor_config import PredictorConfig, make_predictor
from app.prompt_data import PromptPairs, load_pairs, split_by_conversation
from core.classes import LengthClassConfig


def _scores(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    return float(np.mean(pred == truth)), float(np.mean(np.abs(pred - truth) <= 1))


def _by_input_size_median(train: PromptPairs, held: PromptPairs, buckets: LengthBuckets,
                          lengths: LengthClassConfig) -> np.ndarray:
    outputs: dict[str, list[int]] = {}
    for p, o in zip(train.prompt_tokens, train.output_tokens):
        outputs.setdefault(lengths.input_size(p), []).append(o)
    medians = {size: int(np.median(v)) for size, v in outputs.items()}
    overall = int(np.median(train.output_tokens))
    return np.array([buckets.label(medians.get(lengths.input_size(p), overall)) for p in held.prompt_tokens])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.predictor", description=__doc__)
    p.add_argument("--latency-samples", type=int, default=500)
    args = p.parse_args(argv)
    lengths = LengthClassConfig()
    train, held = split_by_conversation(load_pairs())
    print(f"train {len(train)} pairs, held out {len(held)} (by conversation); unit: words = sim tokens")
    print(f"{'buckets':>16} {'predictor':>24} {'exact':>7} {'within1':>8} {'x majority':>11} {'train s':>8}")
    for scheme in ("uniform", "length_classes"):
        config = PredictorConfig(buckets=scheme, online_sample_rate=0.0)
        start = time.perf_counter()
        predictor = make_predictor(config, lengths, 200)
        train_s = time.perf_counter() - start
        buckets = predictor.buckets
        truth = np.array([buckets.label(n) for n in held.output_tokens])
        majority = np.bincount([buckets.label(n) for n in train.output_tokens]).argmax()
        rows = {
            "majority bucket": np.full(len(truth), majority),
            "median by input size": _by_input_size_median(train, held, buckets, lengths),
            "hashed text (default)": predictor.predict_buckets(held.prompts, held.prompt_tokens),
        }
        base_exact, base_within = _scores(rows["majority bucket"], truth)
        for name, pred in rows.items():
            exact, within = _scores(pred, truth)
            print(f"{f'{scheme} ({buckets.n})':>16} {name:>24} {exact:>7.3f} {within:>8.3f} "
                  f"{exact / base_exact:>5.2f}/{within / base_within:<5.2f}"
                  f" {train_s if name.startswith('hashed') else 0:>8.2f}")
        errors = predictor.errors
        print(f"{'':>16} held-out error: mean relative {errors.mean_relative_error:.2f}, "
              f"actual/predicted p50 {errors.margin_ratio(0.5):.2f} p90 {errors.margin_ratio(0.9):.2f}")
    latencies = []
    for text, tokens in zip(held.prompts[: args.latency_samples], held.prompt_tokens):
        start = time.perf_counter()
        predictor.predict(tokens, 4096, text)
        latencies.append(time.perf_counter() - start)
    ms = np.array(latencies) * 1e3
    print(f"predict latency over {len(ms)} held-out prompts: p50 {np.percentile(ms, 50):.3f} ms, "
          f"p99 {np.percentile(ms, 99):.3f} ms, max {ms.max():.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
