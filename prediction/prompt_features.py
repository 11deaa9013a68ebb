"""Prompt text -> sparse features for the length predictor: hashed words plus task cues.

Hashing (no vocabulary) lets the model learn online from unseen words without refitting
a vectoriser; inverse document frequencies, learned once at fit, keep frequent filler
words from drowning the rare ones that name the task. The hand-made cues
(prediction.prompt_cues) are standardised and appended with a fixed weight. The idf and
scaling are plain numpy, not TfidfTransformer / StandardScaler: their per-call checks
cost ~1 ms of a single request's latency.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import HashingVectorizer

from prediction.prompt_cues import cue_matrix


class PromptFeaturizer:
    """Fitted once on the training prompts, then frozen: the same text always maps to the same row."""

    def __init__(self, n_features: int = 2**18, max_chars: int = 4000, cue_weight: float = 0.5) -> None:
        self.max_chars = max_chars  # long prompts: the head says what is asked; caps latency
        # Cues against the ~20 non-zero unit-norm word columns: 0.5 measured on the validation split.
        self.cue_weight = cue_weight
        self._vectorizer = HashingVectorizer(
            n_features=n_features, ngram_range=(1, 2), alternate_sign=False, norm=None, lowercase=True,
        )
        self._idf = np.ones(n_features)
        self._cue_mean = np.zeros(0)
        self._cue_scale = np.ones(0)

    def _counts(self, texts: list[str]) -> csr_matrix:
        return self._vectorizer.transform([t[: self.max_chars] for t in texts])

    def fit(self, texts: list[str], prompt_tokens: list[int]) -> PromptFeaturizer:
        self._fit(self._counts(texts), cue_matrix(texts, prompt_tokens))
        return self

    def fit_transform(self, texts: list[str], prompt_tokens: list[int]) -> csr_matrix:
        """fit, then transform of the same prompts, reading each prompt's words and cues once
        (the cues' regexes are most of a fit: ~1 s of the ingress predictor's start)."""
        counts, cues = self._counts(texts), cue_matrix(texts, prompt_tokens)
        self._fit(counts, cues)
        return self._transform(counts, cues)

    def transform(self, texts: list[str], prompt_tokens: list[int]) -> csr_matrix:
        return self._transform(self._counts(texts), cue_matrix(texts, prompt_tokens))

    def _fit(self, counts: csr_matrix, cues: np.ndarray) -> None:
        df = np.bincount(counts.indices, minlength=counts.shape[1])
        self._idf = np.log((1 + counts.shape[0]) / (1 + df)) + 1  # scikit-learn's smoothed idf
        self._cue_mean = cues.mean(axis=0)
        std = cues.std(axis=0)
        self._cue_scale = np.where(std > 0, std, 1.0)

    def _transform(self, counts: csr_matrix, cues: np.ndarray) -> csr_matrix:
        words = counts.astype(np.float64)
        words.data = (1 + np.log(words.data)) * self._idf[words.indices]  # sublinear tf x idf
        rows = np.repeat(np.arange(words.shape[0]), np.diff(words.indptr))
        norms = np.sqrt(np.bincount(rows, weights=words.data**2, minlength=words.shape[0]))
        words.data /= norms[rows]
        scaled = (cues - self._cue_mean) / self._cue_scale * self.cue_weight
        return hstack([words, csr_matrix(scaled)], format="csr")
