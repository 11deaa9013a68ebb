"""Output-length predictor (Mico §3.2): TEST-split accuracy of each candidate vs baselines, and latency.

    python -m bench.predictor [--labels smollm2]

The shipped ShareGPT pairs (or, with --labels smollm2, the served model's own lengths) split
three ways by conversation (prediction.prompt_data.split_three_way): every model fits on
train; hyper-parameters and the default were chosen on the validation split (python -m
bench.predictor_sweep); this scores the test split, each candidate at the sweep's winner for
the label source, in Mico's 10 buckets of l_max / 10 tokens and DynamoLLM's S / M / L.
Baselines use the same train split: its majority bucket, and the median output of its
prompts of the same input size (what BucketMedianPredictor converges to). "majority bucket
(all pairs)" is the baseline issue 19 used: the majority over all shipped pairs. Lengths are
tokens (core.token_counter).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from bench.predictor_candidates import BASELINES, CANDIDATES, WINNERS, Predict, labels, majority_bucket
from bench.predictor_sweep import add_labels_argument, scores
from core.classes import LengthClassConfig
from prediction.length_buckets import LengthBuckets
from prediction.predictor_config import PredictorConfig
from prediction.predictor_factory import make_bucket_predictor
from prediction.prompt_data import LABEL_SOURCES, split_three_way


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.predictor", description=__doc__)
    p.add_argument("--latency-samples", type=int, default=500)
    add_labels_argument(p)
    args = p.parse_args(argv)
    lengths = LengthClassConfig()
    pairs = LABEL_SOURCES[args.labels]()
    split = split_three_way(pairs)
    print(f"train {len(split.train)} pairs, validation {len(split.validation)} (chose hyper-parameters), "
          f"test {len(split.test)} (scored here); split by conversation; unit: tokens (core.token_counter)")
    l_max = PredictorConfig().l_max_tokens
    schemes = {f"10 x {l_max // 10} tokens": LengthBuckets.uniform(l_max, 10),
               "S/M/L": LengthBuckets.from_length_classes(lengths, l_max)}
    rows: dict[str, Predict] = dict(BASELINES)
    rows["majority bucket (all pairs)"] = lambda tr, b, te: majority_bucket(pairs, b, te)
    rows |= {c.name: functools.partial(c.predict, **WINNERS[args.labels].get(c.name, {})) for c in CANDIDATES}
    header = " ".join(f"{s + ' exact':>19} {'within1':>8}" for s in schemes)
    print(f"{'predictor':>36} {header}  predicted buckets (10)")
    for name, predict in rows.items():
        cells: list[float] = []
        spread = ""
        for buckets in schemes.values():
            pred = predict(split.train, buckets, split.test)
            cells += scores(pred, labels(buckets, split.test))
            if buckets.n == 10:
                spread = " ".join(str(n) for n in np.bincount(pred, minlength=buckets.n))
        print(f"{name:>36} {cells[0]:>19.3f} {cells[1]:>8.3f} {cells[2]:>19.3f} {cells[3]:>8.3f}  {spread}", flush=True)
    test_labels = labels(schemes[f"10 x {l_max // 10} tokens"], split.test)
    truth = " ".join(str(n) for n in np.bincount(test_labels, minlength=10))
    print(f"{'(actual test buckets)':>36} {'':>66}  {truth}")

    start = time.perf_counter()
    predictor = make_bucket_predictor(PredictorConfig(online_sample_rate=0.0), lengths)
    train_s = time.perf_counter() - start
    latencies = []
    for text, tokens in zip(split.test.prompts[: args.latency_samples], split.test.prompt_tokens):
        start = time.perf_counter()
        predictor.predict(tokens, 4096, text)
        latencies.append(time.perf_counter() - start)
    ms = np.array(latencies) * 1e3
    print(f"default predictor: start-up (load + train + seed errors) {train_s:.2f} s; predict latency over "
          f"{len(ms)} single test prompts p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms, "
          f"max {ms.max():.3f} ms")
    errors = predictor.errors
    print(f"seeded error (validation split): exact {errors.exact_accuracy:.3f}, "
          f"within1 {errors.within_one_accuracy:.3f}, "
          f"actual/predicted p50 {errors.margin_ratio(0.5):.2f} p90 {errors.margin_ratio(0.9):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
