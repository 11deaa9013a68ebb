"""Hyper-parameter sweep of the length-predictor candidates, on the VALIDATION split only.

    python -m bench.predictor_sweep [--labels smollm2]

Fits each grid point on the train split and scores it on the validation split (10
uniform buckets and S/M/L). The winner per candidate is the highest exact + within-one
on the 10 buckets; its values are the defaults in bench.predictor_candidates.CANDIDATES.
The test split is never read here.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

from bench.predictor_candidates import CANDIDATES, labels
from core.classes import LengthClassConfig
from prediction.length_buckets import LengthBuckets
from prediction.predictor_config import PredictorConfig
from prediction.prompt_data import LABEL_SOURCES, split_three_way


def add_labels_argument(p: argparse.ArgumentParser) -> None:
    """`--labels`, the predictor benches' choice of whose response lengths to predict."""
    p.add_argument("--labels", choices=sorted(LABEL_SOURCES), default="sharegpt", help=(
        "whose response lengths to predict: ShareGPT's (ChatGPT's answers) or the served SmolLM2's own "
        "(data/prompts/smollm2_lengths.jsonl)"))


def scores(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(exact, within one bucket) accuracy."""
    return float(np.mean(pred == truth)), float(np.mean(np.abs(pred - truth) <= 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.predictor_sweep", description=__doc__)
    add_labels_argument(p)
    split = split_three_way(LABEL_SOURCES[p.parse_args(argv).labels]())
    l_max = PredictorConfig().l_max_tokens
    uniform = LengthBuckets.uniform(l_max, 10)
    classes = LengthBuckets.from_length_classes(LengthClassConfig(), l_max)
    print(f"train {len(split.train)} pairs, validation {len(split.validation)}; scores on validation")
    print(f"{'candidate':>36} {'params':>28} {'10 exact':>9} {'within1':>8} {'SML exact':>10} {'within1':>8}")
    for candidate in CANDIDATES:
        best: tuple[float, str] | None = None
        for values in itertools.product(*candidate.grid.values()):
            params = dict(zip(candidate.grid, values))
            row: list[float] = []
            for buckets in (uniform, classes):
                pred = candidate.predict(split.train, buckets, split.validation, **params)
                row += scores(pred, labels(buckets, split.validation))
            text = ", ".join(f"{k}={v:g}" for k, v in params.items())
            cells = f"{row[0]:>9.3f} {row[1]:>8.3f} {row[2]:>10.3f} {row[3]:>8.3f}"
            print(f"{candidate.name:>36} {text:>28} {cells}", flush=True)
            if best is None or row[0] + row[1] > best[0]:
                best = (row[0] + row[1], text)
        if best is not None:
            print(f"{'':>36} best: {best[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
