"""The output-length models weighed against the default, and the baselines, for bench.predictor.

Each candidate fits on the train split and returns a bucket per prompt. Hyper-parameters
are arguments so bench.predictor_sweep can try them on the validation split; the values
in CANDIDATES are the sweep's winners there (never chosen on the test split), and WINNERS
holds those of another label source where they differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction.text import HashingVectorizer, TfidfVectorizer
from sklearn.linear_model import LogisticRegression, Ridge, SGDClassifier
from sklearn.preprocessing import StandardScaler

from core.classes import LengthClassConfig
from prediction.hashed_bucket_model import HashedBucketModel
from prediction.length_buckets import LengthBuckets
from prediction.length_predictor import median_bucket
from prediction.prompt_cues import cue_matrix
from prediction.prompt_data import PromptPairs

MAX_CHARS = 4000


def labels(buckets: LengthBuckets, pairs: PromptPairs) -> np.ndarray:
    return np.array([buckets.label(n) for n in pairs.output_tokens])


def majority_bucket(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs) -> np.ndarray:
    return np.full(len(test), np.bincount(labels(buckets, train), minlength=buckets.n).argmax())


def median_by_input_size(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs) -> np.ndarray:
    """What BucketMedianPredictor converges to: the median output of prompts of the same input size."""
    lengths = LengthClassConfig()
    outputs: dict[str, list[int]] = {}
    for p, o in zip(train.prompt_tokens, train.output_tokens):
        outputs.setdefault(lengths.input_size(p), []).append(o)
    medians = {size: int(np.median(v)) for size, v in outputs.items()}
    overall = int(np.median(train.output_tokens))
    return np.array([buckets.label(medians.get(lengths.input_size(p), overall)) for p in test.prompt_tokens])


def decide(proba: np.ndarray, argmax: float) -> np.ndarray:
    """The predicted bucket: the distribution's median (the predictor's rule, fewest buckets off on
    average) or, with `argmax`, its mode (more often exact where lengths are bimodal)."""
    return proba.argmax(axis=1) if argmax else median_bucket(proba)


def hashed_cues_sgd(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs,
                    alpha: float = 3e-4, epochs: int = 20, argmax: float = 0) -> np.ndarray:
    """The default model (prediction.hashed_bucket_model)."""
    model = HashedBucketModel(buckets.n, alpha=alpha, epochs=epochs)
    model.fit(train.prompts, train.prompt_tokens, list(labels(buckets, train)))
    return decide(model.predict_proba(test.prompts, test.prompt_tokens), argmax)


def _markers(text: str, prompt_tokens: int) -> str:
    tags = [f"__plen{int(math.log2(max(prompt_tokens, 1)))}__", f"__lines{min(text.count(chr(10)), 8)}__"]
    tags += [tag for tag, present in (("__code__", "```" in text), ("__question__", "?" in text)) if present]
    return " ".join(tags)


def previous_default(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs,
                     alpha: float = 3e-5, epochs: int = 10) -> np.ndarray:
    """The model issue 19 scored 0.21 / 0.61 off-sample: hashed 1-2 grams plus shape markers, no idf, no cues."""
    vectorizer = HashingVectorizer(n_features=2**18, ngram_range=(1, 2), alternate_sign=False, norm="l2")

    def features(pairs: PromptPairs) -> csr_matrix:
        docs = [t[:MAX_CHARS] + " " + _markers(t, n) for t, n in zip(pairs.prompts, pairs.prompt_tokens)]
        return vectorizer.transform(docs)

    X, y = features(train), labels(buckets, train)
    model = SGDClassifier(loss="log_loss", alpha=alpha, random_state=0)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        model.partial_fit(X[order], y[order], classes=np.arange(buckets.n))
    return median_bucket(model.predict_proba(features(test)))


def _scaled_cues(train: PromptPairs, test: PromptPairs) -> tuple[np.ndarray, np.ndarray]:
    scaler = StandardScaler().fit(cue_matrix(train.prompts, train.prompt_tokens))
    return (scaler.transform(cue_matrix(train.prompts, train.prompt_tokens)),
            scaler.transform(cue_matrix(test.prompts, test.prompt_tokens)))


def _proba_all_buckets(model: LogisticRegression | HistGradientBoostingClassifier, X: np.ndarray | csr_matrix,
                       n: int) -> np.ndarray:
    """predict_proba over all n buckets, zero for those the training data lack."""
    proba = np.zeros((X.shape[0], n))
    proba[:, model.classes_] = model.predict_proba(X)
    return proba


def cues_logistic(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs, C: float = 0.3) -> np.ndarray:
    Xtr, Xte = _scaled_cues(train, test)
    model = LogisticRegression(C=C, max_iter=3000).fit(Xtr, labels(buckets, train))
    return median_bucket(_proba_all_buckets(model, Xte, buckets.n))


def cues_boosting(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs, iterations: int = 50) -> np.ndarray:
    Xtr, Xte = _scaled_cues(train, test)
    model = HistGradientBoostingClassifier(learning_rate=0.05, max_depth=3, max_iter=iterations,
                                           l2_regularization=1.0, random_state=0).fit(Xtr, labels(buckets, train))
    return median_bucket(_proba_all_buckets(model, Xte, buckets.n))


def _tfidf_and_cues(train: PromptPairs, test: PromptPairs,
                    vectorizer: TfidfVectorizer) -> tuple[csr_matrix, csr_matrix]:
    words_tr = vectorizer.fit_transform([t[:MAX_CHARS] for t in train.prompts])
    words_te = vectorizer.transform([t[:MAX_CHARS] for t in test.prompts])
    cues_tr, cues_te = _scaled_cues(train, test)
    return hstack([words_tr, csr_matrix(cues_tr)], format="csr"), hstack([words_te, csr_matrix(cues_te)], format="csr")


def _words() -> TfidfVectorizer:
    return TfidfVectorizer(ngram_range=(1, 2), min_df=3, sublinear_tf=True, max_features=50000)


def _chars() -> TfidfVectorizer:
    return TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=5, sublinear_tf=True, max_features=100000)


def words_logistic(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs, C: float = 3.0,
                   argmax: float = 0) -> np.ndarray:
    Xtr, Xte = _tfidf_and_cues(train, test, _words())
    model = LogisticRegression(C=C, max_iter=3000).fit(Xtr, labels(buckets, train))
    return decide(_proba_all_buckets(model, Xte, buckets.n), argmax)


def chars_logistic(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs, C: float = 3.0) -> np.ndarray:
    Xtr, Xte = _tfidf_and_cues(train, test, _chars())
    model = LogisticRegression(C=C, max_iter=3000).fit(Xtr, labels(buckets, train))
    return median_bucket(_proba_all_buckets(model, Xte, buckets.n))


def log_length_ridge(train: PromptPairs, buckets: LengthBuckets, test: PromptPairs, alpha: float = 3.0) -> np.ndarray:
    """Ordinal by regression: predict log(length), then take its bucket."""
    Xtr, Xte = _tfidf_and_cues(train, test, _words())
    model = Ridge(alpha=alpha).fit(Xtr, np.log(np.asarray(train.output_tokens, dtype=np.float64)))
    return np.array([buckets.label(int(np.exp(v))) for v in model.predict(Xte)])


Predict = Callable[[PromptPairs, LengthBuckets, PromptPairs], np.ndarray]


@dataclass(frozen=True)
class Candidate:
    name: str
    predict: Callable[..., np.ndarray]
    grid: dict[str, list[float]] = field(default_factory=dict)  # what bench.predictor_sweep tries


BASELINES: dict[str, Predict] = {
    "majority bucket (train)": majority_bucket,
    "median by input size (train)": median_by_input_size,
}
CANDIDATES: list[Candidate] = [
    Candidate("hashed words+cues SGD (default)", hashed_cues_sgd,
              {"alpha": [3e-5, 1e-4, 3e-4, 1e-3], "epochs": [5, 10, 20], "argmax": [0, 1]}),
    Candidate("previous default", previous_default),
    Candidate("cues logistic", cues_logistic, {"C": [0.03, 0.1, 0.3, 1.0]}),
    Candidate("cues gradient boosting", cues_boosting, {"iterations": [50, 100, 200]}),
    Candidate("tfidf words+cues logistic", words_logistic, {"C": [0.3, 1.0, 3.0], "argmax": [0, 1]}),
    Candidate("tfidf chars+cues logistic", chars_logistic, {"C": [0.3, 1.0, 3.0]}),
    Candidate("tfidf words+cues ridge log-length", log_length_ridge, {"alpha": [1.0, 3.0, 10.0]}),
]
# The sweep's winners on the served model's own lengths (bench.predictor_sweep --labels smollm2,
# 2026-11-26), where they differ from the defaults above (ShareGPT's winners).
WINNERS: dict[str, dict[str, dict[str, float]]] = {"sharegpt": {}, "smollm2": {
    "hashed words+cues SGD (default)": {"alpha": 3e-5, "epochs": 20, "argmax": 1},
    "cues logistic": {"C": 1.0},
    "cues gradient boosting": {"iterations": 200},
    "tfidf words+cues logistic": {"C": 1.0, "argmax": 1},
    "tfidf words+cues ridge log-length": {"alpha": 1.0},
}}
