"""Shared harness for length predictors on a frozen model's prompt embeddings (bench.predictor_encoder,
bench.predictor_served_model): the same heads, grid, splits, baselines, scores and timing, so the
two feature sources are compared on equal terms.

Heads fit on the train split only; every choice is made on validation; a --test run scores the
one chosen configuration on the test split, next to the default and the baselines there.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.linear_model import LogisticRegression, SGDClassifier

from bench.predictor_candidates import BASELINES, _scaled_cues, hashed_cues_sgd, labels
from bench.predictor_sweep import add_labels_argument, scores
from core.classes import LengthClassConfig
from core.disk_cache import CACHE_DIR
from prediction.hashed_bucket_model import HashedBucketModel
from prediction.length_buckets import LengthBuckets
from prediction.length_predictor import median_bucket
from prediction.predictor_config import PredictorConfig
from prediction.prompt_data import PromptPairs
from prediction.prompt_features import PromptFeaturizer

CUE_WEIGHT = 0.5  # as prediction.prompt_features


def cached(key: str, pairs: PromptPairs, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`compute()` once per (key, prompts), then from the machine's cache (core.disk_cache.CACHE_DIR):
    sweeps refit heads, never the encoder."""
    digest = hashlib.sha256("\x00".join(pairs.prompts).encode()).hexdigest()[:16]
    path = CACHE_DIR / f"embeddings-{key}-{digest}.npz"
    if path.exists():
        with np.load(path) as stored:
            return {name: stored[name] for name in stored.files}
    arrays = compute()
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return arrays


@dataclass(frozen=True)
class Config:
    head: str  # "sgd" (learns online) or "logistic" (batch only, a reference)
    features: str  # "embedding" alone, "embedding+cues" or "hashed+embedding"
    reg: float  # SGD alpha or logistic C
    weight: float = 1.0  # scale of the embedding block beside the unit-norm hashed words
    pooling: str = ""  # which of the encoder's pooled vectors; "" where it has one

    def label(self) -> str:
        reg = "alpha" if self.head == "sgd" else "C"
        pooling = f"{self.pooling} " if self.pooling else ""
        return f"{pooling}{self.head} {self.features} {reg}={self.reg:g} w={self.weight:g}"


def _features(config: Config, train: PromptPairs, other: PromptPairs, emb_train: np.ndarray,
              emb_other: np.ndarray) -> tuple[Any, Any]:
    if config.features == "embedding":
        return emb_train * config.weight, emb_other * config.weight
    if config.features == "embedding+cues":  # the default's standardised cues (prompt length among them)
        cues_tr, cues_o = _scaled_cues(train, other)
        return (np.hstack([emb_train * config.weight, cues_tr * CUE_WEIGHT]),
                np.hstack([emb_other * config.weight, cues_o * CUE_WEIGHT]))
    featurizer = PromptFeaturizer().fit(train.prompts, train.prompt_tokens)
    return (hstack([featurizer.transform(train.prompts, train.prompt_tokens), csr_matrix(emb_train * config.weight)],
                   format="csr"),
            hstack([featurizer.transform(other.prompts, other.prompt_tokens), csr_matrix(emb_other * config.weight)],
                   format="csr"))


def predict(config: Config, train: PromptPairs, buckets: LengthBuckets, other: PromptPairs,
            emb_train: np.ndarray, emb_other: np.ndarray, epochs: int = 20, seed: int = 0) -> np.ndarray:
    Xtr, Xo = _features(config, train, other, emb_train, emb_other)
    y = labels(buckets, train)
    if config.head == "logistic":
        model = LogisticRegression(C=config.reg, max_iter=3000).fit(Xtr, y)
        proba = np.zeros((Xo.shape[0], buckets.n))
        proba[:, model.classes_] = model.predict_proba(Xo)
        return median_bucket(proba)
    sgd = SGDClassifier(loss="log_loss", alpha=config.reg, random_state=seed)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        sgd.partial_fit(Xtr[order], y[order], classes=np.arange(buckets.n))
    return median_bucket(sgd.predict_proba(Xo))


def grid(pooling: str = "") -> list[Config]:
    """The 32 heads bench.predictor_encoder swept, for one pooled embedding."""
    return (
        [Config("sgd", "embedding", a, pooling=pooling) for a in (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)]
        + [Config("logistic", "embedding", c, pooling=pooling) for c in (0.3, 1.0, 3.0, 10.0)]
        + [Config("sgd", "embedding+cues", a, w, pooling)
           for a, w in itertools.product((3e-4, 1e-3, 3e-3), (1.0, 3.0))]
        + [Config("logistic", "embedding+cues", c, 1.0, pooling) for c in (0.1, 0.3, 1.0)]
        + [Config("sgd", "hashed+embedding", a, w, pooling)
           for a, w in itertools.product((1e-4, 3e-4, 1e-3), (0.5, 1.0, 2.0))]
        + [Config("logistic", "hashed+embedding", c, 1.0, pooling) for c in (0.3, 1.0, 3.0)]
    )


def _schemes() -> dict[str, LengthBuckets]:
    l_max = PredictorConfig().l_max_tokens
    return {"10": LengthBuckets.uniform(l_max, 10),
            "SML": LengthBuckets.from_length_classes(LengthClassConfig(), l_max)}


def _row(name: str, cells: list[float]) -> str:
    return f"{name:>44} {cells[0]:>9.3f} {cells[1]:>8.3f} {cells[2]:>10.3f} {cells[3]:>8.3f}"


@dataclass(frozen=True)
class EmbeddingBench:
    """One run's data: the splits' prompts and, per pooling, the train and scored split's embeddings."""

    train: PromptPairs
    other: PromptPairs  # validation, or test in a --test run
    emb_train: dict[str, np.ndarray]
    emb_other: dict[str, np.ndarray]

    def embeddings(self, config: Config) -> tuple[np.ndarray, np.ndarray]:
        key = config.pooling or next(iter(self.emb_train))
        return self.emb_train[key], self.emb_other[key]


def run(bench: EmbeddingBench, configs: list[Config], test: bool) -> Config:
    """Print the baselines, the default and each config on `bench.other`; return the highest exact + within-one
    on 10 buckets (the choice, meaningful only on validation)."""
    schemes = _schemes()
    print(f"{'predictor':>44} {'10 exact':>9} {'within1':>8} {'SML exact':>10} {'within1':>8}")
    references = dict(BASELINES) | {"hashed words+cues SGD (default)": hashed_cues_sgd}
    for name, fn in references.items():
        cells: list[float] = []
        for buckets in schemes.values():
            cells += scores(fn(bench.train, buckets, bench.other), labels(buckets, bench.other))
        print(_row(name, cells), flush=True)
    best: tuple[float, Config] | None = None
    for config in configs:
        emb_train, emb_other = bench.embeddings(config)
        cells = []
        for buckets in schemes.values():
            cells += scores(predict(config, bench.train, buckets, bench.other, emb_train, emb_other),
                            labels(buckets, bench.other))
        print(_row(config.label(), cells), flush=True)
        if best is None or cells[0] + cells[1] > best[0]:
            best = (cells[0] + cells[1], config)
    assert best is not None
    if not test:
        print(f"best on validation (exact + within-one, 10 buckets): {best[1].label()}")
    return best[1]


def seed_spread(bench: EmbeddingBench, chosen: Config, n: int) -> None:
    """Mean (min-max) over training seeds on 10 buckets: how much of a gain is one seed's luck."""
    buckets = _schemes()["10"]
    truth = labels(buckets, bench.other)
    emb_train, emb_other = bench.embeddings(chosen)
    rows = {
        "hashed words+cues SGD (default)": [scores(_default(bench.train, buckets, bench.other, s), truth)
                                            for s in range(n)],
        chosen.label(): [scores(predict(chosen, bench.train, buckets, bench.other, emb_train, emb_other, seed=s),
                                truth) for s in range(n)],
    }
    print(f"validation, 10 buckets, training seeds 0-{n - 1}: mean (min-max)")
    for name, cells in rows.items():
        a = np.array(cells)
        print(f"{name:>44} exact {a[:, 0].mean():.3f} ({a[:, 0].min():.3f}-{a[:, 0].max():.3f}) "
              f"within1 {a[:, 1].mean():.3f} ({a[:, 1].min():.3f}-{a[:, 1].max():.3f})")


def _default(train: PromptPairs, buckets: LengthBuckets, other: PromptPairs, seed: int) -> np.ndarray:
    model = HashedBucketModel(buckets.n, seed=seed)
    model.fit(train.prompts, train.prompt_tokens, list(labels(buckets, train)))
    return median_bucket(model.predict_proba(other.prompts, other.prompt_tokens))


def time_single_requests(encode: Callable[[list[str]], object], pairs: PromptPairs, n: int, threads: int) -> None:
    """Batch-of-one embedding latency (the head's dot product adds ~10 us), after one warm-up call."""
    encode(["warm up"])
    ms = []
    for text in pairs.prompts[:n]:
        start = time.perf_counter()
        encode([text])
        ms.append((time.perf_counter() - start) * 1e3)
    a = np.array(ms)
    print(f"encoder predict latency, {len(a)} single test prompts: p50 {np.percentile(a, 50):.2f} ms, "
          f"p99 {np.percentile(a, 99):.2f} ms, max {a.max():.2f} ms (torch threads {threads})")


def arguments(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The options both benches share; each adds its own --max-length (and model options)."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--test", action="store_true", help="score CHOSEN on the test split (once) and time it")
    p.add_argument("--latency-samples", type=int, default=500)
    p.add_argument("--seeds", type=int, default=0,
                   help="instead of the sweep: CHOSEN and the default over training seeds 0..N-1, on validation")
    p.add_argument("--only", default="", help="sweep only the grid points whose label contains this")
    add_labels_argument(p)
    return p


def finish(bench: EmbeddingBench, args: argparse.Namespace, chosen: Config, configs: list[Config],
           encode: Callable[[list[str]], object], threads: int) -> int:
    """The seed spread, the validation sweep, or the test score of `chosen` plus single-request latency."""
    if args.seeds and not args.test:
        seed_spread(bench, chosen, args.seeds)
        return 0
    run(bench, [chosen] if args.test else [c for c in configs if args.only in c.label()], args.test)
    if args.test:
        time_single_requests(encode, bench.other, args.latency_samples, threads)
    return 0
